#!/usr/bin/env python3
"""Writes the .pt2 exports the activation-memory work (issue 30) is checked against, and a manifest.

Each export is `torch.export.save(torch.export.export(model, args=(), kwargs={...}, strict=False))` at
the default (training) IR, of a corpus model in train mode with SDPA attention and `labels` (so the
loss is in the graph); see actmodels.py. Per model: the static shapes actmodels.SHAPES in float32, the
first shape again in bfloat16 (`model.to(torch.bfloat16)`); for llama and gpt2 one export with
dynamic `Dim("batch")` and `Dim("seq")`. With --full, also Llama-3-8B- and Llama-3-70B-shaped
exports on the meta device (bf16, batch 1 x seq 4096 and 8192; timed). Weights of the small models
are real but tiny (a few hundred KB); meta exports write empty weight records.

Every export is traced inside actmodels.hf_training_export(), so that the graph has the attention
eager training runs (is_causal, no materialised mask, enable_gqa); the `*_plain.pt2` files (llama,
mistral, gpt2, LoRA llama at the first shape) are what a plain torch.export of HF gives, for the
reader to see the difference (GRAPH.md).

    python tests/activations/make_exports.py OUTDIR [--full] [-k SUBSTRING]

OUTDIR/manifest.json lists every export: file, model, batch, seq, dtype, dims (dynamic only: the
range constraints torch wrote), export and save seconds, file and models/model.json sizes, node count.
"""
import argparse
import contextlib
import json
import os
import sys
import time
import zipfile
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from torch.export import Dim  # noqa: E402

import actmodels  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def cases(full: bool) -> List[Dict[str, Any]]:
    out = []
    for name in actmodels.MODELS:
        shapes = [(b, None if name == "vit" else s) for b, s in actmodels.SHAPES]
        for b, s in shapes:
            out.append(dict(model=name, batch=b, seq=s, dtype="float32"))
        b, s = shapes[0]
        out.append(dict(model=name, batch=b, seq=s, dtype="bfloat16"))
    for name in ("llama", "gpt2"):
        # Traced at the second shape: torch specialises a dynamic dimension traced at size 1.
        b, s = actmodels.SHAPES[1]
        out.append(dict(model=name, batch=b, seq=s, dtype="float32", dynamic=True))
    for name in ("llama", "mistral", "gpt2", "llama_lora"):
        # What a plain torch.export of HF gives (causal mask materialised, repeat_kv): see
        # actmodels.hf_training_export, which every other export uses.
        b, s = actmodels.SHAPES[0]
        out.append(dict(model=name, batch=b, seq=s, dtype="float32", plain=True))
    # The tracker headline's model as peak_oracle.py --headline runs it (fp32 parameters, FSDP's bf16
    # mixed precision, HF's tracing attention): Llama-3-8B dimensions on meta, a plain export. Cut to
    # 4 layers here (refs/headline_8b_4layers.json), all 32 with --full (refs/headline_8b_*.json).
    out.append(dict(model="llama3_8b", batch=1, seq=4096, dtype="float32", meta=True, plain=True, layers=4))
    if full:
        out.append(dict(model="llama3_8b", batch=1, seq=4096, dtype="float32", meta=True, plain=True))
        out.append(dict(model="llama3_8b", batch=1, seq=4096, dtype="bfloat16", meta=True))
        out.append(dict(model="llama3_70b", batch=1, seq=8192, dtype="bfloat16", meta=True))
        # What a plain export gives at the headline's shape (HF's export-time mask and repeat_kv; the
        # same path HF takes under FakeTensorMode, where the headline was measured).
        out.append(dict(model="llama3_8b", batch=1, seq=4096, dtype="bfloat16", meta=True, plain=True))
    for c in out:
        c["file"] = file_stem(c) + ".pt2"
    return out


def file_stem(c: Dict[str, Any]) -> str:
    if c.get("dynamic"):
        return f"{c['model']}_dyn"
    if c.get("plain"):
        layers = f"_{c['layers']}l" if c.get("layers") else ""
        dt = "_fp32" if c.get("meta") and c["dtype"] == "float32" else ""
        return f"{c['model']}{layers}_b{c['batch']}s{c['seq']}{dt}_plain"
    dt = "" if c["dtype"] == "float32" else "_bf16"
    if c["seq"] is None:  # ViT: the sequence is the config's (image / patch)
        return f"{c['model']}_b{c['batch']}{dt}"
    return f"{c['model']}_b{c['batch']}s{c['seq']}{dt}"


def model_json(path: str) -> Dict[str, Any]:
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/models/model.json"))
        return {"bytes": z.getinfo(name).file_size, "doc": json.loads(z.read(name))}


def dynamic_shapes(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """input_ids and labels as [Dim("batch"), Dim("seq")]."""
    batch, seq = Dim("batch"), Dim("seq")
    return {k: {0: batch, 1: seq} for k in kwargs}


def export_one(c: Dict[str, Any], outdir: str) -> Dict[str, Any]:
    dtype = DTYPES[c["dtype"]]
    t0 = time.perf_counter()
    if c.get("meta"):
        model = actmodels.full_size(c["model"], "meta", dtype)
        if c.get("layers"):  # as peak_oracle.py --layers cuts it
            model.model.layers = model.model.layers[:c["layers"]]
            model.config.num_hidden_layers = c["layers"]
        ids = torch.randint(3, 1000, (c["batch"], c["seq"]), device="meta")
        kwargs = {"input_ids": ids, "labels": torch.randint(3, 1000, (c["batch"], c["seq"]), device="meta")}
    else:
        model = actmodels.build(c["model"], "cpu", dtype)
        kwargs = actmodels.inputs(c["model"], model, c["batch"], c["seq"])
    actmodels.tuple_forward(model, kwargs)
    t1, c1 = time.perf_counter(), time.process_time()
    with contextlib.nullcontext() if c.get("plain") else actmodels.hf_training_export():
        ep = torch.export.export(model, args=(), kwargs=kwargs, strict=False,
                                 dynamic_shapes=dynamic_shapes(kwargs) if c.get("dynamic") else None)
    t2, c2 = time.perf_counter(), time.process_time()
    path = os.path.join(outdir, c["file"])
    torch.export.save(ep, path)
    t3 = time.perf_counter()
    mj = model_json(path)
    graph = mj["doc"]["graph_module"]["graph"]
    # Wall and CPU seconds: the wall time depends on the machine's load (a shared 2-core box here).
    rec = dict(c, build_s=round(t1 - t0, 2), export_s=round(t2 - t1, 2), export_cpu_s=round(c2 - c1, 2),
               save_s=round(t3 - t2, 2),
               file_bytes=os.path.getsize(path), model_json_bytes=mj["bytes"], nodes=len(graph["nodes"]),
               params=sum(p.numel() for p in model.parameters()),
               trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad),
               layer_classes=actmodels.decoder_layer_classes(model), torch=torch.__version__)
    if c.get("dynamic"):
        # What torch recorded: ep.range_constraints (symbol -> ValueRanges) and, as serialised,
        # model.json's "range_constraints" ({"s0": {"min_val": .., "max_val": ..}}).
        rec["range_constraints"] = {str(k): [str(v.lower), str(v.upper)] for k, v in ep.range_constraints.items()}
        rec["serialized_range_constraints"] = mj["doc"].get("range_constraints")
        rec["input_sizes"] = {n: [s.get("as_expr", {}).get("expr_str") if "as_expr" in s else s.get("as_int")
                                  for s in graph["tensor_values"][n]["sizes"]]
                              for n in ("input_ids", "labels") if n in graph["tensor_values"]}
    return rec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--full", action="store_true", help="also the Llama-3-8B/70B-shaped meta exports (slow)")
    ap.add_argument("-k", help="only files whose name contains this")
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    mpath = os.path.join(args.outdir, "manifest.json")
    manifest: Dict[str, Any] = {}
    if os.path.exists(mpath) and args.k:
        with open(mpath) as f:
            manifest = {e["file"]: e for e in json.load(f)["exports"]}
    failed = 0
    for c in cases(args.full):
        if args.k and args.k not in c["file"]:
            continue
        try:
            rec = export_one(c, args.outdir)
        except Exception as e:  # reported, not hidden: the manifest records the reason
            failed += 1
            rec = dict(c, error=f"{type(e).__name__}: {str(e)[:500]}")
            print(f"FAIL {c['file']}: {rec['error']}")
        else:
            print(f"ok   {c['file']}: export {rec['export_s']} s, {rec['file_bytes']} bytes, {rec['nodes']} nodes")
        manifest[c["file"]] = rec
    with open(mpath, "w") as f:
        json.dump({"exports": sorted(manifest.values(), key=lambda e: e["file"])}, f, indent=1, sort_keys=True)
        f.write("\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
