"""Activations under tensor parallelism against torch 2.13: the plan's memory.activations vs act_reference.json.

act_reference.json is what autograd saved on tp rank 0 in one training forward (labels given) of
the small corpus Llama after parallelize_module with Hugging Face's own plan, and of sp_decoder.py's
model with a sequence-parallel plan (which HF's Llama does not run), on the fake backend
(tp_act_reference.py writes it, counting each DTensor by its local storage). For each case this
test exports the same model to a .pt2 (fsdp-plan-export, at the reference's batch and sequence
length, with labels), plans it at `--device cpu` (the oracle ran the CPU kernels) with the same
tensor_parallel section on a (dp_shard 2, tp) mesh, and checks, each within TOLERANCE (issue 30's
2%):

- the saved activation bytes, the parameters and inputs saved, and every module's subtree total;
- at tp 1 (no tensor_parallel section) the same against the unsplit model's reference, so a
  difference at tp > 1 is the tensor-parallel rule's, not the walk's;
- the plan's tp > 1 figures are below its tp 1 figures (the rule divides);
- the whole step: the plan's per-rank peak (memory.per_rank.peak_bytes: parameters, gradients,
  optimizer state and the activations together) against FSDPMemTracker's peak of the second of two
  real steps on the same (dp_shard 2, tp) mesh (fully_shard on each layer and the root), within
  TOLERANCE_PEAK (issue 26: 5%).

    /work/main/.venv/bin/python tests/tensor_parallel/test_tp_activations.py BINARY [-k SUBSTRING] [-v]

Exits 1 on any failure. About a minute (two exports).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import test_tp_plan  # noqa: E402  (export_pt2, LAYER_CLASS)
import tp_act_reference  # noqa: E402
import tp_common  # noqa: E402  (write_policy, plan_json)

TOLERANCE = 0.02
TOLERANCE_PEAK = 0.05


def rel(a: int, b: int) -> float:
    return (a - b) / b if b else (0.0 if a == 0 else 1.0)


def policy_for(case: dict) -> dict:
    tp = case["tp"]
    layer = "Block" if case["model"] == "sp_decoder" else test_tp_plan.LAYER_CLASS[case["model"]]
    pol = {"module_classes": [layer],
           "fsdp": {"version": 2, "world_size": 2 * tp, "optimizer": "adamw", "optimizer_impl": "for-loop"}}
    if tp > 1:
        plan = "model" if case.get("runtime") == "transformers" else case["plan"]
        pol["tensor_parallel"] = {"degree": tp, "plan": plan, "mesh": {"dp_shard": 2}}
    return pol


def export_sp_decoder(tmp: str) -> str:
    """sp_decoder.py's model by fsdp-plan-export --factory (its own batch, sequence and labels)."""
    out = os.path.join(tmp, "sp_decoder.pt2")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "..", "..", "python"), HERE,
                                                        os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-m", "fsdp_plan.export", "--factory", "sp_decoder:factory", "-o", out, "-q"],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"fsdp-plan-export sp_decoder: {r.stderr.strip()[-600:]}")
    return out


def run_plan(binary: str, model_file: str, pfile: str) -> dict:
    return tp_common.plan_json(binary, model_file, pfile, ("--device", "cpu", "-q"))


def check_case(binary: str, name: str, case: dict, pt2: str, tmp: str, verbose: bool) -> tuple:
    fails = []
    pfile = tp_common.write_policy(tmp, name, policy_for(case))
    plan = run_plan(binary, pt2, pfile)
    errors = [w["message"] for w in plan["warnings"] if w["severity"] == "error"]
    if errors:
        fails.append(f"the plan refuses: {errors}")
    acts = plan["memory"]["activations"]
    if acts.get("source") != "graph":
        return fails + [f"activations source {acts.get('source')!r}, not 'graph'"], None
    if acts.get("missing_ops"):
        fails.append(f"operators without a row: {acts['missing_ops']}")
    worst = 0.0
    for ours, theirs in (("saved_bytes", "total_bytes"), ("param_saved_bytes", "param_saved_bytes"),
                         ("input_saved_bytes", "input_saved_bytes")):
        r = rel(acts[ours], case[theirs])
        worst = max(worst, abs(r))
        if abs(r) > TOLERANCE:
            fails.append(f"{ours}: plan {acts[ours]}, autograd {case[theirs]} ({r:+.2%})")
    got = {m["path"]: m["total_bytes"] for m in acts["modules"]}
    for path in sorted(set(got) | set(case["modules"])):
        a, b = got.get(path, 0), case["modules"].get(path, {}).get("total_bytes", 0)
        r = rel(a, b)
        worst = max(worst, abs(r))
        if abs(r) > TOLERANCE:
            fails.append(f"module {path!r}: plan {a}, autograd {b} ({r:+.2%})")
    peak, tracked = plan["memory"]["per_rank"]["peak_bytes"], case["tracker"].get("peak_bytes")
    if tracked is None:
        fails.append(f"the tracker did not run: {case['tracker']}")
    elif abs(rel(peak, tracked)) > TOLERANCE_PEAK:
        fails.append(f"step peak: plan {peak}, FSDPMemTracker {tracked} ({rel(peak, tracked):+.2%})")
    if verbose:
        print(f"  {name}: plan {acts['saved_bytes']} B saved, autograd {case['total_bytes']} B "
              f"({rel(acts['saved_bytes'], case['total_bytes']):+.3%}; worst of {len(case['modules'])} modules "
              f"{worst:.3%}); step peak {peak} B, FSDPMemTracker {tracked} B ({rel(peak, tracked or 1):+.2%})")
    return fails, acts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("-k", default="", help="only the cases whose name contains this")
    ap.add_argument("-v", action="store_true")
    ap.add_argument("--pt2-dir", help="reuse MODEL.pt2 files exported there before (default: export them)")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    with open(tp_act_reference.REFERENCE) as f:
        ref = json.load(f)
    failed = passed = 0
    saved = {}
    with tempfile.TemporaryDirectory() as tmp:
        pt2s: dict = {}
        for name, case in sorted(ref["cases"].items()):
            if args.k not in name:
                continue
            model = case["model"]
            if model not in pt2s:
                pt2 = os.path.join(args.pt2_dir, model + ".pt2") if args.pt2_dir else ""
                if not os.path.exists(pt2) and model == "sp_decoder":
                    pt2 = export_sp_decoder(tmp)
                elif not os.path.exists(pt2):
                    pt2 = test_tp_plan.export_pt2(model, tmp, ("--batch", str(case["batch"]), "--seq", str(case["seq"])))
                pt2s[model] = pt2
            fails, acts = check_case(args.binary, name, case, pt2s[model], tmp, args.v)
            if acts is not None:
                saved[(model, case["tp"])] = acts["saved_bytes"]
            for line in fails:
                print(f"FAIL {name}: {line}")
            failed += bool(fails)
            passed += not fails
        # The rule divides: a tp > 1 plan saves less than the same model's tp 1 plan.
        for (model, tp), b in sorted(saved.items()):
            if tp > 1 and (model, 1) in saved and not b < saved[(model, 1)]:
                print(f"FAIL {model} tp {tp}: {b} B saved, not below tp 1's {saved[(model, 1)]} B")
                failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
