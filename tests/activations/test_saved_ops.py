#!/usr/bin/env python3
"""saved_ops.yaml against autograd itself, one operator call at a time.

1. Coverage: every operator of every export in EXPORTS_DIR (make_exports.py) must have a row
   (fails when the table loses a row the corpus uses).
2. Correctness: each export's graph (ep.module()) is run once without grad on its real inputs, which
   records every call's real argument values; the distinct calls (operator, argument sizes,
   strides, dtypes and non-tensor values) are then replayed one by one, with fresh copies of their
   tensor arguments, under `torch.autograd.graph.saved_tensors_hooks`, for every combination of
   which floating-point tensor arguments require grad (a tensor list counts as one). The bytes of
   the distinct storages autograd packs must equal the table's prediction (saved_ops.predict)
   exactly, and so must the number of storages; where the table says an output aliases an
   argument (views, in-place ops), the output's storage must be that argument's, and otherwise a
   new one. Every call is checked with the SDPA default of the CPU and again under
   `sdpa_kernel(SDPBackend.MATH)` (Env(sdpa="math")).
3. Rows no export uses (SYNTHETIC below: conv1d, group/batch norm, rms_norm, bmm, matmul,
   index_select, scatter_add, one_hot, SDPA with dropout, ...) are checked on hand-made calls.

    python tests/activations/test_saved_ops.py EXPORTS_DIR [-k OP_SUBSTRING] [-v] [--max-per-op N]

Exits 1 on any failure. Plain asserts-and-prints, no test framework.
"""
import argparse
import itertools
import json
import os
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.fx  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import actmodels  # noqa: E402
import op_catalogue  # noqa: E402
import saved_ops  # noqa: E402
from saved_ops import Arg, Env, TensorMeta  # noqa: E402

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
               torch.float64: "float64", torch.int64: "int64", torch.int32: "int32", torch.bool: "bool",
               torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16", torch.complex64: "complex64",
               torch.complex128: "complex128"}


def op_key(target) -> str:
    return op_catalogue.op_name(f"torch.ops.{target}") if isinstance(target, torch._ops.OpOverload) else str(target)


# ----------------------------------------------------------------------------------------- capture

class _Capture(torch.fx.Interpreter):
    def __init__(self, gm, sink):
        super().__init__(gm)
        self.sink = sink

    def call_function(self, target, args, kwargs):
        out = super().call_function(target, args, kwargs)
        if isinstance(target, torch._ops.OpOverload):
            self.sink.append((target, args, kwargs))
        return out


def capture_calls(path: str, entry: Dict[str, Any]) -> List[Tuple[Any, tuple, dict]]:
    ep = torch.export.load(path)
    gm = ep.module()
    dtype = torch.bfloat16 if entry["dtype"] == "bfloat16" else torch.float32
    ref = actmodels.build(entry["model"], "cpu", dtype)
    kwargs = actmodels.inputs(entry["model"], ref, entry["batch"], entry["seq"])
    calls: List[Tuple[Any, tuple, dict]] = []
    torch.manual_seed(0)
    with torch.no_grad():
        _Capture(gm, calls).run(*[kwargs[n.name] for n in gm.graph.nodes if n.op == "placeholder"])
    return calls


def signature(target, args, kwargs) -> tuple:
    def sig(v):
        if isinstance(v, torch.Tensor):
            return ("T", tuple(v.shape), tuple(v.stride()), str(v.dtype))
        if isinstance(v, (list, tuple)):
            return tuple(sig(x) for x in v)
        return repr(v)
    return (str(target), sig(args), tuple(sorted((k, sig(v)) for k, v in kwargs.items())))


# ----------------------------------------------------------------------------------------- replay

def bind(target, args, kwargs) -> Dict[str, Any]:
    """Schema argument name -> value, defaults filled in (as the graph's reader will see them:
    model.json lists the arguments the call passed; the schema gives the rest)."""
    out = {}
    for i, a in enumerate(target._schema.arguments):
        if i < len(args):
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
    return out


def fresh_tensor(t: torch.Tensor) -> torch.Tensor:
    """A copy with its own storage and the same sizes and strides (expanded dims keep stride 0: the
    values are written through the non-overlapping part)."""
    x = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
    src, dst = t, x
    for d, (size, stride) in enumerate(zip(t.shape, t.stride())):
        if stride == 0 and size > 1:
            src, dst = src.narrow(d, 0, 1), dst.narrow(d, 0, 1)
    with torch.no_grad():
        dst.copy_(src)
    return x


def meta(t: torch.Tensor) -> TensorMeta:
    st = t.untyped_storage()
    return TensorMeta(list(t.shape), list(t.stride()), DTYPE_NAMES[t.dtype], st._cdata, st.nbytes(),
                      t.requires_grad, t.storage_offset())


def can_grad(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def float_units(bound: Dict[str, Any]) -> List[str]:
    """Arguments that can be made to require grad: floating tensors, or lists holding one."""
    out = []
    for name, v in bound.items():
        if isinstance(v, torch.Tensor) and can_grad(v):
            out.append(name)
        elif isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) and can_grad(x) for x in v):
            out.append(name)
    return out


def build_args(bound: Dict[str, Any], rg: Dict[str, bool], inplace: bool) -> Dict[str, Any]:
    """Fresh copies (one per distinct source tensor, so aliasing among the arguments is kept);
    requires_grad where `rg` says; an in-place op's `self` that requires grad is a clone of a leaf
    (a leaf that requires grad cannot be modified in place)."""
    memo: Dict[Tuple[int, bool], torch.Tensor] = {}

    def conv(name, v):
        if isinstance(v, torch.Tensor):
            want = rg.get(name, False) and can_grad(v)
            key = (id(v), want)
            if key not in memo:
                x = fresh_tensor(v)
                if want:
                    x.requires_grad_(True)
                    if inplace and name == "self":
                        x = x.clone()
                memo[key] = x
            return memo[key]
        if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
            return type(v)(conv(name, x) if x is not None else None for x in v)
        return v

    return {name: conv(name, v) for name, v in bound.items()}


def to_arg(v) -> Arg:
    if isinstance(v, torch.Tensor):
        return Arg(meta(v))
    if isinstance(v, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in v):
        return Arg([meta(x) if isinstance(x, torch.Tensor) else None for x in v])
    if isinstance(v, torch.dtype):
        return Arg(DTYPE_NAMES.get(v, str(v)))
    if isinstance(v, (torch.device, torch.layout, torch.memory_format)):
        return Arg(str(v))
    return Arg(v)


class Recorder:
    def __init__(self):
        self.packed: List[torch.Tensor] = []

    def pack(self, t):
        self.packed.append(t)
        return len(self.packed) - 1

    def unpack(self, i):
        return self.packed[i]


def run_call(target, bound: Dict[str, Any], rg: Dict[str, bool], inplace: bool, math: bool):
    args = build_args(bound, rg, inplace)
    schema_args = target._schema.arguments
    pos, kw = [], {}
    for a in schema_args:
        if a.name not in args:
            continue
        if a.kwarg_only or kw:
            kw[a.name] = args[a.name]
        else:
            pos.append(args[a.name])
    metas = {name: to_arg(v) for name, v in args.items()}
    rec = Recorder()
    ctx = sdpa_kernel([SDPBackend.MATH]) if math else torch.nn.attention.sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH])
    torch.manual_seed(0)
    with ctx, torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
        out = target(*pos, **kw)
    outs = [o for o in (out if isinstance(out, (list, tuple)) else [out])]
    return metas, outs, rec.packed


def storages(tensors: List[torch.Tensor]) -> Dict[int, int]:
    out = {}
    for t in tensors:
        st = t.untyped_storage()
        out.setdefault(st._cdata, st.nbytes())
    return out


def check_call(name: str, row: Dict[str, Any], target, bound: Dict[str, Any], math: bool) -> List[str]:
    """All requires-grad combinations of one call. Returns failure messages."""
    fails = []
    units = float_units(bound)
    inplace = name.split(".")[1].endswith("_") if "." in name else False
    combos = list(itertools.product([False, True], repeat=len(units))) if len(units) <= 4 else \
        [tuple(False for _ in units), tuple(True for _ in units)] + \
        [tuple(i == j for j in range(len(units))) for i in range(len(units))]
    for combo in combos:
        rg = dict(zip(units, combo))
        try:
            metas, outs, packed = run_call(target, bound, rg, inplace, math)
        except Exception as e:
            msg = str(e)
            # Combinations no graph can produce: a gradient asked of an argument autograd refuses
            # (batch_norm's running stats), or of an op whose output dtype has no gradient
            # (cumsum to int32 of histc's float counts).
            if "is not differentiable with respect to argument" in msg or "Autograd not support dtype" in msg:
                continue
            fails.append(f"{name} rg={rg}: the call raised {type(e).__name__}: {msg[:200]}")
            continue
        out_metas = []
        for i, o in enumerate(outs):
            if isinstance(o, torch.Tensor):
                out_metas.append(meta(o))
            else:
                out_metas.append(TensorMeta([], [], "int64", ("nontensor", i), 0))
        env = Env(device="cpu", sdpa="math" if math else "default")
        # Output aliasing as the table states it.
        for i, o in enumerate(outs):
            if not isinstance(o, torch.Tensor):
                continue
            alias = saved_ops.output_alias(row, i)
            when = (row.get("outputs") or [{}])[i].get("alias_when") if row.get("outputs") and i < len(row["outputs"]) else None
            if alias and when is not None and not saved_ops.evaluate(when, metas, out_metas, env):
                alias = None
            ost = o.untyped_storage()._cdata
            if alias:
                src = metas.get(alias)
                ok = src is not None and any(t.storage == ost for t in src.tensors)
                if not ok:
                    fails.append(f"{name} rg={rg}: output {i} should alias {alias} but has its own storage")
            else:
                if any(t.storage == ost for a in metas.values() for t in a.tensors):
                    fails.append(f"{name} rg={rg}: output {i} aliases an input; the table says a new storage")
        try:
            want_strides = saved_ops.output_strides(row, metas, out_metas, env)
        except Exception as e:
            want_strides = None
            fails.append(f"{name} rg={rg}: output_strides failed: {e}")
        if want_strides is not None and isinstance(outs[0], torch.Tensor) and list(outs[0].stride()) != want_strides:
            fails.append(f"{name} rg={rg}: output strides {list(outs[0].stride())}, table {want_strides}")
        try:
            pred = saved_ops.predict(row, metas, out_metas, env)
        except Exception as e:
            fails.append(f"{name} rg={rg}: the table failed: {type(e).__name__}: {e}")
            continue
        got = storages(packed)
        want_bytes = saved_ops.total_bytes(pred)
        want_n = len({p.storage for p in pred})
        if sum(got.values()) != want_bytes or len(got) != want_n:
            where = {}
            for name_, a in metas.items():
                for t in a.tensors:
                    where.setdefault(t.storage, name_)
            for i, m in enumerate(out_metas):
                where.setdefault(m.storage, f"result{i or ''}")
            got_desc = [(where.get(t.untyped_storage()._cdata, "new"), list(t.shape), DTYPE_NAMES.get(t.dtype),
                         t.untyped_storage().nbytes()) for t in packed]
            pred_desc = [(p.what, p.bytes) for p in pred]
            shapes = {k: (list(v.shape) if isinstance(v, torch.Tensor) else v if not isinstance(v, (list, tuple))
                          else "[...]") for k, v in bound.items()}
            fails.append(f"{name} rg={rg} sdpa={'math' if math else 'default'}: autograd saved "
                         f"{sum(got.values())} bytes in {len(got)} storages {got_desc}; table {want_bytes} in "
                         f"{want_n} {pred_desc}; args {shapes}")
    return fails


# ----------------------------------------------------------------------------------------- synthetic

def synthetic_calls() -> List[Tuple[Any, tuple, dict]]:
    """Hand-made calls for rows no export uses (and extra argument values of rows they do use)."""
    g = torch.Generator().manual_seed(0)
    r = lambda *s, dt=torch.float32: torch.randn(*s, generator=g).to(dt)  # noqa: E731
    aten = torch.ops.aten
    q, k, v = r(2, 4, 16, 8), r(2, 4, 16, 8), r(2, 4, 16, 8)
    kv2 = r(2, 2, 16, 8)
    calls = [
        (aten.mm.default, (r(6, 5), r(5, 3)), {}),
        (aten.bmm.default, (r(2, 6, 5), r(2, 5, 3)), {}),
        (aten.baddbmm.default, (r(2, 6, 3), r(2, 6, 5), r(2, 5, 3)), {}),
        (aten.matmul.default, (r(2, 3, 6, 5), r(2, 3, 5, 4)), {}),
        (aten.matmul.default, (r(2, 6, 5), r(5, 4)), {}),
        (aten.matmul.default, (r(6, 5).t(), r(6, 4)), {}),
        (aten.linear.default, (r(2, 6, 5).transpose(0, 1), r(4, 5)), {}),
        (aten.linear.default, (r(2, 6, 5).transpose(0, 1), r(4, 5), r(4)), {}),
        (aten.linear.default, (r(6, 5), r(4, 5)), {}),
        (aten.linear.default, (r(2, 3, 6, 5), r(4, 5), r(4)), {}),
        (aten.softmax.int, (r(3, 7), -1), {}),
        (aten.log_softmax.int, (r(3, 7), -1), {}),
        (aten._softmax.default, (r(3, 7), -1, False), {}),
        (aten.native_layer_norm.default, (r(2, 5, 8), [8], r(8), r(8), 1e-5), {}),
        (aten.layer_norm.default, (r(2, 5, 8), [8]), {}),
        (aten.rms_norm.default, (r(2, 5, 8), [8], r(8), 1e-6), {}),
        # bf16 on the CPU: the float32 upcast saved in the input's place, rstd and the product float32.
        (aten.rms_norm.default, (r(2, 5, 8, dt=torch.bfloat16), [8], r(8, dt=torch.bfloat16), 1e-6), {}),
        (aten.rms_norm.default, (r(2, 5, 8, dt=torch.bfloat16), [8], None, 1e-6), {}),
        (aten.group_norm.default, (r(2, 6, 5, 5), 3, r(6), r(6)), {}),
        (aten.batch_norm.default, (r(4, 6, 5, 5), r(6), r(6), torch.zeros(6), torch.ones(6), True, 0.1, 1e-5,
                                   False), {}),
        (aten.conv1d.default, (r(2, 4, 9), r(6, 4, 3), r(6)), {}),
        (aten.conv2d.default, (r(2, 3, 8, 8), r(5, 3, 3, 3)), {}),
        (aten.dropout.default, (r(4, 8), 0.1, True), {}),
        (aten.dropout.default, (r(4, 8), 0.0, True), {}),
        (aten.dropout.default, (r(4, 8), 0.1, False), {}),
        (aten.native_dropout.default, (r(4, 8), 0.1, True), {}),
        (aten.scaled_dot_product_attention.default, (q, k, v), {"dropout_p": 0.1}),
        # GPT-2's layout: q, k, v transposed slices of one fused [B, S, 3 * H * D] output, batch 2
        *[(aten.scaled_dot_product_attention.default, tuple(t.view(2, 16, 4, 8).transpose(1, 2)
                                                           for t in r(2, 16, 96).split(32, dim=-1)), kw)
          for kw in ({"dropout_p": 0.1}, {"is_causal": True})],
        (aten.matmul.default, (r(2, 3, 6, 5).transpose(0, 1), r(3, 2, 5, 4)), {}),
        (aten.scaled_dot_product_attention.default, (q, k, v), {"is_causal": True}),
        (aten.scaled_dot_product_attention.default, (q, kv2, kv2), {"is_causal": True, "enable_gqa": True}),
        (aten.scaled_dot_product_attention.default, (q, k, v, torch.ones(16, 16, dtype=torch.bool).tril()), {}),
        (aten.scaled_dot_product_attention.default, (q, k, v, r(2, 1, 16, 16)), {}),
        (aten.scaled_dot_product_attention.default, (q.to(torch.bfloat16), k.to(torch.bfloat16),
                                                     v.to(torch.bfloat16)), {"is_causal": True}),
        (aten.index_select.default, (r(7, 4), 0, torch.tensor([0, 3, 3, 6])), {}),
        (aten.scatter_add.default, (r(5, 4), 0, torch.tensor([[0, 1, 2, 3], [4, 0, 1, 2]]), r(2, 4)), {}),
        (aten.index_add.default, (r(5, 4), 0, torch.tensor([0, 4, 4]), r(3, 4)), {}),
        (aten.bincount.default, (torch.tensor([0, 1, 1, 3]),), {}),
        (aten.one_hot.default, (torch.tensor([0, 1, 1, 3]), 4), {}),
        (aten.gather.default, (r(5, 4), 1, torch.tensor([[0, 1], [2, 3], [0, 0], [1, 1], [3, 2]])), {}),
        (aten.topk.default, (r(6, 5), 2), {}),
        (aten.sort.default, (r(6, 5),), {}),
        (aten.embedding.default, (r(10, 4), torch.tensor([[1, 2, 9]])), {}),
        (aten.relu.default, (r(4, 5),), {}),
        (aten.gelu.default, (r(4, 5),), {"approximate": "tanh"}),
        (aten.exp.default, (r(4, 5),), {}),
        (aten.sqrt.default, (r(4, 5).abs(),), {}),
        (aten.clamp.default, (r(4, 5), -0.5, 0.5), {}),
        (aten.maximum.default, (r(4, 5), r(4, 5)), {}),
        (aten.where.self, (torch.rand(4, 5, generator=g) > 0.5, r(4, 5), r(4, 5)), {}),
        (aten.masked_fill.Scalar, (r(4, 5), torch.rand(4, 5, generator=g) > 0.5, 0.0), {}),
        (aten.cross_entropy_loss.default, (r(6, 11), torch.tensor([1, 2, 3, -100, 4, 10])), {}),
        (aten.cross_entropy_loss.default, (r(6, 11).to(torch.bfloat16), torch.tensor([1, 2, 3, 0, 4, 10])), {}),
        (aten.cross_entropy_loss.default, (r(6, 11), torch.tensor([1, 2, 3, 0, 4, 10])), {"label_smoothing": 0.1}),
        (aten.nll_loss_forward.default, (r(6, 11).log_softmax(-1), torch.tensor([1, 2, 3, 0, 4, 10]), None, 1, -100),
         {}),
        (aten.repeat_interleave.self_int, (r(4, 3), 2, 0), {}),
        (aten.mul.Tensor, (r(4, 5), 2.0), {}),
        (aten.div.Tensor, (r(4, 5), r(4, 1)), {}),
        (aten.silu.default, (r(4, 5, dt=torch.bfloat16),), {}),
        (aten.sum.dim_IntList, (r(4, 5), [1]), {}),
        (aten.mean.dim, (r(4, 5), [1], True), {}),
        (aten.var_mean.correction, (r(4, 5), [1]), {"correction": 0, "keepdim": True}),
        (aten.cumsum.default, (r(4, 5), 1), {}),
        (aten.split.Tensor, (r(6, 4), 2), {}),
        (aten.stack.default, ([r(3, 4), r(3, 4)],), {}),
        (aten.permute.default, (r(2, 3, 4), [2, 0, 1]), {}),
        (aten.t.default, (r(3, 4),), {}),
        (aten.squeeze.dim, (r(3, 1, 4), 1), {}),
        (aten.reshape.default, (r(3, 4).t(), [12]), {}),
        (aten.contiguous.default, (r(3, 4).t(),), {}),
        (aten.to.dtype, (r(3, 4), torch.bfloat16), {}),
        (aten.to.dtype, (r(3, 4), torch.float32), {}),
    ]
    return calls


# ----------------------------------------------------------------------------------------- generated rows

def generated_calls() -> List[Tuple[Any, tuple, dict]]:
    """Calls of operators whose rows gen_op_rows.py generates (saved_ops_generated.yaml): the ones
    issue 40 found without a row in exports of other architectures, and each rule of the generator
    (torchgen's guards, an in-place op's clone of the original self, saved outputs, schema views,
    composite views, factories, NotImplemented). Checked against the GENERATED row even where a
    hand row overrides it."""
    g = torch.Generator().manual_seed(1)
    r = lambda *s, dt=torch.float32: torch.randn(*s, generator=g).to(dt)  # noqa: E731
    aten = torch.ops.aten
    idx = torch.tensor([[0, 1, 2, 3], [4, 0, 1, 2]])
    return [
        (aten.type_as.default, (r(4, 5), r(2, dt=torch.bfloat16)), {}),
        (aten.type_as.default, (r(4, 5), r(2)), {}),
        (aten.split_with_sizes.default, (r(6, 4), [2, 4]), {}),
        (aten.broadcast_to.default, (r(1, 4), [3, 4]), {}),
        (aten.numpy_T.default, (r(2, 3, 4),), {}),
        (aten.max.dim, (r(4, 5), 1), {}),
        (aten.max.dim, (r(4, 5), 1, True), {}),
        (aten.max.default, (r(4, 5),), {}),
        (aten.view_as_complex.default, (r(4, 3, 2),), {}),
        (aten.view_as_real.default, (torch.randn(4, 3, dtype=torch.complex64, generator=g),), {}),
        (aten.polar.default, (r(4, 3).abs(), r(4, 3)), {}),
        (aten.softplus.default, (r(4, 5),), {}),
        (aten.triu.default, (r(5, 5),), {}),
        (aten.tril.default, (r(5, 5), -1), {}),
        (aten.eye.default, (4,), {}),
        (aten.new_empty.default, (r(3, 4), [2, 2]), {}),
        (aten.scatter_.src, (r(5, 4), 0, idx, r(2, 4)), {}),
        (aten.scatter_.value, (r(5, 4), 0, idx, 1.5), {}),
        (aten.scatter.src, (r(5, 4), 0, idx, r(2, 4)), {}),
        (aten.bitwise_not.default, (torch.tensor([1, 2, 3]),), {}),
        (aten.mul_.Tensor, (r(4, 5), r(4, 5)), {}),
        (aten.div_.Tensor, (r(4, 5), r(4, 5)), {}),
        (aten.mul.Tensor, (r(4, 5), r(4, 5)), {}),
        (aten.addmm.default, (r(3), r(2, 4), r(4, 3)), {}),
        (aten.addcmul.default, (r(4, 5), r(4, 5), r(4, 5)), {}),
        (aten.lerp.Tensor, (r(4, 5), r(4, 5), r(4, 5)), {}),
        (aten.logsumexp.default, (r(4, 5), [1]), {}),
        (aten.amax.default, (r(4, 5), [1]), {}),
        (aten.prod.dim_int, (r(4, 5), 1), {}),
        (aten.cumprod.default, (r(4, 5), 1), {}),
        (aten.unbind.int, (r(3, 4),), {}),
        (aten.narrow.default, (r(6, 4), 0, 1, 3), {}),
        (aten.diagonal.default, (r(4, 4),), {}),
        (aten.expand_as.default, (r(1, 4), r(3, 4)), {}),
        (aten.index_put.default, (r(5, 4), [torch.tensor([0, 2])], r(2, 4)), {}),
        (aten.linalg_vector_norm.default, (r(4, 5), 2, [1]), {}),
        (aten.clamp_min.default, (r(4, 5), 0.0), {}),
        (aten.flip.default, (r(3, 4), [0]), {}),
        (aten.roll.default, (r(3, 4), [1], [0]), {}),
        (aten.repeat.default, (r(3, 4), [2, 1]), {}),
        (aten.var.correction, (r(4, 5), [1]), {}),
        (aten.pow.Tensor_Tensor, (r(4, 5).abs(), r(4, 5)), {}),
        (aten._to_copy.default, (r(3, 4),), {"dtype": torch.bfloat16}),
        (aten.native_layer_norm.default, (r(2, 5, 8), [8], r(8), r(8), 1e-5), {}),
        (aten.native_group_norm.default, (r(2, 6, 5), r(6), r(6), 2, 6, 5, 3, 1e-5), {}),
        (aten.masked_fill_.Scalar, (r(4, 5), torch.rand(4, 5, generator=g) > 0.5, 0.0), {}),
        (aten.index_select.default, (r(7, 4), 0, torch.tensor([0, 3, 3, 6])), {}),
        (aten.gather.default, (r(5, 4), 1, torch.tensor([[0, 1], [2, 3], [0, 0], [1, 1], [3, 2]])), {}),
        (aten.sort.default, (r(6, 5),), {}),
        (aten.cat.default, ([r(3, 4), r(2, 4)],), {}),
        (aten.stack.default, ([r(3, 4), r(3, 4)],), {}),
        (aten.full.default, ([2, 3], 1.0), {}),
        (aten.argmax.default, (r(4, 5),), {}),
        (aten.cumsum.default, (r(4, 5), 1), {}),
        (aten.argsort.default, (r(4, 5),), {}),
        (aten.max_pool2d.default, (r(2, 3, 8, 8), [2, 2]), {}),
        (aten.max_pool2d.default, (r(2, 3, 9, 7), [3, 2], [2, 1]), {}),
        (aten.square.default, (r(4, 5),), {}),
        (aten.multiply.Tensor, (r(4, 5), r(4, 5)), {}),
        (aten.clip.default, (r(4, 5), -0.5, 0.5), {}),
        (aten.concat.default, ([r(3, 4), r(2, 4)],), {}),
        (aten.arctan2.default, (r(4, 5), r(4, 5)), {}),
    ]


def elementwise_sample(gen_table: Dict[str, Any]) -> List[Tuple[Any, tuple, dict]]:
    """Every generated row of a one- or two-tensor operator (`(Tensor self) -> Tensor`,
    `(Tensor self, Tensor other) -> Tensor` and their in-place forms, other arguments defaulted)
    that runs on [4, 5] float32 tensors: the generator's rules on some two hundred operators."""
    g = torch.Generator().manual_seed(2)
    calls = []
    for name in sorted(gen_table):
        ns, opname, overload = name.split(".")
        try:
            target = getattr(getattr(torch.ops.aten, opname), overload)
        except (AttributeError, RuntimeError):
            continue
        sch = target._schema
        required = [a for a in sch.arguments if not a.has_default_value() and not a.kwarg_only]
        types = [str(a.type) for a in required]
        if types not in (["Tensor"], ["Tensor", "Tensor"]) or any(a.kwarg_only and not a.has_default_value()
                                                                  for a in sch.arguments):
            continue
        if len(sch.returns) != 1 or str(sch.returns[0].type) != "Tensor":
            continue
        args = tuple(torch.rand(4, 5, generator=g) + 0.25 for _ in types)
        try:
            with torch.no_grad():
                out = target(*[a.clone() for a in args])
        except Exception:
            continue  # not for float32 [4, 5] (integer ops, shape rules, complex only, ...)
        if not isinstance(out, torch.Tensor) or out.layout != torch.strided or out.is_mkldnn or \
                out.dtype not in DTYPE_NAMES:
            continue  # sparse, mkldnn, uint64 outputs: no storage this harness can compare
        calls.append((target, args, {}))
    return calls


# ----------------------------------------------------------------------------------------- driver

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("exports_dir", nargs="?", help="make_exports.py's output (not needed with --no-exports)")
    ap.add_argument("--no-exports", action="store_true", help="only the hand-made calls (synthetic, generated)")
    ap.add_argument("--no-generated", action="store_true",
                    help="skip the check of the generated rows (saved_ops_generated.yaml) on their own")
    ap.add_argument("--table", default=saved_ops.DEFAULT_TABLE)
    ap.add_argument("-k", help="only operators whose name contains this")
    ap.add_argument("-v", action="store_true")
    ap.add_argument("--max-per-op", type=int, default=12, help="distinct calls checked per operator")
    ap.add_argument("--no-synthetic", action="store_true")
    ap.add_argument("--only", help="only exports whose file name contains this (faster; coverage still uses all)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    table = saved_ops.load(args.table)
    failures: List[str] = []

    if not args.no_exports:
        check_exports(args, table, failures)
    calls: Dict[str, Dict[tuple, Tuple[Any, dict]]] = {}
    if not args.no_exports:
        capture_exports(args, calls)
    n_calls = check_table(args, table, calls, failures)
    if not args.no_generated:
        n_calls += check_generated(args, failures)
    print(f"{n_calls} distinct calls checked in {time.perf_counter() - t0:.1f} s; {len(failures)} failures")
    return 1 if failures else 0


def check_exports(args, table, failures: List[str]) -> None:
    # 1. coverage
    cat = op_catalogue.catalogue(args.exports_dir)
    for op in cat["ops"]:
        if op not in table:
            failures.append(f"MISSING ROW {op} (used by {', '.join(cat['ops'][op]['models'])})")
    print(f"coverage: {len(cat['ops'])} operators in {cat['exports']} exports, "
          f"{sum(1 for op in cat['ops'] if op in table)} with a row")


def capture_exports(args, calls) -> None:
    # 2. every distinct call of the exports
    with open(os.path.join(args.exports_dir, "manifest.json")) as f:
        manifest = [e for e in json.load(f)["exports"] if "error" not in e and not e.get("meta")]
    for e in manifest:
        if args.only and args.only not in e["file"]:
            continue
        for target, a, kw in capture_calls(os.path.join(args.exports_dir, e["file"]), e):
            name = op_key(target)
            if args.k and args.k not in name:
                continue
            per = calls.setdefault(name, {})
            sig = signature(target, a, kw)
            if sig not in per and len(per) < args.max_per_op:
                per[sig] = (target, bind(target, a, kw))


def check_table(args, table, calls, failures: List[str]) -> int:
    if not args.no_synthetic:
        for target, a, kw in synthetic_calls():
            name = op_key(target)
            if args.k and args.k not in name:
                continue
            per = calls.setdefault(name, {})
            per[signature(target, a, kw)] = (target, bind(target, a, kw))

    # Each row's defaults are the schema's.
    for name, row in table.items():
        if not row.get("defaults"):
            continue
        ns, opname, overload = name.split(".")
        schema = getattr(getattr(getattr(torch.ops, ns), opname), overload)._schema
        declared = {a.name: a for a in schema.arguments}
        for k, v in row["defaults"].items():
            a = declared.get(k)
            if a is None or not a.has_default_value():
                failures.append(f"{name}: defaults names {k}, which has no default in {schema}")
                continue
            dv = a.default_value
            if isinstance(dv, torch.dtype) or isinstance(dv, torch.memory_format) or isinstance(dv, torch.layout):
                dv = None if v is None else str(dv)
            if dv != v and not (isinstance(dv, float) and isinstance(v, float) and abs(dv - v) < 1e-12):
                failures.append(f"{name}: default {k}={v!r}, schema {dv!r}")

    n_calls = n_ok = 0
    for name in sorted(calls):
        row = table.get(name)
        if row is None:
            if not any(f.startswith(f"MISSING ROW {name} ") for f in failures):
                failures.append(f"MISSING ROW {name} (synthetic)")
            continue
        op_fails = []
        for sig, (target, bound) in calls[name].items():
            n_calls += 1
            for math in (False, True):
                try:
                    f = check_call(name, row, target, bound, math)
                except Exception:
                    f = [f"{name}: {traceback.format_exc()}"]
                op_fails += f
            if not op_fails:
                n_ok += 1
        status = "ok  " if not op_fails else "FAIL"
        if op_fails or args.v:
            print(f"{status} {name}: {len(calls[name])} calls")
        for f in op_fails[:6]:
            print("     " + f)
        failures += op_fails
    print(f"{n_calls} distinct calls of {len(calls)} operators checked against the table")
    return n_calls


def check_generated(args, failures: List[str]) -> int:
    """4. The generated rows on their own (hand rows do not hide them), on generated_calls() and
    elementwise_sample()."""
    gen_path = os.path.join(os.path.dirname(args.table), "saved_ops_generated.yaml")
    with open(gen_path) as f:
        loader = getattr(saved_ops.yaml, "CSafeLoader", saved_ops.yaml.SafeLoader)
        gen_table = saved_ops.yaml.load(f, Loader=loader)["ops"]
    calls: Dict[str, Dict[tuple, Tuple[Any, dict]]] = {}
    for target, a, kw in generated_calls() + elementwise_sample(gen_table):
        name = op_key(target)
        if args.k and args.k not in name:
            continue
        calls.setdefault(name, {})[signature(target, a, kw)] = (target, bind(target, a, kw))
    n_calls = 0
    for name in sorted(calls):
        row = gen_table.get(name)
        if row is None:
            failures.append(f"MISSING GENERATED ROW {name}")
            continue
        op_fails = []
        for sig, (target, bound) in calls[name].items():
            n_calls += 1
            try:
                op_fails += check_call(name, row, target, bound, False)
            except Exception:
                op_fails.append(f"{name}: {traceback.format_exc()}")
        if op_fails or args.v:
            print(f"{'ok  ' if not op_fails else 'FAIL'} generated {name}: {len(calls[name])} calls")
        for f in op_fails[:4]:
            print("     " + f)
        failures += [f"generated row: {f}" for f in op_fails]
    print(f"{n_calls} calls of {len(calls)} operators checked against their generated rows")
    return n_calls


if __name__ == "__main__":
    sys.exit(main())
