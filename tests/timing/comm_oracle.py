#!/usr/bin/env python3
"""Collective oracle: every collective one FSDP1 / FSDP2 training step issues, counted under the
single-process `fake` backend (torch 2.13, CPU, FakeTensorMode), per FSDP unit and phase.

For each case (model x FSDP version x world size x setting) this builds the model on fake CPU
tensors, wraps it (FSDP1: `FullyShardedDataParallel` with `ModuleWrapPolicy({decoder layer})`;
FSDP2: `fully_shard` per decoder layer, then the root), runs two training steps (forward with the
loss, backward, AdamW step, zero_grad) and records:

- every call that reaches a c10d process group, seen at the dispatcher (a TorchDispatchMode that
  sees `c10d::_allgather_base_`, `allgather_`, `_reduce_scatter_base_`, `allreduce_`,
  `broadcast_`, ...): so nothing FSDP calls can escape, whichever `torch.distributed` function it
  went through (that function's name is recorded too);
- each call's input / output numel and dtype, and its process group (size, ranks);
- which FSDP unit issued it: FSDP1's `FlatParamHandle` (attributed in `FlatParamHandle.unshard`
  and `_runtime_utils._reduce_grad` / `_reduce_grad_no_shard`), FSDP2's `FSDPParamGroup`
  (attributed in `FSDPParamGroup.unshard` and `FSDPParamGroup.post_backward`), and why
  (unshard, prefetch, reduce);
- the phase: init (wrapping, before the first step), forward, backward, optimizer;
- the host<->device copy calls FSDP makes for CPU offload (`Tensor.to(device, ...)` and
  `Tensor.copy_(..., non_blocking=...)` inside those windows), seen as calls: on this CPU-only
  machine the compute device is the CPU, so no copy moves data (see COMM.md). FSDP1's
  CPUOffload does not run at all without an accelerator, so only FSDP2's is recorded.

Step 2 is the steady state (step 1 adds lazy initialisation). Output, per case, stable JSON in
reference/comm/CASE.json: the ordered step-2 collectives, the init collectives, the step-1 list
where it differs, the units' structure (flat parameter or per-parameter shard sizes), a per-unit
summary (calls and bytes by collective and phase) and structural checks (each all-gather's and
reduce-scatter's size against the unit's own shard sizes; a failed check fails the run).

    python tests/timing/comm_oracle.py                 # every case, writes reference/comm/
    python tests/timing/comm_oracle.py -k llama.fsdp2  # cases whose name contains the string
    python tests/timing/comm_oracle.py --ci --check    # the CI subset, compared with reference/
    python tests/timing/comm_oracle.py --list

Bytes: `bytes` of a call is its message size as nccl-tests counts it: the unsharded (output)
buffer of an all-gather, the unsharded (input) buffer of a reduce-scatter, the tensor of an
all-reduce or broadcast. What a rank sends is (n-1)/n of it for the ring algorithms (time-model.md).
"""
import argparse
import contextlib
import functools
import os
import sys
import time
import traceback
from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import timing_common as tc  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # noqa: E402
    CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import (CPUOffload, CPUOffloadPolicy, FullyShardedDataParallel as FSDP,  # noqa: E402
                                    MixedPrecision, MixedPrecisionPolicy, ShardingStrategy, fully_shard)
from torch.distributed.fsdp import _runtime_utils as fsdp1_runtime  # noqa: E402
from torch.distributed.fsdp._flat_param import FlatParamHandle  # noqa: E402
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup  # noqa: E402
from torch.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

OUT_DIR = os.path.join(tc.REFERENCE, "comm")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}

# c10d dispatcher ops -> the collective they are. The Python API functions FSDP calls
# (torch/distributed/distributed_c10d.py) all end in one of these.
KIND = {
    "_allgather_base_": "all_gather", "allgather_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "broadcast_": "broadcast", "barrier": "barrier", "alltoall_base_": "all_to_all", "alltoall_": "all_to_all",
}
# Public torch.distributed functions whose name is recorded with each call (the outermost one).
API = ["all_gather_single", "all_gather_into_tensor", "_all_gather_base", "all_gather", "reduce_scatter_single",
       "reduce_scatter_tensor", "_reduce_scatter_base", "reduce_scatter", "all_reduce", "broadcast", "barrier",
       "all_to_all_single", "all_gather_object", "broadcast_object_list"]


# ------------------------------------------------------------------------------------------ recording

class Recorder:
    """The state the hooks below write into: one per case."""

    def __init__(self) -> None:
        self.records: List[Dict[str, Any]] = []
        self.copies: List[Dict[str, Any]] = []
        self.phase = "init"
        self.step = 0
        self.unit_stack: List[Tuple[Any, str]] = []  # (handle or param group, cause)
        self.api_stack: List[str] = []
        self.unit_names: Dict[int, str] = {}  # id(handle / param group) -> unit path
        # Only with CPU offload: FSDP1's mixed precision also calls `_local_shard.to(self.device)`
        # (_flat_param.py L1352), a no-op when the shard is already on the device.
        self.record_copies = False

    def unit(self) -> Tuple[Optional[str], Optional[str]]:
        if not self.unit_stack:
            return None, None
        owner, cause = self.unit_stack[-1]
        causes = [c for _, c in self.unit_stack]
        return self.unit_names.get(id(owner), f"?{type(owner).__name__}"), "/".join(causes)


CURRENT: Optional[Recorder] = None


def _tensor_summary(value: Any) -> List[Tuple[int, str]]:
    """(numel, dtype) of every tensor in an argument (a tensor, a list, a list of lists)."""
    if isinstance(value, torch.Tensor):
        return [(value.numel(), str(value.dtype).replace("torch.", ""))]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _tensor_summary(v)]
    return []


def _merge(summary: List[Tuple[int, str]]) -> Optional[Dict[str, Any]]:
    if not summary:
        return None
    dtypes = sorted({d for _, d in summary})
    return {"numel": sum(n for n, _ in summary), "dtype": dtypes[0] if len(dtypes) == 1 else "+".join(dtypes),
            "tensors": len(summary)}


ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "uint8": 1, "int64": 8, "int32": 4, "float64": 8}


class CollectiveMode(TorchDispatchMode):
    """Sees every c10d op at the dispatcher and records it in CURRENT."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        ns = func.namespace
        if CURRENT is not None and ns in ("c10d", "_c10d_functional"):
            rec = CURRENT
            name = func._schema.name.split("::")[-1]
            inputs, outputs, group = [], [], None
            for arg, value in zip(func._schema.arguments, list(args) + [kwargs.get(a.name) for a in
                                                                       func._schema.arguments[len(args):]]):
                if isinstance(value, torch.ScriptObject):
                    try:
                        group = torch._C._distributed_c10d.ProcessGroup.unbox(value)
                    except RuntimeError:
                        pass  # the ReduceOp argument
                elif arg.name.startswith("output"):
                    outputs += _tensor_summary(value)
                elif arg.name.startswith("input"):
                    inputs += _tensor_summary(value)
                elif arg.name == "tensors" or arg.name == "tensor":
                    inputs += _tensor_summary(value)  # in place: all-reduce, broadcast
                    outputs += _tensor_summary(value)
            unit, cause = rec.unit()
            kind = KIND.get(name, name)
            i, o = _merge(inputs), _merge(outputs)
            big = max([x for x in (i, o) if x], key=lambda x: x["numel"], default=None)
            rec.records.append({
                "op": f"{ns}.{name}", "api": rec.api_stack[0] if rec.api_stack else None, "kind": kind,
                "phase": rec.phase, "step": rec.step, "unit": unit, "cause": cause,
                "group_size": group.size() if group is not None else None,
                "group_ranks": dist.get_process_group_ranks(group) if group is not None else None,
                "in": i, "out": o,
                "bytes": big["numel"] * ITEMSIZE[big["dtype"]] if big and big["dtype"] in ITEMSIZE else None,
            })
        return func(*args, **kwargs)


def _record_copy(call: str, t: torch.Tensor, numel: int, device, non_blocking: bool) -> None:
    rec = CURRENT
    unit, cause = rec.unit()
    rec.copies.append({"call": call, "device": str(device), "numel": numel,
                       "dtype": str(t.dtype).replace("torch.", ""), "non_blocking": bool(non_blocking),
                       "phase": rec.phase, "step": rec.step, "unit": unit, "cause": cause})


_TENSOR_TO = torch.Tensor.to
_TENSOR_COPY = torch.Tensor.copy_


def _to(self, *args, **kwargs):
    """Tensor.to, recording the calls that name a device inside an FSDP unit's window (the CPU
    offload copies: _fsdp_param.py FSDPParam.all_gather_inputs `.to(self.device, non_blocking=True)`,
    _fsdp_collectives.py foreach_reduce `.to(torch.device("cpu"), ...)`)."""
    rec = CURRENT
    if rec is not None and rec.record_copies and rec.unit_stack:
        device = kwargs.get("device")
        for a in args:
            if isinstance(a, (torch.device, str)):
                device = a
        if device is not None:
            _record_copy("Tensor.to", self, self.numel(), device, kwargs.get("non_blocking", False))
    return _TENSOR_TO(self, *args, **kwargs)


def _copy(self, src, *args, **kwargs):
    """Tensor.copy_ with non_blocking= (FSDP1's gradient offload, _runtime_utils.py _offload_grad)."""
    rec = CURRENT
    if rec is not None and rec.record_copies and rec.unit_stack and "non_blocking" in kwargs:
        _record_copy("Tensor.copy_", self, src.numel(), self.device, kwargs["non_blocking"])
    return _TENSOR_COPY(self, src, *args, **kwargs)


@contextlib.contextmanager
def copy_hooks():
    """Tensor.to / copy_ wrapped for the duration of a case (a TorchFunctionMode would not see the
    calls made from autograd's backward hooks)."""
    torch.Tensor.to, torch.Tensor.copy_ = _to, _copy
    try:
        yield
    finally:
        torch.Tensor.to, torch.Tensor.copy_ = _TENSOR_TO, _TENSOR_COPY


def _owner_wrapper(fn, cause, owner_of):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        rec = CURRENT
        if rec is None:
            return fn(*args, **kwargs)
        rec.unit_stack.append((owner_of(*args), cause))
        try:
            return fn(*args, **kwargs)
        finally:
            rec.unit_stack.pop()
    return wrapper


def _cause_wrapper(fn, cause):
    """A frame that names why the inner unshard runs (a prefetch) without naming a unit."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        rec = CURRENT
        if rec is None:
            return fn(*args, **kwargs)
        rec.unit_stack.append((None, cause))
        try:
            return fn(*args, **kwargs)
        finally:
            rec.unit_stack.pop()
    return wrapper


def _api_wrapper(fn, name):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        rec = CURRENT
        if rec is None:
            return fn(*args, **kwargs)
        rec.api_stack.append(name)
        try:
            return fn(*args, **kwargs)
        finally:
            rec.api_stack.pop()
    return wrapper


_PATCHED = False


def install_hooks() -> None:
    """Wraps the FSDP methods that issue collectives, so that each call knows its unit.
    FSDP1: torch/distributed/fsdp/_flat_param.py FlatParamHandle.pre_unshard / unshard (the
    all-gather, `_all_gather_flat_param`), _runtime_utils.py `_reduce_grad` (reduce-scatter, and
    HYBRID_SHARD's all-reduce) / `_reduce_grad_no_shard` (NO_SHARD's all-reduce) /
    `_prefetch_handle`. FSDP2: _fully_shard/_fsdp_param_group.py FSDPParamGroup.unshard
    (`foreach_all_gather`), post_backward (`foreach_reduce`: reduce-scatter, HSDP all-reduce),
    `_prefetch_unshard` (backward prefetch)."""
    global _PATCHED
    if _PATCHED:
        return
    _PATCHED = True
    FlatParamHandle.pre_unshard = _owner_wrapper(FlatParamHandle.pre_unshard, "pre_unshard", lambda h, *a: h)
    FlatParamHandle.unshard = _owner_wrapper(FlatParamHandle.unshard, "unshard", lambda h, *a: h)
    fsdp1_runtime._reduce_grad = _owner_wrapper(fsdp1_runtime._reduce_grad, "reduce", lambda s, h, *a: h)
    fsdp1_runtime._reduce_grad_no_shard = _owner_wrapper(fsdp1_runtime._reduce_grad_no_shard, "reduce",
                                                         lambda s, h, *a: h)
    fsdp1_runtime._prefetch_handle = _cause_wrapper(fsdp1_runtime._prefetch_handle, "prefetch")
    FSDPParamGroup.unshard = _owner_wrapper(FSDPParamGroup.unshard, "unshard", lambda g, *a, **k: g)
    FSDPParamGroup.post_backward = _owner_wrapper(FSDPParamGroup.post_backward, "reduce", lambda g, *a: g)
    FSDPParamGroup._prefetch_unshard = staticmethod(
        _cause_wrapper(FSDPParamGroup.__dict__["_prefetch_unshard"].__func__, "prefetch"))
    import torch.distributed.distributed_c10d as c10d
    for name in API:
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        w = _api_wrapper(fn, name)
        setattr(c10d, name, w)
        if getattr(dist, name, None) is fn:
            setattr(dist, name, w)


# ------------------------------------------------------------------------------------------ cases

def case_table() -> Dict[str, Dict[str, Any]]:
    """name -> settings. See the module docstring and COMM.md for what each one shows."""
    cases: Dict[str, Dict[str, Any]] = {}

    def add(model, version, world, variant="base", **kw):
        name = f"{model}.fsdp{version}.w{world}.{variant}"
        cases[name] = dict(model=model, version=version, world=world, variant=variant, **kw)

    for model in ("llama", "mixtral", "gpt2", "tiny_gpt"):
        for world in (3, 8):
            add(model, 1, world)
            add(model, 2, world)
        add(model, 1, 8, "mp_bf16_fp32", mp=("bf16", "fp32"))
        add(model, 2, 8, "mp_bf16_fp32", mp=("bf16", "fp32"))
    add("tiny_gpt", 1, 3, "orig", orig=True)
    # Odd sizes: FSDP1's flat-parameter padding with and without use_orig_params, FSDP2's dim-0 padding.
    for world in (3, 8):
        add("odd_lm", 1, world)
        add("odd_lm", 1, world, "orig", orig=True)
        add("odd_lm", 2, world)
    add("odd_lm", 1, 8, "orig_mp_bf16_fp32", orig=True, mp=("bf16", "fp32"))
    add("gpt2", 1, 3, "orig", orig=True)
    for world in (3, 8):
        add("llama", 1, world, "shard_grad_op", strategy="SHARD_GRAD_OP")
        add("llama", 1, world, "no_shard", strategy="NO_SHARD")
        add("llama", 1, world, "orig", orig=True)
        add("llama", 1, world, "mp_bf16_bf16", mp=("bf16", "bf16"))
        add("llama", 1, world, "lora", lora=True, orig=True, real=True)
        add("llama", 1, world, "ac_torch", ac="torch")
        add("llama", 1, world, "ac_hf", ac="hf")
        add("llama", 1, world, "ac_outside", ac="outside")
        add("llama", 1, world, "ac_outside_reentrant", ac="outside_reentrant")
        add("llama", 2, world, "raf_false", raf=False)
        add("llama", 2, world, "mp_bf16_bf16", mp=("bf16", "bf16"))
        add("llama", 2, world, "offload", offload=True, real=True)
        add("llama", 2, world, "lora", lora=True, real=True)
        add("llama", 2, world, "ac_torch", ac="torch")
        add("llama", 2, world, "ac_hf", ac="hf")
        add("llama", 2, world, "ac_outside", ac="outside")
        add("llama", 2, world, "ac_outside_reentrant", ac="outside_reentrant")
    add("llama", 1, 3, "mp_bf16_fp32", mp=("bf16", "fp32"))
    add("llama", 2, 3, "mp_bf16_fp32", mp=("bf16", "fp32"))
    add("llama", 2, 8, "offload_mp", offload=True, mp=("bf16", "fp32"), real=True)
    # real tensors: the post-forward reshard to k ranks reads a size as data under FakeTensorMode.
    add("llama", 2, 8, "raf_2", raf=2, real=True)
    add("llama", 2, 8, "raf_4", raf=4, real=True)
    add("llama", 2, 8, "root_raf_true", root_raf=True)
    for mesh in ((2, 4), (4, 2)):
        tag = f"hsdp{mesh[0]}x{mesh[1]}"
        add("llama", 1, 8, tag, strategy="HYBRID_SHARD", mesh=mesh)
        add("llama", 2, 8, tag, mesh=mesh)
    add("llama", 1, 8, "hsdp2x4_zero2", strategy="_HYBRID_SHARD_ZERO2", mesh=(2, 4))
    add("llama", 1, 8, "hsdp2x4_mp_bf16_fp32", strategy="HYBRID_SHARD", mesh=(2, 4), mp=("bf16", "fp32"))
    add("llama", 2, 8, "hsdp2x4_mp_bf16_fp32", mesh=(2, 4), mp=("bf16", "fp32"))
    add("mixtral", 2, 3, "mp_bf16_fp32", mp=("bf16", "fp32"))
    # Llama-3-8B (32 layers, fake tensors): the worked check's full-size numbers (model_check.py).
    add("llama3_8b", 1, 8, "mp_bf16_fp32", mp=("bf16", "fp32"))
    add("llama3_8b", 2, 8, "mp_bf16_fp32", mp=("bf16", "fp32"))
    # Two nodes of 8: sharded over all 16, or HSDP with the shard group inside a node.
    add("llama3_8b", 2, 16, "mp_bf16_fp32", mp=("bf16", "fp32"))
    add("llama3_8b", 2, 16, "hsdp2x8_mp_bf16_fp32", mesh=(2, 8), mp=("bf16", "fp32"))
    return cases


# The cases a CI run repeats (about 40 s on 2 idle cores): each model, both versions, W 3 and 8,
# HSDP, reshard_after_forward false / int, mixed precision, LoRA, AC, padding.
CI_CASES = [
    "llama.fsdp1.w3.base", "llama.fsdp2.w8.mp_bf16_fp32", "mixtral.fsdp2.w8.base", "odd_lm.fsdp1.w8.orig",
    "tiny_gpt.fsdp2.w3.base", "gpt2.fsdp1.w8.base", "llama.fsdp1.w8.hsdp2x4", "llama.fsdp2.w8.hsdp2x4",
    "llama.fsdp2.w8.raf_false", "llama.fsdp2.w8.raf_2", "llama.fsdp1.w8.lora", "llama.fsdp2.w8.lora",
    "llama.fsdp1.w8.ac_outside_reentrant",
]


# ------------------------------------------------------------------------------------------ one case

def _replace_layers(model: nn.Module, cls: type, fn) -> None:
    """Replaces each `cls` submodule in its parent by fn(submodule)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, cls) or (isinstance(child, FSDP) and isinstance(child.module, cls)):
                setattr(parent, name, fn(child))


def _lora(model: nn.Module) -> nn.Module:
    """peft LoRA (r=4) on the attention q/v projections: everything else frozen."""
    from peft import LoraConfig, get_peft_model
    targets = ["q_proj", "v_proj"] if hasattr(model, "config") and model.config.model_type != "gpt2" else ["c_attn"]
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets, lora_dropout=0.0))


def make_mesh(cfg: Dict[str, Any]):
    """The device mesh, made outside FakeTensorMode (DeviceMesh reads its rank map's values).
    HSDP: (replicate, shard); FSDP1 takes the same 2-D mesh for HYBRID_SHARD."""
    if cfg.get("mesh"):
        return init_device_mesh("cpu", cfg["mesh"], mesh_dim_names=("replicate", "shard"))
    return init_device_mesh("cpu", (cfg["world"],)) if cfg["version"] == 2 else None


def wrap_fsdp1(model: nn.Module, cfg: Dict[str, Any], cls: type, mesh) -> nn.Module:
    kw: Dict[str, Any] = dict(device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({cls}),
                              use_orig_params=bool(cfg.get("orig", False)),
                              sharding_strategy=getattr(ShardingStrategy, cfg.get("strategy", "FULL_SHARD")))
    if mesh is not None:
        kw["device_mesh"] = mesh
    if cfg.get("mp"):
        p, r = (DTYPES[d] for d in cfg["mp"])
        kw["mixed_precision"] = MixedPrecision(param_dtype=p, reduce_dtype=r, buffer_dtype=p)
    if cfg.get("offload"):
        kw["cpu_offload"] = CPUOffload(offload_params=True)
    fsdp = FSDP(model, **kw)
    if cfg.get("ac") == "torch":
        # Accelerate's and the FSDP tutorial's order: wrap, then checkpoint the layers inside the units.
        apply_activation_checkpointing(
            fsdp, check_fn=lambda m: isinstance(m, cls),
            checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
    elif cfg.get("ac", "").startswith("outside"):
        # checkpoint(FSDP(layer)): the recompute runs the FSDP unit's forward again (transformers
        # issue 30404 / pytorch issue 105635, with HF's checkpointing of 2023-2024, reentrant).
        _replace_layers(fsdp, cls, lambda m: checkpoint_wrapper(m, checkpoint_impl=_ac_impl(cfg)))
    return fsdp


def wrap_fsdp2(model: nn.Module, cfg: Dict[str, Any], cls: type, mesh) -> nn.Module:
    kw: Dict[str, Any] = dict(mesh=mesh)
    if cfg.get("mp"):
        p, r = (DTYPES[d] for d in cfg["mp"])
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=p, reduce_dtype=r)
    if cfg.get("offload"):
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    if cfg.get("ac") == "torch":
        # torchtitan's order (torchtitan/distributed/activation_checkpoint.py, then fully_shard):
        # checkpoint_wrapper(layer), then fully_shard(wrapper).
        _replace_layers(model, cls, lambda m: checkpoint_wrapper(m, checkpoint_impl=CheckpointImpl.NO_REENTRANT))
        layer_type = type(checkpoint_wrapper(nn.Identity()))
        layers = [m for m in model.modules() if isinstance(m, layer_type)]
    else:
        layers = [m for m in model.modules() if isinstance(m, cls)]
    raf = cfg.get("raf", None)
    for layer in layers:
        fully_shard(layer, reshard_after_forward=raf, **kw)
    fully_shard(model, reshard_after_forward=cfg.get("root_raf", None), **kw)
    if cfg.get("ac", "").startswith("outside"):
        _replace_layers(model, cls, lambda m: checkpoint_wrapper(m, checkpoint_impl=_ac_impl(cfg)))
    return model


def _ac_impl(cfg: Dict[str, Any]) -> CheckpointImpl:
    return CheckpointImpl.REENTRANT if cfg.get("ac") == "outside_reentrant" else CheckpointImpl.NO_REENTRANT


def unit_structure_fsdp1(fsdp: nn.Module, rec: Recorder) -> List[Dict[str, Any]]:
    units = []
    for name, mod in fsdp.named_modules():
        if not isinstance(mod, FSDP) or mod._handle is None:
            continue
        h = mod._handle
        fp = h.flat_param
        path = tc.clean_fqn(name)
        rec.unit_names[id(h)] = path
        units.append({
            "unit": path,
            "strategy": str(h._sharding_strategy).split(".")[-1],
            "world_size": h.world_size,
            "orig_dtype": str(h._orig_param_dtype).replace("torch.", ""),
            "param_dtype": str(h._fwd_bwd_param_dtype).replace("torch.", ""),
            "reduce_dtype": str(h._reduce_dtype).replace("torch.", ""),
            "requires_grad": bool(fp.requires_grad),
            "num_params": len(fp._fqns),
            "param_numel": sum(fp._numels),
            # FSDP1's flat parameter: the original parameters (plus alignment padding when
            # use_orig_params), then padding up to a multiple of the world size (_flat_param.py
            # FlatParamHandle.flatten_tensors / _get_shard: chunk(world_size), pad the last).
            "unsharded_numel": fp._unpadded_unsharded_size.numel(),
            "padded_unsharded_numel": fp._padded_unsharded_size.numel() if hasattr(fp, "_padded_unsharded_size")
            else None,
            "sharded_numel": fp._sharded_size.numel(),
        })
    return units


def unit_structure_fsdp2(model: nn.Module, rec: Recorder) -> List[Dict[str, Any]]:
    """Valid after the first forward (FSDPParam's dtypes are set in lazy init)."""
    units, seen = [], set()
    for name, mod in model.named_modules():
        get_state = getattr(mod, "_get_fsdp_state", None)
        if get_state is None:
            continue
        group = get_state()._fsdp_param_group
        if group is None or id(group) in seen:
            continue
        seen.add(id(group))
        path = tc.clean_fqn(name)
        rec.unit_names[id(group)] = path
        mi, pmi = group.mesh_info, group.post_forward_mesh_info
        params = []
        for fp in group.fsdp_params:
            params.append({
                "name": fp._param_fqn if hasattr(fp, "_param_fqn") else fp._module_info.param_name,
                "shape": list(fp._orig_size),
                "padded_sharded_numel": fp.padded_sharded_param_size.numel(),
                "orig_dtype": str(getattr(fp, "orig_dtype", fp.sharded_param.dtype)).replace("torch.", ""),
                "param_dtype": str(getattr(fp, "param_dtype", None) or fp.sharded_param.dtype).replace("torch.", ""),
                "reduce_dtype": str(getattr(fp, "reduce_dtype", None) or getattr(fp, "param_dtype", None)
                                    or fp.sharded_param.dtype).replace("torch.", ""),
                "requires_grad": bool(fp.sharded_param.requires_grad),
            })
        units.append({
            "unit": path,
            "shard_size": mi.shard_mesh_size,
            "replicate_size": getattr(mi, "replicate_mesh_size", 1),
            "post_forward_shard_size": pmi.shard_mesh_size if pmi is not None else None,
            "num_params": len(params),
            "param_numel": sum(int(torch.Size(p["shape"]).numel()) for p in params),
            "padded_sharded_numel": sum(p["padded_sharded_numel"] for p in params),
            "params": params,
        })
    return units


def run_case(cfg: Dict[str, Any]) -> Dict[str, Any]:
    global CURRENT
    install_hooks()
    rec = Recorder()
    rec.record_copies = bool(cfg.get("offload"))
    world = cfg["world"]
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    mesh = make_mesh(cfg)
    CURRENT = rec
    try:
        # FakeTensorMode (no storage) except where it cannot run: CPU offload pins host memory
        # (aten._pin_memory has no fake kernel) and peft's get_peft_model swaps parameters
        # (`_apply` cannot swap fake tensors). Those cases use real tensors of the small model;
        # the fake backend leaves collective outputs uninitialised, which changes no size.
        fake = contextlib.nullcontext() if cfg.get("real") else FakeTensorMode(allow_non_fake_inputs=True)
        with fake, CollectiveMode(), copy_hooks():
            model = tc.build(cfg["model"])
            cls = tc.decoder_layer_class(model)
            if cfg.get("ac") == "hf":  # transformers' default: non-reentrant
                model.gradient_checkpointing_enable()
            if cfg.get("lora"):
                model = _lora(model)
            wrapped = (wrap_fsdp1 if cfg["version"] == 1 else wrap_fsdp2)(model, cfg, cls, mesh)
            units = (unit_structure_fsdp1(wrapped, rec) if cfg["version"] == 1
                     else unit_structure_fsdp2(wrapped, rec))
            optim = torch.optim.AdamW([p for p in wrapped.parameters() if p.requires_grad], lr=1e-3, foreach=False)
            ids = tc.make_batch(model)
            for step in (1, 2):
                rec.step = step
                rec.phase = "forward"
                loss = tc.loss_of(wrapped, ids)
                rec.phase = "backward"
                loss.backward()
                rec.phase = "optimizer"
                optim.step()
                optim.zero_grad()
                if step == 1:
                    # Lazy initialisation (first forward) sets FSDP1's padded unsharded size
                    # (_flat_param.py FlatParamHandle.init_flat_param_attributes) and FSDP2's
                    # dtypes (FSDPParam.init_dtype_attrs): read the units again.
                    units = (unit_structure_fsdp1(wrapped, rec) if cfg["version"] == 1
                             else unit_structure_fsdp2(wrapped, rec))
    finally:
        CURRENT = None
    return build_doc(cfg, rec, units)


# ------------------------------------------------------------------------------------------ output

def _compact(r: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in r.items() if k != "step"}


def summarize(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """unit -> kind -> phase -> {calls, bytes, group_size}."""
    out: Dict[str, Any] = defaultdict(lambda: defaultdict(dict))
    for r in records:
        slot = out["(none)" if r["unit"] is None else r["unit"]][r["kind"]].setdefault(r["phase"], {"calls": 0, "bytes": 0,
                                                                           "group_sizes": []})
        slot["calls"] += 1
        slot["bytes"] += r["bytes"] or 0
        if r["group_size"] not in slot["group_sizes"]:
            slot["group_sizes"].append(r["group_size"])
    return {u: {k: dict(v) for k, v in kinds.items()} for u, kinds in out.items()}


def totals(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    t: Dict[str, Dict[str, int]] = defaultdict(lambda: {"calls": 0, "bytes": 0})
    for r in records:
        t[r["kind"]]["calls"] += 1
        t[r["kind"]]["bytes"] += r["bytes"] or 0
    return dict(t)


def offload_summary(copies: List[Dict[str, Any]]) -> Dict[str, Any]:
    """unit -> phase -> direction -> {calls, bytes}: host-to-device for an unshard's copy of the
    sharded parameter, device-to-host for a reduce's copy of the sharded gradient."""
    out: Dict[str, Any] = defaultdict(lambda: defaultdict(dict))
    for c in copies:
        direction = "device_to_host" if c["cause"].endswith("reduce") else "host_to_device"
        slot = out["(none)" if c["unit"] is None else c["unit"]][c["phase"]].setdefault(direction, {"calls": 0, "bytes": 0})
        slot["calls"] += 1
        slot["bytes"] += c["numel"] * ITEMSIZE[c["dtype"]]
    return {u: dict(v) for u, v in out.items()}


def structural_checks(cfg: Dict[str, Any], units: List[Dict[str, Any]], records: List[Dict[str, Any]]) -> List[str]:
    """Each all-gather / reduce-scatter of the steady step against the unit's own sizes. These are
    the statements of COMM.md; a failure means FSDP does something the document does not say."""
    fails = []
    by_unit = {u["unit"]: u for u in units}
    for r in records:
        u = by_unit.get(r["unit"])
        where = f"{r['phase']} {r['kind']} of {r['unit']!r}"
        if u is None:
            fails.append(f"{where}: no unit")
            continue
        if cfg["version"] == 1:
            ws = u["world_size"]
            if r["kind"] == "all_gather":
                want = (u["sharded_numel"], u["padded_unsharded_numel"], u["param_dtype"], ws)
                got = (r["in"]["numel"], r["out"]["numel"], r["out"]["dtype"], r["group_size"])
            elif r["kind"] == "reduce_scatter":
                want = (u["padded_unsharded_numel"], u["sharded_numel"], u["reduce_dtype"], ws)
                got = (r["in"]["numel"], r["out"]["numel"], r["in"]["dtype"], r["group_size"])
            elif r["kind"] == "all_reduce":
                hybrid = "HYBRID" in u["strategy"]
                # HYBRID: the shard, across the replicas; NO_SHARD: the whole flat gradient
                # (its `_sharded_size` is the unsharded size, _flat_param.py FlatParamHandle.shard).
                want = (u["sharded_numel"], u["reduce_dtype"], cfg["world"] // ws if hybrid else ws)
                got = (r["in"]["numel"], r["in"]["dtype"], r["group_size"])
            else:
                fails.append(f"{where}: unexpected collective")
                continue
        else:
            s = u["shard_size"]
            pdt = {p["param_dtype"] for p in u["params"]}
            pdt = pdt.pop() if len(pdt) == 1 else "uint8"
            grads = [p for p in u["params"] if p["requires_grad"]]
            rs_numel = sum(p["padded_sharded_numel"] for p in grads) * s
            rdt = {p["reduce_dtype"] for p in grads}
            if r["kind"] == "all_gather":
                n = u["padded_sharded_numel"] * s
                k = r["group_size"]
                # reshard_after_forward=int k: backward gathers the post-forward shard over k ranks.
                if k not in (s, u["post_forward_shard_size"]):
                    fails.append(f"{where}: group of {k}, shard group {s}")
                want = (n // k, n, pdt)
                got = (r["in"]["numel"], r["out"]["numel"], r["out"]["dtype"])
            elif r["kind"] == "reduce_scatter":
                want = (rs_numel, rs_numel // s, rdt.pop() if len(rdt) == 1 else sorted(rdt), s)
                got = (r["in"]["numel"], r["out"]["numel"], r["in"]["dtype"], r["group_size"])
            elif r["kind"] == "all_reduce":
                want = (rs_numel // s, u["replicate_size"])
                got = (r["in"]["numel"], r["group_size"])
            else:
                fails.append(f"{where}: unexpected collective")
                continue
        if want != got:
            fails.append(f"{where}: expected {want}, counted {got}")
    return fails


def build_doc(cfg: Dict[str, Any], rec: Recorder, units: List[Dict[str, Any]]) -> Dict[str, Any]:
    init = [_compact(r) for r in rec.records if r["phase"] == "init"]
    step = {s: [_compact(r) for r in rec.records if r["step"] == s and r["phase"] != "init"] for s in (1, 2)}
    copies = {s: [_compact(c) for c in rec.copies if c["step"] == s] for s in (1, 2)}
    doc = {
        "case": f"{cfg['model']}.fsdp{cfg['version']}.w{cfg['world']}.{cfg['variant']}",
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in sorted(cfg.items())},
        "versions": tc.versions(),
        "rank": 0,
        "batch": [tc.DEFAULT_BATCH, tc.DEFAULT_SEQ],
        "units": units,
        "init": init,
        "collectives": step[2],
        "step1_collectives": step[1] if step[1] != step[2] else "same as step 2",
        "offload_copies": copies[2],
        "offload_summary": offload_summary(copies[2]),
        "summary": summarize(step[2]),
        "totals": totals(step[2]),
        "checks": structural_checks(cfg, units, step[2]),
    }
    return doc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", action="append", default=[], help="run the cases whose name contains this (repeatable)")
    ap.add_argument("--ci", action="store_true", help="only the CI subset")
    ap.add_argument("--check", action="store_true",
                    help="compare with the committed reference/comm/*.json instead of writing them")
    ap.add_argument("--out", default=OUT_DIR, help="where to write the JSON (default: reference/comm)")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    table = case_table()
    names = CI_CASES if args.ci else list(table)
    names = tc.select(names, args.k)
    if args.list:
        print("\n".join(names))
        return 0
    failed = 0
    t_all = time.time()
    for name in names:
        t0 = time.time()
        try:
            doc = run_case(table[name])
        except Exception:
            failed += 1
            print(f"FAIL {name}: exception\n{traceback.format_exc()}")
            continue
        path = os.path.join(args.out, name + ".json")
        problems = list(doc["checks"])
        if args.check:
            if not os.path.exists(path):
                problems.append(f"no reference {path}")
            else:
                ref = tc.read_json(path)
                ref.pop("versions", None)
                mine = {k: v for k, v in doc.items() if k != "versions"}
                d = tc.first_difference(ref, tc.json_round_trip(mine))
                if d:
                    problems.append(f"differs from the reference: {d}")
        else:
            tc.write_json(path, doc)
        t = doc["totals"]
        line = ", ".join(f"{k} {v['calls']}x {v['bytes']} B" for k, v in sorted(t.items()))
        status = "FAIL" if problems else "ok  "
        failed += bool(problems)
        print(f"{status} {name} ({time.time() - t0:.1f} s): {line}")
        for p in problems:
            print("     " + p)
    print(f"{len(names) - failed} passed, {failed} failed, {time.time() - t_all:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
