"""What the tensor-parallel references and tests share: the references' command line, and the tests'
policy files and plan runs.

- `reference_main`: a reference script's main(): run torch on every case (or those whose name
  contains -k) and write the JSON reference, or with --check compare with the stored one;
- `write_policy`, `plan_json`: a test's policy written to its temporary directory, and the plan
  fsdp-plan makes with it (exit 0 or 1: a plan with errors is still a plan).
"""
import argparse
import json
import os
import subprocess
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

import torch


def reference_main(doc: str, default_out: str, cases: Dict[str, Any], run_case: Callable[[str, Any], Any],
                   what: str, extra: Optional[Dict[str, Any]] = None,
                   report: Optional[Callable[[Dict[str, Any]], None]] = None,
                   argv: Optional[List[str]] = None) -> int:
    """A reference script's main(). `run_case(name, case)` gives a case's JSON-able result; the
    reference holds them under "cases" with torch's version (and `extra`). --check compares each
    case with the stored one (printing "FAIL NAME: torch's WHAT differ from FILE"); without it the
    file is written (with -k, the selected cases replace theirs in the stored file) and `report`
    prints a summary of the result."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--out", default=default_out, help="where to write the reference (default: %(default)s)")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    ap.add_argument("-k", default="", help="only the cases whose name contains this")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    result = {"torch": torch.__version__.split("+")[0], **(extra or {}),
              "cases": {n: run_case(n, c) for n, c in cases.items() if args.k in n}}
    result = json.loads(json.dumps(result))  # as the file holds it: tuples as lists
    if args.check:
        with open(args.out) as f:
            stored = json.load(f)
        bad = [n for n, c in result["cases"].items() if stored["cases"].get(n) != c]
        for n in bad:
            print(f"FAIL {n}: torch's {what} differ from {args.out}")
        print(f"{len(result['cases']) - len(bad)} passed, {len(bad)} failed")
        return 1 if bad else 0
    if args.k and os.path.exists(args.out):
        with open(args.out) as f:
            result = {**result, "cases": {**json.load(f)["cases"], **result["cases"]}}
    with open(args.out, "w") as f:
        f.write(json.dumps(result, indent=1, sort_keys=True) + "\n")
    if report:
        report(result)
    print(f"wrote {args.out}: {len(result['cases'])} cases")
    return 0


def write_policy(tmp: str, name: str, policy: Dict[str, Any]) -> str:
    """The policy as TMP/NAME.policy.json; its path."""
    path = os.path.join(tmp, name + ".policy.json")
    with open(path, "w") as f:
        json.dump(policy, f)
    return path


def plan_json(binary: str, model_file: str, policy_file: str, extra: Sequence[str] = ()) -> Dict[str, Any]:
    """fsdp-plan MODEL --policy POLICY --format json [EXTRA...]: the plan, or RuntimeError on an exit
    other than 0 or 1."""
    r = subprocess.run([binary, model_file, "--policy", policy_file, "--format", "json", *extra],
                       capture_output=True, text=True)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"exit {r.returncode}: {r.stderr.strip()}")
    return json.loads(r.stdout)
