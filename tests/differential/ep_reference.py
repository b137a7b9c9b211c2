#!/usr/bin/env python3
"""Expert parallelism (EP) + FSDP2 as torchtitan applies them, for real, on rank 0 of a single-process
`fake` process group (torch 2.13, CPU): the ground truth the planner's EP numbers are checked against.

ep_step(model_factory, world, ep) builds one of ep_models.py's decoders (forced balanced, static
routing) and, without TP / CP / PP, follows torchtitan:

- meshes (torchtitan/distributed/parallel_dims.py, partial_dtensor backend): dense `(fsdp = world,)`
  ["fsdp"] and sparse `(efsdp = world // ep, ep)` ["efsdp", "ep"], row-major (ep innermost), each
  from init_device_mesh("cpu", ...). The sparse mesh is one root, so FSDP can concatenate its efsdp
  and ep sub-meshes (_fsdp_param.py: _init_sharding_spec_dtensor, DeviceMesh._concatenate).
- routed experts, `GroupedExperts` (FusedMoE): w1 / w2 / w3 become DTensors Shard(0) on the ep mesh
  (distribute_module with a partition_fn calling distribute_tensor(..., [Shard(0)]), as torchtitan's
  ExpertParallel style does); rank 0 keeps experts [0, E/ep). FSDP then sees a DTensor parameter and
  shards its local [E/ep, F, D] over efsdp (torch 2.13 takes this path; no workaround needed).
  `PerExpertMoE`: torchtitan has no EP for experts held as separate modules; the natural equivalent
  is that rank 0 keeps only its E/ep ExpertMLP modules (the ModuleList is rebuilt with experts
  [0, E/ep)), which stay plain parameters that FSDP shards over efsdp.
- the EP forward (torchtitan/models/common/token_dispatcher.py: AllToAllTokenDispatcher): the T*K
  routed rows, sorted by expert, are dispatched with
  torch.distributed._functional_collectives.all_to_all_single_autograd on the ep group with equal
  splits (T*K/ep rows to each ep peer), permuted rank-major -> expert-major, run through the local
  experts, permuted back and combined with the reverse all-to-all (the same autograd function,
  whose backward is again an all-to-all), then weighted and index-added as in ep_models.py. The
  token-count exchange (a small all_to_all of the per-expert counts under no_grad) is skipped: the
  splits are static. Under the fake backend the received rows are whatever torch.empty held: fine
  for counting memory and communication.
- FSDP2 (torchtitan/distributed/fsdp.py: apply_fsdp_to_decoder): `fully_shard(layer, mesh=dense,
  shard_placement_fn=...)` per decoder layer, expert parameters giving
  ShardPlacementResult(Shard(0) if efsdp * ep <= E else Shard(1), efsdp mesh info) and the others
  ShardPlacementResult(Shard(0), dense mesh info); torch 2.13 puts the two into separate
  FSDPParamGroups of the layer (_fsdp_init.py: _init_param_group), each with its own all-gather and
  reduce-scatter. Then fully_shard(model, mesh=dense). With units="root" (the default, the
  simplest) the embedding, final norm and head are left to the root group. With units="titan"
  they are sharded as torchtitan does: fully_shard(embed), fully_shard([norm, head],
  reshard_after_forward=False), the layers, the root (which then holds nothing), and with ep > 1
  torchtitan's explicit forward / backward prefetching. Either way each layer reshards after
  forward, and set_gradient_divide_factor(1.0) is called on every FSDP module, as torchtitan does.
  The PerExpertMoE's experts always take Shard(0): a per-expert Linear weight's dim 0 is the
  hidden / model dim, the one fused Shard(1) shards; the Shard(1) rule is about the fused expert dim.
  ep = 1 is accepted too: no EP, torchtitan's ep_degree == 1 branch (one mesh; Shard(1) on fused
  experts when world > E).
- No mixed precision by default (fp32); param_dtype=torch.bfloat16 gives MixedPrecisionPolicy(
  param_dtype, reduce_dtype=float32, cast_forward_inputs=False) as torchtitan does.

Two training steps (forward with the loss, backward, AdamW(foreach=False) step, zero_grad) with the
factory's example inputs, under FSDPMemTracker and CommDebugMode. Reported for rank 0 (second step,
the steady state: the first adds FSDP's lazy initialisation and AdamW's state):

- params_bytes / expert_params_bytes: the local shards' nbytes after fully_shard (`to_local()`),
  all parameters / the routed experts' only;
- grads_bytes: the local gradients' nbytes after backward; optimizer_bytes: AdamW's state tensors'
  nbytes after the step (step counters included: 4-byte float32 scalars, one per parameter);
- tracker_peak_bytes and tracker_peak (FSDPMemTracker's categories at the Total peak of the step),
  non_activation_peak_bytes and non_activation_peak (at the largest sum of the non-activation
  categories, as tests/differential/test_fsdp2.py compares), after_backward / after_step snapshots;
- collectives: every collective CommDebugMode saw (it sees FSDP2's c10d ops as well as the
  functional all-to-alls), in order: kind, op, group size and mesh dim, bytes (the message size,
  nccl-tests' sense: an all-gather's output, a reduce-scatter's input, an all-to-all's input),
  dtype, phase (forward, backward: inside autograd's graph task; optimizer) and module (where
  CommDebugMode's module tracker was when it was issued: a prefetched all-gather shows the module
  that prefetched it, not the group's owner); and summaries by (kind, phase, mesh dim, group size):
  count and bytes; all_to_all count and bytes;
- fsdp_param_groups: each FSDPParamGroup (a decoder layer has two with EP: dense on fsdp, experts
  on efsdp): its modules, shard group size, parameter count, padded local shard bytes.

With units="titan", [norm, head] is one FSDPParamGroup over two modules, and torch 2.13 runs its
post-backward once per module: head's gradient is reduce-scattered alone and the group resharded,
then all-gathered again for norm's backward and norm's gradient reduce-scattered alone (so one
more all-gather and reduce-scatter in backward than one would plan for a group that stays
unsharded after forward).

    PYTHONPATH=python:. .venv/bin/python tests/differential/ep_reference.py --model fused --world 8 --ep 2
    PYTHONPATH=python:. .venv/bin/python tests/differential/ep_reference.py --all   # every case below
"""
import argparse
import json
import os
import sys
import types
import warnings
from functools import wraps
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed._functional_collectives import all_to_all_single_autograd  # noqa: E402
from torch.distributed._tools.fsdp2_mem_tracker import (FSDPMemTracker, _FSDPModState, _FSDPRefType,  # noqa: E402
                                                         _FSDPState)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.distributed.fsdp._fully_shard._fsdp_common import ShardPlacementResult  # noqa: E402
from torch.distributed.fsdp._fully_shard._fsdp_init import _get_mesh_info  # noqa: E402
from torch.distributed.fsdp._fully_shard._fsdp_state import FSDPState  # noqa: E402
from torch.distributed.tensor import DTensor, Shard, distribute_module, distribute_tensor  # noqa: E402
from torch.distributed.tensor.debug import CommDebugMode  # noqa: E402
from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402

import ep_models  # noqa: E402

warnings.filterwarnings("ignore")

CASES: List[Tuple[str, int, int]] = [(m, w, e) for m in ("fused", "per_expert")
                                     for w, e in ((8, 2), (8, 4), (8, 8), (4, 4))]
NON_ACTIVATION = ["Sharded Param", "Unsharded Param", "Buffer", "Sharded Grad", "Unsharded Grad",
                  "All Gather", "Reduce Scatter", "OptState"]
KIND = {"_allgather_base_": "all_gather", "allgather_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
        "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
        "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
        "reduce_scatter_tensor_coalesced_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
        "reduce_scatter_tensor_coalesced": "reduce_scatter",
        "alltoall_base_": "all_to_all", "alltoall_": "all_to_all", "all_to_all_single": "all_to_all",
        "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "all_reduce": "all_reduce",
        "all_reduce_coalesced": "all_reduce", "broadcast_": "broadcast", "broadcast": "broadcast",
        "barrier": "barrier"}


# ------------------------------------------------------------------------------------------ recording

def _group_of(leaves: List[Any]) -> Optional[dist.ProcessGroup]:
    """The process group of a collective: a c10d op's ProcessGroup argument, a functional op's group name."""
    for a in leaves:
        if isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type()):
            return dist.ProcessGroup.unbox(a)
    for a in leaves:
        if isinstance(a, str):
            try:
                return dist.distributed_c10d._resolve_process_group(a)
            except Exception:
                continue
    return None


def _tensors(value: Any) -> List[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


class RecordingCommMode(CommDebugMode):
    """CommDebugMode (which counts) also keeping each collective's message size, process group and phase.
    The phase is "backward" inside autograd's graph task (FSDP's reduce-scatters in post-backward hooks
    and the final callback, the all-to-alls' backward), "optimizer" once `phase` is set so, else
    "forward"."""

    def __init__(self, mesh_dims: Dict[str, List[str]]):
        super().__init__()
        self.calls: List[Dict[str, Any]] = []
        self.mesh_dims = mesh_dims  # group name -> the mesh dims whose group it is
        self.phase = "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is NotImplemented:
            return out
        packet = func._overloadpacket
        if packet not in self.comm_registry and packet not in c10d_collective_ops:
            return out
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        kind = KIND.get(name, name)
        if kind in ("barrier",) or name == "wait_tensor":
            return out
        group = _group_of(tree_leaves((args, kwargs)))
        size = group.size() if group is not None else None
        inputs, outputs = [], []
        bound = list(args) + [kwargs.get(a.name) for a in func._schema.arguments[len(args):]]
        for arg, value in zip(func._schema.arguments, bound):
            if arg.name.startswith("output"):
                outputs += _tensors(value)
            elif arg.name.startswith("input") or arg.name in ("self", "tensor", "tensors"):
                inputs += _tensors(value)
        in_bytes = sum(t.numel() * t.element_size() for t in inputs)
        out_bytes = sum(t.numel() * t.element_size() for t in outputs)
        if kind == "all_gather":  # the gathered (output) buffer; a functional op has only its input
            nbytes = out_bytes if outputs else in_bytes * (size or 1)
        else:  # reduce-scatter, all-to-all: the input; all-reduce, broadcast: the tensor
            nbytes = in_bytes
        if torch._C._current_graph_task_id() != -1:
            phase = "backward"
        else:
            phase = self.phase
        module = self.advanced_module_tracker.name  # "FSDPFusedMoE.layers.0..."; "Global" outside every module
        module = "" if module == "Global" else module.split(".", 1)[1] if "." in module else ""
        self.calls.append({"kind": kind, "op": f"{func.namespace}.{name}", "phase": phase, "module": module,
                           "group_size": size,
                           "mesh_dim": self.mesh_dim(group, kind),
                           "bytes": nbytes, "dtype": str((inputs or outputs)[0].dtype).replace("torch.", "")
                           if inputs or outputs else None})
        return out

    def mesh_dim(self, group, kind: str) -> Optional[str]:
        """The mesh dim a collective ran on: "ep" for an all-to-all where the group is also ep's, else
        the first dim the group belongs to (fsdp, ep, efsdp)."""
        dims = self.mesh_dims.get(group.group_name, []) if group is not None else []
        if kind == "all_to_all" and "ep" in dims:
            return "ep"
        return next((d for d in dims if d != "ep"), dims[0] if dims else None)


def summarize(calls: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Count and bytes by (kind, phase, mesh dim, group size), in first-seen order."""
    out: Dict[Tuple[Any, ...], Dict[str, Any]] = {}
    for c in calls:
        key = (c["kind"], c["phase"], c["mesh_dim"], c["group_size"])
        s = out.setdefault(key, {"kind": c["kind"], "phase": c["phase"], "mesh_dim": c["mesh_dim"],
                                 "group_size": c["group_size"], "count": 0, "bytes": 0})
        s["count"] += 1
        s["bytes"] += c["bytes"]
    return list(out.values())


def peak_tracker(base):
    """A subclass of `base` (FSDPMemTracker) keeping, from `reset_peaks()` on, the largest Total and the
    largest sum of the NON_ACTIVATION categories with the snapshots there (the tracker's own peak dates
    from its __enter__)."""

    class Tracker(base):
        def reset_peaks(self):
            self.total_peak, self.total_snap, self.non_act_peak, self.non_act_snap = 0, {}, 0, {}

        def _update_snap(self, *args, **kwargs):
            super()._update_snap(*args, **kwargs)
            if not hasattr(self, "total_peak"):
                self.reset_peaks()
            for snap in self._curr_mem_snap.values():
                named = {getattr(k, "value", k): v for k, v in snap.items()}
                non_act = sum(v for k, v in named.items() if k in NON_ACTIVATION)
                if named.get("Total", 0) > self.total_peak:
                    self.total_peak, self.total_snap = named.get("Total", 0), named
                if non_act > self.non_act_peak:
                    self.non_act_peak, self.non_act_snap = non_act, named

    return Tracker


class _MergedGroups:
    """What FSDPMemTracker's pre-forward closure reads of `FSDPState._fsdp_param_group` (its fsdp_params),
    for a module with several FSDPParamGroups."""

    def __init__(self, groups):
        self.fsdp_params = [fp for g in groups for fp in g.fsdp_params]


_SINGULAR = FSDPState._fsdp_param_group


def _any_group(state):
    groups = state._fsdp_param_groups
    return _MergedGroups(groups) if len(groups) > 1 else _SINGULAR.fget(state)


class MultiGroupFSDPMemTracker(FSDPMemTracker):
    """FSDPMemTracker for modules whose parameters FSDP splits into several FSDPParamGroups (a
    shard_placement_fn returning ShardPlacementResult on other meshes: the EP layers' expert and dense
    parameters). torch 2.13's tracker reads `FSDPState._fsdp_param_group`, which raises for more than one
    group. Here each group's sharded parameters and gradients are tracked and its pre_backward /
    post_backward wrapped (the latter reading only its own group), and, while the tracker is entered, the
    singular property gives the pre-forward closure all the groups' parameters (unsharded together)."""

    def __enter__(self):
        if self._depth == 0:
            FSDPState._fsdp_param_group = property(_any_group)
        try:
            return super().__enter__()
        except BaseException:
            if self._depth == 0:
                FSDPState._fsdp_param_group = _SINGULAR
            raise

    def __exit__(self, *args):
        try:
            super().__exit__(*args)
        finally:
            if self._depth == 0:
                FSDPState._fsdp_param_group = _SINGULAR

    def _group_post_backward(self, fsdp_mod, group, orig):
        """FSDPMemTracker._fsdp_param_group_post_backward, for one group of the module."""

        @wraps(orig)
        def inner(*args, **kwargs):
            for fp in group.fsdp_params:
                if fp._unsharded_param.grad is not None:
                    self._update_and_maybe_create_winfos(fp._unsharded_param.grad, _FSDPRefType.UNSHARDED_GRAD,
                                                         update_existing=True)
            mod_stat = self.memory_tracking[fsdp_mod]
            mod_stat.snapshots.setdefault(_FSDPModState.BEF_POST_BW, []).append(self.get_tracker_snapshot())
            self._fsdp_state = _FSDPState.POST_BW
            orig(*args, **kwargs)
            for fp in group.fsdp_params:
                if fp.sharded_param.grad is not None:
                    self._update_and_maybe_create_winfos(fp.sharded_param.grad, _FSDPRefType.SHARDED_GRAD)
            mod_stat.snapshots.setdefault(_FSDPModState.AFT_POST_BW, []).append(self.get_tracker_snapshot())

        return inner

    def _instrument_fsdp_module(self) -> None:
        """FSDPMemTracker._instrument_fsdp_module, over every FSDPParamGroup of a module."""
        modules = [m for m in self._root_mod.modules()
                   if isinstance(m, FSDPModule) and m._get_fsdp_state()._fsdp_param_groups]
        handles = {}
        for m in modules:
            st = m._get_fsdp_state()
            handles[st._pre_forward_hook_handle] = handles[st._post_forward_hook_handle] = True
        for h in handles:
            h.remove()
        for m in modules:
            st = m._get_fsdp_state()
            groups = st._fsdp_param_groups
            for g in groups:
                self._instrument_fsdp_sharded_params_grads(g)
            st._pre_forward_hook_handle = m.register_forward_pre_hook(
                self._fsdp_state_pre_forward(m, st._pre_forward), prepend=True, with_kwargs=True)
            st._post_forward_hook_handle = m.register_forward_hook(
                self._fsdp_state_post_forward(m, st._post_forward), prepend=False, always_call=True)
            self._fsdp_mod_to_saved_methods[m] = [(g, g.pre_backward, g.post_backward) for g in groups]
            for g in groups:
                g.pre_backward = self._fsdp_param_group_pre_backward(m, g.pre_backward)
                g.post_backward = self._group_post_backward(m, g, g.post_backward)
        for buffer in self._root_mod.buffers():
            self._update_and_maybe_create_winfos(buffer, _FSDPRefType.BUFFER)

    def _deregister_module_and_optimizer_hooks(self) -> None:
        for m, saved in self._fsdp_mod_to_saved_methods.items():
            st = m._get_fsdp_state()
            st._pre_forward_hook_handle.remove()
            st._post_forward_hook_handle.remove()
            st._pre_forward_hook_handle = m.register_forward_pre_hook(st._pre_forward, prepend=True,
                                                                      with_kwargs=True)
            st._post_forward_hook_handle = m.register_forward_hook(st._post_forward, prepend=False)
            for g, pre, post in saved:
                g.pre_backward, g.post_backward = pre, post
        self._fsdp_mod_to_saved_methods.clear()
        if self._optimizer_hook_handles is not None:
            for handle in self._optimizer_hook_handles:
                handle.remove()
            self._optimizer_hook_handles = None


PeakTracker = peak_tracker(MultiGroupFSDPMemTracker)


def _snapshot(snap: Dict[Any, Dict[Any, int]]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for dev_snap in snap.values():
        for k, v in dev_snap.items():
            out[getattr(k, "value", k)] = out.get(getattr(k, "value", k), 0) + v
    return out


# ------------------------------------------------------------------------------------------ EP

def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _hot_rows(n: int, ep: int, imbalance: float) -> int:
    """The rows rank 0 receives from each peer when it is the busiest rank: imbalance x n / ep."""
    rows = imbalance * n / ep
    if rows != int(rows):
        raise ValueError(f"imbalance {imbalance} x {n} rows / ep {ep} is not a whole number of rows")
    return int(rows)


def dispatch(rows_nd: torch.Tensor, ep: int, local_experts: int, group, imbalance: float = 1) -> torch.Tensor:
    """rows [N, D] sorted by expert -> [local_experts, imbalance * ep * N / E, D] expert-major: the all-to-all
    sends the N/ep rows of peer r's experts to r (equal splits), and receives, rank-major, from every peer
    its rows for this rank's experts; AllToAllTokenDispatcher._permute makes them expert-major. With
    `imbalance` > 1 rank 0 is the busiest rank of skewed routing: it receives imbalance x N/ep rows from
    each peer (the fake backend does not check the peers' splits agree)."""
    n, d = rows_nd.shape
    splits = [n // ep] * ep
    recv_splits = [_hot_rows(n, ep, imbalance)] * ep
    recv = all_to_all_single_autograd(rows_nd, recv_splits, splits, group)  # [ep * local_experts * per, D]
    per = recv.shape[0] // (ep * local_experts)  # rows per (peer, expert): imbalance x T*K/E
    return recv.view(ep, local_experts, per, d).transpose(0, 1).reshape(local_experts, ep * per, d)


def combine(out_erd: torch.Tensor, ep: int, group, imbalance: float = 1) -> torch.Tensor:
    """The inverse of dispatch: expert-major [local_experts, ep * per, D] -> rank-major, the reverse
    all-to-all, -> this rank's rows [N, D] in expert order."""
    local_experts, rows, d = out_erd.shape
    per = rows // ep
    send = out_erd.view(local_experts, ep, per, d).transpose(0, 1).reshape(-1, d)
    splits = [send.shape[0] // ep] * ep
    recv_splits = [int(send.shape[0] / imbalance) // ep] * ep
    return all_to_all_single_autograd(send, recv_splits, splits, group)


def ep_grouped_experts_forward(self, x: torch.Tensor, top_k_index: torch.Tensor,
                               top_k_weights: torch.Tensor) -> torch.Tensor:
    """GroupedExperts.forward under EP (bound to the instance): local reorder, dispatch, the local
    experts' SwiGLU (the DTensor parameters to_local, as torchtitan's GroupedExperts.forward), combine."""
    top_k = top_k_index.shape[1]
    order, token = ep_models.sort_by_expert(top_k_index, top_k)
    w1, w2, w3 = _local(self.w1), _local(self.w2), _local(self.w3)
    rows = dispatch(x[token], self.ep_size, w1.shape[0], self.ep_group, self.imbalance)
    out = combine(self.swiglu(rows, w1, w2, w3), self.ep_size, self.ep_group, self.imbalance)
    out = out * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(out.dtype)
    return torch.zeros_like(x).index_add(0, token, out)


def ep_per_expert_forward(self, x: torch.Tensor) -> torch.Tensor:
    """PerExpertMoEBlock.forward under EP (bound to the instance): the local ExpertMLPs (experts
    [rank * E/ep, (rank + 1) * E/ep)) each on their rows of the dispatched tokens."""
    shape = x.shape
    x_td = x.reshape(-1, shape[-1])
    top_k_index, top_k_weights = self.route(x_td)
    order, token = ep_models.sort_by_expert(top_k_index, self.top_k)
    rows = dispatch(x_td[token], self.ep_size, len(self.experts), self.ep_group, self.imbalance)
    out = torch.stack([expert(rows[e]) for e, expert in enumerate(self.experts)])
    out = combine(out, self.ep_size, self.ep_group, self.imbalance)
    out = out * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(out.dtype)
    return torch.zeros_like(x_td).index_add(0, token, out).reshape(shape)


def apply_ep(model: nn.Module, ep_mesh, imbalance: float = 1) -> List[set]:
    """Expert parallelism on rank 0 of ep_mesh; returns each layer's set of routed-expert parameters."""
    ep = ep_mesh.size()
    rank = ep_mesh.get_local_rank()
    per_layer = []
    for layer in model.layers:
        moe = layer.moe
        if isinstance(moe.experts, ep_models.GroupedExperts):
            experts = moe.experts
            if experts.num_experts % ep:
                raise ValueError(f"ep {ep} does not divide {experts.num_experts} experts")

            # torchtitan's ExpertParallel._partition_fn: each parameter Shard(0) on the ep mesh.
            # src_data_rank=None: every rank cuts its own chunk, no scatter (the fake backend's
            # scatter would leave the chunk uninitialised).
            def partition_fn(name, module, mesh):
                for pname, param in list(module.named_parameters(recurse=False)):
                    module.register_parameter(pname, nn.Parameter(
                        distribute_tensor(param.data, mesh, [Shard(0)], src_data_rank=None)))

            distribute_module(experts, ep_mesh, partition_fn)
            experts.ep_size, experts.ep_group, experts.imbalance = ep, ep_mesh.get_group(), imbalance
            experts.forward = types.MethodType(ep_grouped_experts_forward, experts)
            per_layer.append(set(experts.parameters()))
        else:
            # Experts held as separate modules: torchtitan has no EP for these; the natural
            # equivalent is that this rank holds only its E/ep experts' modules.
            e = len(moe.experts)
            if e % ep:
                raise ValueError(f"ep {ep} does not divide {e} experts")
            lo, n = rank * (e // ep), e // ep
            moe.experts = nn.ModuleList(list(moe.experts)[lo:lo + n])
            moe.ep_size, moe.ep_group, moe.imbalance = ep, ep_mesh.get_group(), imbalance
            moe.forward = types.MethodType(ep_per_expert_forward, moe)
            per_layer.append(set(moe.experts.parameters()))
    return per_layer


def apply_fsdp(model: nn.Module, dense, sparse, ep: int, expert_params: List[set], mp: MixedPrecisionPolicy,
               units: str) -> None:
    """torchtitan's apply_fsdp_to_decoder without TP / CP / PP (see the module docstring)."""
    cfg = dict(mesh=dense, mp_policy=mp)
    if units == "titan":
        fully_shard(model.embed, reshard_after_forward=True, **cfg)
        fully_shard([model.norm, model.head], reshard_after_forward=False, **cfg)
    for layer, params in zip(model.layers, expert_params):
        fused = isinstance(layer.moe.experts, ep_models.GroupedExperts)
        num_experts = layer.moe.num_experts
        efsdp_ep = sparse["efsdp"].size() * ep if ep > 1 else dense.size()
        expert_placement = Shard(1) if fused and efsdp_ep > num_experts else Shard(0)
        if ep == 1 and expert_placement == Shard(0):
            fully_shard(layer, reshard_after_forward=True, **cfg)
        elif ep == 1:
            fully_shard(layer, reshard_after_forward=True, **cfg,
                        shard_placement_fn=lambda p, _e=params: Shard(1) if p in _e else None)
        else:
            edp_info, dp_info = _get_mesh_info(sparse["efsdp"]), _get_mesh_info(dense)

            def placement(p, _e=params, _place=expert_placement, _edp=edp_info, _dp=dp_info):
                if p in _e:
                    return ShardPlacementResult(placement=_place, mesh_info=_edp)
                return ShardPlacementResult(placement=Shard(0), mesh_info=_dp)

            fully_shard(layer, reshard_after_forward=True, shard_placement_fn=placement, **cfg)
    fully_shard(model, **cfg)
    for m in model.modules():  # torchtitan's disable_fsdp_gradient_division
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
    if units == "titan" and ep > 1:  # torchtitan's explicit prefetching with EP
        layers = list(model.layers)
        model.embed.set_modules_to_forward_prefetch([layers[0]])
        for layer, nxt in zip(layers, layers[1:] + [None]):
            layer.set_modules_to_forward_prefetch([nxt] if nxt is not None else [model.norm, model.head])
        rev = layers[::-1]
        model.head.set_modules_to_backward_prefetch([rev[0]])
        for layer, prev in zip(rev, rev[1:] + [None]):
            layer.set_modules_to_backward_prefetch([prev] if prev is not None else [model.embed])


# ------------------------------------------------------------------------------------------ the step

def ep_step(model_factory: Union[str, Callable[[], Any]], world: int, ep: int, optimizer: str = "adamw",
            param_dtype: Optional[torch.dtype] = None, units: str = "root", imbalance: float = 1) -> Dict[str, Any]:
    """EP (degree `ep`) and FSDP2 over `world` ranks, two training steps on rank 0; the measurements
    of the second (see the module docstring). model_factory: "fused", "per_expert" or a function
    returning (module, args, kwargs) as ep_models.fused_moe does. imbalance > 1: rank 0 is the busiest
    rank of skewed routing, its experts receiving imbalance x the mean rows (dispatch)."""
    if optimizer != "adamw":
        raise ValueError("only adamw")
    if world % ep:
        raise ValueError(f"ep {ep} does not divide world {world}")
    factory = ep_models.FACTORIES[model_factory] if isinstance(model_factory, str) else model_factory
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    dense = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
    sparse = init_device_mesh("cpu", (world // ep, ep), mesh_dim_names=("efsdp", "ep")) if ep > 1 else None
    # With ep == world the ep dim's group is the world's, as is fsdp's: one group, two dims.
    mesh_dims: Dict[str, List[str]] = {dense.get_group().group_name: ["fsdp"]}
    if sparse is not None:
        for d in ("ep", "efsdp"):
            mesh_dims.setdefault(sparse[d].get_group().group_name, []).append(d)

    model, args, kwargs = factory()
    model_class = type(model).__name__
    if ep > 1:
        expert_params = apply_ep(model, sparse["ep"], imbalance)
    else:
        expert_params = [set(layer.moe.experts.parameters()) for layer in model.layers]
    expert_ids = {id(p) for s in expert_params for p in s}
    expert_names_before = [n for n, p in model.named_parameters() if id(p) in expert_ids]
    mp = (MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
          if param_dtype is not None else MixedPrecisionPolicy())
    apply_fsdp(model, dense, sparse, ep, expert_params, mp, units)

    params = dict(model.named_parameters())
    local_bytes = {n: _local(p).nbytes for n, p in params.items()}
    expert_names = set(expert_names_before)
    groups: Dict[int, Dict[str, Any]] = {}  # one FSDPParamGroup per entry ([norm, head] share theirs)
    for m_name, m in model.named_modules():
        if isinstance(m, FSDPModule):
            for g in m._get_fsdp_state()._fsdp_param_groups:
                if id(g) in groups:
                    groups[id(g)]["modules"].append(m_name)
                    continue
                groups[id(g)] = {"modules": [m_name], "mesh_size": g.mesh_info.shard_mesh_size,
                                 "params": len(g.fsdp_params),
                                 "padded_shard_bytes": sum(fp._sharded_param_data.nbytes for fp in g.fsdp_params)}
    placements = {n: [str(x) for x in p.placements] for n, p in params.items() if n in expert_names}

    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    tracker = PeakTracker(model, optim)
    tracker.track_inputs((args, kwargs))
    comm = RecordingCommMode(mesh_dims)
    with tracker:
        for it in range(2):
            if it == 1:
                tracker.reset_mod_stats()
                tracker.reset_peaks()
                comm.calls.clear()
                comm.phase = "forward"
                comm.__enter__()
            loss = model(*args, **kwargs)
            loss.backward()
            after_backward = _snapshot(tracker.get_tracker_snapshot())
            grads = {n: _local(p.grad).nbytes for n, p in model.named_parameters() if p.grad is not None}
            comm.phase = "optimizer"
            optim.step()
            after_step = _snapshot(tracker.get_tracker_snapshot())
            optim.zero_grad()
            if it == 1:
                comm.__exit__(None, None, None)
    opt_bytes = sum(_local(t).nbytes for s in optim.state.values() for t in s.values() if torch.is_tensor(t))

    calls = comm.calls
    a2a = [c for c in calls if c["kind"] == "all_to_all"]
    by_kind: Dict[str, Dict[str, Any]] = {}
    for c in calls:
        k = by_kind.setdefault(c["kind"], {"count": 0, "bytes": 0, "by_group_size": {}})
        k["count"] += 1
        k["bytes"] += c["bytes"]
        g = k["by_group_size"].setdefault(str(c["group_size"]), {"count": 0, "bytes": 0})
        g["count"] += 1
        g["bytes"] += c["bytes"]
    return {
        "model": model_class, "world": world, "ep": ep, "efsdp": world // ep if ep > 1 else None,
        "units": units, "imbalance": imbalance,
        "param_dtype": str(param_dtype).replace("torch.", "") if param_dtype else "float32",
        "torch": torch.__version__,
        "params_bytes": sum(local_bytes.values()),
        "expert_params_bytes": sum(v for n, v in local_bytes.items() if n in expert_names),
        "grads_bytes": sum(grads.values()),
        "optimizer_bytes": opt_bytes,
        "tracker_peak_bytes": tracker.total_peak,
        "tracker_peak": tracker.total_snap,
        "non_activation_peak_bytes": tracker.non_act_peak,
        "non_activation_peak": tracker.non_act_snap,
        "after_backward": after_backward,
        "after_step": after_step,
        "all_to_all_count": len(a2a),
        "all_to_all_bytes": sum(c["bytes"] for c in a2a),
        "collectives_by_kind": by_kind,
        "collectives_summary": summarize(calls),
        "collectives": calls,
        "fsdp_param_groups": list(groups.values()),
        "expert_placements": placements,
        "local_experts_per_layer": model.layers[0].moe.num_experts // ep,
        "loss_finite": bool(torch.isfinite(loss.detach()).item()),
    }


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=sorted(ep_models.FACTORIES), default="fused")
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--ep", type=int, default=2)
    ap.add_argument("--bf16", action="store_true", help="MixedPrecisionPolicy(bfloat16, reduce float32)")
    ap.add_argument("--units", choices=("root", "titan"), default="root",
                    help="root: embed, norm and head in the root group; titan: sharded as torchtitan does")
    ap.add_argument("--all", action="store_true", help="every case in CASES, one JSON object per line")
    ap.add_argument("--brief", action="store_true", help="leave out the per-call list of collectives")
    a = ap.parse_args(argv)
    cases = CASES if a.all else [(a.model, a.world, a.ep)]
    try:
        for model, world, ep in cases:
            r = ep_step(model, world, ep, param_dtype=torch.bfloat16 if a.bf16 else None, units=a.units)
            if a.brief or a.all:
                r.pop("collectives")
            print(json.dumps(r, indent=None if a.all else 1, sort_keys=False))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
