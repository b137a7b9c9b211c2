"""Ground truth for tensor parallelism's collectives: CommDebugMode around one real training step of the 2-D model.

For each case (a corpus decoder with Hugging Face's own tensor-parallel plan, or sp_decoder.py's
model with its sequence-parallel plan; a (dp_shard, tp) mesh), this script builds the small model on
the CPU, rank 0 of a single-process "fake" process group, runs torch 2.13's parallelize_module on
the "tp" sub-mesh and fully_shard on each decoder layer and the root on the "dp_shard" sub-mesh (as
tp_reference.py does), then one forward and backward of a (BATCH, SEQ) batch of token ids under
torch.distributed.tensor.debug.CommDebugMode (the logits' sum; sp_decoder's loss), and records:

- `comm_counts`: CommDebugMode's own count per module, phase and collective (its
  comm_module_counts, the module's own calls: the counts it adds to the parents are left out);
- `collectives`: every collective in issue order as the dispatcher sees it (a CommDebugMode
  subclass records each call's tensors and process group): the module CommDebugMode attributes it
  to, phase, kind, message numel (nccl-tests' sense: an all-gather's output, a reduce-scatter's
  input, an all-reduce's tensor), dtype, and the group's size and rank stride, with `mesh_dim`
  "tp" or "dp_shard" by the group it ran on;
- `local_flops`: the FLOPs rank 0 computes in a second step (forward, backward), FlopCounterMode's
  formulas on the local ops DTensor runs (LocalFlops); `unsplit_flops` the same of the model without
  tensor parallelism.

Real CPU tensors (the small models are a few hundred KB; the fake backend's collectives move no
data), not FakeTensorMode: Hugging Face's mask code calls .item(), which fake tensors refuse.

    /work/main/.venv/bin/python tests/tensor_parallel/tp_comm_reference.py [--out FILE] [--check]

With --check, compares against the stored reference instead of writing it (exit 1 on a
difference). About half a minute.
"""
import os
import sys
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import sp_decoder  # noqa: E402
import tp_reference  # noqa: E402  (its models, HF's plan and the style translation)
import tp_common  # noqa: E402  (reference_main)
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # noqa: E402
    apply_activation_checkpointing,
    checkpoint_wrapper,
)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.distributed.tensor.debug import CommDebugMode  # noqa: E402
from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops  # noqa: E402
from torch.distributed.tensor.parallel import parallelize_module  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402
from torch.utils import flop_counter  # noqa: E402
from torch.utils.flop_counter import flop_registry  # noqa: E402

REFERENCE = os.path.join(HERE, "comm_reference.json")
BATCH, SEQ = 2, 16
# The corpus Llama at tp 2 and (with as many key-value heads as heads, which tp 4 divides) at tp 4.
CASES: Dict[str, Dict[str, Any]] = {
    "llama_hf_4x2": dict(model="llama", mesh={"dp_shard": 4, "tp": 2}),
    "llama_kv4_hf_2x4": dict(model="llama_kv4", mesh={"dp_shard": 2, "tp": 4}),
    # Activation checkpointing on each decoder layer (apply_activation_checkpointing, non-reentrant
    # checkpoint_wrapper, applied after parallelize_module and before fully_shard, as torchtitan
    # does): the recompute in backward issues the layer's forward collectives again, up to where
    # checkpointing stops.
    "llama_hf_4x2_ac": dict(model="llama", mesh={"dp_shard": 4, "tp": 2}, ac=True),
    # Sequence parallelism (sp_decoder.py: HF's Llama does not run under it) at tp 2 and 4, and with
    # activation checkpointing on each block.
    "sp_decoder_sp_4x2": dict(model="sp_decoder", mesh={"dp_shard": 4, "tp": 2}),
    "sp_decoder_sp_2x4": dict(model="sp_decoder", mesh={"dp_shard": 2, "tp": 4}),
    "sp_decoder_sp_4x2_ac": dict(model="sp_decoder", mesh={"dp_shard": 4, "tp": 2}, ac=True),
    # torchtitan's own plan: prepare_module_input gathers each block's input once (sp_decoder.py).
    "sp_decoder_titan_4x2": dict(model="sp_decoder", mesh={"dp_shard": 4, "tp": 2}, plan="titan"),
    "sp_decoder_titan_4x2_ac": dict(model="sp_decoder", mesh={"dp_shard": 4, "tp": 2}, plan="titan", ac=True),
    # The model's own plan as transformers applies it (tp_reference.transformers_tp): the embedding's
    # vocabulary split (its output all-reduced), and Mixtral's experts under moe_tp_experts (their
    # output all-reduced in forward, their hidden states' and routing weights' gradients in backward).
    "llama_tfm_4x2": dict(model="llama", mesh={"dp_shard": 4, "tp": 2}, runtime="transformers"),
    "mixtral_tfm_4x2": dict(model="mixtral", mesh={"dp_shard": 4, "tp": 2}, runtime="transformers"),
    # Qwen3-MoE: replicated_with_grad_allreduce all-reduces the q / k norms' gradients as autograd makes them.
    "qwen3_moe_tfm_4x2": dict(model="qwen3_moe", mesh={"dp_shard": 4, "tp": 2}, runtime="transformers"),
    "mixtral_tfm_4x2_ac": dict(model="mixtral", mesh={"dp_shard": 4, "tp": 2}, runtime="transformers", ac=True),
}
KIND = {"all_reduce": "all_reduce", "allreduce_": "all_reduce", "all_gather_into_tensor": "all_gather",
        "_allgather_base_": "all_gather", "allgather_": "all_gather", "reduce_scatter_tensor": "reduce_scatter",
        "_reduce_scatter_base_": "reduce_scatter"}


def group_ranks(group) -> List[int]:
    return dist.get_process_group_ranks(group)


class RecordingCommMode(CommDebugMode):
    """CommDebugMode, also keeping each collective's tensors and group (it counts, but keeps no sizes)."""

    def __init__(self, group_names: Dict[str, str]):
        super().__init__()
        self.calls: List[Dict[str, Any]] = []
        self.group_names = group_names

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = super().__torch_dispatch__(func, types, args, kwargs)
        if out is NotImplemented:
            return out
        packet = func._overloadpacket
        if packet not in self.comm_registry and packet not in c10d_collective_ops:
            return out
        op = packet.__name__
        leaves = tree_leaves((args, kwargs or {}))
        tensors = [a for a in leaves if isinstance(a, torch.Tensor)]
        name = next((a for a in leaves if isinstance(a, str) and a in self.group_names), None)
        if name is None:  # a c10d op: its ProcessGroup argument
            for a in leaves:
                if isinstance(a, torch.ScriptObject) and "ProcessGroup" in str(a._type()):
                    name = dist.ProcessGroup.unbox(a).group_name
        dim = self.group_names[name]
        ranks = self.ranks[dim]
        kind = KIND[op]
        if op in ("_allgather_base_", "_reduce_scatter_base_"):  # (output, input)
            numel = tensors[0].numel() if kind == "all_gather" else tensors[1].numel()
        elif kind == "all_gather":  # funcol: the local input, gathered over the group
            numel = tensors[0].numel() * len(ranks)
        else:
            numel = tensors[0].numel()
        self.calls.append({"module": strip(self.advanced_module_tracker.name),
                           "phase": "backward" if self.advanced_module_tracker.is_bw else "forward",
                           "kind": kind, "numel": numel, "dtype": str(tensors[0].dtype).replace("torch.", ""),
                           "mesh_dim": dim, "group_size": len(ranks),
                           "group_stride": ranks[1] - ranks[0] if len(ranks) > 1 else 1})
        return out


GLOBAL = "(global)"


class LocalFlops(TorchDispatchMode):
    """FlopCounterMode's formulas (torch.utils.flop_counter.flop_registry) on the ops a rank runs:
    a DTensor call is passed on to DTensor (NotImplemented, as CommDebugMode does), which runs the
    local op, counted then; the meta-tensor calls DTensor's sharding propagation makes are not
    computed on the rank and not counted. (FlopCounterMode itself counts a DTensor matmul at its
    global shape.) Forward and backward apart (inside autograd's graph task: backward). SDPA's CPU
    kernels, which torch's registry does not list, count as its GPU kernels do (torch's own
    sdpa_flop / sdpa_backward_flop, as tests/timing/flop_oracle.py maps them); aten._grouped_mm
    (the MoE experts' kernel), which it does not list either, as the matmuls it runs (2*M*K*N per
    group: tests/timing/graph_flops.py grouped_mm_flops, which flop_oracle.py maps too)."""

    @staticmethod
    def grouped_mm_flop(a, b, *args, out_val=None, **kwargs) -> int:
        groups = a.shape[0] if a.dim() == 3 and b.dim() == 3 else 1
        return groups * 2 * a.shape[-2] * a.shape[-1] * b.shape[-1]

    REGISTRY = {**flop_registry,
                torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: flop_counter.sdpa_flop,
                torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward:
                    flop_counter.sdpa_backward_flop,
                torch.ops.aten._grouped_mm: grouped_mm_flop.__func__}

    def __init__(self):
        super().__init__()
        self.forward = self.backward = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if any(t == DTensor for t in types):
            return NotImplemented
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func._overloadpacket
        if packet in self.REGISTRY and not any(isinstance(a, torch.Tensor) and a.is_meta for a in args):
            n = self.REGISTRY[packet](*args, **kwargs, out_val=out)
            if torch._C._current_graph_task_id() != -1:
                self.backward += n
            else:
                self.forward += n
        return out


def strip(fqn: str) -> str:
    """CommDebugMode's module names start with the root's class ("FSDPLlamaForCausalLM.model..."), the
    root is "" here; "Global" (outside every module: FSDP's backward hooks before the root's) is GLOBAL."""
    if fqn == "Global":
        return GLOBAL
    fqn = fqn.replace("._checkpoint_wrapped_module", "")  # checkpoint_wrapper's inner module: the plan's path
    return fqn.split(".", 1)[1] if "." in fqn else ""


def build(name: str):
    return sp_decoder.build() if name == "sp_decoder" else tp_reference.MODELS[name]("cpu")


def plan_of(name: str) -> Dict[str, Any]:
    return sp_decoder.SP_PLAN if name == "sp_decoder" else tp_reference.hf_plan(name)


def layers_of(model):
    return model.layers if hasattr(model, "layers") else model.model.layers


def step(model, ids: torch.Tensor) -> None:
    """One forward and backward: the sum of the logits (the corpus models), the loss in the forward
    (sp_decoder, which returns only the loss)."""
    if isinstance(model, sp_decoder.SpDecoder):
        model(input_ids=ids, labels=ids).loss.backward()
    else:
        model(input_ids=ids).logits.float().sum().backward()


def run_case(case: Dict[str, Any]) -> Dict[str, Any]:
    sizes = [case["mesh"]["dp_shard"], case["mesh"]["tp"]]
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=sizes[0] * sizes[1], store=FakeStore())
    mesh = init_device_mesh("cpu", tuple(sizes), mesh_dim_names=("dp_shard", "tp"))
    model = build(case["model"])
    if case.get("runtime") == "transformers":
        plan = tp_reference.model_plan(case["model"])
        tp_reference.transformers_tp(model, mesh["tp"], case["mesh"])
    else:
        plan = sp_decoder.TITAN_SP_PLAN if case.get("plan") == "titan" else plan_of(case["model"])
        parallelize_module(model, mesh["tp"], {k: tp_reference.torch_style(v) for k, v in plan.items()})
    if case.get("ac"):
        layer_class = type(layers_of(model)[0])
        apply_activation_checkpointing(model, checkpoint_wrapper_fn=checkpoint_wrapper,
                                       check_fn=lambda m: isinstance(m, layer_class))
    for layer in layers_of(model):
        fully_shard(layer, mesh=mesh["dp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])
    names = {mesh[d].get_group().group_name: d for d in ("dp_shard", "tp")}
    mode = RecordingCommMode(names)
    mode.ranks = {d: group_ranks(mesh[d].get_group()) for d in ("dp_shard", "tp")}
    ids = torch.randint(3, 200, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with mode:
        step(model, ids)
    flops = LocalFlops()
    with flops:  # a second step: what each rank computes
        step(model, ids)
    whole = build(case["model"])  # the unsplit model's step, for the ratio
    if case.get("ac"):
        apply_activation_checkpointing(whole, checkpoint_wrapper_fn=checkpoint_wrapper,
                                       check_fn=lambda m: isinstance(m, type(layers_of(whole)[0])))
    unsplit = LocalFlops()
    with unsplit:
        step(whole, ids)
    counts: Dict[str, Dict[str, Dict[str, int]]] = {}
    own: Dict[str, Dict[str, Dict[str, int]]] = {}
    for c in mode.calls:  # each call once, at the module that issued it
        own.setdefault(c["module"], {}).setdefault(c["phase"], {}).setdefault(c["kind"], 0)
        own[c["module"]][c["phase"]][c["kind"]] += 1
    # CommDebugMode's counts add each call to the module and every parent: a module's own calls
    # are its count less its children's. Kept as CommDebugMode reports them, for the check below.
    for fqn, per in mode.comm_module_counts.items():
        if fqn.endswith("._checkpoint_wrapped_module"):
            continue  # the same module as its checkpoint_wrapper (whose count holds it), by the plan's path
        counts[strip(fqn)] = {ph: by_kind(per[ph]) for ph in ("forward", "backward")}
    return {"model": case["model"], "mesh": case["mesh"], "batch": BATCH, "seq": SEQ, "plan": plan,
            "runtime": case.get("runtime", "torch"),
            "activation_checkpointing": bool(case.get("ac")),
            "collectives": mode.calls, "comm_counts": counts, "own_counts": own,
            "total_counts": by_kind(mode.get_comm_counts()),
            "local_flops": {"forward": flops.forward, "backward": flops.backward},
            "unsplit_flops": {"forward": unsplit.forward, "backward": unsplit.backward}}


def by_kind(per_op) -> Dict[str, int]:
    """CommDebugMode's counts by op (c10d and functional ops apart) summed by kind."""
    out: Dict[str, int] = {}
    for op, n in per_op.items():
        if n:
            out[KIND[op.__name__]] = out.get(KIND[op.__name__], 0) + n
    return out


def main(argv: Optional[List[str]] = None) -> int:
    return tp_common.reference_main(__doc__, REFERENCE, CASES, lambda name, case: run_case(case), "collectives",
                                    argv=argv)


if __name__ == "__main__":
    sys.exit(main())
