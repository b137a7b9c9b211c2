"""2-D plans against torch 2.13: fsdp-plan's tensor-parallel placements vs tests/tensor_parallel/reference.json.

reference.json is what real parallelize_module + fully_shard did on a fake-backend device mesh
(tp_reference.py writes it). For each of its cases this test traces the same small model to
TorchScript, plans it with a policy holding the case's tensor_parallel section (fully_shard on
each decoder layer and the root, as the reference did), and checks:

- every parameter's TP placement, TP-local shape, placements on the full mesh, mesh dimension
  names, and rank 0's local shard (= FSDP2's padded shard) equal torch's;
- the plan's sharded parameter bytes per rank are the sum of torch's padded shards;
- where torch fails (a style on a module it cannot split, a key matching nothing, tp not
  dividing the heads), the plan refuses with the expected warning kind; the one gap the
  parameter shapes cannot show (tp 4 over 2 key-value heads: 16 rows of k_proj divide by 4,
  yet a head is 8 rows) is asserted to be a gap, so that closing it shows here.

    /work/main/.venv/bin/python tests/tensor_parallel/test_tp_plan.py BINARY [-k SUBSTRING] [-v]

Exits 1 on any failure. About a minute (traces three small models).
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
sys.path.insert(0, os.path.join(HERE, "..", "corpus"))

import corpus  # noqa: E402
import tp_reference  # noqa: E402

# The warning kind each failing case must raise; None: the plan cannot see it from shapes.
EXPECTED_REFUSAL = {
    "llama_colwise_norm_4x2": "tp_style_class",
    "llama_unmatched_4x2": "tp_unmatched_pattern",
    "llama_heads_2x3": "tp_uneven_split",
    "llama_kv_heads_2x4": None,  # needs the head counts (the .pt2 record's config): not checked yet
}
LAYER_CLASS = {"llama": "LlamaDecoderLayer", "llama_kv4": "LlamaDecoderLayer", "mistral": "MistralDecoderLayer"}


def save_model(name: str, tmp: str, cache: dict) -> str:
    if name not in cache:
        model = tp_reference.MODELS[name]("cpu")
        path = os.path.join(tmp, name + ".pt")
        traced = corpus.trace(model, "llama", corpus.example_inputs("llama", model))
        traced.save(path)
        cache[name] = path
    return cache[name]


def policy_for(case: dict) -> dict:
    mesh = case["mesh"]
    tp = {"degree": mesh["tp"], "plan": case["plan"], "mesh": {k: v for k, v in mesh.items() if k != "tp"}}
    return {"module_classes": [LAYER_CLASS[case["model"]]],
            "fsdp": {"version": 2, "world_size": case["world_size"]},
            "tensor_parallel": tp}


def check_case(binary: str, name: str, case: dict, model_file: str, tmp: str, verbose: bool) -> list:
    pfile = os.path.join(tmp, name + ".policy.json")
    with open(pfile, "w") as f:
        json.dump(policy_for(case), f)
    r = subprocess.run([binary, model_file, "--policy", pfile, "--format", "json"], capture_output=True, text=True)
    if r.returncode not in (0, 1):
        return [f"exit {r.returncode}: {r.stderr.strip()}"]
    plan = json.loads(r.stdout)
    kinds = sorted({w["kind"] for w in plan["warnings"] if w["severity"] == "error"})
    fails = []
    if name in EXPECTED_REFUSAL:
        want = EXPECTED_REFUSAL[name]
        tp_kinds = [k for k in kinds if k.startswith("tp_")]
        if want is None and tp_kinds:
            fails.append(f"the known gap now refuses ({tp_kinds}): update EXPECTED_REFUSAL and the docs")
        if want is not None and want not in kinds:
            fails.append(f"torch fails ({case['error'] or case['warnings']}), the plan raises no {want} (has {kinds})")
        if verbose:
            print(f"  {name}: torch: {case['error'] or case['warnings']}; plan: {kinds}")
    elif kinds:
        fails.append(f"torch plans this case, the plan refuses: {kinds}")
    if not case["params"]:
        return fails
    got = {p["name"]: p for p in plan["tensor_parallel"]["params"]}
    if sorted(got) != sorted(case["params"]):
        return fails + [f"parameters differ: {sorted(set(got) ^ set(case['params']))}"]
    for pname, ref in case["params"].items():
        p = got[pname]
        want = {"tp_placement": None if ref["tp_placement"] == "none" else ref["tp_placement"],
                "tp_local_shape": ref["tp_local_shape"], "placements": ref["placements"],
                "mesh_dims": ref["mesh_dims"], "local_shape": ref["padded_shard_shape"]}
        have = {k: p[k] for k in want}
        if have != want:
            fails.append(f"{pname}: torch {want}, plan {have}")
    # FSDP2 holds each padded shard (float32 here): the plan's sharded parameters per rank.
    padded = 0
    for ref in case["params"].values():
        n = 1
        for d in ref["padded_shard_shape"]:
            n *= d
        padded += 4 * n
    if plan["memory"]["per_rank"]["params_bytes"] != padded:
        fails.append(f"sharded parameter bytes per rank: torch's shards {padded}, plan "
                     f"{plan['memory']['per_rank']['params_bytes']}")
    if verbose:
        print(f"  {name}: {len(case['params'])} parameters, {padded} bytes of shards per rank")
    return fails


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("binary")
    ap.add_argument("-k", default="", help="only the cases whose name contains this")
    ap.add_argument("-v", action="store_true")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    with open(tp_reference.REFERENCE) as f:
        ref = json.load(f)
    failed = passed = 0
    with tempfile.TemporaryDirectory() as tmp:
        cache: dict = {}
        for name, case in sorted(ref["cases"].items()):
            if args.k not in name:
                continue
            fails = check_case(args.binary, name, case, save_model(case["model"], tmp, cache), tmp, args.v)
            for line in fails:
                print(f"FAIL {name}: {line}")
            failed += bool(fails)
            passed += not fails
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
