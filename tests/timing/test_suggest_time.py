#!/usr/bin/env python3
"""`fsdp-plan suggest` ranks by the step-time estimate (issue 27, "Verified").

On the corpus decoders (Llama, Mistral, Mixtral, Qwen2-MoE, GPT-2; tests/corpus) and the
Llama-3-8B dimensions on the meta device, at 8 x 80 GiB and 64 x 24 GiB, FSDP1 and FSDP2, the best
fitting policy must wrap every decoder layer (the model's `_no_split_modules` class, what
Accelerate's TRANSFORMER_BASED_WRAP and torchtitan wrap) in a unit of its own, with no unit inside
a layer, and never be the root unit alone. Before issue 27 suggest ranked "fewer units" first and
answered "no auto-wrap (the root unit only)" on the Llama-3-8B shape: that case fails on such a
binary. Each report must also carry the estimate (`time.estimate`, exposed communication per
candidate) and a `why` line.

    python tests/timing/test_suggest_time.py FSDP_PLAN [--models DIR] [--big] [-k SUBSTRING]

The models are traced once into DIR (default: a temporary directory); --big adds Llama-3-70B.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "corpus"))
import corpus  # noqa: E402

MODELS = ["llama", "mistral", "mixtral", "qwen2_moe", "gpt2", "llama3_8b"]
SETUPS = [(8, "80GiB"), (64, "24GiB")]


def model_file(name: str, out_dir: str) -> Tuple[str, str]:
    """The corpus model saved as TorchScript, and its decoder layer class (`_no_split_modules`)."""
    path = os.path.join(out_dir, name + ".pt")
    meta = path + ".json"
    if os.path.exists(path) and os.path.exists(meta):
        with open(meta) as f:
            return path, json.load(f)["layer_class"]
    model = corpus.build(name)
    layer = corpus.no_split_modules(model)
    if len(layer) != 1:
        raise RuntimeError(f"{name}: _no_split_modules is {layer}, expected one class")
    corpus.save(model, name, path)
    with open(meta, "w") as f:
        json.dump({"layer_class": layer[0]}, f)
    return path, layer[0]


def run(args: List[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True)


def check(binary: str, model: str, layer: str, world: int, budget: str, version: int, tmp: str) -> List[str]:
    best_file = os.path.join(tmp, "best.json")
    if os.path.exists(best_file):
        os.remove(best_file)
    base = [binary, "suggest", model, "--budget", budget, "--world-size", str(world), "--fsdp-version", str(version)]
    r = run(base + ["-f", "json", "-o", best_file])
    if r.returncode != 0:
        return [f"suggest exit {r.returncode}: {r.stderr.strip()[:300]}"]
    doc = json.loads(r.stdout)
    fails = []
    best = doc["best"]
    if best["label"] == "no auto-wrap (the root unit only)":
        fails.append("best is the root unit alone")
    top = doc["candidates"][0]
    if not (top.get("time") or {}).get("estimate"):
        fails.append("the best candidate has no time estimate")
    # The best policy's plan: every decoder layer a unit, no unit inside a layer.
    p = run([binary, model, "-p", best_file, "-f", "json"])
    if p.returncode not in (0, 1):
        return fails + [f"plan of the best policy: exit {p.returncode}: {p.stderr.strip()[:300]}"]
    plan = json.loads(p.stdout)
    units = [u["path"] for u in plan["units"]]
    layers = [m["path"] for m in plan.get("modules", [])] if plan.get("modules") else None
    unit_classes: Dict[str, str] = {u["path"]: u.get("class", "") for u in plan["units"]}
    layer_units = [u for u, c in unit_classes.items() if c.split(".")[-1] == layer]
    if not layer_units:
        fails.append(f"best {best['label']!r}: no {layer} is a unit (units {units[:6]}...)")
    inside = [u for u in units if any(u.startswith(lu + ".") for lu in layer_units)]
    if inside:
        fails.append(f"best {best['label']!r}: units inside a decoder layer: {inside[:4]}")
    del layers
    if plan.get("time", {}).get("estimate") is not True:
        fails.append("the plan's time section is not marked an estimate")
    t = run(base)
    if "why     " not in t.stdout or "ESTIMATE" not in t.stdout:
        fails.append("the text report has no why / estimate line")
    return fails


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--models", help="where the traced models are kept (default: a temporary directory)")
    ap.add_argument("--big", action="store_true", help="add Llama-3-70B (meta device)")
    ap.add_argument("-k", action="append", default=[], help="only models whose name contains this")
    args = ap.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="suggest_time_")
    models_dir = args.models or tmp
    os.makedirs(models_dir, exist_ok=True)
    names = MODELS + (["llama3_70b"] if args.big else [])
    if args.k:
        names = [n for n in names if any(k in n for k in args.k)]
    failed = passed = 0
    for name in names:
        path, layer = model_file(name, models_dir)
        for world, budget in SETUPS:
            for version in (1, 2):
                fails = check(args.binary, path, layer, world, budget, version, tmp)
                print(f"{'FAIL' if fails else 'ok  '} {name} {world} x {budget} FSDP{version}", flush=True)
                for f in fails:
                    print("     " + f)
                failed += bool(fails)
                passed += not fails
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
