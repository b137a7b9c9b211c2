#!/usr/bin/env python3
"""The plan's peak memory and step time beside a real training step on one CUDA GPU (issues 27, 30).

One prepared run, under 5 minutes on an H100 / H200 / A100: a Llama-3-8B-shaped model (transformers'
LlamaForCausalLM, hidden 4096, 14336 MLP, 32 heads / 8 KV heads, vocabulary 128,256) cut to --layers
decoder layers, FSDP2 at world size 1 (fully_shard per decoder layer, then the root; fp32 parameters,
MixedPrecisionPolicy bf16 / fp32 reduce; AdamW), activation checkpointing off and on (checkpoint_wrapper
per layer before fully_shard, as tests/activations/peak_oracle.py and Accelerate apply it).

1. Exports the model (meta device, no weights) with the project's exporter (python/fsdp_plan/export.py,
   with labels, at --batch x --seq).
2. Plans it with the binary for each AC setting (`--format json`, --hardware from the GPU's name). When
   the plan has no FLOPs of its own, FLOPs from the graph (tests/timing/graph_flops.py, FLOPS.md's
   formulas; the AC recompute by graph_flops.recompute_flops) are given with --flops.
3. On CUDA: --steps training steps after --warmup, each timed with CUDA events (forward with the loss,
   backward, optimizer step, zero_grad); torch.cuda.max_memory_allocated() over the timed steps.
4. Prints the plan's peak and step time beside the measured ones, and the ratios.

Without CUDA, or with --dry-run, it does 1 and 2, says that the GPU part did not run, and exits 0
(`--tiny`: a small config for the ctest that runs this path). The figures are the plan's ESTIMATE
against one measurement; nothing here asserts a tolerance.

Usage: $VENV/bin/python bench/gpu_check.py [--binary build/app/fsdp-plan] [--layers 4] [--seq 4096]
       [--batch 1] [--steps 5] [--warmup 2] [--hardware PRESET] [--dry-run] [--tiny] [--json OUT]
       [--workdir DIR]
"""
import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "timing")]

LAYER_CLASS = "LlamaDecoderLayer"
# Llama-3-8B (meta-llama/Meta-Llama-3-8B config.json), the layer count aside.
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                 vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                 tie_word_embeddings=False)
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
            max_position_embeddings=256, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)


def llama_config(args):
    from transformers import LlamaConfig
    cfg = LlamaConfig(**(TINY if args.tiny else LLAMA3_8B), num_hidden_layers=args.layers)
    cfg._attn_implementation = "sdpa"
    cfg.use_cache = False  # a training step: no KV cache (and no DynamicCache in the export's outputs)
    return cfg


def build_model(cfg, device: str):
    import torch
    from transformers import LlamaForCausalLM
    with torch.device(device):
        model = LlamaForCausalLM(cfg)
    model.train()
    return model


def export(cfg, batch: int, seq: int, path: str) -> float:
    """The model on the meta device through the project's exporter (the file fsdp-plan reads)."""
    import torch
    from fsdp_plan.export import export_module
    t0 = time.perf_counter()
    model = build_model(cfg, "meta")
    ids = torch.zeros(batch, seq, dtype=torch.long, device="meta")
    export_module(model, (), {"input_ids": ids, "labels": ids}, path, what="the Llama-3-8B-shaped model")
    return time.perf_counter() - t0


def graph_flop_file(pt2: str, ac: bool, out: str) -> str:
    """--flops from the export's graph: per module forward / backward, and with AC each layer's recompute
    (added to its ancestors too: the file's figures include the submodules')."""
    import torch
    import graph_flops
    ep = torch.export.load(pt2)
    g = graph_flops.graph_flops(ep)
    modules = {k: dict(v) for k, v in g["modules"].items()}
    if ac:
        layers = sorted({p for p in modules if p.startswith("model.layers.") and p.count(".") == 2})
        for layer in layers:
            rec = graph_flops.recompute_flops(ep, layer)
            parts = layer.split(".")
            for i in range(len(parts) + 1):
                m = modules.setdefault(".".join(parts[:i]), {"forward": 0, "backward": 0})
                m["recompute"] = m.get("recompute", 0) + rec
    with open(out, "w") as f:
        json.dump({"modules": modules, "source": "tests/timing/graph_flops.py on " + os.path.basename(pt2)}, f,
                  indent=1, sort_keys=True)
    return out


def plan(binary: str, pt2: str, ac: bool, hardware: str, workdir: str) -> Dict[str, Any]:
    policy = {"module_classes": [LAYER_CLASS],
              "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}}
    if ac:
        policy["activation_checkpointing"] = {"module_classes": [LAYER_CLASS]}
    pfile = os.path.join(workdir, "policy_ac.json" if ac else "policy.json")
    with open(pfile, "w") as f:
        json.dump(policy, f)
    argv = [binary, pt2, "--policy", pfile, "--fsdp-version", "2", "--world-size", "1", "--hardware", hardware,
            "--optimizer", "adam", "--format", "json"]

    def run(extra: List[str]) -> Dict[str, Any]:
        p = subprocess.run(argv + extra, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if p.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(argv + extra)}: exit {p.returncode}: {p.stderr.strip()}")
        return json.loads(p.stdout)

    doc = run([])
    flops_from = "the plan's own"
    if not (doc.get("time") or {}).get("flops_known"):
        ffile = graph_flop_file(pt2, ac, os.path.join(workdir, "flops_ac.json" if ac else "flops.json"))
        doc = run(["--flops", ffile])
        flops_from = "tests/timing/graph_flops.py (--flops)"
    r = doc["memory"]["per_rank"]
    t = doc.get("time") or {}
    return {"peak_bytes": r["peak_bytes"], "activation_bytes": r.get("activation_bytes"),
            "steady_bytes": r["steady_bytes"], "peak_phase": r.get("peak_phase"),
            "step_s": t.get("step_s"), "compute_s": t.get("compute_s"), "exposed_comm_s": t.get("exposed_comm_s"),
            "optimizer_s": t.get("optimizer_s"), "flops_from": flops_from, "argv": argv}


def preset_for(name: str) -> Optional[str]:
    n = name.upper()
    for key, preset in (("H200", "h200"), ("H100", "h100"), ("A100", "a100")):
        if key in n:
            return preset
    return None


def gpu_steps(cfg, ac: bool, batch: int, seq: int, steps: int, warmup: int) -> Dict[str, Any]:
    """Real training steps on cuda:0 under FSDP2 at world size 1; peak and median step time."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointWrapper,
                                                                              checkpoint_wrapper)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    torch.cuda.set_device(0)
    if not dist.is_initialized():
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh("cuda", (1,))
    torch.manual_seed(0)
    model = build_model(cfg, "cuda")
    layer_cls = type(model.model.layers[0])
    if ac:  # torch's non-reentrant checkpoint_wrapper, deepest first (peak_oracle.py apply_fsdp2_ac)
        for name, mod in reversed(list(model.named_modules())):
            if name and isinstance(mod, layer_cls):
                model.set_submodule(name, checkpoint_wrapper(mod, preserve_rng_state=False))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    # fully_shard per layer (through its CheckpointWrapper under AC), bottom-up, then the root.
    for name, mod in reversed(list(model.named_modules())):
        if name and (isinstance(mod, CheckpointWrapper) if ac else isinstance(mod, layer_cls)):
            fully_shard(mod, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-5)
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda", generator=g)

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    out = {"peak_bytes": torch.cuda.max_memory_allocated(), "step_s": statistics.median(times),
           "step_s_all": [round(t, 5) for t in times]}
    del model, optim
    torch.cuda.empty_cache()
    return out


def gib(n: Optional[float]) -> str:
    if n is None:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def sec(s: Optional[float]) -> str:
    if s is None:
        return "-"
    return f"{s * 1e3:.1f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def ratio(a: Optional[float], b: Optional[float]) -> str:
    return "-" if a is None or not b else f"{a / b:.3f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "app", "fsdp-plan"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--hardware", help="the plan's --hardware (default: from the GPU's name, else h100)")
    ap.add_argument("--dry-run", action="store_true", help="export and plan only; no GPU part")
    ap.add_argument("--tiny", action="store_true", help="a small Llama config (the ctest), not 8B-shaped")
    ap.add_argument("--json", help="write every figure here (sorted keys)")
    ap.add_argument("--workdir", help="keep the export and policies here (default: a temporary directory)")
    args = ap.parse_args()

    import torch
    cuda = torch.cuda.is_available() and not args.dry_run
    gpu_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    hardware = args.hardware or (preset_for(gpu_name) if gpu_name else None) or "h100"
    workdir = args.workdir or tempfile.mkdtemp(prefix="gpu_check-")
    os.makedirs(workdir, exist_ok=True)
    started = time.perf_counter()
    try:
        cfg = llama_config(args)
        pt2 = os.path.join(workdir, f"llama3_8b_shape_{args.layers}l_b{args.batch}s{args.seq}.pt2")
        secs = export(cfg, args.batch, args.seq, pt2)
        print(f"exported {pt2} ({os.path.getsize(pt2) / 1e6:.1f} MB) in {secs:.1f} s; "
              f"{'tiny' if args.tiny else 'Llama-3-8B-shaped'}, {args.layers} layers, batch {args.batch} x seq {args.seq}")
        rows = []
        for ac in (False, True):
            p = plan(args.binary, pt2, ac, hardware, workdir)
            m = gpu_steps(cfg, ac, args.batch, args.seq, args.steps, args.warmup) if cuda else None
            rows.append({"ac": ac, "plan": p, "measured": m})
            print(f"planned AC {'on' if ac else 'off'}: peak {gib(p['peak_bytes'])}, step {sec(p['step_s'])} "
                  f"(FLOPs from {p['flops_from']})", flush=True)
        print()
        print(f"GPU: {gpu_name or 'none'}; plan --hardware {hardware}; FSDP2, world size 1, fp32 parameters with "
              f"MixedPrecisionPolicy bf16 / fp32 reduce, AdamW; the plan's figures are an ESTIMATE")
        print(f"{'AC':4} {'plan peak':>11} {'measured peak':>14} {'ratio':>7}   {'plan step':>10} {'measured step':>14} "
              f"{'ratio':>7}")
        for r in rows:
            p, m = r["plan"], r["measured"] or {}
            print(f"{'on' if r['ac'] else 'off':4} {gib(p['peak_bytes']):>11} {gib(m.get('peak_bytes')):>14} "
                  f"{ratio(p['peak_bytes'], m.get('peak_bytes')):>7}   {sec(p['step_s']):>10} "
                  f"{sec(m.get('step_s')):>14} {ratio(p['step_s'], m.get('step_s')):>7}")
        if not cuda:
            why = "--dry-run" if args.dry_run else "no CUDA device (torch.cuda.is_available() is False)"
            print(f"\nthe GPU part did not run: {why}; the measured columns are empty")
        print(f"total {time.perf_counter() - started:.1f} s")
        # FLOPs were given, so each plan must have a step time and a peak (the ctest relies on it).
        missing = [("on" if r["ac"] else "off") for r in rows if r["plan"]["step_s"] is None or not r["plan"]["peak_bytes"]]
        if missing:
            print(f"error: the plan with AC {', '.join(missing)} has no step time or peak", file=sys.stderr)
            return 1
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"gpu": gpu_name, "hardware": hardware, "ran_on_gpu": cuda, "layers": args.layers,
                           "batch": args.batch, "seq": args.seq, "tiny": args.tiny, "rows": rows}, f, indent=1,
                          sort_keys=True)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
        with contextlib.suppress(Exception):
            import torch.distributed as dist
            if dist.is_initialized():
                dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
