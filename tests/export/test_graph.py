#!/usr/bin/env python3
"""The C++ graph (lib/model/graph.h, printed by graph_dump) against the file.

For every .pt2 in DIR (the corpus exports of tests/activations/make_exports.py,
ctest fixture act_exports), graph_dump's JSON must equal what the program's
models/model.json says, read here with json and evaluated with sympy, as
torch.export.load reads it (torch/_export/serde/serialize.py:
GraphModuleDeserializer): the node count and order, each node's op, argument
names and outputs, its innermost nn_module_stack entry and the tree module it
is attributed to, and each tensor value's dtype, requires_grad and sizes and
strides evaluated at the traced values and, for exports with dynamic
dimensions, at a second setting (batch=3, seq=48 given as --dim would be).

    test_graph.py BUILD/tests/export/graph_dump BUILD/act_exports

Prints one line per file and `N passed, M failed`; exit 1 on any failure.
About 5 s for the 30 corpus exports.
"""
import argparse
import json
import os
import subprocess
import sys
import zipfile
from typing import Any, Dict, List, Optional

import sympy

SECOND = {"batch": 3, "seq": 48}


def model_json(path: str) -> Dict[str, Any]:
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/models/model.json"))
        return json.loads(z.read(name))


def flat_outputs(outs: List[Dict[str, Any]]) -> List[Optional[str]]:
    """A node's outputs as graph_dump lists them: lists flattened, None for a None."""
    names: List[Optional[str]] = []
    for o in outs:
        (kind, v), = o.items()
        if kind == "as_tensor":
            names.append(v["name"])
        elif kind == "as_tensors":
            names.extend(t["name"] for t in v)
        elif kind == "as_optional_tensors":
            names.extend(t["as_tensor"]["name"] if "as_tensor" in t else None for t in v)
        elif kind in ("as_sym_int", "as_sym_bool", "as_sym_float"):
            names.append(v["as_name"])
        elif kind == "as_none":
            names.append(None)
        else:
            raise ValueError(f"an output of kind {kind}")
    return names


class Evaluator:
    """srepr text -> value at one setting of the symbols (exprs cached)."""

    def __init__(self, values: Dict[str, int]):
        self.values = {sympy.Symbol(k, positive=True, integer=True): v for k, v in values.items()}
        self.cache: Dict[str, int] = {}

    def dim(self, d: Dict[str, Any]) -> int:
        if "as_int" in d:
            return d["as_int"]
        text = d["as_expr"]["expr_str"]
        if text not in self.cache:
            self.cache[text] = int(sympy.sympify(text).subs(self.values))
        return self.cache[text]


def hints(doc: Dict[str, Any]) -> Dict[str, int]:
    """Each symbol at the value torch traced it at: the hint of a size that is exactly it."""
    out: Dict[str, int] = {}
    for t in doc["graph_module"]["graph"]["tensor_values"].values():
        for d in t["sizes"]:
            e = d.get("as_expr")
            if e and e.get("hint") and e["expr_str"].startswith("Symbol("):
                out[str(sympy.sympify(e["expr_str"]))] = e["hint"]["as_int"]
    return out


def innermost(stack: Optional[str]) -> str:
    if not stack:
        return ""
    entry = stack.split(";")[-1]
    # "KEY,PATH,CLASS" where PATH may hold commas inside brackets: the middle field.
    key_end = entry.index(",")
    cls_start = entry.rindex(",")
    return entry[key_end + 1:cls_start]


def dump(tool: str, path: str, dims: List[str]) -> Dict[str, Any]:
    p = subprocess.run([tool, path, *dims], capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError(f"graph_dump exit {p.returncode}: {p.stderr.strip()}")
    return json.loads(p.stdout)


def compare(tool: str, path: str) -> List[str]:
    doc = model_json(path)
    g = doc["graph_module"]["graph"]
    problems: List[str] = []
    got = dump(tool, path, [])
    # Nodes.
    if len(got["nodes"]) != len(g["nodes"]):
        return [f"{len(got['nodes'])} nodes, the file has {len(g['nodes'])}"]
    for i, (mine, theirs) in enumerate(zip(got["nodes"], g["nodes"])):
        want = {
            "name": theirs["name"],
            "op": theirs["target"].removeprefix("torch.ops."),
            "call": innermost((theirs.get("metadata") or {}).get("nn_module_stack")),
            "args": [a["name"] for a in theirs["inputs"]],
            "outputs": flat_outputs(theirs["outputs"]),
        }
        for k, v in want.items():
            if mine[k] != v:
                problems.append(f"node {i} ({theirs['name']}) {k}: {mine[k]!r}, the file says {v!r}")
        # The tree module: the innermost call that is a module of the tree, else the root.
        if not (mine["module"] == "" or mine["call"] == mine["module"]
                or mine["call"].startswith(mine["module"] + ".")):
            problems.append(f"node {i} module {mine['module']!r} is not {mine['call']!r} or a parent")
    # Dims: torch's symbols, named.
    symbols = set(doc.get("range_constraints", {}))
    if set(got["dims"]) != symbols:
        problems.append(f"dims {sorted(got['dims'])}, range_constraints has {sorted(symbols)}")
    # Tensors at the traced values, then (dynamic) at the second setting.
    settings = [(hints(doc), [])]
    if symbols:
        by_dim = {v["dim"]: k for k, v in got["dims"].items()}
        values = dict(settings[0][0])
        given = []
        for dim, value in SECOND.items():
            if dim in by_dim:
                values[by_dim[dim]] = value
                given.append(f"{dim}={value}")
        settings.append((values, given))
    for values, given in settings:
        tensors = got["tensors"] if not given else dump(tool, path, given)["tensors"]
        ev = Evaluator(values)
        if set(tensors) != set(g["tensor_values"]):
            problems.append(f"tensor names differ: {sorted(set(tensors) ^ set(g['tensor_values']))[:5]}")
        for name, t in g["tensor_values"].items():
            mine = tensors.get(name)
            if mine is None:
                continue
            want = {"dtype": t["dtype"], "requires_grad": t["requires_grad"],
                    "sizes": [ev.dim(d) for d in t["sizes"]], "strides": [ev.dim(d) for d in t["strides"]]}
            for k, v in want.items():
                if mine[k] != v:
                    problems.append(f"tensor {name} {k} at {given or 'the traced values'}: {mine[k]}, "
                                    f"the file says {v}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("graph_dump", help="the graph_dump binary (BUILD/tests/export/graph_dump)")
    ap.add_argument("dir", help="a folder of .pt2 files (BUILD/act_exports)")
    args = ap.parse_args()
    files = sorted(f for f in os.listdir(args.dir) if f.endswith(".pt2"))
    passed = failed = 0
    for f in files:
        try:
            problems = compare(args.graph_dump, os.path.join(args.dir, f))
        except Exception as e:  # one line per file, whatever went wrong
            problems = [f"{type(e).__name__}: {e}"]
        if problems:
            failed += 1
            print(f"FAIL {f}: {len(problems)} differences")
            for p in problems[:10]:
                print(f"     {p}")
        else:
            passed += 1
            print(f"ok   {f}")
    if not files:
        print(f"no .pt2 files in {args.dir}")
        failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
