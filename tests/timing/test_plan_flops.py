#!/usr/bin/env python3
"""fsdp-plan's FLOPs from a .pt2 graph against FlopCounterMode (issue 27, item 2).

For every case of reference/flops/ (flop_oracle.py: torch.utils.flop_counter.FlopCounterMode on
one training step, per module, forward and backward, activation checkpointing's recompute in the
backward) this exports the case's model as flop_oracle.py does (torch.export, training IR, with
the labels so that the loss is in the graph), plans it with one FSDP unit per decoder layer (FSDP2;
the case's activation checkpointing on those layers), and compares each unit's `time.forward_flops`
and `time.backward_flops` with FlopCounterMode's figures for the unit: the module's count minus
those of the units nested in it. The issue's gate is 1%; the formulas mirror flop_counter.py, so
every figure is expected to be exact, and the test says where it is not.

    python tests/timing/test_plan_flops.py FSDP_PLAN [--exports DIR] [-k SUBSTRING] [--skip-big]
    python tests/timing/test_plan_flops.py FSDP_PLAN --perturb 1.02   # every reference off by 2%: must fail

The exports are written once into DIR (default: a temporary directory) and reused when it is kept;
the Llama-3-8B cases' export takes about a minute.
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import timing_common as tc  # noqa: E402

TOLERANCE = 0.01  # issue 27: within 1% of FlopCounterMode
BIG = ("llama3_8b",)


def export_key(cfg: Dict[str, Any]) -> str:
    # The graph does not depend on activation checkpointing: AC and no-AC cases share an export.
    return f"{cfg['model']}.{cfg['attn']}.b{cfg['batch']}s{cfg['seq']}"


def layer_class(cfg: Dict[str, Any], exports: str) -> str:
    path = os.path.join(exports, export_key(cfg) + ".json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)["layer_class"]
    import torch
    with torch.device("meta"):
        model = tc.build(cfg["model"], attn=cfg["attn"] if cfg["attn"] != "own" else "eager")
    cls = tc.decoder_layer_class(model).__name__
    with open(path, "w") as f:
        json.dump({"layer_class": cls}, f)
    return cls


def export(cfg: Dict[str, Any], exports: str) -> str:
    path = os.path.join(exports, export_key(cfg) + ".pt2")
    if not os.path.exists(path):
        import flop_oracle
        t0 = time.time()
        flop_oracle.export_graph(cfg, exports, export_key(cfg))
        print(f"     exported {os.path.basename(path)} ({time.time() - t0:.0f} s)", flush=True)
    return path


def plan(binary: str, model: str, policy: Dict[str, Any], tmp: str) -> Dict[str, Any]:
    path = os.path.join(tmp, "policy.json")
    with open(path, "w") as f:
        json.dump(policy, f)
    r = subprocess.run([binary, model, "-p", path, "-f", "json"], capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"fsdp-plan exit {r.returncode}: {r.stderr.strip()}")
    return json.loads(r.stdout)


def reference_units(ref: Dict[str, Any], units: List[str], perturb: float) -> Dict[str, Tuple[int, int]]:
    """FlopCounterMode's (forward, backward) per unit path: the module's figures (its submodules'
    included) minus those of the other units inside it. A unit the counter never saw counts 0."""
    mods = ref["modules"]

    def total(path: str) -> Tuple[int, int]:
        m = mods.get(path, {"forward": 0, "backward": 0})
        return m["forward"], m["backward"]

    def parent(v: str) -> str:
        """The innermost other unit holding v (the root holds every one)."""
        above = [w for w in units if w != v and (w == "" or v.startswith(w + "."))]
        return max(above, key=len) if above else None

    out = {}
    for u in units:
        f, b = total(u)
        for v in units:
            if v != u and parent(v) == u:
                vf, vb = total(v)
                f, b = f - vf, b - vb
        out[u] = (round(f * perturb), round(b * perturb))
    return out


# LoRA (peft on the corpus llama, q_proj and v_proj): frozen base weights, whose matmuls compute
# the input's gradient only. Counted here with FlopCounterMode (flop_oracle.py's counter), live:
# a small model, a few seconds.
LORA_CASES = {"llama_lora.sdpa.noac.b2s16": False, "llama_lora.sdpa.ac.b2s16": True}


def _lora_model():
    from peft import LoraConfig, get_peft_model
    import torch
    model = tc.build("llama", attn="sdpa")
    torch.manual_seed(0)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            lora_dropout=0.0))


def lora_reference(ac: bool) -> Dict[str, Any]:
    import torch
    import flop_oracle
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointImpl, checkpoint_wrapper
    cfg = dict(model="llama_lora", attn="sdpa", ac=ac, batch=2, seq=16)
    # Real CPU tensors (a small model): peft's LoRA layers cannot be built under FakeTensorMode.
    with contextlib.nullcontext():
        model = _lora_model()
        if ac:  # torch's wrapper, as flop_oracle does for tiny_gpt: HF's would make the inputs require grad
            for parent in list(model.modules()):
                for child_name, child in list(parent.named_children()):
                    if type(child).__name__ == "LlamaDecoderLayer":
                        setattr(parent, child_name, checkpoint_wrapper(child, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
        ids = tc.make_batch(model, cfg["batch"], cfg["seq"])
        counter = flop_oracle.TracingFlopCounter()
        with counter:  # as flop_oracle.count_step: forward, then backward, apart
            loss = model(input_ids=ids, labels=ids).loss
            fwd = {k: sum(v.values()) for k, v in counter.flop_counts.items()}
            loss.backward()
        total = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    root = type(model).__name__
    out = {flop_oracle._fqn(k, root): {"forward": fwd.get(k, 0), "backward": total[k] - fwd.get(k, 0)}
           for k in total}
    g = out.pop("Global")
    return {"config": cfg, "modules": out, "totals": g}


def export_lora(exports: str) -> str:
    import torch
    path = os.path.join(exports, "llama_lora.sdpa.b2s16.pt2")
    if not os.path.exists(path):
        model = _lora_model()  # on the CPU: a small model (peft's layers do not build on meta)
        ids = tc.make_batch(model, 2, 16)
        ep = torch.export.export(model, (), kwargs={"input_ids": ids, "labels": ids}, strict=False)
        torch.export.save(ep, path)
    with open(os.path.join(exports, "llama_lora.sdpa.b2s16.json"), "w") as f:
        json.dump({"layer_class": "LlamaDecoderLayer"}, f)
    return path


def check_case(binary: str, name: str, ref: Dict[str, Any], exports: str, tmp: str, perturb: float):
    cfg = ref["config"]
    model = export_lora(exports) if cfg["model"] == "llama_lora" else export(cfg, exports)
    cls = layer_class(cfg, exports)
    policy: Dict[str, Any] = {"module_classes": [cls], "fsdp": {"version": 2, "world_size": 8}}
    if cfg["ac"]:
        policy["activation_checkpointing"] = {"module_classes": [cls]}
    doc = plan(binary, model, policy, tmp)
    t = doc.get("time") or {}
    fails: List[str] = []
    if t.get("flops_source") != "graph":
        fails.append(f"time.flops_source is {t.get('flops_source')!r}, not 'graph'")
        return fails, 0.0, 0, 0
    # tiny_gpt's export wraps the model in a module holding the loss (flop_oracle._TinyGPTWithLoss).
    prefix = "model." if cfg["model"] == "tiny_gpt" else ""
    paths = []
    for u in doc["units"]:
        p = u["path"]
        paths.append(p[len(prefix):] if prefix and p.startswith(prefix) else ("" if p == prefix.rstrip(".") else p))
    want = reference_units(ref, paths, perturb)
    worst, exact, checked = 0.0, 0, 0
    for path, u in zip(paths, doc["units"]):
        got = (u["time"]["forward_flops"], u["time"]["backward_flops"])
        for what, g, w in zip(("forward", "backward"), got, want[path]):
            checked += 1
            err = abs(g - w) / w if w else (0.0 if g == 0 else float("inf"))
            worst = max(worst, err)
            exact += g == w
            if err > TOLERANCE:
                fails.append(f"unit {path or '(root)'} {what}: plan {g}, FlopCounterMode {w} ({100 * err:.3f}% off)")
    tot = (sum(u["time"]["forward_flops"] for u in doc["units"]), sum(u["time"]["backward_flops"] for u in doc["units"]))
    want_tot = (round(ref["totals"]["forward"] * perturb), round(ref["totals"]["backward"] * perturb))
    if tot != want_tot and max(abs(a - b) / b for a, b in zip(tot, want_tot)) > TOLERANCE:
        fails.append(f"step: plan {tot}, FlopCounterMode {want_tot}")
    return fails, worst, exact, checked


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--exports", help="directory for the cases' .pt2 exports (kept; default: a temporary one)")
    ap.add_argument("-k", action="append", default=[], help="only cases whose name contains this (repeatable)")
    ap.add_argument("--skip-big", action="store_true", help="leave out the Llama-3-8B cases")
    ap.add_argument("--perturb", type=float, default=1.0,
                    help="multiply every reference figure by this (a check that the test can fail)")
    args = ap.parse_args(argv)
    ref_dir = os.path.join(tc.REFERENCE, "flops")
    names = sorted(f[:-5] for f in os.listdir(ref_dir) if f.endswith(".json"))
    names = tc.select(names, args.k)
    if args.skip_big:
        names = [n for n in names if not n.startswith(BIG)]
    own_tmp = tempfile.TemporaryDirectory()
    exports = args.exports or own_tmp.name
    os.makedirs(exports, exist_ok=True)
    failed, worst, exact, checked = 0, 0.0, 0, 0
    t_all = time.time()
    names += tc.select(sorted(LORA_CASES), args.k)
    for name in names:
        t0 = time.time()
        try:
            ref = (lora_reference(LORA_CASES[name]) if name in LORA_CASES
                   else tc.read_json(os.path.join(ref_dir, name + ".json")))
            fails, w, e, c = check_case(args.binary, name, ref, exports, own_tmp.name, args.perturb)
        except Exception as exc:  # a case that cannot run is a failure, with its reason
            fails, w, e, c = [f"{type(exc).__name__}: {exc}"], 0.0, 0, 0
        worst, exact, checked = max(worst, w), exact + e, checked + c
        failed += bool(fails)
        print(f"{'FAIL' if fails else 'ok  '} {name} ({time.time() - t0:.1f} s): {e} of {c} figures exact, "
              f"max error {100 * w:.4f}%", flush=True)
        for f in fails:
            print("     " + f, flush=True)
    print(f"{len(names) - failed} passed, {failed} failed; {exact} of {checked} unit figures exact, max error "
          f"{100 * worst:.4f}% (gate {100 * TOLERANCE:g}%), {time.time() - t_all:.0f} s")
    return 1 if failed or not names else 0


if __name__ == "__main__":
    sys.exit(main())
