#!/usr/bin/env python3
"""Generate saved_ops.inc, the C++ form of saved_ops.yaml (what autograd saves per ATen operator).

saved_ops.yaml is the reviewed source: one row per operator, each citing derivatives.yaml or the
decomposition it follows; its rows override saved_ops_generated.yaml's (gen_op_rows.py: a row for
every ATen operator, from the installed torch's autograd metadata), and the .inc holds the merge;
tests/activations/saved_ops.py is its reference evaluator and test_saved_ops.py checks every row
against autograd. This script turns the rows into constant arrays that lib/activations/saved_ops.cpp reads: the row's expressions (`when`,
shapes, dtypes, `alias_when`, `output_strides`) are parsed here with Python's own `ast`, checked
against the grammar saved_ops.py accepts, and written as a flat array of expression nodes, so the
C++ side evaluates them without a parser.

    python3 lib/activations/gen_saved_ops.py                 # rewrite lib/activations/saved_ops.inc
    python3 lib/activations/gen_saved_ops.py --check [--catalogue tests/activations/refs/op_catalogue.json]

--check exits 1 when the committed saved_ops.inc is not what the YAML generates (stale), and, with
--catalogue, when an operator the corpus exports use (op_catalogue.py's list) has no row.
Needs PyYAML (Debian's python3-yaml, or the project's venv).
"""
import argparse
import ast
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_YAML = os.path.join(HERE, "saved_ops.yaml")
DEFAULT_GENERATED = os.path.join(HERE, "saved_ops_generated.yaml")
DEFAULT_OUT = os.path.join(HERE, "saved_ops.inc")

# The dtype names a `new` tensor may be given literally (saved_ops.py: ITEMSIZE).
DTYPES = ["float64", "float32", "bfloat16", "float16", "int64", "int32", "int16", "int8", "uint8", "bool",
          "complex64"]
ROW_KEYS = {"source", "differentiable", "cases", "saves", "outputs", "note", "verified", "alias", "defaults"}
CASE_KEYS = {"when", "name", "saves", "output_strides", "verified"}
ITEM_KEYS = {"tensor", "new", "name", "if_grad", "when", "device"}
# saved_ops.py: evaluate() accepts exactly these functions. The first argument of every function
# but ceil_div, ones and len names a tensor argument (or result, result1, ...).
FUNCTIONS = ["has", "rg", "dim", "size", "numel", "dtype", "shape", "dims", "contiguous", "viewable_flat",
             "view_ok", "flatten_ok", "dense_like", "is_float", "is_number", "same_dtype", "ones", "len",
             "ceil_div"]
NAME_FIRST = set(FUNCTIONS) - {"ones", "len", "ceil_div"}
BINOPS = {ast.Add: "Add", ast.Sub: "Sub", ast.Mult: "Mul", ast.FloorDiv: "FloorDiv"}
CMPOPS = {ast.Eq: "Eq", ast.NotEq: "Ne", ast.Lt: "Lt", ast.LtE: "Le", ast.Gt: "Gt", ast.GtE: "Ge", ast.In: "In",
          ast.NotIn: "NotIn"}


class TableError(Exception):
    pass


def c_str(s: Optional[str]) -> str:
    if s is None:
        return "nullptr"
    return json.dumps(s)  # a JSON string of ASCII text is a valid C++ string literal


class Emitter:
    """The arrays of saved_ops.inc, appended to as rows are read."""

    def __init__(self) -> None:
        self.nodes: List[str] = []     # ExprNode initialisers
        self.children: List[int] = []  # node indices, by ExprNode::first/count
        self.names: List[str] = []     # argument-name lists, by first/count
        self.items: List[str] = []
        self.cases: List[str] = []
        self.outputs: List[str] = []
        self.defaults: List[str] = []
        self.rows: List[str] = []

    # ------------------------------------------------------------------ expressions
    def node(self, kind: str, op: str = "None", kids: Tuple[int, ...] = (), i: int = 0, f: float = 0.0,
             s: Optional[str] = None) -> int:
        first = len(self.children)
        self.children.extend(kids)
        self.nodes.append(f"{{K::{kind}, O::{op}, {len(kids)}, {first if kids else 0}, {i}, {f!r}, {c_str(s)}}}")
        return len(self.nodes) - 1

    def const(self, v: Any) -> int:
        if v is None:
            return self.node("None")
        if isinstance(v, bool):
            return self.node("Bool", i=int(v))
        if isinstance(v, int):
            return self.node("Int", i=v)
        if isinstance(v, float):
            return self.node("Float", f=v)
        if isinstance(v, str):
            return self.node("Str", s=v)
        if isinstance(v, list):
            return self.node("List", kids=tuple(self.const(x) for x in v))
        raise TableError(f"constant {v!r} of type {type(v).__name__}")

    def expr(self, text: Any, where: str) -> int:
        """A row expression (or a plain YAML number / bool) as a node index."""
        if not isinstance(text, str):
            return self.const(text)
        try:
            tree = ast.parse(text, mode="eval")
        except SyntaxError as e:
            raise TableError(f"{where}: expression {text!r}: {e.msg}") from e
        return self._ev(tree.body, text, where)

    def _ev(self, n: ast.AST, text: str, where: str) -> int:
        def bad(why: str) -> TableError:
            return TableError(f"{where}: expression {text!r}: {why}")

        if isinstance(n, ast.Constant):
            return self.const(n.value)
        if isinstance(n, (ast.List, ast.Tuple)):
            return self.node("List", kids=tuple(self._ev(e, text, where) for e in n.elts))
        if isinstance(n, ast.Name):
            if n.id in ("True", "False", "None"):
                return self.const({"True": True, "False": False, "None": None}[n.id])
            return self.node("Name", s=n.id)
        if isinstance(n, ast.BoolOp):
            return self.node("And" if isinstance(n.op, ast.And) else "Or",
                             kids=tuple(self._ev(v, text, where) for v in n.values))
        if isinstance(n, ast.UnaryOp):
            if isinstance(n.op, ast.Not):
                return self.node("Not", kids=(self._ev(n.operand, text, where),))
            if isinstance(n.op, ast.USub):
                return self.node("Neg", kids=(self._ev(n.operand, text, where),))
            raise bad(f"{type(n.op).__name__} is not allowed")
        if isinstance(n, ast.IfExp):
            return self.node("If", kids=(self._ev(n.test, text, where), self._ev(n.body, text, where),
                                         self._ev(n.orelse, text, where)))
        if isinstance(n, ast.BinOp):
            if type(n.op) not in BINOPS:
                raise bad(f"{type(n.op).__name__} is not allowed")
            return self.node("Bin", BINOPS[type(n.op)], (self._ev(n.left, text, where), self._ev(n.right, text, where)))
        if isinstance(n, ast.Compare):
            # a < b < c is (a < b) and (b < c), as Python evaluates it (our operands have no side effects).
            parts = []
            left = n.left
            for op, right in zip(n.ops, n.comparators):
                if type(op) not in CMPOPS:
                    raise bad(f"{type(op).__name__} is not allowed")
                parts.append(self.node("Cmp", CMPOPS[type(op)], (self._ev(left, text, where), self._ev(right, text, where))))
                left = right
            return parts[0] if len(parts) == 1 else self.node("And", kids=tuple(parts))
        if isinstance(n, ast.Call):
            if not isinstance(n.func, ast.Name) or n.func.id not in FUNCTIONS:
                raise bad(f"unknown function {ast.dump(n.func)}")
            if n.keywords:
                raise bad("keyword arguments are not allowed")
            fn = n.func.id
            if fn in NAME_FIRST and (not n.args or not isinstance(n.args[0], ast.Name)):
                raise bad(f"{fn}()'s first argument must be an argument name")
            arity = {"size": 2, "dims": 3, "view_ok": 2, "flatten_ok": 3, "same_dtype": 2, "ceil_div": 2}.get(fn, 1)
            if len(n.args) != arity:
                raise bad(f"{fn}() takes {arity} argument(s), not {len(n.args)}")
            kids = []
            for k, a in enumerate(n.args):
                if (k == 0 and fn in NAME_FIRST) or (fn == "same_dtype" and k == 1):
                    kids.append(self.node("Name", s=a.id))
                else:
                    kids.append(self._ev(a, text, where))
            return self.node("Call", "".join(w.capitalize() for w in fn.split("_")), tuple(kids))
        raise bad(f"{type(n).__name__} is not allowed")

    def name_list(self, names: List[str]) -> Tuple[int, int]:
        first = len(self.names)
        self.names.extend(names)
        return first, len(names)

    # ------------------------------------------------------------------ rows
    def save_item(self, item: Dict[str, Any], where: str) -> None:
        for key in item:
            if key not in ITEM_KEYS:
                raise TableError(f"{where}: unknown save key {key!r}")
        if ("tensor" in item) == ("new" in item):
            raise TableError(f"{where}: a save item has exactly one of tensor / new")
        shape = dtype = -1
        if "new" in item:
            spec = item["new"]
            if set(spec) != {"shape", "dtype"}:
                raise TableError(f"{where}: new needs shape and dtype")
            s = spec["shape"]
            shape = self.expr(s, where) if isinstance(s, str) else \
                self.node("List", kids=tuple(self.expr(e, where) for e in s))
            d = spec["dtype"]
            dtype = self.const(d) if d in DTYPES else self.expr(d, where)
        when = self.expr(item["when"], where) if "when" in item else -1
        gfirst, gcount = self.name_list(list(item.get("if_grad") or []))
        device = item.get("device")
        if device not in (None, "cpu", "cuda"):
            raise TableError(f"{where}: device {device!r}")
        self.items.append(f"{{{c_str(item.get('tensor'))}, {shape}, {dtype}, {c_str(item.get('name'))}, {when}, "
                          f"{gfirst}, {gcount}, {c_str(device)}}}")

    def case(self, body: Dict[str, Any], when: Any, name: Optional[str], verified: bool, where: str) -> None:
        first = len(self.items)
        for item in body.get("saves") or []:
            self.save_item(item, where)
        strides = self.expr(body["output_strides"], where) if body.get("output_strides") else -1
        w = self.expr(when, where) if when is not None else -1
        self.cases.append(f"{{{w}, {c_str(name)}, {first}, {len(self.items) - first}, {strides}, "
                          f"{'true' if verified else 'false'}}}")

    def row(self, op: str, row: Dict[str, Any]) -> None:
        for key in row:
            if key not in ROW_KEYS:
                raise TableError(f"{op}: unknown key {key!r}")
        if "source" not in row:
            raise TableError(f"{op}: no source (every row cites derivatives.yaml or a decomposition)")
        dfirst, dcount = self.name_list(list(row.get("differentiable") or []))
        ofirst = len(self.outputs)
        for k, o in enumerate(row.get("outputs") or []):
            if set(o) - {"alias", "alias_when"}:
                raise TableError(f"{op}: outputs[{k}] has unknown keys")
            when = self.expr(o["alias_when"], op) if "alias_when" in o else -1
            self.outputs.append(f"{{{c_str(o.get('alias'))}, {when}}}")
        deffirst = len(self.defaults)
        for k, v in (row.get("defaults") or {}).items():
            self.defaults.append(f"{{{c_str(k)}, {self.const(v)}}}")
        cfirst = len(self.cases)
        verified = row.get("verified", True) is not False
        if "cases" in row:
            if "saves" in row:
                raise TableError(f"{op}: both saves and cases")
            for k, case in enumerate(row["cases"]):
                for key in case:
                    if key not in CASE_KEYS:
                        raise TableError(f"{op}: cases[{k}]: unknown key {key!r}")
                self.case(case, case.get("when"), case.get("name"), verified and case.get("verified", True) is not False,
                          f"{op} cases[{k}]")
        else:
            self.case(row, None, None, verified, op)
        self.rows.append(f"{{{c_str(op)}, {dfirst}, {dcount}, {c_str(row.get('alias'))}, {ofirst}, "
                         f"{len(self.outputs) - ofirst}, {deffirst}, {len(self.defaults) - deffirst}, {cfirst}, "
                         f"{len(self.cases) - cfirst}}}")

    def text(self, source: str) -> str:
        def block(decl: str, items: List[str], per_line: int = 1) -> str:
            if not items:
                items = ["{}"]
            lines = []
            for k in range(0, len(items), per_line):
                lines.append("    " + ", ".join(items[k:k + per_line]) + ",")
            return f"{decl} = {{\n" + "\n".join(lines) + "\n};\n"
        out = [f"// Generated by lib/activations/gen_saved_ops.py from {source}. Do not edit:",
               "// change the YAML (the reviewed source, with its citations) and run the script again.",
               f"// {len(self.rows)} operators, {len(self.cases)} cases, {len(self.items)} saved items, "
               f"{len(self.nodes)} expression nodes.",
               "// ExprNode: {kind, op, child count, first child (into kExprChildren), int, float, string}",
               block("const ExprNode kExprNodes[]", self.nodes),
               block("const int32_t kExprChildren[]", [str(c) for c in self.children], 16),
               block("const char* const kNames[]", [c_str(n) for n in self.names], 8),
               "// SaveItem: {tensor, new shape, new dtype, name, when, if_grad first, count, device}",
               block("const SaveItem kSaveItems[]", self.items),
               "// OpCase: {when, name, saves first, count, output_strides, verified}",
               block("const OpCase kCases[]", self.cases),
               "// OutputAlias: {alias, alias_when}",
               block("const OutputAlias kOutputs[]", self.outputs),
               "// Default: {argument, value}",
               block("const Default kDefaults[]", self.defaults),
               "// OpRow: {op, differentiable first, count, alias, outputs first, count, defaults first, count,",
               "//         cases first, count}; sorted by op",
               block("const OpRow kRows[]", self.rows)]
        return "\n".join(out)


def read_table(path: str) -> Dict[str, Any]:
    with open(path) as f:
        doc = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if doc.get("version") != 1:
        raise TableError(f"{path}: version {doc.get('version')!r}, this generator reads version 1")
    return doc


def merged_ops(yaml_path: str, generated_path: Optional[str]) -> Tuple[Dict[str, Any], int, int]:
    """The hand rows over the generated ones (gen_op_rows.py): (ops, hand rows, generated rows used)."""
    hand = read_table(yaml_path)["ops"]
    gen = read_table(generated_path)["ops"] if generated_path else {}
    ops = dict(gen)
    ops.update(hand)
    return ops, len(hand), len(ops) - len(hand)


def generate(yaml_path: str, generated_path: Optional[str] = None) -> Tuple[str, Dict[str, Any]]:
    ops, n_hand, n_gen = merged_ops(yaml_path, generated_path)
    em = Emitter()
    for op in sorted(ops):  # sorted: the C++ side looks rows up by binary search
        em.row(op, ops[op])
    root = os.path.dirname(os.path.dirname(HERE))
    source = os.path.relpath(yaml_path, root).replace(os.sep, "/")
    if generated_path:
        source += f" ({n_hand} rows) over {os.path.relpath(generated_path, root).replace(os.sep, '/')} ({n_gen} rows)"
    return em.text(source), ops


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--yaml", default=DEFAULT_YAML)
    ap.add_argument("--generated", default=DEFAULT_GENERATED,
                    help="the generated rows (gen_op_rows.py) the YAML's rows override; '' for none")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it; exit 1 if stale")
    ap.add_argument("--catalogue", help="op_catalogue.json: exit 1 if an operator it lists has no row")
    args = ap.parse_args()
    try:
        text, ops = generate(args.yaml, args.generated or None)
    except TableError as e:
        print(f"gen_saved_ops.py: {e}", file=sys.stderr)
        return 1
    failed = False
    if args.catalogue:
        with open(args.catalogue) as f:
            used = json.load(f)["ops"]
        missing = sorted(op for op in used if op not in ops)
        for op in missing:
            print(f"MISSING: {op} (used by {', '.join(used[op]['models'])}) has no row in {args.yaml}")
        print(f"{len(used) - len(missing)} of the {len(used)} operators the corpus exports use have a row; "
              f"{len(ops)} rows in all")
        failed |= bool(missing)
    if args.check:
        try:
            with open(args.out) as f:
                committed = f.read()
        except FileNotFoundError:
            committed = ""
        if committed != text:
            print(f"STALE: {args.out} is not what {args.yaml} generates; run "
                  f"python3 lib/activations/gen_saved_ops.py")
            failed = True
        else:
            print(f"{args.out} is up to date")
    else:
        with open(args.out, "w") as f:
            f.write(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
