#!/usr/bin/env python3
"""The op table is complete for the installed torch (issue 40): every operator of its
derivatives.yaml has a row (saved_ops.yaml's hand rows over gen_op_rows.py's generated ones) or a
listed reason (saved_ops_generated.yaml: `reasons`), and the committed saved_ops_generated.yaml is
what gen_op_rows.py makes from this torch (a torch upgrade that adds or changes an operator fails
here until the file is generated again).

    python tests/activations/test_op_rows.py [--no-stale-check]

Prints the counts; exits 1 on a missing operator or a stale file.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "lib", "activations"))

import yaml  # noqa: E402

import gen_op_rows  # noqa: E402
import saved_ops  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-stale-check", action="store_true", help="skip regenerating the rows (~1 min)")
    args = ap.parse_args()
    failures = []
    with open(gen_op_rows.DEFAULT_OUT) as f:
        generated = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    hand = saved_ops.load(generated=None)
    table = saved_ops.load()
    reasons = generated.get("reasons") or {}
    entries = gen_op_rows.derivative_entries()
    n_hand = n_gen = n_reason = 0
    for op in entries:
        if op in hand:
            n_hand += 1
        elif op in table:
            n_gen += 1
        elif op in reasons:
            n_reason += 1
        else:
            failures.append(f"MISSING: {op} (derivatives.yaml of torch {gen_op_rows.torch.__version__}) has no row "
                            f"and no reason; run lib/activations/gen_op_rows.py")
    print(f"derivatives.yaml of torch {gen_op_rows.torch.__version__}: {len(entries)} operators: {n_hand} with a hand "
          f"row, {n_gen} with a generated row, {n_reason} with a reason, {len(entries) - n_hand - n_gen - n_reason} "
          f"missing")
    print(f"table: {len(table)} rows ({len(hand)} hand, {len(table) - len(hand)} generated), {len(reasons)} reasons")
    # A reason never hides a row: an operator with a reason has no generated row.
    for op in reasons:
        if op in generated["ops"]:
            failures.append(f"{op}: both a generated row and a reason")
    if not args.no_stale_check:
        with open(gen_op_rows.DEFAULT_OUT) as f:
            if f.read() != gen_op_rows.text():
                failures.append(f"STALE: {gen_op_rows.DEFAULT_OUT} is not what torch {gen_op_rows.torch.__version__} "
                                f"generates; run lib/activations/gen_op_rows.py")
    for f in failures:
        print(f)
    print(f"{len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
