#!/usr/bin/env python3
"""fsdp-plan's activations (the C++ walk, lib/activations/) against PyTorch's own figures.

Two checks, each on the corpus exports of the `act_exports` fixture (make_exports.py):

--saved: per export and CPU SDPA path (default: the CPU flash kernel; math), the plan's
  `memory.activations` (`fsdp-plan FILE --device cpu --sdpa ... -f json`) against what autograd saves
  in the eager model (refs/saved_eager.json, saved_oracle.py): total, parameters and user inputs saved,
  and every module's subtree total, within TOLERANCE_SAVED (issue 30: 2%). The `*_plain` exports (HF's
  export-time mask and repeat_kv, GRAPH.md item 8) and the meta-device full-size ones are skipped;
  a dynamic export is planned at its traced hint and compared with the static export of that shape.
--peak: the plan's `memory.per_rank.peak_bytes` (`--device cpu`, the policy the tracker ran: the
  decoder layers as units, world size, bf16 mixed precision with fp32 reduce or none, AdamW, AC on the
  layers or not) against the tracker's peak (peak_oracle.py: real FSDP1 / FSDP2 under the fake
  backend, MemTracker / FSDPMemTracker, second step):
  - issue 30's headline, Llama-3-8B dimensions, FSDP2, 8 ranks, bf16, b1 s4096, on the fp32 plain
    meta exports (the tracker ran HF's tracing attention): 4 layers (refs/headline_8b_4layers.json,
    always) and 32 layers with and without AC (refs/headline_8b_{noac,ac}.json, when make_exports.py
    --full made llama3_8b_b1s4096_fp32_plain.pt2): within TOLERANCE_PEAK (issue 30: 5%);
  - the corpus cases of refs/peak_small.json (tiny models, world 1 and 8, FSDP1 and FSDP2, fp32 and
    bf16, AC on and off) on the fp32 exports: each within TOLERANCE_SMALL (issue 30: 5%), and per FSDP
    version the median within MEDIAN_SMALL (README.md, "The small-model peak"). peak_probe.py KEY
    shows one case in detail.

    python tests/activations/test_plan_activations.py BINARY EXPORTS_DIR [--saved] [--peak]
        [-k SUBSTRING] [--summary FILE] [--jobs N]

Without --saved or --peak both run. Exits 1 on any failure.
"""
import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
TOLERANCE_SAVED = 0.02
TOLERANCE_PEAK = 0.05
TOLERANCE_SMALL = 0.05  # per case (measured: max 2.5% FSDP1, 2.6% FSDP2; README "The small-model peak")
# The foreach cases (refs/peak_foreach.json): the step's temporaries are the whole sharded model, so
# the for-loop's model is 2-3% off at world size 1 (measured: all 24 within 0.23%; the for-loop model at world 1, e.g. llama FSDP2, is -2.2%).
TOLERANCE_FOREACH = 0.01
MEDIAN_SMALL = 0.02     # per FSDP version (measured: 0.0% FSDP1, 0.1% FSDP2)
HEADLINES = [("headline_8b_4layers.json", "llama3_8b_4l_b1s4096_fp32_plain.pt2", True),
             ("headline_8b_noac.json", "llama3_8b_b1s4096_fp32_plain.pt2", False),
             ("headline_8b_ac.json", "llama3_8b_b1s4096_fp32_plain.pt2", False)]


def plan_json(binary: str, pt2: str, extra: List[str]) -> Dict[str, Any]:
    cmd = [binary, pt2, "-f", "json", "--device", "cpu", "-q"] + extra
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode not in (0, 1):  # 1: the plan has error findings; it is still printed
        raise RuntimeError(f"{' '.join(cmd)}: exit {res.returncode}: {res.stderr.strip()[:400]}")
    return json.loads(res.stdout)


def rel(a: int, b: int) -> float:
    return (a - b) / b if b else (0.0 if a == 0 else 1.0)


def eager_key(entry: Dict[str, Any], sdpa: str) -> str:
    shape = f"b{entry['batch']}" + ("" if entry["seq"] is None else f"s{entry['seq']}")
    dt = "bf16" if entry["dtype"] == "bfloat16" else "fp32"
    return f"{entry['model']}_{shape}/{dt}{'_math' if sdpa == 'math' else ''}"


def check_saved(binary: str, exports: str, manifest: List[Dict[str, Any]], eager: Dict[str, Any],
                k: Optional[str], jobs: int, summary: Dict[str, Any]) -> List[str]:
    work: List[Tuple[str, Dict[str, Any], str, str]] = []
    for e in manifest:
        if e.get("plain") or e.get("meta"):
            continue
        for sdpa in ("default", "math"):
            key = f"{e['file'][:-4]}/{sdpa}"
            ekey = eager_key(e, sdpa)
            if (k and k not in key) or ekey not in eager:
                continue
            work.append((key, e, sdpa, ekey))

    # The retype estimate (walk.cpp: retype): an fp32 export planned with bf16 mixed precision
    # against what autograd saves in the bf16 model, which runs as FSDP's mixed precision does.
    tmp = tempfile.mkdtemp(prefix="plan_saved_")
    mp_policy = os.path.join(tmp, "bf16.json")
    with open(mp_policy, "w") as f:
        json.dump({"fsdp": {"version": 2}, "mixed_precision": {"param_dtype": "bfloat16"}}, f)
    for e in manifest:
        if e.get("plain") or e.get("meta") or e["dtype"] != "float32" or e.get("dynamic"):
            continue
        for sdpa in ("default", "math"):
            key = f"{e['file'][:-4]}/{sdpa}/retype_bf16"
            ekey = eager_key(dict(e, dtype="bfloat16"), sdpa)
            if (k and k not in key) or ekey not in eager:
                continue
            work.append((key, e, sdpa, ekey))

    def one(item):
        key, e, sdpa, ekey = item
        extra = ["--policy", mp_policy] if key.endswith("/retype_bf16") else ["--fsdp-version", "2"]
        return item, plan_json(binary, os.path.join(exports, e["file"]), ["--sdpa", sdpa] + extra)

    failures: List[str] = []
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for (key, e, sdpa, ekey), plan in pool.map(one, work):
            acts = plan["memory"]["activations"]
            ref = eager[ekey]
            fails, worst = [], 0.0
            if acts.get("source") != "graph":
                failures.append(f"{key}: activations source {acts.get('source')!r}, not 'graph'")
                continue
            retype = key.endswith("/retype_bf16")
            # Under mixed precision FSDP casts a floating batch (ViT's pixel_values) to bf16: a copy
            # made in the forward, so an activation where the bf16 model saves its own input.
            cast = ref["input_saved_bytes"] - acts["input_saved_bytes"] if retype else 0
            want_saved = ref["total_bytes"] + cast
            for ours, want in (("saved_bytes", want_saved), ("param_saved_bytes", ref["param_saved_bytes"]),
                               ("input_saved_bytes", ref["input_saved_bytes"] - cast)):
                r = rel(acts[ours], want)
                if ours == "saved_bytes":
                    worst = max(worst, abs(r))
                if abs(r) > TOLERANCE_SAVED:
                    fails.append(f"{ours}: plan {acts[ours]}, autograd {want} ({r:+.2%})")
            got = {m["path"]: m["total_bytes"] for m in acts["modules"]}
            # (With a cast batch the module that saves it differs by its bytes: the totals above hold it.)
            for path in sorted(set(got) | set(ref["modules"])) if not cast else []:
                a, b = got.get(path, 0), ref["modules"].get(path, {}).get("total_bytes", 0)
                r = rel(a, b)
                worst = max(worst, abs(r))
                if abs(r) > TOLERANCE_SAVED:
                    fails.append(f"module {path!r}: plan {a}, autograd {b} ({r:+.2%})")
            if acts.get("missing_ops"):
                fails.append(f"operators without a row: {acts['missing_ops']}")
            summary[key] = {"plan_saved_bytes": acts["saved_bytes"], "eager_key": ekey,
                            "eager_bytes": want_saved, "worst_module": worst,
                            "modules": len(ref["modules"])}
            print(f"{key:34s} plan {acts['saved_bytes']:>9d}  autograd {want_saved:>9d}  "
                  f"({rel(acts['saved_bytes'], want_saved):+.3%}; worst of {len(ref['modules'])} modules "
                  f"{worst:.3%})")
            failures += [f"{key} vs {ekey}: {m}" for m in fails]
    return failures


def policy_for(case: Dict[str, Any]) -> Dict[str, Any]:
    """The policy peak_oracle.py ran: the decoder layers as units (FSDP1 ModuleWrapPolicy; FSDP2
    fully_shard per layer, then the root), AdamW, the world size, bf16 mixed precision with fp32
    reduce, AC on the layers; LoRA under FSDP1 with use_orig_params."""
    pol: Dict[str, Any] = {"module_classes": case["layer_classes"],
                           "fsdp": {"version": case["fsdp"], "world_size": case["world"], "optimizer": "adamw"}}
    if case["model"] == "llama_lora" and case["fsdp"] == 1:
        pol["fsdp"]["use_orig_params"] = True
    if case["dtype"] == "bfloat16":
        pol["mixed_precision"] = {"param_dtype": "bfloat16", "reduce_dtype": "float32"}
    if case["ac"]:
        pol["activation_checkpointing"] = {"module_classes": case["layer_classes"]}
    if case.get("optimizer_impl"):
        pol["fsdp"]["optimizer_impl"] = case["optimizer_impl"]
    return pol


def check_peak(binary: str, exports: str, manifest: List[Dict[str, Any]], paths: List[str], k: Optional[str],
               jobs: int, summary: Dict[str, Any]) -> List[str]:
    cases: Dict[str, Any] = {}
    for path in paths:
        with open(path) as f:
            cases.update(json.load(f)["cases"])
    by_stem = {e["file"][:-4]: e for e in manifest}
    work = []
    failures: List[str] = []
    for ref, file, required in HEADLINES:
        with open(os.path.join(HERE, "refs", ref)) as f:
            for key, c in json.load(f)["cases"].items():
                if k and k not in key:
                    continue
                if not os.path.exists(os.path.join(exports, file)):
                    if required:
                        failures.append(f"{key}: no {file} in {exports} (make_exports.py makes it)")
                    else:
                        print(f"{key:44s} skipped: no {file} (make_exports.py --full)")
                    continue
                work.append((key, dict(c, headline=True), {"file": file}))
    for key, c in sorted(cases.items()):
        if (k and k not in key) or "error" in c:
            continue
        stem = key.split("/")[0]
        if stem not in by_stem:
            continue
        work.append((key, c, by_stem[stem]))
    tmp = tempfile.mkdtemp(prefix="plan_act_")

    def one(item):
        key, c, e = item
        pol = os.path.join(tmp, key.replace("/", "_") + ".json")
        with open(pol, "w") as f:
            json.dump(policy_for(c), f)
        return item, plan_json(binary, os.path.join(exports, e["file"]), ["--policy", pol])

    small: List[Tuple[str, float]] = []
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for (key, c, e), plan in pool.map(one, work):
            pr = plan["memory"]["per_rank"]
            got, want = pr["peak_bytes"], c["peak_bytes"]
            r = rel(got, want)
            tol = TOLERANCE_PEAK if c.get("headline") else TOLERANCE_FOREACH if key.endswith("/foreach") \
                else TOLERANCE_SMALL
            summary[key] = {"plan_peak_bytes": got, "tracker_peak_bytes": want, "rel": r, "tolerance": tol,
                            "plan_activation_bytes": pr.get("activation_bytes"),
                            "plan_peak_phase": plan["memory"].get("peak", {}).get("phase"),
                            "tracker_peak": c["peak"]}
            if not c.get("headline"):
                small.append((key, r))
            print(f"{key:44s} plan {got:>12d}  tracker {want:>12d}  ({r:+.2%}; bound {tol:.0%})")
            if abs(r) > tol:
                failures.append(f"{key}: plan peak {got}, tracker {want} ({r:+.2%}, bound {tol:.0%})")
    for version in (1, 2):
        a = sorted(abs(x) for key, x in small if f"/fsdp{version}/" in key)
        if not a:
            continue
        med = a[len(a) // 2]
        print(f"corpus cases FSDP{version}: {len(a)}, |plan - tracker| / tracker median {med:.1%}, "
              f"within 2%: {sum(x <= 0.02 for x in a)}, within 5%: {sum(x <= 0.05 for x in a)}, max {a[-1]:.1%}")
        # The whole distribution is gated, not only each case: a regression that
        # moves many cases a little fails here (ctest runs every case; -k does not gate).
        if not k and med > MEDIAN_SMALL:
            failures.append(f"FSDP{version} corpus cases: median error {med:.1%} above {MEDIAN_SMALL:.0%}")
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("exports_dir")
    ap.add_argument("--saved", action="store_true")
    ap.add_argument("--peak", action="store_true")
    ap.add_argument("--eager", default=os.path.join(HERE, "refs", "saved_eager.json"))
    # peak_foreach.json: the same cases with AdamW(foreach=True), PyTorch's default on CUDA.
    ap.add_argument("--peak-ref", nargs="+", default=[os.path.join(HERE, "refs", "peak_small.json"),
                                                      os.path.join(HERE, "refs", "peak_foreach.json")])
    ap.add_argument("-k")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--summary", help="write the per-case comparison as JSON here")
    args = ap.parse_args()
    both = not args.saved and not args.peak
    with open(os.path.join(args.exports_dir, "manifest.json")) as f:
        manifest = [e for e in json.load(f)["exports"] if "error" not in e]
    failures: List[str] = []
    summary: Dict[str, Any] = {}
    if args.saved or both:
        with open(args.eager) as f:
            eager = json.load(f)["cases"]
        failures += check_saved(args.binary, args.exports_dir, manifest, eager, args.k, args.jobs, summary)
    if args.peak or both:
        failures += check_peak(args.binary, args.exports_dir, manifest, args.peak_ref, args.k, args.jobs, summary)
    for f_ in failures:
        print("FAIL " + f_)
    print(f"{len(summary)} cases, {len(failures)} failures")
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1, sort_keys=True)
            f.write("\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
