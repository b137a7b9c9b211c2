#!/usr/bin/env python3
"""Generate saved_ops_generated.yaml: a row for every ATen operator, from the installed torch's own
autograd metadata (torchgen), so that no operator of an export is unknown to the activation walk.

    python lib/activations/gen_op_rows.py            # rewrite lib/activations/saved_ops_generated.yaml
    python lib/activations/gen_op_rows.py --check    # exit 1 when the committed file is stale

Needs the project's venv (torch ships torchgen, with packaged/autograd/derivatives.yaml and
packaged/ATen/native/native_functions.yaml). The hand-written saved_ops.yaml OVERRIDES these rows
(gen_saved_ops.py merges the two): its rows encode what the metadata cannot (reshape's view_ok,
SDPA's kernels, dropout's cases, the decompositions of composite operators).

How a row is made (mirroring what the generated VariableType.cpp does at run time):
- Operators with a derivatives.yaml entry (matched as torchgen's match_differentiability_info does:
  an in-place or generated variant uses its functional entry): `differentiable` is the entry's
  args_with_derivatives; `saves` its all_saved_inputs and all_saved_outputs that are tensors
  (load_derivatives.saved_variables turns `self.sym_sizes()`, `self.options()`, `zeros_like(self)`,
  `self.scalar_type()`, ... into non-tensor attributes: sizes are not tensors and are not counted);
  each with the guard gen_variable_type.py's guard_for puts on it (`if_grad`: saved only when that
  input needs its gradient, including wrap_opt_if(x, grad_input_mask[i] || ...)). An in-place
  operator that saves `self` saves a clone of the original (gen_variable_type: original_self =
  self.clone()): a new tensor of self's shape and dtype. No differentiable output
  (output_differentiability all False) or no argument with a derivative: nothing is recorded.
- Views and in-place operators: an output whose schema annotation is `Tensor(a)` (native_functions.yaml)
  aliases the argument annotated `(a)` / `(a!)`.
- Operators in gen_variable_type's DONT_REQUIRE_DERIVATIVE (new_empty, zeros_like, argmax, isnan,
  ...), factories (no tensor argument: eye, arange, ...) and operators returning no tensor: nothing
  recorded.
- Operators without an entry and with their own kernels (bitwise_not, ...): autograd records a
  NotImplemented node when a float argument requires grad (its backward raises) and saves nothing.
- CompositeImplicitAutograd operators without an entry decompose, at dispatch, into operators that
  have one. Those whose outputs are schema views (numpy_T, broadcast_to, expand_as, ...) are
  compositions of views and save nothing. A few common ones are given from their decomposition
  (COMPOSITE below, each citing it). The rest are listed under `reasons` (composite: what they save
  depends on the decomposition's path); the walk counts such an operator, where an export keeps it,
  as saving all its inputs (a warning names it), and a hand row in saved_ops.yaml can replace that.
- out= variants and foreach operators get no row: autograd refuses out= calls, and the foreach
  operators run in the optimizer step, not in the forward graph.
"""
import argparse
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

import yaml

import torch
import torchgen
from torchgen import local
from torchgen.api import cpp
from torchgen.api.autograd import gen_differentiable_outputs, match_differentiability_info
from torchgen.api.types import BaseCType, tensorT
from torchgen.gen import get_grouped_by_view_native_functions, parse_native_yaml
from torchgen.model import NativeFunction, SchemaKind
from torchgen.packaged.autograd.gen_inplace_or_view_type import is_tensor_list_type
from torchgen.packaged.autograd.gen_variable_type import DONT_REQUIRE_DERIVATIVE
from torchgen.packaged.autograd.load_derivatives import load_derivatives
from torchgen.utils import concatMap

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "saved_ops_generated.yaml")
TG = os.path.dirname(torchgen.__file__)
DERIVATIVES = os.path.join(TG, "packaged", "autograd", "derivatives.yaml")
NATIVE = os.path.join(TG, "packaged", "ATen", "native", "native_functions.yaml")
TAGS = os.path.join(TG, "packaged", "ATen", "native", "tags.yaml")

# CompositeImplicitAutograd operators without a derivatives.yaml entry, given from their
# decomposition (aten/src/ATen/native/*.cpp): what they save is what the operators they call save.
COMPOSITE: Dict[str, Dict[str, Any]] = {
    "aten.type_as.default": {
        "differentiable": ["self"],
        "outputs": [{"alias": "self", "alias_when": "dtype(self) == dtype(other)"}],
        "saves": [],
        "source": "CompositeImplicit type_as (TensorConversions.cpp): self.to(other.options()): self when the "
                  "dtype is other's, else _to_copy (derivatives.yaml _to_copy: _to_copy_backward(grad, "
                  "self.options()): no tensor saved)",
    },
    "aten.argsort.default": {
        "differentiable": ["self"],
        "saves": [{"tensor": "result"}],
        "source": "CompositeImplicit argsort (Sorting.cpp): std::get<1>(sort(self, dim, descending)); sort saves "
                  "its indices (derivatives.yaml sort: value_selecting_reduction_backward_symint(grad, dim, "
                  "indices, ...)), which are argsort's result",
    },
    "aten.argsort.stable": {
        "differentiable": ["self"],
        "saves": [{"tensor": "result"}],
        "source": "CompositeImplicit argsort.stable -> sort.stable (saves its indices: argsort's result)",
    },
    "aten.max_pool2d.default": {
        "differentiable": ["self"],
        "saves": [{"tensor": "self"}, {"new": {"shape": "shape(result)", "dtype": "int64"}, "name": "indices"}],
        "source": "CompositeImplicit max_pool2d (MaxPooling.cpp) -> max_pool2d_with_indices when self requires grad "
                  "(derivatives.yaml max_pool2d_with_indices: max_pool2d_with_indices_backward(grad, self, ..., "
                  "result1): self and the int64 indices, the output's shape)",
    },
    "aten.square.default": {
        "differentiable": ["self"],
        "saves": [{"tensor": "self"}],
        "source": "CompositeImplicit square (UnaryOps.cpp): at::pow(self, 2) (derivatives.yaml pow.Tensor_Scalar: "
                  "pow_backward(grad, self, exponent))",
    },
}

# CompositeImplicitAutograd operators that only call another operator with the same arguments
# (aten/src/ATen/native/*.cpp: `return at::OTHER(...)`): the other's row.
ALIAS_OF = {
    "multiply.Tensor": "mul.Tensor", "multiply_.Tensor": "mul_.Tensor", "divide.Tensor": "div.Tensor",
    "divide_.Tensor": "div_.Tensor", "divide.Tensor_mode": "div.Tensor_mode", "true_divide.Tensor": "div.Tensor",
    "true_divide_.Tensor": "div_.Tensor", "subtract.Tensor": "sub.Tensor", "subtract_.Tensor": "sub_.Tensor",
    "negative.default": "neg.default", "negative_.default": "neg_.default", "absolute.default": "abs.default",
    "absolute_.default": "abs_.default", "clip.default": "clamp.default", "clip.Tensor": "clamp.Tensor",
    "clip_.default": "clamp_.default", "clip_.Tensor": "clamp_.Tensor", "fix.default": "trunc.default",
    "fix_.default": "trunc_.default", "arccos.default": "acos.default", "arcsin.default": "asin.default",
    "arctan.default": "atan.default", "arccosh.default": "acosh.default", "arcsinh.default": "asinh.default",
    "arctanh.default": "atanh.default", "arctan2.default": "atan2.default", "special_expit.default": "sigmoid.default",
    "special_erf.default": "erf.default", "special_erfc.default": "erfc.default",
    "special_exp2.default": "exp2.default",
    "special_expm1.default": "expm1.default", "special_log1p.default": "log1p.default",
    "special_psi.default": "digamma.default", "special_digamma.default": "digamma.default",
    "special_gammaln.default": "lgamma.default",
    "greater.Tensor": "gt.Tensor", "greater.Scalar": "gt.Scalar", "greater_equal.Tensor": "ge.Tensor",
    "greater_equal.Scalar": "ge.Scalar", "less.Tensor": "lt.Tensor", "less.Scalar": "lt.Scalar",
    "less_equal.Tensor": "le.Tensor", "less_equal.Scalar": "le.Scalar", "not_equal.Tensor": "ne.Tensor",
    "not_equal.Scalar": "ne.Scalar", "concat.default": "cat.default", "concatenate.default": "cat.default",
}

# Operators given no row, and why (their outputs break the generator's rules).
EXCLUDED = {
    "aten._foobar.default": "a test operator (returns its input, no alias annotation)",
    "aten.dequantize.self": "quantization: on a float tensor it returns the tensor itself (no alias annotation)",
    "aten.lift.default": "export-internal (lifts a tensor into a tracing mode): returns its input",
    "aten.set.source_Tensor": "storage swap: the output shares `source`'s storage",
    "aten.set_.default": "storage swap: the output gets a new empty storage",
    "aten.set_.source_Tensor": "storage swap: the output shares `source`'s storage",
    "aten.set_.source_Storage": "storage swap: the output shares the given storage",
    "aten.set_.source_Storage_storage_offset": "storage swap: the output shares the given storage",
    "aten.set_.source_Tensor_storage_offset": "storage swap: the output shares `source`'s storage",
    "aten.resize_as_.default": "autograd refuses to resize a tensor that requires grad",
}


def op_name(f: NativeFunction) -> str:
    name = f.func.name
    return f"aten.{name.name}.{name.overload_name or 'default'}"


def tensor_args(f: NativeFunction) -> List[str]:
    return [a.name for a in f.func.arguments.flat_all if a.type.is_tensor_like()]


def output_aliases(f: NativeFunction) -> Tuple[Optional[str], Optional[List[Dict[str, str]]]]:
    """(row alias, per-output aliases) from the schema's alias annotations: a return `Tensor(a)` or
    `Tensor(a!)` is a view of (or is) the argument annotated with the same alias set."""
    by_set = {}
    for a in f.func.arguments.flat_all:
        if a.annotation is not None:
            for s in a.annotation.alias_set:
                by_set.setdefault(s, a.name)
    per = []
    for r in f.func.returns:
        src = None
        if r.annotation is not None:
            for s in r.annotation.alias_set:
                src = by_set.get(s, src)
        per.append(src)
    if not per or all(p is None for p in per):
        return None, None
    if all(p == per[0] for p in per):
        return per[0], None
    return None, [{"alias": p} if p else {} for p in per]


def result_name(f: NativeFunction, name: str) -> Optional[str]:
    """The row's name of a saved output (`result`, `result1`, ...) from derivatives.yaml's name."""
    names = cpp.return_names(f)
    if name in names:
        i = names.index(name)
        return "result" if i == 0 else f"result{i}"
    m = re.fullmatch(r"result(\d*)", name)
    if m:
        return name
    return None


def guard(info, arg, awd: List[str], has_tensorlist: bool) -> Optional[List[str]]:
    """gen_variable_type.py: guard_for, as the argument names whose gradient the save waits for."""
    if has_tensorlist or "backward" in info.name or len(awd) <= 1:
        return None
    if arg.nctype.type != BaseCType(tensorT):
        return None
    used_in = [d for d in info.derivatives if arg in d.saved_inputs]
    if len(used_in) != 1:
        return None
    d = used_in[0]
    if len(d.var_names) != 1:
        m = re.search(rf"wrap_opt_if\({re.escape(str(arg.nctype.name))},(.*?)\)", d.formula)
        if m is None:
            return None
        cond = m.group(1).strip()
        idx = re.findall(r"grad_input_mask\[(\d+)\]", cond)
        if re.sub(r"grad_input_mask\[\d+\]|\|\||\s", "", cond):
            return None  # not a plain OR of masks: kept unguarded (saves at least as much)
        # torchgen rewrites grad_input_mask[k] to should_compute_output(k): edge k.
        return [awd[int(k)] for k in idx]
    return [d.var_names[0]]


def derivative_row(f: NativeFunction, fn, info) -> Dict[str, Any]:
    inplace = f.func.kind() == SchemaKind.inplace
    awd = [b.name for b in info.args_with_derivatives]
    row: Dict[str, Any] = {}
    alias, per = output_aliases(f)
    outs = gen_differentiable_outputs(fn, "Default")
    if not awd or not outs or info.name in DONT_REQUIRE_DERIVATIVE:
        row["differentiable"] = []
        row["saves"] = []
        row["source"] = f"derivatives.yaml {info.name}: no differentiable " + \
            ("output" if awd else "argument")
    else:
        row["differentiable"] = awd
        has_tl = any(is_tensor_list_type(b.argument.type) for b in info.args_with_derivatives)
        saves = []
        for sa in sorted(info.all_saved_inputs, key=lambda s: str(s.nctype.name)):
            name = str(sa.nctype.name)
            if not _is_tensor_ctype(sa.nctype.type):
                continue
            if sa.expr != name:
                continue  # a value computed at save time (sizes, options): not a tensor
            item: Dict[str, Any]
            if name == "self" and inplace:
                item = {"new": {"shape": "shape(self)", "dtype": "dtype(self)"}, "name": "original_self"}
            else:
                item = {"tensor": name}
            g = guard(info, sa, awd, has_tl)
            if g:
                item["if_grad"] = g
            saves.append(item)
        for sa in sorted(info.all_saved_outputs, key=lambda s: str(s.nctype.name)):
            if not _is_tensor_ctype(sa.nctype.type):
                continue
            rn = result_name(f, str(sa.nctype.name))
            if rn is None:
                raise SystemExit(f"gen_op_rows.py: {op_name(f)}: saved output {sa.nctype.name} is no return")
            saves.append({"tensor": rn})
        row["saves"] = saves
        row["source"] = f"derivatives.yaml {info.name} ({str(info.func.func.name)})"
    if alias:
        row["alias"] = alias
    elif per:
        row["outputs"] = per
    return row


def _is_tensor_ctype(t) -> bool:
    """A saved attribute that holds tensors (a tensor, an optional one, a list); not sizes, options,
    TensorGeometry or TypeAndSize."""
    s = t.cpp_type()
    return bool(re.search(r"\bat::Tensor\b|TensorList|ITensorListRef", s))


def rows_and_reasons() -> Tuple[Dict[str, Dict[str, Any]], Dict[str, str], Dict[str, Any]]:
    infos, _ = load_derivatives(DERIVATIVES, NATIVE, TAGS)
    funcs = parse_native_yaml(NATIVE, TAGS).native_functions
    grouped = get_grouped_by_view_native_functions(funcs)
    funcs = concatMap(lambda g: [g] if isinstance(g, NativeFunction) else list(g.functions(include_copy=True)),
                      grouped)
    matched = match_differentiability_info(funcs, infos)
    rows: Dict[str, Dict[str, Any]] = {}
    reasons: Dict[str, str] = {}
    pending_alias: Dict[str, str] = {}
    counts = {"derivatives": 0, "views": 0, "not_differentiable": 0, "not_implemented": 0, "composite": 0,
              "composite_reason": 0}
    for fn in matched:
        f = fn.func
        name = op_name(f)
        kind = f.func.kind()
        if kind == SchemaKind.out or kind == SchemaKind.scratch:
            continue  # autograd refuses out= calls
        if str(f.func.name.name).startswith("_foreach_"):
            reasons[name] = "foreach: an optimizer-step operator on tensor lists, not in a forward graph"
            continue
        if name in EXCLUDED:
            reasons[name] = EXCLUDED[name]
            continue
        info = (fn.info or {}).get("Default")
        # A CompositeImplicitAutograd kernel is what the Autograd key runs on dense tensors (its
        # derivatives.yaml entry, if any, serves other dispatch keys: linear -> MmBackward0).
        if info is not None and not f.has_composite_implicit_autograd_kernel:
            with local.parametrize(use_const_ref_for_mutable_tensors=f.use_const_ref_for_mutable_tensors,
                                   use_ilistref_for_tensor_lists=f.part_of_structured_group):
                rows[name] = derivative_row(f, fn, info)
            counts["derivatives" if rows[name]["differentiable"] else "not_differentiable"] += 1
            continue
        if fn.info and not f.has_composite_implicit_autograd_kernel:
            reasons[name] = "derivatives.yaml gives only dispatch-key formulas (" + ", ".join(fn.info) + ")"
            continue
        alias, per = output_aliases(f)
        base = str(f.func.name.name.base)
        no_tensor_out = not any(r.type.is_tensor_like() for r in f.func.returns)
        dont = base in DONT_REQUIRE_DERIVATIVE or str(f.func.name.name) in DONT_REQUIRE_DERIVATIVE
        if name in COMPOSITE:
            rows[name] = COMPOSITE[name]
            counts["composite"] += 1
        elif name[5:] in ALIAS_OF:
            pending_alias[name] = ALIAS_OF[name[5:]]
            continue
        elif not tensor_args(f) or no_tensor_out or (dont and not f.has_composite_implicit_autograd_kernel):
            why = "DONT_REQUIRE_DERIVATIVE (gen_variable_type.py)" if dont else \
                "no tensor argument (a factory)" if not tensor_args(f) else "no tensor output"
            rows[name] = {"differentiable": [], "saves": [], "source": f"not differentiable: {why}"}
            counts["not_differentiable"] += 1
        elif f.has_composite_implicit_autograd_kernel:
            if (alias or per) and kind == SchemaKind.functional:
                rows[name] = {"differentiable": [a for a in tensor_args(f)], "saves": [],
                              "source": "CompositeImplicit view (native_functions.yaml: returns Tensor(a)): "
                                        "a composition of views, which save no tensor"}
                counts["views"] += 1
            else:
                reasons[name] = "composite: CompositeImplicitAutograd, decomposes at dispatch into operators " \
                                "with rows; what it saves depends on the decomposition's path"
                counts["composite_reason"] += 1
                continue
        else:
            rows[name] = {"differentiable": tensor_args(f), "saves": [],
                          "source": "no derivatives.yaml entry: autograd records NotImplemented (its backward "
                                    "raises), saves nothing"}
            counts["not_implemented"] += 1
        if alias and "alias" not in rows[name] and "outputs" not in rows[name]:
            rows[name]["alias"] = alias
        elif per and "alias" not in rows[name] and "outputs" not in rows[name]:
            rows[name]["outputs"] = per
    for name, target in pending_alias.items():
        t = rows.get("aten." + target)
        if t is None:
            reasons[name] = f"composite: calls aten.{target}, which has no generated row"
            continue
        rows[name] = dict(t, source=f"CompositeImplicit {name[5:]}: calls aten.{target} with the same arguments; "
                                    f"its row ({t['source']})")
        counts["composite"] += 1
    return rows, reasons, counts


def derivative_entries() -> List[str]:
    """The operator of every `- name:` entry of the installed derivatives.yaml (aten.NAME.OVERLOAD)."""
    with open(DERIVATIVES) as f:
        defs = yaml.safe_load(f)
    out = []
    for d in defs:
        sig = d["name"]
        head = sig.split("(", 1)[0].strip()
        name, _, overload = head.partition(".")
        out.append(f"aten.{name}.{overload or 'default'}")
    return out


def text() -> str:
    rows, reasons, counts = rows_and_reasons()
    header = (
        f"# Generated by lib/activations/gen_op_rows.py from torch {torch.__version__}'s torchgen\n"
        "# (packaged/autograd/derivatives.yaml, packaged/ATen/native/native_functions.yaml). Do not edit:\n"
        "# saved_ops.yaml's hand rows override these (gen_saved_ops.py merges the two); the grammar is\n"
        "# saved_ops.yaml's. `reasons` lists the operators that get no row, and why.\n"
        f"# {len(rows)} rows: {counts['derivatives']} from derivatives.yaml, {counts['views']} composite views, "
        f"{counts['composite']} composite decompositions,\n# {counts['not_differentiable']} not differentiable, "
        f"{counts['not_implemented']} without a formula (NotImplemented); {len(reasons)} reasons "
        f"({counts['composite_reason']} composite, "
        f"{sum(1 for r in reasons.values() if r.startswith('foreach'))} foreach).\n")
    doc = {"version": 1, "torch": torch.__version__.split("+")[0], "ops": dict(sorted(rows.items()))}
    return header + yaml.safe_dump(doc, sort_keys=False, width=200, default_flow_style=None) + \
        yaml.safe_dump({"reasons": dict(sorted(reasons.items()))}, sort_keys=False, width=200, default_flow_style=False)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="exit 1 if --out is not what the installed torch generates")
    args = ap.parse_args()
    t = text()
    if args.check:
        try:
            with open(args.out) as f:
                same = f.read() == t
        except FileNotFoundError:
            same = False
        print(f"{args.out} is up to date" if same else
              f"STALE: {args.out} is not what torch {torch.__version__} generates; run lib/activations/gen_op_rows.py")
        return 0 if same else 1
    with open(args.out, "w") as f:
        f.write(t)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
