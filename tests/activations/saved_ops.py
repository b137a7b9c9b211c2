"""Reader and evaluator of saved_ops.yaml: what autograd saves for one operator call.

The reference semantics of the table (the C++ generator must implement the same):

    rows = saved_ops.load("lib/activations/saved_ops.yaml")
    saved = saved_ops.predict(rows["aten.mul.Tensor"], args, outputs, Env(device="cpu"))

`args` maps each argument name of the operator's schema to an `Arg`: a tensor (`TensorMeta`: sizes,
strides, dtype, storage key and storage bytes, requires_grad), a list of tensors, or a plain value
(number, bool, string, list of ints, None). `outputs` are the results' TensorMeta (their storage key
is the input's where the row says the output is an alias). `predict` returns the saved tensors as
`Saved(storage_key, storage_bytes, what)`: the caller counts each storage key once, across the whole
graph (views share their base's storage).

Row semantics (see the header of saved_ops.yaml for the grammar):
1. If no argument listed in `differentiable` requires grad (a tensor requires grad only if it is
   floating point), autograd records nothing: nothing is saved and no output requires grad.
2. Otherwise the first entry of `cases` whose `when` holds is taken (a row without `cases` is one
   case); each of its `saves` items that passes its filters is saved:
   - `if_grad: [a, b]`: only if one of these arguments requires grad (torchgen's guard_for: a saved
     value used by one input's formula only is saved only when that input needs its gradient);
   - `when: EXPR`: only if the expression holds;
   - `tensor: NAME` saves that argument (each element of a list) or output (`result`, `result1`, ...);
     `new: {shape, dtype}` saves a tensor the decomposition creates (a new storage; items of one
     call with the same `name` are one storage).
Outputs require grad iff step 1 recorded the op, except outputs the row marks `nondiff`.
"""
import ast
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
# The table lives beside its C++ generator (lib/activations/gen_saved_ops.py).
DEFAULT_TABLE = os.path.normpath(os.path.join(HERE, "..", "..", "lib", "activations", "saved_ops.yaml"))

ITEMSIZE = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4, "int16": 2,
            "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}
FLOATS = {"float64", "float32", "bfloat16", "float16"}
# What can require grad: floating and complex tensors (view_as_real, polar).
DIFFERENTIABLE_DTYPES = FLOATS | {"complex64", "complex128"}


@dataclass
class TensorMeta:
    sizes: List[int]
    strides: List[int]
    dtype: str
    storage: Any = None          # storage key (same key = same storage)
    storage_bytes: int = 0       # the storage's whole size
    requires_grad: bool = False
    storage_offset: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for s in self.sizes:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * ITEMSIZE[self.dtype]


def span_bytes(sizes: Sequence[int], strides: Sequence[int], dtype: str, offset: int = 0) -> int:
    """Bytes of the smallest storage that holds a tensor of these sizes and strides."""
    if any(s == 0 for s in sizes):
        return 0
    last = offset + sum((s - 1) * st for s, st in zip(sizes, strides))
    return (last + 1) * ITEMSIZE[dtype]


def is_contiguous(t: TensorMeta) -> bool:
    expected = 1
    for size, stride in reversed(list(zip(t.sizes, t.strides))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def viewable_flat(t: TensorMeta) -> bool:
    """Whether t.reshape(-1, t.size(-1)) is a view (torch's computeStride: every dimension before
    the last can be merged with the next one)."""
    dims = [(s, st) for s, st in zip(t.sizes[:-1], t.strides[:-1]) if s != 1]
    if len(t.sizes) < 2:
        return True
    for (s0, st0), (s1, st1) in zip(dims, dims[1:]):
        if st0 != st1 * s1:
            return False
    return True


def compute_stride(sizes: Sequence[int], strides: Sequence[int], shape: Sequence[int]) -> Optional[List[int]]:
    """The strides of `view(shape)` of a tensor, or None where no view exists: a port of
    aten/src/ATen/TensorUtils.cpp: computeStride (`shape` may hold one -1)."""
    numel = math.prod(sizes)
    shape = list(shape)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = numel // known if known else 0
    if math.prod(shape) != numel:
        return None
    if numel == 0 or not sizes:
        return [1] * len(shape) if sizes or numel == 1 else None
    newstride = [0] * len(shape)
    view_d = len(shape) - 1
    chunk_base_stride = strides[-1]
    tensor_numel, view_numel = 1, 1
    for tensor_d in range(len(sizes) - 1, -1, -1):
        tensor_numel *= sizes[tensor_d]
        if tensor_d == 0 or (sizes[tensor_d - 1] != 1 and strides[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or shape[view_d] == 1):
                newstride[view_d] = view_numel * chunk_base_stride
                view_numel *= shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = strides[tensor_d - 1]
                tensor_numel, view_numel = 1, 1
    if view_d != -1:
        return None
    return newstride


def dense_like(sizes: Sequence[int], strides: Sequence[int]) -> List[int]:
    """The strides empty_like gives (preserve_format): the input's own strides if it is dense and
    non-overlapping, else dense strides in the input's dimension order (c10: infer_dense_strides,
    ordering dimensions by stride, size-1 dimensions kept in place)."""
    n = len(sizes)
    perm = sorted(range(n), key=lambda d: (strides[d], -d))  # innermost first
    out = [0] * n
    acc = 1
    for d in perm:
        out[d] = acc
        acc *= max(sizes[d], 1)
    return out


@dataclass
class Arg:
    value: Any  # TensorMeta, list of TensorMeta (None entries allowed), or a plain value

    @property
    def tensors(self) -> List[TensorMeta]:
        if isinstance(self.value, TensorMeta):
            return [self.value]
        if isinstance(self.value, (list, tuple)):
            return [v for v in self.value if isinstance(v, TensorMeta)]
        return []


@dataclass
class Env:
    device: str = "cpu"      # "cpu" or "cuda": the device the step runs on
    sdpa: str = "default"    # "default" (what the device picks) or a backend: math, flash, efficient, cudnn


@dataclass
class Saved:
    storage: Any
    bytes: int
    what: str
    dtype: str = ""


class TableError(Exception):
    pass


def load(path: str = DEFAULT_TABLE, generated: Optional[str] = "beside") -> Dict[str, Dict[str, Any]]:
    """The table as the C++ reads it: the rows of `path` (the hand-written saved_ops.yaml) over the
    generated ones (gen_op_rows.py's saved_ops_generated.yaml, by default the one beside `path`;
    None: the hand rows alone)."""
    if generated == "beside":
        generated = os.path.join(os.path.dirname(path), "saved_ops_generated.yaml")
        if not os.path.exists(generated):
            generated = None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    ops: Dict[str, Dict[str, Any]] = {}
    if generated:
        with open(generated) as f:
            ops.update(yaml.load(f, Loader=loader)["ops"])
    with open(path) as f:
        doc = yaml.load(f, Loader=loader)
    ops.update(doc["ops"])
    for name, row in ops.items():
        for key in row:
            if key not in ("source", "differentiable", "cases", "saves", "outputs", "note", "verified", "alias",
                           "defaults"):
                raise TableError(f"{name}: unknown key {key!r}")
    return ops


# ------------------------------------------------------------------------------------------ expressions

_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare, ast.Eq,
            ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Name, ast.Load, ast.Constant,
            ast.Call, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.List, ast.Tuple, ast.IfExp)


def _tensor(args: Dict[str, Arg], name: str) -> Optional[TensorMeta]:
    a = args.get(name)
    return a.value if a is not None and isinstance(a.value, TensorMeta) else None


def evaluate(expr: Union[str, int, float, bool], args: Dict[str, Arg], outputs: List[TensorMeta], env: Env) -> Any:
    """Evaluates a `when` / shape expression. Names: the operator's non-tensor arguments (their
    values), `device`, `sdpa`. Functions: has(a) (argument given and not None), rg(a) (requires
    grad), dim(a), size(a, i), numel(a), dtype(a), contiguous(a), viewable_flat(a), is_float(a),
    is_number(a) (a Python number where the schema takes a tensor), same_dtype(a, b), ceil_div(x, n)."""
    if not isinstance(expr, str):
        return expr
    tree = ast.parse(expr, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise TableError(f"expression {expr!r}: {type(node).__name__} is not allowed")

    def tensor_of(node) -> Optional[TensorMeta]:
        if not isinstance(node, ast.Name):
            raise TableError(f"expression {expr!r}: function arguments must be names")
        if node.id == "result":
            return outputs[0]
        if node.id.startswith("result") and node.id[6:].isdigit():
            return outputs[int(node.id[6:])]
        return _tensor(args, node.id)

    def ev(node) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, (ast.List, ast.Tuple)):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.Name):
            if node.id == "device":
                return env.device
            if node.id == "sdpa":
                return env.sdpa
            if node.id in ("True", "False", "None"):
                return {"True": True, "False": False, "None": None}[node.id]
            if node.id not in args:
                return None  # an optional argument the call left out
            v = args[node.id].value
            if isinstance(v, TensorMeta):
                raise TableError(f"expression {expr!r}: {node.id} is a tensor; use a function of it")
            return v
        if isinstance(node, ast.BoolOp):
            vals = (ev(v) for v in node.values)
            return all(vals) if isinstance(node.op, ast.And) else any(vals)
        if isinstance(node, ast.UnaryOp):
            v = ev(node.operand)
            return (not v) if isinstance(node.op, ast.Not) else -v
        if isinstance(node, ast.IfExp):
            return ev(node.body) if ev(node.test) else ev(node.orelse)
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.Mult):
                return a * b
            return a // b
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, right_node in zip(node.ops, node.comparators):
                right = ev(right_node)
                ok = {ast.Eq: lambda: left == right, ast.NotEq: lambda: left != right, ast.Lt: lambda: left < right,
                      ast.LtE: lambda: left <= right, ast.Gt: lambda: left > right, ast.GtE: lambda: left >= right,
                      ast.In: lambda: left in right, ast.NotIn: lambda: left not in right}[type(op)]()
                if not ok:
                    return False
                left = right
            return True
        if isinstance(node, ast.Call):
            fn = node.func.id
            if fn == "has":
                name = node.args[0].id
                return name in args and args[name].value is not None
            if fn == "is_number":
                name = node.args[0].id
                return name in args and isinstance(args[name].value, (int, float)) and \
                    not isinstance(args[name].value, bool)
            if fn == "ceil_div":
                x, n = ev(node.args[0]), ev(node.args[1])
                return -(-x // n)
            if fn == "ones":
                return [1] * int(ev(node.args[0]))
            if fn == "len":
                return len(ev(node.args[0]))
            t = tensor_of(node.args[0])
            if fn == "rg":
                if t is None:
                    a = args.get(node.args[0].id)
                    return any(x.requires_grad for x in a.tensors) if a else False
                return t.requires_grad
            if t is None:
                raise TableError(f"expression {expr!r}: {node.args[0].id} is not a tensor here")
            if fn == "dim":
                return len(t.sizes)
            if fn == "size":
                i = ev(node.args[1])
                return t.sizes[i]
            if fn == "numel":
                return t.numel
            if fn == "dtype":
                return t.dtype
            if fn == "contiguous":
                return is_contiguous(t)
            if fn == "viewable_flat":
                return viewable_flat(t)
            if fn == "is_float":
                return t.dtype in FLOATS
            if fn == "same_dtype":
                u = tensor_of(node.args[1])
                return u is not None and u.dtype == t.dtype
            if fn == "shape":
                return list(t.sizes)
            if fn == "dense_like":
                return dense_like(t.sizes, t.strides)
            if fn == "dims":
                return list(t.sizes[ev(node.args[1]):ev(node.args[2])])
            if fn == "view_ok":
                return compute_stride(t.sizes, t.strides, ev(node.args[1])) is not None
            if fn == "flatten_ok":
                n = len(t.sizes)
                if n == 0:
                    return True
                s0, e0 = ev(node.args[1]), ev(node.args[2])
                s0, e0 = s0 % n, e0 % n
                new = t.sizes[:s0] + [math.prod(t.sizes[s0:e0 + 1])] + t.sizes[e0 + 1:]
                return compute_stride(t.sizes, t.strides, new) is not None
            raise TableError(f"expression {expr!r}: unknown function {fn}")
        raise TableError(f"expression {expr!r}: cannot evaluate {type(node).__name__}")

    return ev(tree)


# ------------------------------------------------------------------------------------------ predict

def differentiable_rg(row: Dict[str, Any], args: Dict[str, Arg]) -> bool:
    """Whether autograd records the call: one of the differentiable arguments requires grad."""
    for name in row.get("differentiable", []):
        a = args.get(name)
        if a is not None and any(t.requires_grad and t.dtype in DIFFERENTIABLE_DTYPES for t in a.tensors):
            return True
    return False


def _grad_of(args: Dict[str, Arg], names: Sequence[str]) -> bool:
    return any(any(t.requires_grad for t in args[n].tensors) for n in names if n in args)


def _new_meta(spec: Dict[str, Any], args: Dict[str, Arg], outputs: List[TensorMeta], env: Env) -> Tuple[List[int], str]:
    shape = spec["shape"]
    if isinstance(shape, str):
        sizes = evaluate(shape, args, outputs, env)
    else:
        sizes = [int(evaluate(e, args, outputs, env)) for e in shape]
    dtype = spec["dtype"]
    if dtype not in ITEMSIZE:
        dtype = evaluate(dtype, args, outputs, env)
    return [int(s) for s in sizes], dtype


def select_case(row: Dict[str, Any], args: Dict[str, Arg], outputs: List[TensorMeta], env: Env) -> Dict[str, Any]:
    """The row itself, or the first of its `cases` whose `when` holds."""
    if "cases" not in row:
        return row
    for case in row["cases"]:
        if evaluate(case.get("when", True), args, outputs, env):
            return case
    raise TableError("no case matches")


def output_strides(row: Dict[str, Any], args: Dict[str, Arg], outputs: List[TensorMeta], env: Env) -> Optional[List[int]]:
    """The kernel's output layout where the row's case gives one (`output_strides`), else None."""
    case = select_case(row, args, outputs, env)
    expr = case.get("output_strides")
    return [int(x) for x in evaluate(expr, args, outputs, env)] if expr else None


def predict(row: Dict[str, Any], args: Dict[str, Arg], outputs: List[TensorMeta], env: Env,
            new_key=None) -> List[Saved]:
    """The tensors the call saves (see the module docstring). `new_key(i)` names the storage of the
    i-th new tensor (default: a unique object)."""
    if not differentiable_rg(row, args):
        return []
    body = select_case(row, args, outputs, env)
    out: List[Saved] = []
    n_new = 0
    new_keys: Dict[Any, Any] = {}
    for item in body.get("saves", []) or []:
        if "if_grad" in item and not _grad_of(args, item["if_grad"]):
            continue
        if "device" in item and item["device"] != env.device:
            continue
        if "when" in item and not evaluate(item["when"], args, outputs, env):
            continue
        if "tensor" in item:
            name = item["tensor"]
            if name == "result" or (name.startswith("result") and name[6:].isdigit()):
                t = outputs[0 if name == "result" else int(name[6:])]
                out.append(Saved(t.storage, t.storage_bytes, name, t.dtype))
            else:
                a = args.get(name)
                if a is None:
                    continue
                if is_number_arg(a):
                    # A Python number where the schema takes a Tensor (mul(x, 0.5)): a wrapped
                    # number, which autograd does not save (measured: nothing is packed).
                    continue
                for i, t in enumerate(a.tensors):
                    out.append(Saved(t.storage, t.storage_bytes, name if len(a.tensors) == 1 else f"{name}[{i}]",
                                     t.dtype))
        elif "new" in item:
            # New tensors of one call that share a `name` are one storage (one tensor saved by two
            # of the decomposition's operators, under different conditions).
            sizes, dtype = _new_meta(item["new"], args, outputs, env)
            name = item.get("name")
            if name is None or name not in new_keys:
                new_keys[name if name is not None else len(new_keys)] = new_key(n_new) if new_key else object()
                n_new += 1
            key = new_keys[name if name is not None else len(new_keys) - 1]
            nbytes = math.prod(sizes) * ITEMSIZE[dtype] if sizes else ITEMSIZE[dtype]
            out.append(Saved(key, nbytes, name or "new", dtype))
        else:
            raise TableError(f"save item without tensor/new: {item}")
    return out


def is_number_arg(a: Arg) -> bool:
    return isinstance(a.value, (int, float)) and not isinstance(a.value, bool)


def output_alias(row: Dict[str, Any], index: int = 0) -> Optional[str]:
    """The argument output `index` may alias (views, in-place ops), or None for a new storage;
    `outputs[index].alias_when` says when it does."""
    if row.get("alias"):
        return row["alias"]
    outs = row.get("outputs")
    if outs and index < len(outs):
        return outs[index].get("alias")
    return None


def total_bytes(saved: List[Saved]) -> int:
    seen = {}
    for s in saved:
        seen.setdefault(s.storage, s.bytes)
    return sum(seen.values())
