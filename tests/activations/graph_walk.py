#!/usr/bin/env python3
"""Saved bytes from a .pt2 graph alone, with saved_ops.yaml: a Python model of what the C++ planner
will compute (issue 30), to check the table end to end against the oracles.

Reads models/model.json (stdlib JSON, no torch), walks the nodes in order and, per node:
- binds its arguments by schema name (`inputs[i].name`); arguments the call left out take the
  row's `defaults` (model.json does not write default values);
- tensors: `graph.tensor_values[name]` (sizes, strides, dtype, storage_offset; symbolic sizes are
  evaluated at --dim values or at the traced hint); a placeholder has its own storage; an output
  shares its argument's storage where the row says it aliases it (views, in-place ops, no-op
  `to`/`contiguous`/`reshape`), else a new one;
- requires_grad flows forward: parameters as `tensor_values[...].requires_grad` records them
  (LoRA's frozen base is false), user inputs and buffers false, a node's floating outputs require
  grad iff the row records the call (one of its `differentiable` arguments requires grad); an in-place
  op's `self` takes its output's flag;
- saved storages: saved_ops.predict; each storage counted once, attributed to the innermost module
  (`nn_module_stack`) of the first node that saves it; storages of parameters/buffers and of user
  inputs are counted apart (param_saved_bytes, input_saved_bytes), as saved_oracle.py does.
A node whose operator has no row is reported and counted conservatively: all its tensor arguments.

    python tests/activations/graph_walk.py FILE.pt2 [--device cpu|cuda] [--sdpa default|math|...]
        [--dim NAME=VALUE ...] [--compare ORACLE.json KEY]
"""
import argparse
import json
import math
import os
import re
import sys
import zipfile
from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import saved_ops  # noqa: E402
from saved_ops import Arg, Env, TensorMeta  # noqa: E402

# torch/_export/serde/schema.py: ScalarType
SCALAR_TYPES = {1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float16", 7: "float32",
                8: "float64", 12: "bool", 13: "bfloat16"}


def load_program(path: str) -> Dict[str, Any]:
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/models/model.json"))
        return json.loads(z.read(name))


# ------------------------------------------------------------------------------ symbolic sizes

_SYM = re.compile(r"Symbol\('(\w+)'[^)]*\)")


def eval_expr(expr: str, dims: Dict[str, int]) -> int:
    """A sympy srepr as torch writes it (Symbol, Integer, Add, Mul, Pow, Min, Max, FloorDiv, Mod,
    CeilToInt) at the given symbol values."""
    text = _SYM.sub(lambda m: f"S({m.group(1)!r})", expr)

    def S(name):
        if name not in dims:
            raise KeyError(name)
        return dims[name]

    ns = {"S": S, "Integer": int, "Add": lambda *a: sum(a), "Mul": lambda *a: math.prod(a),
          "Pow": lambda a, b: a ** b, "Min": min, "Max": max, "FloorDiv": lambda a, b: a // b,
          "Mod": lambda a, b: a % b, "CeilToInt": lambda a: math.ceil(a), "IntTrueDiv": lambda a, b: a / b,
          "__builtins__": {}}
    return int(eval(text, ns))  # noqa: S307 - our own archives; names restricted above


def size_of(s: Dict[str, Any], dims: Dict[str, int]) -> int:
    if "as_int" in s:
        return s["as_int"]
    e = s["as_expr"]
    try:
        return eval_expr(e["expr_str"], dims)
    except KeyError:
        hint = e.get("hint") or {}
        if "as_int" in hint:
            return hint["as_int"]
        raise


def symbol_names(prog: Dict[str, Any]) -> Dict[str, Tuple[str, int]]:
    """Each symbol -> (the first user-input dimension that is exactly it, as 'input_ids.1')."""
    g = prog["graph_module"]["graph"]
    out = {}
    for spec in prog["graph_module"]["signature"]["input_specs"]:
        if "user_input" not in spec:
            continue
        name = spec["user_input"]["arg"].get("as_tensor", {}).get("name")
        if not name:
            continue
        for i, s in enumerate(g["tensor_values"][name]["sizes"]):
            m = _SYM.fullmatch(s.get("as_expr", {}).get("expr_str", ""))
            if m and m.group(1) not in out:
                out[m.group(1)] = (f"{name}.{i}", s["as_expr"].get("hint", {}).get("as_int"))
    return out


# ------------------------------------------------------------------------------ the walk

class Walk:
    def __init__(self, prog: Dict[str, Any], table: Dict[str, Any], env: Env, dims: Dict[str, int]):
        self.prog, self.table, self.env, self.dims = prog, table, env, dims
        g = prog["graph_module"]["graph"]
        self.tv = g["tensor_values"]
        self.meta: Dict[str, TensorMeta] = {}
        self.kind: Dict[Any, str] = {}  # storage -> param / buffer / input
        self.next_storage = 0
        self.saved: Dict[Any, Tuple[int, str, str, str]] = {}  # storage -> (bytes, module, dtype, what)
        self.missing: Dict[str, int] = defaultdict(int)
        self.scalars: Dict[str, Any] = {}
        self.restrided: set = set()  # ids of TensorMeta whose strides were derived, not read
        self.producer: Dict[str, str] = {}  # tensor name -> module path of the node that made it
        self.ac_paths: List[str] = []       # checkpointed modules (activation checkpointing)
        self.ac_inputs: Dict[Any, Tuple[int, str, str]] = {}  # storage -> (bytes, module, dtype)
        self.kept_outside: set = set()  # storages saved by a node outside every checkpointed module

    def new_meta(self, name: str, storage=None, storage_bytes=None, rg=False) -> TensorMeta:
        v = self.tv[name]
        sizes = [size_of(s, self.dims) for s in v["sizes"]]
        strides = [size_of(s, self.dims) for s in v["strides"]]
        offset = size_of(v["storage_offset"], self.dims)
        dtype = SCALAR_TYPES.get(v["dtype"], "float32")
        if storage is None:
            storage = ("storage", self.next_storage)
            self.next_storage += 1
            storage_bytes = saved_ops.span_bytes(sizes, strides, dtype, offset)
        m = TensorMeta(sizes, strides, dtype, storage, storage_bytes, rg, offset)
        self.meta[name] = m
        return m

    def placeholders(self) -> None:
        for spec in self.prog["graph_module"]["signature"]["input_specs"]:
            (kind, body), = spec.items()
            arg = body["arg"]
            name = arg.get("name") or arg.get("as_tensor", {}).get("name")
            if not name or name not in self.tv:
                continue
            rg = bool(self.tv[name].get("requires_grad")) if kind == "parameter" else False
            m = self.new_meta(name, rg=rg)
            self.kind[m.storage] = {"parameter": "param", "buffer": "param", "tensor_constant": "param",
                                    "constant_tensor": "param", "user_input": "input"}.get(kind, "input")

    def arg_value(self, a: Dict[str, Any]) -> Any:
        (k, v), = a.items()
        if k == "as_tensor":
            return self.meta[v["name"]]
        if k == "as_tensors":
            return [self.meta[t["name"]] for t in v]
        if k == "as_optional_tensors":
            return [self.meta[t["as_tensor"]["name"]] if "as_tensor" in t else None for t in v]
        if k == "as_optional_tensor":
            return self.meta[v["as_tensor"]["name"]] if "as_tensor" in v else None
        if k == "as_none":
            return None
        if k == "as_scalar_type":
            return SCALAR_TYPES.get(v, str(v))
        if k == "as_sym_int":
            return self.scalars.get(v.get("as_name"), v.get("as_int"))
        if k == "as_sym_ints":
            return [self.scalars.get(x.get("as_name"), x.get("as_int")) for x in v]
        return v

    def run(self) -> None:
        self.placeholders()
        for node in self.prog["graph_module"]["graph"]["nodes"]:
            self.node(node)

    def node(self, node: Dict[str, Any]) -> None:
        target = node["target"]
        op = target[len("torch.ops."):] if target.startswith("torch.ops.") else target
        stack = node.get("metadata", {}).get("nn_module_stack") or ""
        module = _innermost(stack)
        row = self.table.get(op)
        args = {i["name"]: Arg(self.arg_value(i["arg"])) for i in node["inputs"]}
        region = self._ac_region(module)
        if region is not None:
            # A checkpointed module keeps its inputs: tensors made outside it, consumed inside.
            for i in node["inputs"]:
                for tname in _tensor_names(i["arg"]):
                    if self._ac_region(self.producer.get(tname, "")) != region:
                        t = self.meta[tname]
                        if self.kind.get(t.storage, "activation") == "activation":
                            self.ac_inputs.setdefault(t.storage, (t.storage_bytes, region, t.dtype))
        for o in _output_names(node):
            self.producer[o] = module
        if row is not None:
            for k, v in (row.get("defaults") or {}).items():
                args.setdefault(k, Arg(v))
        outputs = _output_names(node)
        if op == "aten.sym_size.int":
            t = args["self"].value
            for o in outputs:
                self.scalars[o] = t.sizes[args["dim"].value]
            return
        if row is None:
            self.missing[op] += 1
            recorded = any(t.requires_grad for a in args.values() for t in a.tensors)
            out_metas = [self.new_meta(o, rg=recorded and SCALAR_TYPES.get(self.tv[o]["dtype"]) in saved_ops.FLOATS)
                         for o in outputs if o in self.tv]
            if recorded:
                for name, a in args.items():
                    for t in a.tensors:
                        self.save(t.storage, t.storage_bytes, module, t.dtype, f"{op}.{name} (no row)")
            return
        recorded = saved_ops.differentiable_rg(row, args)
        out_metas = []
        for i, o in enumerate(outputs):
            if o not in self.tv:
                continue
            alias = saved_ops.output_alias(row, i)
            when = None
            if row.get("outputs") and i < len(row["outputs"]):
                when = row["outputs"][i].get("alias_when")
            is_float = SCALAR_TYPES.get(self.tv[o]["dtype"]) in saved_ops.FLOATS
            rg = recorded and is_float
            src = args.get(alias).value if alias and alias in args else None
            if isinstance(src, TensorMeta) and (when is None or self._eval_alias(when, args, o)):
                m = self.new_meta(o, src.storage, src.storage_bytes, rg)
                if row.get("alias") == "self" and op.split(".")[1].endswith("_") and rg:
                    src.requires_grad = True  # in-place: `self` is the output
            else:
                m = self.new_meta(o, rg=rg)
            out_metas.append(m)
        self.restride(op, row, args, out_metas)
        if not recorded:
            return
        for s in saved_ops.predict(row, args, out_metas, self.env,
                                   new_key=lambda i, n=node["name"]: ("new", n, i)):
            self.save(s.storage, s.bytes, module, s.dtype, f"{op}.{s.what}")

    def restride(self, op: str, row: Dict[str, Any], args: Dict[str, Arg], outs: List[TensorMeta]) -> None:
        """The layout the kernels give, where the graph's recorded strides are not it.

        A fused attention kernel returns the transpose of a [B, L, H, D] buffer, but an export traced on
        the meta device records the math path's contiguous [B, H, L, D] (saved_ops.yaml:
        output_strides). Where an input's strides were so corrected, a view's output strides are
        derived again from them (transpose, permute, view/reshape by computeStride, unsqueeze,
        squeeze, select, slice, expand, alias, split/chunk), so that a later `contiguous` or
        `reshape` is found to be the alias (or the copy) it is on the device."""
        if "output_strides" in str(row.get("cases", "")):
            try:
                st = saved_ops.output_strides(row, args, outs, self.env)
            except Exception:
                st = None
            if st is not None and outs and st != outs[0].strides:
                outs[0].strides = st
                self.restrided.add(id(outs[0]))
            return
        src = args.get("self")
        t = src.value if src is not None else None
        if not isinstance(t, TensorMeta) or id(t) not in self.restrided:
            return
        name = op.split(".")[1]
        for o in outs:
            if o.storage != t.storage:
                continue  # a copy: a new dense tensor, as recorded
            new = _view_strides(name, t, o, args)
            if new is not None:
                o.strides = new
                self.restrided.add(id(o))

    def _eval_alias(self, when: str, args: Dict[str, Arg], out_name: str) -> bool:
        try:
            return bool(saved_ops.evaluate(when, args, [self.meta.get(out_name) or self.new_meta(out_name)], self.env))
        except Exception:
            return False

    def _ac_region(self, module: str) -> Optional[str]:
        for p in self.ac_paths:
            if module == p or module.startswith(p + "."):
                return p
        return None

    def save(self, storage, nbytes: int, module: str, dtype: str, what: str) -> None:
        if storage not in self.saved:
            self.saved[storage] = (nbytes, module, dtype, what)
        if self._ac_region(module) is None:
            self.kept_outside.add(storage)

    def ac_kept_bytes(self) -> Dict[str, int]:
        """With activation checkpointing on `ac_paths`: what stays saved after the forward (storages
        saved outside the checkpointed modules, and the checkpointed modules' inputs, each storage
        once), and the largest saved bytes of one checkpointed module (what its recompute in backward
        saves again, the planner's extra during that module's backward)."""
        kept = {s: v[0] for s, v in self.saved.items()
                if s in self.kept_outside and self.kind.get(s, "activation") == "activation"}
        for s, (b, _, _) in self.ac_inputs.items():
            kept.setdefault(s, b)
        per_region: Dict[str, int] = defaultdict(int)
        for s, (b, module, _, _) in self.saved.items():
            r = self._ac_region(module)
            if r is not None and self.kind.get(s, "activation") == "activation":
                per_region[r] += b
        return {"kept_bytes": sum(kept.values()), "inputs_bytes": sum(v[0] for v in self.ac_inputs.values()),
                "largest_region_bytes": max(per_region.values()) if per_region else 0}

    def summary(self, module_paths: Optional[List[str]] = None) -> Dict[str, Any]:
        modules: Dict[str, Dict[str, int]] = defaultdict(lambda: {"self_bytes": 0, "total_bytes": 0})
        by_dtype: Dict[str, int] = defaultdict(int)
        by_op: Dict[str, int] = defaultdict(int)
        totals = {"activation": 0, "param": 0, "input": 0}
        input_float = 0
        for storage, (nbytes, module, dtype, what) in self.saved.items():
            kind = self.kind.get(storage, "activation")
            totals[kind] += nbytes
            if kind == "input" and dtype in saved_ops.FLOATS:
                input_float += nbytes
            if kind != "activation":
                continue
            modules[module]["self_bytes"] += nbytes
            by_dtype[dtype] += nbytes
            by_op[what] += nbytes
        paths = set(modules)
        for p in list(paths):
            while p:
                p = p.rsplit(".", 1)[0] if "." in p else ""
                paths.add(p)
        out_modules = {}
        for path in paths:
            total = sum(v["self_bytes"] for p, v in modules.items()
                        if p == path or path == "" or p.startswith(path + "."))
            if total:
                out_modules[path] = {"self_bytes": modules[path]["self_bytes"] if path in modules else 0,
                                     "total_bytes": total}
        return {"modules": out_modules, "total_bytes": totals["activation"], "param_saved_bytes": totals["param"],
                "input_saved_bytes": totals["input"], "input_saved_float_bytes": input_float,
                "by_dtype": dict(by_dtype), "by_op": dict(by_op),
                "storages": sum(1 for s in self.saved if self.kind.get(s, "activation") == "activation"),
                "missing_ops": dict(self.missing)}


def _view_strides(name: str, t: TensorMeta, o: TensorMeta, args: Dict[str, Arg]) -> Optional[List[int]]:
    """The strides of view `name` of t (the output's sizes are o's), or None if not derivable."""
    n = len(t.sizes)

    def v(k, default=None):
        a = args.get(k)
        return a.value if a is not None and a.value is not None else default

    st = list(t.strides)
    if name in ("alias", "split", "chunk", "contiguous", "to", "expand_as", "detach"):
        return st if name != "contiguous" else st
    if name == "transpose":
        d0, d1 = v("dim0") % n, v("dim1") % n
        st[d0], st[d1] = st[d1], st[d0]
        return st
    if name == "t":
        return st[::-1]
    if name == "permute":
        return [st[d % n] for d in v("dims")]
    if name in ("view", "reshape", "_unsafe_view", "flatten"):
        return saved_ops.compute_stride(t.sizes, t.strides, o.sizes)
    if name == "unsqueeze":
        d = v("dim") % (n + 1)
        new = st[d] * t.sizes[d] if d < n else 1
        return st[:d] + [new] + st[d:]
    if name == "squeeze":
        d = v("dim") % n if n else 0
        return st[:d] + st[d + 1:] if n and t.sizes[d] == 1 else st
    if name == "select":
        d = v("dim") % n
        return st[:d] + st[d + 1:]
    if name == "slice":
        d = v("dim", 0) % n
        st[d] *= v("step", 1)
        return st
    if name == "expand":
        k = len(o.sizes) - n
        return [0] * k + [0 if (t.sizes[i] == 1 and o.sizes[k + i] != 1) else st[i] for i in range(n)]
    return None


def _innermost(stack: str) -> str:
    """`nn_module_stack` is 'KEY,PATH,CLASS;KEY,PATH,CLASS;...' (commas inside brackets belong to
    the key); the innermost module is the last entry's PATH."""
    if not stack:
        return ""
    last = stack.split(";")[-1]
    parts, depth, cur = [], 0, ""
    for c in last:
        if c in "[(":
            depth += 1
        elif c in ")]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return parts[1] if len(parts) > 1 else ""


def module_paths_of_classes(prog: Dict[str, Any], classes: List[str]) -> set:
    """Paths of the modules whose class (the last dotted part of nn_module_stack's CLASS) is one of
    `classes`."""
    out = set()
    for node in prog["graph_module"]["graph"]["nodes"]:
        for entry in (node.get("metadata", {}).get("nn_module_stack") or "").split(";"):
            parts = _split_entry(entry)
            if len(parts) == 3 and parts[2].rsplit(".", 1)[-1] in classes:
                out.add(parts[1])
    return out


def _split_entry(entry: str) -> List[str]:
    parts, depth, cur = [], 0, ""
    for c in entry:
        if c in "[(":
            depth += 1
        elif c in ")]":
            depth -= 1
        if c == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += c
    parts.append(cur)
    return parts


def _tensor_names(arg: Dict[str, Any]) -> List[str]:
    (k, v), = arg.items()
    if k == "as_tensor":
        return [v["name"]]
    if k == "as_tensors":
        return [t["name"] for t in v]
    if k == "as_optional_tensors":
        return [t["as_tensor"]["name"] for t in v if "as_tensor" in t]
    if k == "as_optional_tensor" and "as_tensor" in v:
        return [v["as_tensor"]["name"]]
    return []


def _output_names(node: Dict[str, Any]) -> List[str]:
    out = []
    for o in node["outputs"]:
        if "as_tensor" in o:
            out.append(o["as_tensor"]["name"])
        elif "as_tensors" in o:
            out.extend(t["name"] for t in o["as_tensors"])
        elif "as_sym_int" in o:
            out.append(o["as_sym_int"].get("as_name"))
        elif "as_optional_tensors" in o:
            out.extend(t["as_tensor"]["name"] for t in o["as_optional_tensors"] if "as_tensor" in t)
    return out


def fsdp1_flat_requires_grad(prog: Dict[str, Any], unit_paths: List[str]) -> int:
    """FSDP1 flattens each unit's parameters into one FlatParameter; with use_orig_params a unit that
    mixes frozen and trainable parameters has a FlatParameter that requires grad, and the original
    parameters are its views: autograd then treats the frozen ones as requiring grad too (measured:
    LoRA llama under FSDP1 saves 105,356 B, the walk with every layer parameter trainable 105,356 B,
    without 76,684 B). Marks the parameters of such units (the root owns the rest) as requiring
    grad in `prog`; returns how many it changed."""
    tv = prog["graph_module"]["graph"]["tensor_values"]
    params = [(s["parameter"]["parameter_name"], s["parameter"]["arg"]["name"])
              for s in prog["graph_module"]["signature"]["input_specs"] if "parameter" in s]
    units = sorted(unit_paths, key=len, reverse=True)

    def unit_of(fqn: str) -> str:
        return next((u for u in units if fqn.startswith(u + ".")), "")
    trainable_units = {unit_of(f) for f, n in params if tv[n].get("requires_grad")}
    changed = 0
    for f, n in params:
        if unit_of(f) in trainable_units and not tv[n].get("requires_grad"):
            tv[n]["requires_grad"] = True
            changed += 1
    return changed


def walk(path: str, device: str = "cpu", sdpa: str = "default", dims: Optional[Dict[str, int]] = None,
         table: Optional[Dict[str, Any]] = None, ac_classes: Optional[List[str]] = None,
         fsdp1_units: Optional[List[str]] = None) -> Dict[str, Any]:
    """ac_classes: class names whose module calls are checkpointed (their nn_module_stack entries);
    the result then has "ac": Walk.ac_kept_bytes(). fsdp1_units: class names of FSDP1 units
    (use_orig_params): parameters of units that mix frozen and trainable ones count as trainable
    (fsdp1_flat_requires_grad)."""
    prog = load_program(path)
    if fsdp1_units:
        fsdp1_flat_requires_grad(prog, sorted(module_paths_of_classes(prog, fsdp1_units)))
    names = symbol_names(prog)
    resolved: Dict[str, int] = {}
    for k, v in (dims or {}).items():
        # A symbol (s38), or a user-input dimension ('input_ids.1'), or batch/seq for input_ids 0/1.
        alias = {"batch": "input_ids.0", "seq": "input_ids.1"}.get(k, k)
        sym = next((s for s, (where, _) in names.items() if where == alias), k)
        resolved[sym] = v
    w = Walk(prog, table or saved_ops.load(), Env(device=device, sdpa=sdpa), resolved)
    if ac_classes:
        w.ac_paths = sorted(module_paths_of_classes(prog, ac_classes))
    w.run()
    res = w.summary()
    if ac_classes:
        res["ac"] = w.ac_kept_bytes()
    res["symbols"] = {s: {"dim": where, "hint": hint, "value": resolved.get(s, hint)} for s, (where, hint) in names.items()}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pt2")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--sdpa", default="default", choices=["default", "math", "flash", "efficient", "cudnn"])
    ap.add_argument("--dim", action="append", default=[], help="NAME=VALUE (a symbol, batch, seq)")
    ap.add_argument("--compare", nargs=2, metavar=("ORACLE_JSON", "KEY"))
    args = ap.parse_args()
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
    res = walk(args.pt2, args.device, args.sdpa, dims)
    if args.compare:
        with open(args.compare[0]) as f:
            ref = json.load(f)["cases"][args.compare[1]]
        print(f"graph {res['total_bytes']}, oracle {ref['total_bytes']} "
              f"({(res['total_bytes'] - ref['total_bytes']) / ref['total_bytes']:+.2%})")
        for p in sorted(set(ref["modules"]) | set(res["modules"])):
            a = res["modules"].get(p, {}).get("total_bytes", 0)
            b = ref["modules"].get(p, {}).get("total_bytes", 0)
            if a != b:
                print(f"  {p!r}: graph {a}, oracle {b}")
    else:
        print(json.dumps(res, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
