"""`fsdp-plan suggest` against real FSDP on torch 2.13: the policy it picks fits, and PyTorch agrees.

For a few corpus models (tests/corpus, ctest fixture 'corpus') and both FSDP versions:

1. `fsdp-plan suggest MODEL --world-size W [--fsdp-version 2] -f json` once with an unbounded
   budget lists every candidate's per-rank peak; the budget is then set between the lowest and
   the highest of them, so that some candidates fit and some do not;
2. `suggest ... --budget B -o best.json`: it must exit 0, its best must fit B, be the ranked
   candidate with the fewest units among those that fit, and planning best.json on its own
   (`fsdp-plan MODEL --policy best.json`) must give the same units and peak, under B;
3. the suggested policy is applied with real FSDP in this process (fake backend, rank 0 of W):
   - FSDP2: the plan's fully_shard calls, then two AdamW steps under FSDPMemTracker, by
     test_fsdp2.check_against_torch: each group's parameters and shard shapes, sharded
     params/grads/optimizer state/buffers exactly, and the peak of the non-activation
     categories within test_fsdp2.TOLERANCE (20%). The best need not use `groups`, so the
     highest-ranked candidate that does (embeddings/head in fully_shard([...]) calls, some
     with reshard_after_forward False) is checked the same way;
   - FSDP1: FSDPMemTracker does not work with FSDP1 (torch 2.13 raises "FSDPMemTracker only
     supports FSDP modules": it needs fully_shard's FSDPModule). So FSDP1 is checked with what
     does: FullyShardedDataParallel with the matching auto_wrap_policy (test_torch2.fsdp_kwargs)
     builds the plan's units, each with the plan's flat and sharded sizes (test_torch2's
     comparison); and the generic torch.distributed._tools.mem_tracker.MemTracker follows two
     AdamW steps, whose peak of every category but Activation must agree with the plan's peak
     within the same 20%. MemTracker knows nothing of FSDP1: it files the flat parameters'
     gradients, the original parameters' own gradients before autograd concatenates them
     into the flat one (the plan's Vg, docs/memory-model.md), and the gradients of
     activations under Temp, so Temp is counted (activation gradients make the measured
     side slightly larger than what the plan models).

    $FSDP_PLAN_VENV/bin/python tests/differential/test_suggest_fsdp.py BINARY CORPUS_DIR [-k SUBSTR] [-v]

Exits 1 on any failure.
"""
import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "corpus"))

import torch  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: E402

import corpus  # noqa: E402
import test_fsdp2  # noqa: E402
import test_torch2  # noqa: E402

WORLD = 4
# A tied head (FSDP2 must keep the embedding and the head in one group), a mixture of experts,
# and an encoder whose classifier head is untied.
MODELS = ["llama_tied", "mixtral", "vit"]
# MemTracker's categories (torch.distributed._tools.mem_tracker._MemRefType) other than Activation.
FSDP1_NON_ACTIVATION = ["Parameter", "Buffer", "Gradient", "Temp", "Optstate", "Other"]
Fsdp1Tracker = test_fsdp2.non_activation_tracker(MemTracker, FSDP1_NON_ACTIVATION)


def run(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def suggest_and_check(binary, model_file, version, tmp):
    """Steps 1 and 2. Returns (failures, plan of the suggested policy, the policy, budget)."""
    common = [model_file, "--world-size", str(WORLD), "--fsdp-version", str(version), "-f", "json"]
    code, out, err = run(binary, "suggest", *common, "--budget", "1TiB", "--top", "100000")
    if code != 0:
        return [f"suggest (unbounded budget) exit {code}: {err.strip()}"], None, None, None, None
    peaks = sorted({c["peak_bytes"] for c in json.loads(out)["candidates"]})
    if len(peaks) < 2:
        return [f"only {len(peaks)} distinct peak(s) among the candidates: nothing to choose"], None, None, None, None
    budget = (peaks[0] + peaks[-1]) // 2
    best_file = os.path.join(tmp, "best.json")
    code, out, err = run(binary, "suggest", *common, "--budget", str(budget), "--top", "100000", "-o", best_file)
    if code != 0:
        return [f"suggest --budget {budget} exit {code}: {err.strip()}"], None, None, None, None
    doc = json.loads(out)
    best = doc["candidates"][0]
    failures = []
    if not best["fits"] or best["needed_bytes"] > budget:
        failures.append(f"best {best['label']!r} needs {best['needed_bytes']}, budget {budget}")
    # suggest's ranking (docs/suggest.md; docs/time-model.md section 6): among candidates that fit,
    # a coarse plan (one unit, or the root holding most parameters) never ahead of a finer one; then
    # plans with every block a unit; then the lowest estimated step time, or exposed communication
    # where FLOPs are unknown.
    fitting = [c for c in doc["candidates"] if c["fits"]]
    def tier(c):
        return (c["coarse"], not c["per_block"])
    first = min(tier(c) for c in fitting)
    if tier(best) != first:
        failures.append(f"best {best['label']!r} is in tier {tier(best)}; a fitting candidate is in {first}")
    key = "step_s" if best["time"]["step_s"] is not None else "exposed_comm_s"
    lowest = min(c["time"][key] for c in fitting if tier(c) == first)
    if best["time"][key] > lowest * (1 + 1e-9) + 1e-15:
        failures.append(f"best {best['label']!r} has {key} {best['time'][key]}; a candidate of its tier has {lowest}")
    with open(best_file) as f:
        policy = json.load(f)
    if policy != best["policy"] or policy.get("fsdp", {}).get("version", 1) != version:
        failures.append(f"best.json {policy} is not the best candidate's policy {best['policy']}")
    code, out, err = run(binary, model_file, "--policy", best_file, "-f", "json")
    if code not in (0, 1):
        return failures + [f"planning best.json: exit {code}: {err.strip()}"], None, None, None, None
    plan = json.loads(out)
    peak = plan["memory"]["per_rank"]["peak_bytes"]
    if peak != best["peak_bytes"] or len(plan["units"]) != best["units"]:
        failures.append(f"best.json plans {len(plan['units'])} units, peak {peak}; suggest said "
                        f"{best['units']} units, peak {best['peak_bytes']}")
    if peak > budget:
        failures.append(f"best.json's peak {peak} is over the budget {budget}")
    return failures, plan, (best["label"], policy), budget, doc


def plan_policy(binary, model_file, policy, tmp):
    path = os.path.join(tmp, "candidate.json")
    with open(path, "w") as f:
        json.dump(policy, f)
    code, out, err = run(binary, model_file, "--policy", path, "-f", "json")
    assert code in (0, 1), err
    return json.loads(out)


def check_fsdp1(plan, policy, name, verbose):
    """Step 3 for FSDP1: units and sizes, and the peak against MemTracker."""
    test_torch2.init_fake(WORLD)
    eager = corpus.build(name, "cpu")
    inputs = corpus.example_inputs(name, eager)
    model = copy.deepcopy(eager)
    fsdp = FSDP(model, device_id=torch.device("cpu"), use_orig_params=policy["fsdp"].get("use_orig_params", False),
                **test_torch2.fsdp_kwargs(policy, model))
    failures = [f"real FSDP1: {m}" for m in test_torch2.compare_fsdp(test_torch2.fsdp1_units(fsdp, policy), plan)]
    optim = torch.optim.AdamW(fsdp.parameters(), lr=1e-3, foreach=False)
    tracker = Fsdp1Tracker()
    tracker.track_external(fsdp, optim)
    test_fsdp2.two_tracked_steps(tracker, fsdp, optim, inputs)
    peak_t, peak_p = tracker.non_act_peak, plan["memory"]["per_rank"]["peak_bytes"]
    off = (peak_p - peak_t) / peak_t
    if abs(off) > test_fsdp2.TOLERANCE:
        failures.append(f"non-activation peak: MemTracker {peak_t}, plan {peak_p} ({off:+.1%})")
    if verbose:
        print(f"    peak MemTracker {peak_t} {tracker.non_act_snap}; plan {peak_p}")
    return failures, off


def check_fsdp2(plan, name, verbose):
    """Step 3 for FSDP2: test_fsdp2's comparison with fully_shard and FSDPMemTracker."""
    inputs = corpus.example_inputs(name, corpus.build(name, "cpu"))
    result = test_fsdp2.check_against_torch(plan, lambda: test_fsdp2.meta_build(corpus, name), lambda: inputs,
                                            WORLD, 1, False, verbose)
    return result if isinstance(result, tuple) else (result, 0.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("corpus_dir")
    ap.add_argument("-k")
    ap.add_argument("-v", action="store_true")
    args = ap.parse_args()
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in MODELS:
            model_file = os.path.join(args.corpus_dir, name + ".pt")
            for version in (1, 2):
                case = f"{name} FSDP{version} W{WORLD}"
                if args.k and args.k not in case:
                    continue
                off = 0.0
                try:
                    failures, plan, picked, budget, doc = suggest_and_check(args.binary, model_file, version, tmp)
                    if plan is not None:
                        more, off = (check_fsdp1(plan, picked[1], name, args.v) if version == 1
                                     else check_fsdp2(plan, name, args.v))
                        failures += more or []
                    grouped = [c for c in (doc or {}).get("candidates", []) if c["origin"] == "groups"]
                    if version == 2 and not grouped:
                        failures.append("no candidate with groups was ranked")
                    elif version == 2:
                        gplan = plan_policy(args.binary, model_file, grouped[0]["policy"], tmp)
                        more, goff = check_fsdp2(gplan, name, args.v)
                        failures += [f"{grouped[0]['label']}: {m}" for m in more or []]
                        if not more:
                            print(f"ok   {case}: {grouped[0]['label']!r}, {len(gplan['units'])} units "
                                  f"(torch {goff:+.1%})")
                except Exception:
                    failures = [traceback.format_exc()]
                if failures:
                    failed += 1
                    print(f"FAIL {case}")
                    for f in failures:
                        print("     " + f)
                else:
                    passed += 1
                    print(f"ok   {case}: budget {budget}, best {picked[0]!r}, {len(plan['units'])} units, "
                          f"peak {plan['memory']['per_rank']['peak_bytes']} (torch {off:+.1%})")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
