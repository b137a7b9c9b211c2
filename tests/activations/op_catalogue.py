#!/usr/bin/env python3
"""Every operator that appears in the exports' graphs, with counts: the rows saved_ops.yaml must have.

Reads each archive's models/model.json directly (stdlib only, as the C++ reader will): every node's
`target` (`torch.ops.aten.linear.default`, a custom op such as
`torch.ops.transformers.grouped_mm_fallback.default`, `torch.ops.higher_order.*`, or Python's
`_operator.getitem`), counted per export and in all.

    python tests/activations/op_catalogue.py EXPORTS_DIR [--out op_catalogue.json] [--check saved_ops.yaml]

--check exits 1 if an operator of the catalogue has no row in the table (the table must not lose a
row the corpus uses).
"""
import argparse
import json
import os
import sys
import zipfile
from collections import Counter, defaultdict
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))


def graph_of(path: str) -> Dict:
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/models/model.json"))
        return json.loads(z.read(name))["graph_module"]["graph"]


def op_name(target: str) -> str:
    """`torch.ops.aten.linear.default` -> `aten.linear.default` (the table's key); others as written."""
    return target[len("torch.ops."):] if target.startswith("torch.ops.") else target


def catalogue(exports_dir: str) -> Dict:
    with open(os.path.join(exports_dir, "manifest.json")) as f:
        manifest = json.load(f)["exports"]
    ops: Dict[str, Counter] = defaultdict(Counter)
    for e in manifest:
        if "error" in e:
            continue
        g = graph_of(os.path.join(exports_dir, e["file"]))
        for n in g["nodes"]:
            ops[op_name(n["target"])][e["file"]] += 1
    out = {}
    for op, per_file in sorted(ops.items()):
        models = sorted({f.split("_b")[0].replace(".pt2", "").replace("_dyn", "") for f in per_file})
        out[op] = {"count": sum(per_file.values()), "files": len(per_file), "models": models}
    return {"exports": len([e for e in manifest if "error" not in e]), "ops": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("exports_dir")
    ap.add_argument("--out", help="write the catalogue JSON here")
    ap.add_argument("--check", help="saved_ops.yaml: fail if an operator has no row")
    args = ap.parse_args()
    cat = catalogue(args.exports_dir)
    for op, rec in cat["ops"].items():
        print(f"{rec['count']:6d} {rec['files']:3d}  {op}  ({', '.join(rec['models'])})")
    print(f"{len(cat['ops'])} operators in {cat['exports']} exports")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(cat, f, indent=1, sort_keys=True)
            f.write("\n")
    if args.check:
        sys.path.insert(0, HERE)
        import saved_ops  # noqa: E402
        table = saved_ops.load(args.check)
        missing: List[str] = [op for op in cat["ops"] if op not in table]
        for op in missing:
            print(f"MISSING from {args.check}: {op}")
        return 1 if missing else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
