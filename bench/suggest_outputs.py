#!/usr/bin/env python3
"""Snapshot everything `fsdp-plan suggest` writes on the bench models, to compare two binaries:

    suggest_outputs.py BINARY OUTDIR [--models DIR]   (DIR: suggest_bench.py's --keep, default build/bench)
    diff -r OUTDIR_A OUTDIR_B

For llama3_70b and moe_50k, FSDP1 and FSDP2, the bench's 8 x 80GiB and 64 x 24GiB (where nothing fits)
and 64 x 80GiB (where policies fit, so -o and --emit write): the text report, --format json, the -o policy
file, and --emit torch / accelerate, each with its stderr and exit code.
"""
import argparse
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, out, name):
    r = subprocess.run(cmd, capture_output=True, text=True)
    for ext, text in (("out", r.stdout), ("err", r.stderr), ("rc", f"{r.returncode}\n")):
        with open(os.path.join(out, f"{name}.{ext}"), "w") as f:
            f.write(text)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("outdir")
    ap.add_argument("--models", default=os.path.join(ROOT, "build", "bench"))
    args = ap.parse_args()
    os.makedirs(args.outdir, exist_ok=True)
    for model in ("llama3_70b", "moe_50k"):
        path = os.path.join(args.models, model + ".pt")
        for version in (1, 2):
            for world, budget in ((8, "80GiB"), (64, "24GiB"), (64, "80GiB")):
                base = [args.binary, "suggest", path, "--world-size", str(world), "--budget", budget,
                        "--fsdp-version", str(version)]
                tag = f"{model}_v{version}_{world}x{budget}"
                policy = os.path.join(args.outdir, tag + ".policy.json")
                run(base + ["-o", policy], args.outdir, tag + ".text")
                run(base + ["--format", "json"], args.outdir, tag + ".json")
                for emit in ("torch", "accelerate"):
                    run(base + ["--emit", emit], args.outdir, f"{tag}.emit_{emit}")
                print(tag, flush=True)


if __name__ == "__main__":
    main()
