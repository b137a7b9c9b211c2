#!/usr/bin/env python3
"""How fast `fsdp-plan suggest` evaluates its candidates, on two big models:

- Llama-3-70B dimensions (transformers' LlamaForCausalLM on the meta device),
- a mixture-of-experts model of about 50,000 modules (48 layers of 256 experts,
  plain PyTorch on the meta device),

both traced and saved structure-only by the venv's torch (no weight is ever
allocated). For each, it runs `fsdp-plan suggest` at two budgets (8 x 80 GiB
and 64 x 24 GiB), FSDP1 and FSDP2 (--fsdp-versions), and prints the
candidates, the time `suggest` itself reports (-v), the whole run's wall time
(median of --reps), candidates per second, and the target (all candidates in
under 2 s) side by side with the figure, with the machine's load average.

Usage: $FSDP_PLAN_VENV/bin/python bench/suggest_bench.py [FSDP_PLAN_BINARY] [--keep DIR] [--reps N]
       [--fsdp-versions 1,2]
The model files are kept in DIR (default build/bench) and reused.
"""
import argparse
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "corpus"))


def moe_model(layers=48, experts=256, hidden=2048, ffn=1408):
    import torch
    import torch.nn as nn

    class Expert(nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = nn.Linear(hidden, ffn, bias=False)
            self.w2 = nn.Linear(ffn, hidden, bias=False)
            self.w3 = nn.Linear(hidden, ffn, bias=False)

        def forward(self, x):
            return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))

    class MoE(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(hidden, experts, bias=False)
            self.experts = nn.ModuleList(Expert() for _ in range(experts))

        def forward(self, x):
            w = self.gate(x).softmax(-1)
            out = x
            for i, e in enumerate(self.experts):  # dense routing: every expert is called, so traced
                out = out + w[..., i:i + 1] * e(x)
            return out

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1 = nn.LayerNorm(hidden)
            self.attn = nn.MultiheadAttention(hidden, 16, batch_first=True)
            self.norm2 = nn.LayerNorm(hidden)
            self.moe = MoE()

        def forward(self, x):
            h = self.norm1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            return x + self.moe(self.norm2(x))

    class MoEModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(32000, hidden)
            self.layers = nn.ModuleList(Layer() for _ in range(layers))
            self.norm = nn.LayerNorm(hidden)
            self.head = nn.Linear(hidden, 32000, bias=False)

        def forward(self, ids):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            return self.head(self.norm(x))

    with torch.device("meta"):
        m = MoEModel().eval()
    return m, (torch.zeros(1, 2, dtype=torch.long, device="meta"),)


def make(path, build):
    import torch
    if os.path.exists(path):
        return
    t0 = time.time()
    model, inputs = build()
    with torch.no_grad():
        traced = torch.jit.trace(model, inputs, strict=False, check_trace=False)
    torch.jit.save(traced, path + ".tmp")
    os.replace(path + ".tmp", path)
    n = sum(1 for _ in model.modules())
    print(f"made {os.path.basename(path)}: {n} modules, {os.path.getsize(path) / 1e6:.1f} MB, "
          f"{time.time() - t0:.0f} s", file=sys.stderr)


def llama70b():
    import corpus
    model = corpus.build("llama3_70b", device="meta")
    return model, corpus.example_inputs("llama3_70b", model)


def run_suggest(binary, model, world, budget, version):
    t0 = time.perf_counter()
    r = subprocess.run([binary, "suggest", model, "--world-size", str(world), "--budget", budget,
                        "--fsdp-version", str(version), "-v"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if r.returncode not in (0, 1):
        raise SystemExit(f"suggest failed: {r.stderr}")
    m = re.search(r"suggest: (\d+) candidates on (\d+) modules evaluated in (\d+) ms", r.stderr)
    cands, modules, ms = int(m.group(1)), int(m.group(2)), int(m.group(3))
    best = re.search(r"^best +(.*)$", r.stdout, re.M)
    return cands, modules, ms, wall, best.group(1) if best else "nothing fits"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary", nargs="?", default=os.path.join(ROOT, "build", "app", "fsdp-plan"))
    ap.add_argument("--keep", default=os.path.join(ROOT, "build", "bench"))
    ap.add_argument("--reps", type=int, default=3, help="runs per case (default %(default)s); the median is shown")
    ap.add_argument("--fsdp-versions", default="1,2", help="FSDP versions to run (default %(default)s)")
    args = ap.parse_args()
    os.makedirs(args.keep, exist_ok=True)
    models = {"llama3_70b": llama70b, "moe_50k": moe_model}
    for name, build in models.items():
        make(os.path.join(args.keep, name + ".pt"), build)
    load_start = os.getloadavg()[0]
    versions = [int(v) for v in args.fsdp_versions.split(",")]
    print(f"{'model':<12} {'FSDP':>4} {'modules':>8} {'ranks x budget':>16} {'candidates':>10} {'suggest':>9} "
          f"{'whole run':>10} {'candidates/s':>13}  best")
    results = []
    for name in models:
        path = os.path.join(args.keep, name + ".pt")
        for version in versions:
            for world, budget in ((8, "80GiB"), (64, "24GiB")):
                runs = [run_suggest(args.binary, path, world, budget, version) for _ in range(args.reps)]
                runs.sort(key=lambda r: r[3])
                cands, modules, ms, wall, best = runs[len(runs) // 2]  # the median whole run
                results.append((f"{name} v{version}", world, budget, wall, min(r[3] for r in runs),
                                max(r[3] for r in runs)))
                print(f"{name:<12} {version:>4} {modules:>8} {f'{world} x {budget}':>16} {cands:>10} "
                      f"{ms / 1000:>8.2f}s {wall:>9.2f}s {cands / max(ms / 1000, 1e-3):>13.0f}  {best}")
    print(f"\ntarget: all candidates evaluated in under 2 s (whole run, median of {args.reps}; min-max)")
    for name, world, budget, wall, lo, hi in results:
        verdict = "PASS" if wall < 2 else "MISS"
        print(f"  {verdict}  {name:<15} {f'{world} x {budget}':>14}  {wall:6.2f} s  ({lo:.2f}-{hi:.2f})  "
              f"target 2.00 s, {wall / 2:.2f}x of it")
    print(f"load average (1 min) at start {load_start:.2f}, at end {os.getloadavg()[0]:.2f}; "
          f"nproc {os.cpu_count()}")


if __name__ == "__main__":
    main()
