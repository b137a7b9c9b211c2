#!/usr/bin/env python3
"""Context parallelism (CP) + FSDP2 as torchtitan applied them with torch's `context_parallel()`, for real, on
rank 0 of a single-process `fake` process group (torch 2.13, CPU): the ground truth the planner's CP numbers
are checked against.

cp_step(cfg, world, cp) builds cp_models.CPDecoder (cfg overrides cp_models.DEFAULTS) and follows
torchtitan of the `context_parallel` era (parallelize_llama + train_context + create_context_parallel_ctx;
torchtitan HEAD has since moved CP into its own attention backends and dropped the rotate option, #3666, but
this reference uses torch 2.13's `context_parallel` API as that torchtitan did):

- meshes: init_device_mesh("cpu", (world // cp, cp), ("dp_shard", "cp")) and FSDP's mesh, torchtitan's
  "dp_shard_cp", `mesh["dp_shard", "cp"]._flatten("dp_shard_cp")`: flattening works on the fake backend
  (no fallback needed). With cp == world the flattened mesh and the cp mesh are one process group (the
  world's): FSDP's and CP's collectives are then told apart by their op, not their group (below).
- full AC (ac=True): each decoder layer replaced by `checkpoint_wrapper(layer, preserve_rng_state=False)`
  (torch.utils.checkpoint, use_reentrant=False), before fully_shard, as torchtitan's apply_ac.
- FSDP2: `fully_shard(layer, mesh=dp_shard_cp, mp_policy=...)` per decoder layer (reshard after forward),
  then `fully_shard(model, ...)` (the root: embed, norm, head); set_gradient_divide_factor(1.0) on every
  FSDP module (torchtitan's disable_fsdp_gradient_division). param_dtype=torch.bfloat16 gives
  MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=float32, cast_forward_inputs=False); fp32 otherwise.
- AdamW(foreach=False). Two steps (forward with the loss, backward, step, zero_grad); each step's
  forward + backward inside `context_parallel(cp_mesh, buffers=[input_ids, labels, positions],
  buffer_seq_dims=[1, 1, 1], no_restore_buffers={the three})` (torchtitan's train_context), after
  `set_rotate_method(rotate)` and `_cp_options.enable_load_balance = load_balance` (both restored after).
  Each step gets fresh full-sequence inputs (a data loader's batch), which the context shards in place.
  The second step is measured with FSDPMemTracker (torch.distributed._tools.fsdp2_mem_tracker) and
  CommDebugMode (torch.distributed.tensor.debug).

The CPU problem and what is done about it
-----------------------------------------
torch 2.13's CP (torch/distributed/tensor/experimental/_context_parallel/_attention.py) monkey-patches
F.scaled_dot_product_attention so that q, k, v become DTensors Shard(2) on the cp mesh
(_ContextParallel.sdpa_input_fn) and installs DTensor custom op handlers (`custom_ops` -> `_sdpa_handler`)
for the CUDA kernels only: aten._scaled_dot_product_{flash,efficient,cudnn}_attention and their backwards.
On the CPU, SDPA (CompositeImplicit; the backend choice `_fused_sdp_choice_stub` is called by device type,
below the dispatcher) picks aten._scaled_dot_product_flash_attention_for_cpu, which has no handler and no
DTensor sharding strategy. Unpatched, the first attention fails with

    NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have
    a sharding strategy registered.

What this reference adds (install_cpu_ring_attention(), nothing else is changed):
- two functions, _scaled_dot_product_ring_flash_attention_for_cpu(_backward), line for line
  torch's _scaled_dot_product_ring_flash_attention(_backward) with the CPU kernel as `op` and the CPU
  op's arguments: they call torch's own `_templated_ring_attention` / `_templated_ring_attention_backward`
  (so torch's rotaters `_AllGatherRotater` / `_AllToAllRotater`, `_SDPAMerger`, `_is_causal_behavior`, the
  load-balance branches and `_cp_options` are all torch's). No wrapper around the kernels is needed: the
  CPU forward op `(query, key, value, dropout_p, is_causal, *, attn_mask, scale) -> (output, logsumexp)`
  returns two values, so the template's `out, logsumexp, *rest = op(q, k, v, is_causal=..., **kwargs)`
  gets rest = [] and returns (out, lse), the CPU op's own arity; the CPU backward op `(grad_out, query,
  key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask, scale) -> (dq, dk, dv)` takes exactly
  the keyword names the backward template passes (grad_out_name="grad_out", query, key, value, out,
  logsumexp, is_causal, plus dropout_p and scale). The CPU kernel's output has shape [B, H, S, D] (its
  memory follows q's layout) and its logsumexp [B, H, S] float32 (memory [B, S, H]): the shapes of the
  CUDA flash op that the merger (seq dim 2, lse unsqueezed to [B, H, S, 1]) assumes.
- a handler, _cpu_ring_sdpa_handler, standing in for torch's `_sdpa_handler`: unwrap_to_op_info, call the
  ring function on the local shards, wrap the results as DTensors. torch's handler runs DTensor sharding
  propagation with the CP strategies of _sharding_rules.py, which exist for the CUDA ops only; here the
  CP placement is the only one the patched SDPA produces, so the handler checks that every DTensor input
  is Shard(2) on the cp mesh and gives every output Shard(2) with the global shape of the matching input
  (out, lse: q's sequence length; dq, dk, dv: q's, k's, v's). Registered by adding the two CPU ops to
  torch's module-level `custom_ops` dict, which `_enable_cp_dtensor_dispatcher` merges into DTensor's
  handlers on each `context_parallel` entry and drops on exit (so outside the context nothing changes).
- for the recorder only, label_rotaters() wraps torch's `_create_rotater` while cp_step runs so that each
  exchange is tagged "kv" or "dkv" (no change in behaviour or memory: the wrapper holds the rotater weakly).
verify_numerics() checks the adaptation for real (gloo, cp processes): CP attention output and dq, dk, dv
equal full-sequence SDPA's shards (fp32, max error ~1e-6) for allgather / alltoall, head-tail on / off.
Under the fake backend the values are not meaningful (received buffers are uninitialized memory); the
shapes, dtypes, calls and memory are. Nothing here is data-dependent (static shapes, no branches on values).

Collectives torch's CP issues per SDPA call (read from _attention.py, confirmed by CommDebugMode here)
-----------------------------------------------------------------------------------------------------
Notation: B batch, H query heads, Hk the K/V heads SDPA gets (H with repeat_kv, H_kv with enable_gqa),
S_l = S / cp local tokens, D head dim, n = 2 * B * Hk * S_l * D (K and V flattened and concatenated, one
buffer), `dt` the compute dtype (the activations': bf16 under MixedPrecisionPolicy(bf16), else fp32).
All run on the cp group (size cp), as functional collectives (_c10d_functional.*); FSDP's are c10d
ops (c10d._allgather_base_, c10d._reduce_scatter_base_) on dp_shard_cp (size world). cp = 1: below.

  rotate      phase     op                                      calls    elements per call (dtype)
  allgather   forward   all_gather_into_tensor                  1        n in, cp * n out (dt)
  allgather   backward  all_gather_into_tensor (K, V again)     1        n in, cp * n out (dt)
              backward  all_to_all_single (dK, dV ring)         cp       n (float32; dt if convert_to_f32 off)
  alltoall    forward   all_to_all_single (K, V ring)           cp - 1   n (dt)
  alltoall    backward  all_to_all_single (K, V ring)           cp - 1   n (dt)
              backward  all_to_all_single (dK, dV ring)         cp       n (float32; dt if convert_to_f32 off)

- "alltoall" is ft_c.permute_tensor (_AllToAllRotater): an all_to_all_single whose splits send the whole
  buffer to rank + 1 and receive rank - 1's (one peer's worth of traffic: n elements out, n in); its
  input is the n-element buffer. The backward's dK/dV rotater is always _AllToAllRotater, whatever
  set_rotate_method says, and it runs cp times (once per ring step, the last returning the accumulated
  dK/dV to its owner).
- `_cp_options.convert_to_f32` is True by default: the merger upcasts each block's out / lse to float32,
  and the backward accumulates dq, dk, dv in float32 (zeros_like(..., dtype=float32)), so the dK/dV
  exchange is float32 even under bf16 (twice the bytes of the bf16 K/V exchange); the results are cast
  back to the input dtype at the end.
- The head-tail load balancer changes no collective (same calls, same sizes); it changes which blocks
  each ring step computes (the "i <= rank": half K/V; "i > rank": half q and a partial merge) and the
  token order of the buffers. Without it, rank 0 computes only its diagonal block (every later step is
  SKIP) but still issues every collective; ranks differ in compute, not in communication.
- cp = 1 (a mesh of one) still runs the ring: no forward collective, but the backward's dK/dV rotater
  issues its all_to_all_single once per SDPA on the group of one (a local copy, no traffic).
- Full AC: the layer's forward reruns in backward, so the forward's ring runs again during backward:
  per SDPA one more forward ring (allgather: +1 all_gather_into_tensor; alltoall: +cp - 1 all_to_all)
  before the backward ring. These are reported with phase "backward" and ring "forward" (recompute).
- Memory: the attention node (ScaledDotProductFlashAttentionForCpuBackward0) saves per rank only local
  shards: q [B, H, S_l, D], k and v [B, Hk, S_l, D], out [B, H, S_l, D] (dt) and logsumexp
  [B, H, S_l] float32 (as without CP at S_l tokens); the ring runs below autograd, so nothing of the
  gathered K/V is saved. The gathered buffer (allgather: cp * n elements of dt, alive through the ring;
  alltoall: two n-element buffers in flight) and the float32 merger state are transient.
- Layout (a real, rank-dependent activation difference): the CPU kernel's output is [B, S, H, D] in
  memory (it follows q's layout, here the transposed projection), so the model's
  o.transpose(1, 2).reshape(B, S_l, H * D) is a view of it. A partial merge (head-tail, ring step
  i > rank) rebuilds the output with torch.cat (_partial_update), which is [B, H, S, D]-contiguous; the
  reshape then copies and o_proj saves that copy: one more [B, S_l, H * D] (dt) activation per layer
  on ranks 0 .. cp-2 with head-tail (rank cp-1 never merges partially; without the balancer no rank
  does, rank 0 does not merge at all). Non-partial merges are elementwise and keep the layout. CUDA's
  flash path also returns its [B, S, H, D] buffer transposed (aten/src/ATen/native/transformers/cuda/
  attention.cu), so the same is expected on GPUs (not checked here: no GPU).

Sequence length: the head-tail balancer needs S % (2 * cp) == 0; if not, torch silently disables it
(_create_default_load_balancer returns None and `context_parallel` sets enable_load_balance = False, no
warning, no error). The buffers are then sharded by DTensor Shard(1) (torch.chunk sizes: uneven when
S % cp != 0), and the ring needs equal shards (the concatenated K/V buffer sizes must match across
ranks); torch does not check this: on a real backend the collectives would mismatch, and on the fake
backend rank 0 simply gets ceil(S / cp) tokens. cp_step refuses S % cp != 0 (ValueError) and reports
the balancer actually used.

Only rank 0 is simulated by default (rank=r simulates rank r: same collectives, its own merge pattern and
temporaries; e.g. w8 cp2 fp32 head-tail: rank 0 peak 4,008,284 B, rank 1 3,892,572 B).

Returned (rank 0, second step; bytes): params_bytes, grads_bytes, optimizer_bytes (local shards, AdamW
state incl. float32 step counters); tracker_peak_bytes and tracker_peak (FSDPMemTracker categories at the
Total peak of the step); after_forward / after_backward / after_step snapshots and
activation_bytes_after_forward (the tracker's Activation category after the forward: what the step holds
for backward); attention_saved (the tensors the first layer's attention node saves, local shapes; not
under AC, where they are recomputed); sdpa_calls (ring forward / backward calls); collectives (each call:
source "fsdp" | "cp", op, group size, mesh dim, phase (forward; backward: inside autograd's graph task;
optimizer), ring "forward" | "backward" and buffer "kv" | "dkv" for CP, elements (the input: what the rank
contributes), dtype, bytes (nccl-tests' message size: an all-gather's output, a reduce-scatter's or
all-to-all's input)) and collectives_summary grouped by (source, op, group size, phase, ring, buffer, dtype):
count, total bytes, elements per call. Also load_balancer (the one torch actually used), seq_local, rank 0's
first / last local positions (head-tail: 0.. and ..S-1).

    PYTHONPATH=python:. .venv/bin/python tests/differential/cp_reference.py            # the table
    PYTHONPATH=python:. .venv/bin/python tests/differential/cp_reference.py --json --world 8 --cp 4 --bf16
    PYTHONPATH=python:. .venv/bin/python tests/differential/cp_reference.py --verify   # real ring numerics
"""
import argparse
import contextlib
import gc
import json
import os
import sys
import time
import warnings
import weakref
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.tensor.experimental._context_parallel._attention as cp_attention  # noqa: E402
from torch._prims_common import make_contiguous_strides_for  # noqa: E402
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker  # noqa: E402
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor, Shard  # noqa: E402
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta  # noqa: E402
from torch.distributed.tensor.experimental import context_parallel  # noqa: E402
from torch.distributed.tensor.experimental._attention import set_rotate_method  # noqa: E402
from torch.distributed.tensor.experimental._context_parallel._load_balancer import (  # noqa: E402
    _create_default_load_balancer)
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import cp_models  # noqa: E402
import ep_reference  # noqa: E402
from ep_reference import MultiGroupFSDPMemTracker, RecordingCommMode, _snapshot, peak_tracker  # noqa: E402

warnings.filterwarnings("ignore")
aten = torch.ops.aten

CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default

# ------------------------------------------------------------------------------------------ CP on the CPU


class _RingLog:
    """Which ring is running and which buffer it is exchanging (read by the comm recorder), and how many
    rings ran."""

    current: Optional[str] = None
    buffer: Optional[str] = None
    calls: Dict[str, int] = {"forward": 0, "backward": 0}


def _scaled_dot_product_ring_flash_attention_for_cpu(
        mesh, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
        is_causal: bool = False, *, attn_mask: Optional[torch.Tensor] = None,
        scale: Optional[float] = None) -> Tuple[torch.Tensor, ...]:
    """torch's _scaled_dot_product_ring_flash_attention with the CPU flash kernel as `op` (see the docstring)."""
    if attn_mask is not None:
        raise NotImplementedError("attn_mask is not supported yet")
    seq_dim = 2
    group = mesh.get_group()
    return cp_attention._templated_ring_attention(
        group, seq_dim, CPU_FLASH, query=query, key=key, value=value, is_causal=is_causal,
        dropout_p=dropout_p, scale=scale)


def _scaled_dot_product_ring_flash_attention_for_cpu_backward(
        mesh, grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
        out: torch.Tensor, logsumexp: torch.Tensor, dropout_p: float, is_causal: bool, *,
        attn_mask: Optional[torch.Tensor] = None, scale: Optional[float] = None) -> Tuple[torch.Tensor, ...]:
    """torch's _scaled_dot_product_ring_flash_attention_backward with the CPU backward kernel as `op`."""
    if attn_mask is not None:
        raise NotImplementedError("attn_mask is not supported yet")
    seq_dim = 2
    group = mesh.get_group()
    return cp_attention._templated_ring_attention_backward(
        group, seq_dim, CPU_FLASH_BACKWARD, grad_out=grad_out, grad_out_name="grad_out", query=query, key=key,
        value=value, out=out, logsumexp=logsumexp, is_causal=is_causal, dropout_p=dropout_p, scale=scale)


# op -> (ring function, ring name, for each output the index of the DTensor argument whose sequence length it has)
_CPU_CALLS = {
    CPU_FLASH: (_scaled_dot_product_ring_flash_attention_for_cpu, "forward", (0, 0)),
    CPU_FLASH_BACKWARD: (_scaled_dot_product_ring_flash_attention_for_cpu_backward, "backward", (1, 2, 3)),
}
SEQ_DIM = 2


def _cpu_ring_sdpa_handler(op_call: torch._ops.OpOverload, args: Tuple[object, ...],
                           kwargs: Dict[str, object]) -> object:
    """torch's _sdpa_handler for the CPU flash ops, without sharding propagation (see the docstring)."""
    op_info = DTensor._op_dispatcher.unwrap_to_op_info(op_call, args, kwargs)
    mesh = op_info.compute_mesh
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, DTensor) and (tuple(a.placements) != (Shard(SEQ_DIM),) or a.device_mesh != mesh):
            raise AssertionError(f"CP attention expects Shard({SEQ_DIM}) on the cp mesh, got {a.placements}")
    fn, ring, like = _CPU_CALLS[op_call]
    _RingLog.current = ring
    try:
        local = fn(mesh, *op_info.local_args, **op_info.local_kwargs)
    finally:
        _RingLog.current = None
    _RingLog.calls[ring] += 1
    specs = []
    for t, i in zip(local, like):
        shape = list(t.shape)
        shape[SEQ_DIM] = args[i].shape[SEQ_DIM]
        specs.append(DTensorSpec(mesh, (Shard(SEQ_DIM),),
                                 TensorMeta(torch.Size(shape), make_contiguous_strides_for(shape), t.dtype)))
    return DTensor._op_dispatcher.wrap(tuple(local), tuple(specs))


@contextlib.contextmanager
def label_rotaters():
    """Observation only: while entered, each rotater torch's ring templates create (through the module's
    `_create_rotater`, looked up at call time) marks its exchanges "kv" or "dkv" in _RingLog.buffer, so the
    recorder can tell the backward's K/V exchange from its dK/dV exchange (the same op and size under
    alltoall in float32). The dK/dV rotater is the one created with an explicit method (ALL_TO_ALL)."""
    original = cp_attention._create_rotater

    def create(pg, seq_dim, method=None):
        rotater = original(pg, seq_dim, method)
        what, ref = ("dkv" if method is not None else "kv"), weakref.ref(rotater)

        def labelled(curr_buffer):
            # Through a weak reference: a cycle rotater -> labelled -> rotater would keep the rotater, and
            # with it the all-gathered K/V buffer, alive until the next garbage collection.
            _RingLog.buffer = what
            try:
                return type(ref()).exchange_buffers(ref(), curr_buffer)
            finally:
                _RingLog.buffer = None

        rotater.exchange_buffers = labelled
        return rotater

    cp_attention._create_rotater = create
    try:
        yield
    finally:
        cp_attention._create_rotater = original


def install_cpu_ring_attention() -> None:
    """Make torch's CP dispatch the CPU flash ops to the ring functions above (idempotent): the ops join
    torch's `custom_ops`, which every `context_parallel` entry merges into DTensor's op handlers."""
    for op in _CPU_CALLS:
        cp_attention.custom_ops[op] = _cpu_ring_sdpa_handler


# ------------------------------------------------------------------------------------------ recording


class CPCommMode(RecordingCommMode):
    """ep_reference's RecordingCommMode (kind, op, phase, group size, bytes, dtype per collective) with each
    call's source ("cp": a functional collective issued inside the ring; "fsdp": FSDP2's c10d ops), the ring
    that issued it (forward / backward) and its element count."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        n = len(self.calls)
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if len(self.calls) > n:
            c = self.calls[-1]
            functional = func.namespace in ("_c10d_functional", "c10d_functional")
            c["source"] = "cp" if functional and _RingLog.current else ("fsdp" if not functional else "other")
            c["ring"] = _RingLog.current if functional else None
            c["buffer"] = _RingLog.buffer if functional else None
            # By source: with cp == world the cp group and the flattened dp_shard_cp group are one group.
            c["mesh_dim"] = {"cp": "cp", "fsdp": "dp_shard_cp"}.get(c["source"], c["mesh_dim"])
            bound = list(args) + [(kwargs or {}).get(a.name) for a in func._schema.arguments[len(args):]]
            sent = [v for a, v in zip(func._schema.arguments, bound)
                    if isinstance(v, torch.Tensor) and (a.name.startswith("input") or a.name == "self")]
            c["elements"] = sent[0].numel() if sent else None  # the input: what this rank contributes
        return out


def summarize(calls: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Count, bytes and elements per call by (source, op, group size, phase, ring, buffer, dtype), in first-seen
    order."""
    out: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    for c in calls:
        key = (c["source"], c["op"], c["group_size"], c["phase"], c["ring"], c["buffer"], c["dtype"])
        s = out.setdefault(key, {"source": c["source"], "op": c["op"].split(".")[-1], "group_size": c["group_size"],
                                 "phase": c["phase"], "ring": c["ring"], "buffer": c["buffer"], "dtype": c["dtype"],
                                 "count": 0, "bytes": 0, "elements": []})
        s["count"] += 1
        s["bytes"] += c["bytes"]
        if c["elements"] not in s["elements"]:
            s["elements"].append(c["elements"])
    return list(out.values())


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def attention_saved(loss: torch.Tensor) -> List[Dict[str, Any]]:
    """What each attention node of the graph saves (local shards), first layer first: name, shape, dtype, bytes."""
    out, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node.name().startswith("ScaledDotProductFlashAttentionForCpuBackward"):
            rec = []
            for name in ("query", "key", "value", "output", "logsumexp"):
                t = _local(getattr(node, f"_saved_{name}"))
                rec.append({"name": name, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
                            "bytes": t.numel() * t.element_size()})
            out.append(rec)
        stack.extend(n for n, _ in node.next_functions)
    return out[::-1]


# ------------------------------------------------------------------------------------------ the step


@contextlib.contextmanager
def _cp_options(rotate: str, load_balance: bool, convert_to_f32: bool):
    opts = cp_attention._cp_options
    saved = (opts.rotate_method, opts.enable_load_balance, opts.convert_to_f32)
    set_rotate_method(rotate)
    opts.enable_load_balance, opts.convert_to_f32 = load_balance, convert_to_f32
    try:
        yield
    finally:
        opts.rotate_method, opts.enable_load_balance, opts.convert_to_f32 = saved


def _apply_fsdp(model: torch.nn.Module, fsdp_mesh: Any, param_dtype: Optional[torch.dtype], ac: bool) -> None:
    """torchtitan's apply_ac (full, before fully_shard), then fully_shard per decoder layer and the root."""
    if ac:
        for i, layer in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
    mp = (MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
          if param_dtype is not None else MixedPrecisionPolicy())
    for layer in model.layers:
        fully_shard(layer, mesh=fsdp_mesh, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mesh=fsdp_mesh, mp_policy=mp)


def _apply_ep_fsdp(model: torch.nn.Module, fsdp_mesh: Any, world: int, ep: int, param_dtype: Optional[torch.dtype],
                   ac: bool) -> Any:
    """Expert parallelism on the sparse mesh (efsdp = world // ep, ep), then FSDP2 with the experts' group on
    efsdp and the rest on `fsdp_mesh` (ep_reference.apply_ep, apply_fsdp). Returns the sparse mesh."""
    if ac:
        raise ValueError("the EP + CP reference runs without activation checkpointing")
    sparse = init_device_mesh("cpu", (world // ep, ep), mesh_dim_names=("efsdp", "ep"))
    expert_params = ep_reference.apply_ep(model, sparse["ep"])
    mp = (MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
          if param_dtype is not None else MixedPrecisionPolicy())
    ep_reference.apply_fsdp(model, fsdp_mesh, sparse, ep, expert_params, mp, "root")
    return sparse


def cp_step(cfg: Optional[Dict[str, Any]] = None, world: int = 8, cp: int = 2,
            param_dtype: Optional[torch.dtype] = None, ac: bool = False, load_balance: bool = True,
            rotate: str = "allgather", convert_to_f32: bool = True, rank: int = 0,
            applier: Any = None, ep: int = 1) -> Dict[str, Any]:
    """CP (degree `cp`) and FSDP2 over dp_shard x cp = `world` ranks, two training steps on `rank` (0) of the
    fake backend; the measurements of the second (see the module docstring). cfg overrides cp_models.DEFAULTS.
    `applier`: a module `fsdp-plan --emit torch` wrote; its build_mesh, apply_fsdp and cp_context replace the
    code here (`ac` and `param_dtype` are then the emitted plan's). `ep` > 1 (a cfg with experts): expert
    parallelism beside CP as torchtitan builds it, ep borrowing the dp_shard x cp ranks (the sparse mesh
    (efsdp, ep), efsdp x ep = world), the experts split and sharded by ep_reference's apply_ep / apply_fsdp
    (fully_shard on the flattened dp_shard_cp mesh, the experts' group on efsdp); no AC with it."""
    t0 = time.perf_counter()
    cfg = dict(cp_models.DEFAULTS, **(cfg or {}))
    if world % cp:
        raise ValueError(f"cp {cp} does not divide world {world}")
    if cfg["seq"] % cp:
        raise ValueError(f"seq {cfg['seq']} is not a multiple of cp {cp}: torch's ring needs equal shards")
    install_cpu_ring_attention()
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    model = cp_models.build(cfg)
    if applier is not None:
        mesh = applier.build_mesh("cpu")
        model = applier.apply_fsdp(model, mesh=mesh)
        fsdp_mesh = mesh["dp_shard_cp"]
    else:
        mesh = init_device_mesh("cpu", (world // cp, cp), mesh_dim_names=("dp_shard", "cp"))
        fsdp_mesh = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        if ep > 1:
            sparse = _apply_ep_fsdp(model, fsdp_mesh, world, ep, param_dtype, ac)
        else:
            _apply_fsdp(model, fsdp_mesh, param_dtype, ac)
    cp_mesh = mesh["cp"]
    mesh_dims: Dict[str, List[str]] = {}
    named = [("dp_shard_cp", fsdp_mesh), ("cp", cp_mesh), ("dp_shard", mesh["dp_shard"])]
    if ep > 1:
        named += [("ep", sparse["ep"]), ("efsdp", sparse["efsdp"])]
    for name, m in named:
        mesh_dims.setdefault(m.get_group().group_name, []).append(name)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
    params_bytes = sum(_local(p).nbytes for p in model.parameters())

    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    # With EP a layer has two FSDPParamGroups (dense, experts): ep_reference's tracker follows both.
    tracker = peak_tracker(MultiGroupFSDPMemTracker if ep > 1 else FSDPMemTracker)(model, optim)
    comm = CPCommMode(mesh_dims)
    res: Dict[str, Any] = {}
    with _cp_options(rotate, load_balance, convert_to_f32), label_rotaters():
        balancer = _create_default_load_balancer(cfg["seq"], cp, "cpu")
        with tracker:
            for it in range(2):
                inputs = cp_models.example_inputs(cfg, seed=it)
                bufs = [inputs["input_ids"], inputs["labels"], inputs["positions"]]
                if it == 1:
                    gc.collect()  # step 1's garbage (none expected) out of the measured step
                    tracker.track_inputs(tuple(bufs))
                    tracker.reset_mod_stats()
                    tracker.reset_peaks()
                    comm.calls.clear()
                    comm.phase = "forward"
                    _RingLog.calls = {"forward": 0, "backward": 0}
                    comm.__enter__()
                ctx = (applier.cp_context(mesh, bufs) if applier is not None else
                       context_parallel(cp_mesh, buffers=bufs, buffer_seq_dims=[1, 1, 1], no_restore_buffers=set(bufs)))
                with ctx:
                    loss = model(**inputs)
                    if it == 1:
                        res["after_forward"] = _snapshot(tracker.get_tracker_snapshot())
                        res["attention_saved"] = [] if ac else attention_saved(loss)
                        res["local_positions_head"] = inputs["positions"][0, :4].tolist()
                        res["local_positions_tail"] = inputs["positions"][0, -4:].tolist()
                        res["seq_local"] = inputs["input_ids"].shape[1]
                    loss.backward()
                if it == 1:
                    res["after_backward"] = _snapshot(tracker.get_tracker_snapshot())
                    res["grads_bytes"] = sum(_local(p.grad).nbytes for p in model.parameters() if p.grad is not None)
                comm.phase = "optimizer"
                optim.step()
                if it == 1:
                    res["after_step"] = _snapshot(tracker.get_tracker_snapshot())
                optim.zero_grad()
                if it == 1:
                    comm.__exit__(None, None, None)
    calls = comm.calls
    saved = res.get("attention_saved") or []
    out = {
        "world": world, "cp": cp, "dp_shard": world // cp, "rank": rank, "ep": ep,
        "param_dtype": str(param_dtype).replace("torch.", "") if param_dtype else "float32",
        "ac": ac, "rotate": rotate, "load_balance_requested": load_balance,
        "load_balancer": type(balancer).__name__ if balancer is not None else None,
        "convert_to_f32": convert_to_f32, "cfg": cfg, "torch": torch.__version__,
        "seq": cfg["seq"], "seq_local": res["seq_local"],
        "local_positions_head": res["local_positions_head"], "local_positions_tail": res["local_positions_tail"],
        "params_bytes": params_bytes,
        "grads_bytes": res["grads_bytes"],
        "optimizer_bytes": sum(_local(t).nbytes for s in optim.state.values() for t in s.values()
                               if torch.is_tensor(t)),
        "tracker_peak_bytes": tracker.total_peak,
        "tracker_peak": tracker.total_snap,
        "after_forward": res["after_forward"],
        "activation_bytes_after_forward": res["after_forward"].get("Activation", 0),
        "after_backward": res["after_backward"],
        "after_step": res["after_step"],
        "attention_saved": saved[0] if saved else [],
        "attention_saved_bytes_per_layer": sum(t["bytes"] for t in saved[0]) if saved else None,
        "sdpa_calls": dict(_RingLog.calls),
        "collectives_summary": summarize(calls),
        "collectives": calls,
        "loss_shape": list(loss.shape),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    return out


# ------------------------------------------------------------------------------------------ numerics check


def _verify_worker(rank: int, cp: int, port: int, cases: List[Tuple[str, bool]], q: Any) -> None:
    import torch.nn.functional as F
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=cp)
    install_cpu_ring_attention()
    mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))
    results = []
    for rotate, lb in cases:
        g = torch.Generator().manual_seed(0)
        b, h, hk, s, d = 2, 4, 2, 16 * cp, 8
        full = [torch.randn(b, n, s, d, generator=g, dtype=torch.float64).float() for n in (h, hk, hk)]
        dout = torch.randn(b, h, s, d, generator=g)
        ref = [t.clone().requires_grad_() for t in full]
        ref_out = F.scaled_dot_product_attention(*ref, is_causal=True, enable_gqa=True)
        ref_out.backward(dout)
        expect = [ref_out.detach(), dout] + [t.grad for t in ref]  # sharded below, as CP shards its buffers
        with _cp_options(rotate, lb, True):
            bufs = [t.clone() for t in full] + [t.clone() for t in expect]
            with context_parallel(mesh, buffers=bufs, buffer_seq_dims=[2] * len(bufs), no_restore_buffers=set(bufs)):
                qkv = [t.detach().clone().requires_grad_() for t in bufs[:3]]
                o = F.scaled_dot_product_attention(*qkv, is_causal=True, enable_gqa=True)
                o.backward(bufs[4])
        errs = [float((o.detach() - bufs[3]).abs().max())] + [float((x.grad - e).abs().max())
                                                                for x, e in zip(qkv, bufs[5:])]
        results.append({"rotate": rotate, "load_balance": lb, "rank": rank, "max_abs_err": max(errs)})
    q.put(results)
    dist.destroy_process_group()


def verify_numerics(cp: int = 2) -> List[Dict[str, Any]]:
    """Run the adapted ring attention for real (gloo, `cp` processes) against full-sequence SDPA: output and
    dq, dk, dv (GQA without repeat) for rotate allgather / alltoall, head-tail on / off. Returns each rank's
    max absolute error per case."""
    import multiprocessing as mp
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cases = [(r, lb) for r in ("allgather", "alltoall") for lb in (True, False)]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_verify_worker, args=(r, cp, port, cases, q)) for r in range(cp)]
    for p in procs:
        p.start()
    out = [x for _ in procs for x in q.get(timeout=300)]
    for p in procs:
        p.join()
    return sorted(out, key=lambda r: (r["rotate"], not r["load_balance"], r["rank"]))


# ------------------------------------------------------------------------------------------ main

MAIN_CASES = [(w, c, dt, ac) for w, c in ((8, 2), (8, 4), (4, 4)) for dt in (None, torch.bfloat16)
              for ac in (False, True)]


def _memory_row(r: Dict[str, Any]) -> str:
    return (f"w{r['world']} cp{r['cp']} {r['param_dtype']:8} ac={int(r['ac'])} {r['rotate']:9} "
            f"{'headtail' if r['load_balancer'] else 'none':8} | {r['params_bytes']:7} {r['grads_bytes']:7} "
            f"{r['optimizer_bytes']:7} | {r['tracker_peak_bytes']:8} {r['tracker_peak'].get('Temp', 0):7} | "
            f"{r['activation_bytes_after_forward']:8} {str(r['attention_saved_bytes_per_layer']):>7} | "
            f"{r['sdpa_calls']['forward']}/{r['sdpa_calls']['backward']} | {r['seconds']}s")


def _comm_rows(r: Dict[str, Any]) -> List[str]:
    out = []
    for s in r["collectives_summary"]:
        what = f"{s['ring']}-ring {s['buffer']}" if s["source"] == "cp" else ""
        out.append(f"    {s['source']:4} {s['op']:24} g{s['group_size']} {s['phase']:8} {what:15} x{s['count']:<3} "
                   f"in {'/'.join(map(str, s['elements']))} {s['dtype']}, {s['bytes']} B")
    return out


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int)
    ap.add_argument("--cp", type=int)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--ac", action="store_true")
    ap.add_argument("--rotate", choices=("allgather", "alltoall"), default="allgather")
    ap.add_argument("--no-load-balance", action="store_true")
    ap.add_argument("--json", action="store_true", help="one case (--world, --cp) as JSON")
    ap.add_argument("--verify", action="store_true", help="check the ring's numerics for real (gloo, 2 processes)")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    try:
        if a.verify:
            for r in verify_numerics(2):
                print(json.dumps(r))
            return 0
        if a.json:
            r = cp_step(world=a.world or 8, cp=a.cp or 2, param_dtype=torch.bfloat16 if a.bf16 else None, ac=a.ac,
                        load_balance=not a.no_load_balance, rotate=a.rotate)
            print(json.dumps(r, indent=1))
            return 0
        print(f"cp_models.DEFAULTS {cp_models.DEFAULTS}; rank 0, second step, bytes")
        print("case                                     | params   grads   optim | peak     Temp@pk | act@fwd  "
              "attn/ly | sdpa f/b | time")
        cases = [(w, c, dt, ac, "allgather", True) for w, c, dt, ac in MAIN_CASES]
        cases += [(8, 4, dt, False, rot, lb) for dt in (None, torch.bfloat16) for rot, lb in
                  (("alltoall", True), ("allgather", False), ("alltoall", False))]
        cases += [(8, 4, torch.bfloat16, True, "alltoall", True)]
        results = []
        for w, c, dt, ac, rot, lb in cases:
            results.append(cp_step(world=w, cp=c, param_dtype=dt, ac=ac, rotate=rot, load_balance=lb))
            print(_memory_row(results[-1]), flush=True)
        print("\ncollectives (in: elements each call sends; bytes: all-gather output, others input, summed)")
        for r in results:
            print(_memory_row(r).split(" |")[0])
            print("\n".join(_comm_rows(r)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    print(f"total {time.perf_counter() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
