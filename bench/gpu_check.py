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

Two machines: the GPU machine may have neither the binary nor the pinned torch 2.13 (a lent GPU
machine has its own image). Then plan here and measure there:

    $VENV/bin/python bench/gpu_check.py --plan-only --shapes 1x4096,1x8192 --json plans.json
    python3 bench/gpu_check.py --measure plans.json --json measured.json     # on the GPU machine

--replan MEASURED.json --workdir DIR plans a --measure result's rows again (the exports kept in DIR)
and prints the table against its stored measurements: a change to the plan checked without a GPU.
bench/results/gpu_check_h200_{4l,16l}.json are such results (one H200, 2026-12-04).

--measure builds the same model from the same config (transformers' LlamaForCausalLM), runs the
steps and prints the table against the plans the file holds; it needs neither the binary nor the
exporter. Each measured row runs on its own, so an out-of-memory row is reported and the rest run.

Usage: $VENV/bin/python bench/gpu_check.py [--binary build/app/fsdp-plan] [--layers 4]
       [--shapes BxS,...] [--steps 5] [--warmup 2] [--hardware PRESET] [--dry-run] [--tiny]
       [--plan-only | --measure PLANS.json | --replan MEASURED.json] [--json OUT] [--workdir DIR]
"""
import argparse
import contextlib
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Tuple

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
    phase_peaks: Dict[str, int] = {}
    for e in doc["memory"].get("timeline") or []:
        key = {"optimizer step": "optimizer"}.get(e["phase"], e["phase"])
        phase_peaks[key] = max(phase_peaks.get(key, 0), e["total_bytes"])
    # What the forward leaves on top of the steady state: the saved activations and the parameters the
    # root keeps gathered for the backward (the timeline's last forward point is the root's, whose
    # unsharded_params category holds them).
    forward = [e for e in doc["memory"].get("timeline") or [] if e["phase"] == "forward"]
    held = ((doc["memory"].get("activations") or {}).get("held_after_forward_bytes"))
    added = held + forward[-1]["categories"]["unsharded_params"] if forward and held is not None else None
    return {"peak_bytes": r["peak_bytes"], "activation_bytes": r.get("activation_bytes"), "phase_peaks": phase_peaks,
            "forward_added_bytes": added,
            "steady_bytes": r["steady_bytes"], "peak_phase": r.get("peak_phase"),
            "step_s": t.get("step_s"), "compute_s": t.get("compute_s"), "exposed_comm_s": t.get("exposed_comm_s"),
            "forward_end_s": t.get("forward_end_s"), "compute_peak_flops": t.get("compute_peak_flops"),
            "optimizer_s": t.get("optimizer_s"), "flops_from": flops_from, "argv": argv}


def preset_for(name: str) -> Optional[str]:
    n = name.upper()
    for key, preset in (("H200", "h200"), ("H100", "h100"), ("A100", "a100")):
        if key in n:
            return preset
    return None


def gpu_steps(cfg, ac: bool, batch: int, seq: int, steps: int, warmup: int, device: str = "cuda") -> Dict[str, Any]:
    """Real training steps on cuda:0 under FSDP2 at world size 1; peak and median step time.

    Besides the step's peak, the bytes allocated at three points of the last timed step: before the
    forward (the steady state: sharded parameters and optimizer state, no gradients after
    zero_grad(set_to_none=True)), right after the forward (plus what autograd saved and the root's
    gathered parameters, which FSDP2 keeps for backward), and after backward (plus the gradients)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (CheckpointWrapper,
                                                                              checkpoint_wrapper)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    cuda = device == "cuda"  # "cpu": the same steps on gloo, no memory figures (the ctest of this path)
    if cuda:
        torch.cuda.set_device(0)
        at_start = torch.cuda.memory_allocated()  # 0: nothing of another row (each runs in its own process)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh(device, (1,))
    torch.manual_seed(0)
    model = build_model(cfg, device)
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
    g = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device=device, generator=g)
    points: Dict[str, int] = {}
    allocated = torch.cuda.memory_allocated if cuda else (lambda: 0)

    phase_peaks: Dict[str, int] = {}

    def phase_end(name: str, ev) -> None:
        # Each phase's own peak: max_memory_allocated() since the last reset (timed steps only).
        if ev:
            phase_peaks[name] = max(phase_peaks.get(name, 0), torch.cuda.max_memory_allocated())
            torch.cuda.reset_peak_memory_stats()

    def step(ev=None):  # ev: four CUDA events around forward, backward and the optimizer step
        points["before_forward"] = allocated()
        if ev:
            torch.cuda.reset_peak_memory_stats()
            ev[0].record()
        loss = model(input_ids=ids, labels=ids).loss
        if ev:
            ev[1].record()
        phase_end("forward", ev)
        points["after_forward"] = allocated()
        loss.backward()
        if ev:
            ev[2].record()
        phase_end("backward", ev)
        points["after_backward"] = allocated()
        optim.step()
        optim.zero_grad(set_to_none=True)
        if ev:
            ev[3].record()
        phase_end("optimizer", ev)

    try:
        for _ in range(warmup):
            step()
        if not cuda:
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                step()
                times.append(time.perf_counter() - t0)
            return {"peak_bytes": None, "step_s": statistics.median(times), "points": None, "device": device}
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times, parts = [], []
        for _ in range(steps):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            step(ev)
            torch.cuda.synchronize()
            times.append(ev[0].elapsed_time(ev[3]) / 1e3)
            parts.append([ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(3)])
        stats = torch.cuda.memory_stats()
        out = {"peak_bytes": max(phase_peaks.values()), "phase_peaks": dict(phase_peaks),
               "step_s": statistics.median(times),
               "forward_s": statistics.median(p[0] for p in parts),
               "backward_s": statistics.median(p[1] for p in parts),
               "optimizer_s": statistics.median(p[2] for p in parts),
               "step_s_all": [round(t, 5) for t in times], "points": dict(points),
               "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
               "num_alloc_retries": stats.get("num_alloc_retries", 0), "device": device,
               "allocated_at_start": at_start}
    finally:
        # FSDP's hooks hold reference cycles (measure_rows runs each row in a process of its own anyway).
        model = optim = step = None  # the closure's cells too: nothing of this row stays referenced
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return out


def measure_row(cfg, r: Dict[str, Any], steps: int, warmup: int, device: str) -> Dict[str, Any]:
    """The GPU part of one planned row; a failure (out of memory, say) is kept as the row's error."""
    try:
        return gpu_steps(cfg, r["ac"], r["batch"], r["seq"], steps, warmup, device)
    except Exception as e:
        return {"error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"}


def measure_rows(plans: str, rows: List[Dict[str, Any]], args) -> None:
    """Each row in a process of its own, in place: FSDP's state outlives the module in one process (on the first
    H200 run the next row started with the last one's 7.2 GiB of parameters still allocated), and an
    out-of-memory row must not lose the others."""
    for i, r in enumerate(rows):
        t0 = time.perf_counter()
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            argv = [sys.executable, os.path.abspath(__file__), "--measure", plans, "--row", str(i), "--steps",
                    str(args.steps), "--warmup", str(args.warmup), "--json", out.name]
            if args.measure_on_cpu:
                argv.append("--measure-on-cpu")
            p = subprocess.run(argv)
            try:
                with open(out.name) as f:
                    r["measured"] = json.load(f)
            except (OSError, ValueError):
                r["measured"] = {"error": f"the row's process exited {p.returncode} without figures"}
        r["measured"]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"measured b{r['batch']} s{r['seq']} AC {'on' if r['ac'] else 'off'} in "
              f"{r['measured']['seconds']} s: {r['measured'].get('error') or gib(r['measured'].get('peak_bytes'))}, "
              f"step {sec(r['measured'].get('step_s'))}",
              flush=True)


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


def export_path(workdir: str, layers: int, batch: int, seq: int) -> str:
    """Where --plan-only keeps a row's export, and where --replan finds it."""
    return os.path.join(workdir, f"llama3_8b_shape_{layers}l_b{batch}s{seq}.pt2")


def write_json(path: Optional[str], doc: Dict[str, Any]) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)


def parse_shapes(text: str) -> List[Tuple[int, int]]:
    out = []
    for part in text.split(","):
        b, _, q = part.strip().partition("x")
        if not (b.isdigit() and q.isdigit()):
            raise SystemExit(f"--shapes: {part!r} is not BATCHxSEQ (e.g. 1x4096)")
        out.append((int(b), int(q)))
    return out


def print_table(doc: Dict[str, Any]) -> None:
    rows = doc["rows"]
    print()
    print(f"GPU: {doc.get('gpu') or 'none'}; torch {doc.get('torch_measured') or '-'} (measured), "
          f"{doc.get('torch_planned')} (exported); plan --hardware {doc['hardware']}; FSDP2, world size 1, "
          f"fp32 parameters with MixedPrecisionPolicy bf16 / fp32 reduce, AdamW; the plan's figures are an ESTIMATE")
    print(f"{'shape':>9} {'AC':3} {'plan peak':>11} {'measured':>11} {'ratio':>6}  {'plan fwd+':>10} {'measured':>10}"
          f"  {'plan step':>10} {'measured':>10} {'ratio':>6}")
    for r in rows:
        p, m = r["plan"], r.get("measured") or {}
        pts = m.get("points") or {}
        fwd = pts["after_forward"] - pts["before_forward"] if pts else None
        shape = f"{r['batch']}x{r['seq']}"
        if m.get("error"):
            print(f"{shape:>9} {'on' if r['ac'] else 'off':3} {gib(p['peak_bytes']):>11}  measured: {m['error']}")
            continue
        print(f"{shape:>9} {'on' if r['ac'] else 'off':3} {gib(p['peak_bytes']):>11} {gib(m.get('peak_bytes')):>11} "
              f"{ratio(p['peak_bytes'], m.get('peak_bytes')):>6}  {gib(p.get('forward_added_bytes')):>10} {gib(fwd):>10}"
              f"  {sec(p['step_s']):>10} {sec(m.get('step_s')):>10} {ratio(p['step_s'], m.get('step_s')):>6}")
    print(f"\n{'shape':>9} {'AC':3}  peak in: {'forward':>21}  {'backward':>21}  {'optimizer step':>21}   (plan / measured)")
    for r in rows:
        p, m = r["plan"], r.get("measured") or {}
        if m.get("error") or not m.get("phase_peaks"):
            continue
        cells = [f"{gib(p['phase_peaks'].get(k)):>10} {gib(m['phase_peaks'].get(k)):>10}"
                 for k in ("forward", "backward", "optimizer")]
        print(f"{r['batch']}x{r['seq']:<5} {'on' if r['ac'] else 'off':3}           " + "  ".join(cells))
    print(f"\n{'shape':>9} {'AC':3} {'plan fwd':>9} {'measured':>9}  {'plan bwd':>9} {'measured':>9}  {'plan opt':>9} "
          f"{'measured':>9}   (plan: compute at the preset's efficiency; backward includes the AC recompute)")
    for r in rows:
        p, m = r["plan"], r.get("measured") or {}
        if m.get("error") or p.get("forward_end_s") is None:
            continue
        bwd = p["compute_s"] - p["forward_end_s"] if p.get("compute_s") is not None else None
        print(f"{r['batch']}x{r['seq']:<5} {'on' if r['ac'] else 'off':3} {sec(p['forward_end_s']):>9} "
              f"{sec(m.get('forward_s')):>9}  {sec(bwd):>9} {sec(m.get('backward_s')):>9}  {sec(p.get('optimizer_s')):>9} "
              f"{sec(m.get('optimizer_s')):>9}")
    print("fwd+: what the forward leaves allocated on top of the memory it starts from (the plan: the activations "
          "held after the forward and the root's gathered bf16 parameters; measured: memory_allocated() after "
          "model(...).loss less before it)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "app", "fsdp-plan"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--shapes", default="1x4096", help="batch x sequence pairs, comma-separated (1x4096,1x8192)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--hardware", help="the plan's --hardware (default: from the GPU's name, else h100)")
    ap.add_argument("--dry-run", action="store_true", help="export and plan only; no GPU part")
    ap.add_argument("--plan-only", action="store_true", help="export and plan only, for --measure elsewhere")
    ap.add_argument("--measure", metavar="PLANS.json", help="measure the plans a --plan-only run wrote")
    ap.add_argument("--replan", metavar="MEASURED.json",
                    help="plan a --measure result's rows again (exports kept in --workdir) and print the table "
                         "against its stored measurements: the plan's changes checked without the GPU")
    ap.add_argument("--row", type=int, help=argparse.SUPPRESS)  # --measure's child: this row only
    ap.add_argument("--measure-on-cpu", action="store_true",
                    help="--measure's steps on the CPU (gloo; no memory figures): the ctest of that path")
    ap.add_argument("--tiny", action="store_true", help="a small Llama config (the ctest), not 8B-shaped")
    ap.add_argument("--json", help="write every figure here (sorted keys)")
    ap.add_argument("--workdir", help="keep the export and policies here (default: a temporary directory)")
    args = ap.parse_args()

    import torch
    started = time.perf_counter()
    if args.measure:
        with open(args.measure) as f:
            doc = json.load(f)
        device = "cpu" if args.measure_on_cpu else "cuda"
        if device == "cuda" and not torch.cuda.is_available():
            raise SystemExit("--measure needs a CUDA device (torch.cuda.is_available() is False)")
        doc["gpu"] = torch.cuda.get_device_name(0) if device == "cuda" else "none (--measure-on-cpu)"
        doc["torch_measured"] = torch.__version__
        with contextlib.suppress(Exception):
            import transformers
            doc["transformers_measured"] = transformers.__version__
        args.tiny = doc["tiny"]
        args.layers = doc["layers"]
        if args.row is not None:  # one row, in this process (measure_rows' child)
            m = measure_row(llama_config(args), doc["rows"][args.row], args.steps, args.warmup, device)
            with contextlib.suppress(Exception):
                import torch.distributed as dist
                if dist.is_initialized():
                    dist.destroy_process_group()
            with open(args.json, "w") as f:
                json.dump(m, f)
            return 0
        measure_rows(args.measure, doc["rows"], args)
        doc["ran_on_gpu"] = device == "cuda"
        print_table(doc)
        print(f"total {time.perf_counter() - started:.1f} s")
        write_json(args.json, doc)
        return 0

    if args.replan:
        if not args.workdir:
            raise SystemExit("--replan needs the --workdir that holds the rows' exports")
        with open(args.replan) as f:
            doc = json.load(f)
        for r in doc["rows"]:
            pt2 = export_path(args.workdir, doc["layers"], r["batch"], r["seq"])
            r["plan"] = plan(args.binary, pt2, r["ac"], doc["hardware"], args.workdir)
        print_table(doc)
        write_json(args.json, doc)
        return 0

    cuda = torch.cuda.is_available() and not (args.dry_run or args.plan_only)
    gpu_name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    hardware = args.hardware or (preset_for(gpu_name) if gpu_name else None) or "h100"
    workdir = args.workdir or tempfile.mkdtemp(prefix="gpu_check-")
    os.makedirs(workdir, exist_ok=True)
    try:
        cfg = llama_config(args)
        rows = []
        for batch, seq in parse_shapes(args.shapes):
            pt2 = export_path(workdir, args.layers, batch, seq)
            if os.path.exists(pt2) and args.workdir:  # a kept --workdir: the export is made once
                print(f"reusing {pt2}")
            else:
                secs = export(cfg, batch, seq, pt2)
                print(f"exported {pt2} ({os.path.getsize(pt2) / 1e6:.1f} MB) in {secs:.1f} s; "
                      f"{'tiny' if args.tiny else 'Llama-3-8B-shaped'}, {args.layers} layers, batch {batch} x seq {seq}")
            for ac in (False, True):
                p = plan(args.binary, pt2, ac, hardware, workdir)
                rows.append({"ac": ac, "batch": batch, "seq": seq, "plan": p, "measured": None})
                print(f"planned AC {'on' if ac else 'off'}: peak {gib(p['peak_bytes'])}, step {sec(p['step_s'])} "
                      f"(FLOPs from {p['flops_from']})", flush=True)
        doc = {"gpu": gpu_name, "hardware": hardware, "ran_on_gpu": cuda, "layers": args.layers,
               "tiny": args.tiny, "torch_planned": torch.__version__, "rows": rows}
        if cuda:  # measured as --measure does, each row in its own process
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(doc, f)
            try:
                args.measure_on_cpu = False
                measure_rows(f.name, rows, args)
            finally:
                os.unlink(f.name)
        print_table(doc)
        if not cuda:
            why = ("--plan-only" if args.plan_only else "--dry-run" if args.dry_run
                   else "no CUDA device (torch.cuda.is_available() is False)")
            print(f"\nthe GPU part did not run: {why}; the measured columns are empty")
        print(f"total {time.perf_counter() - started:.1f} s")
        # FLOPs were given, so each plan must have a step time and a peak (the ctest relies on it).
        missing = [f"{r['batch']}x{r['seq']} AC {'on' if r['ac'] else 'off'}" for r in rows
                   if r["plan"]["step_s"] is None or not r["plan"]["peak_bytes"]]
        if missing:
            print(f"error: the plan of {', '.join(missing)} has no step time or peak", file=sys.stderr)
            return 1
        write_json(args.json, doc)
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
