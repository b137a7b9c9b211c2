"""Ground truth for activations under tensor parallelism: what autograd saves on one tp rank.

For each case (a corpus decoder with Hugging Face's own tensor-parallel plan, or sp_decoder.py's
model with a sequence-parallel plan, and a tp degree), this script
builds the small model on the CPU, rank 0 of a single-process "fake" process group, runs torch
2.13's parallelize_module on a 1-D "tp" mesh (no fully_shard: FSDP2 changes where parameters live,
not what autograd saves of the activations in fp32), then one training forward with labels and its
backward of a (BATCH, SEQ) batch under `torch.autograd.graph.saved_tensors_hooks`, counting as
tests/activations/saved_oracle.py counts:

- each packed tensor by its storage, once, at the storage's full size; a DTensor by its local
  tensor's storage (`_local_tensor`: what the rank holds);
- attributed to the innermost module running when it is first packed; a module's `total_bytes`
  is its subtree's; parameters' storages (DTensor parameters' local tensors) and the inputs' are
  counted apart.

Case "tp 1" is the same model without parallelize_module, for the ratio.

Then the whole step: the same model on a (dp_shard 2, tp) mesh (at tp 1 the 1-D dp_shard mesh of 2),
parallelize_module on "tp", fully_shard on each decoder layer and the root on "dp_shard", two
training steps (AdamW, foreach=False, labels) under FSDPMemTracker, as
tests/activations/peak_oracle.py runs them on a 1-D mesh: `tracker` holds the second step's peak
(`peak_bytes`, the Total when it peaked) and its categories then.

Real CPU tensors, not FakeTensorMode: Hugging Face's mask code calls .item(), which fake tensors
refuse (tp_comm_reference.py runs the same way); the small models are a few hundred KB, and the
fake backend's collectives move no data (their outputs are the right size, garbage values). The
corpus model's attention is switched to SDPA (set_attn_implementation), as fsdp-plan-export
exports it: the CPU flash kernel then runs, under DTensor too.

    /work/main/.venv/bin/python tests/tensor_parallel/tp_act_reference.py [--out FILE] [--check]

Output: stable JSON (sorted keys, ints for bytes). About twenty seconds.
"""
import os
import sys
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "activations"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor  # noqa: E402
from torch.distributed.tensor.parallel import parallelize_module  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import peak_oracle  # noqa: E402  (apply_fully_shard, two_steps)
import saved_oracle  # noqa: E402  (SavedRecorder, summarise)
import sp_decoder  # noqa: E402
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy  # noqa: E402
import tp_reference  # noqa: E402  (the models, HF's plan, the style translation)
import tp_common  # noqa: E402  (reference_main)

REFERENCE = os.path.join(HERE, "act_reference.json")
BATCH, SEQ = 2, 16
# The corpus Llama (4 heads, 2 key-value heads) at tp 1 and 2; the 4-key-value-head variant at tp 4.
# Sequence parallelism on sp_decoder.py's model (HF's Llama fails under it) at tp 2 and 4.
CASES: Dict[str, Dict[str, Any]] = {
    "llama_tp1": dict(model="llama", tp=1),
    "llama_hf_tp2": dict(model="llama", tp=2),
    "llama_kv4_tp1": dict(model="llama_kv4", tp=1),
    "llama_kv4_hf_tp4": dict(model="llama_kv4", tp=4),
    "sp_decoder_tp1": dict(model="sp_decoder", tp=1),
    "sp_decoder_sp_tp2": dict(model="sp_decoder", tp=2),
    "sp_decoder_sp_tp4": dict(model="sp_decoder", tp=4),
    # torchtitan's own plan: each block's input gathered once (prepare_module_input), not per linear.
    "sp_decoder_titan_tp2": dict(model="sp_decoder", tp=2, plan="titan"),
    # Mixtral with its own plan as transformers applies it (tp_reference.transformers_tp): the
    # experts on local gate_up / down shards (moe_tp_experts), their output all-reduced whole.
    "mixtral_tp1": dict(model="mixtral", tp=1),
    "mixtral_tfm_tp2": dict(model="mixtral", tp=2, runtime="transformers"),
    # Qwen3-MoE: per-head q / k norms on the local heads (replicated_with_grad_allreduce).
    "qwen3_moe_tfm_tp2": dict(model="qwen3_moe", tp=2, runtime="transformers"),
}


def build(name: str):
    return sp_decoder.build() if name == "sp_decoder" else sdpa_model(name)


def plan_of(name: str, case: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    if case and case.get("runtime") == "transformers":
        return tp_reference.model_plan(name)
    if case and case.get("plan") == "titan":
        return sp_decoder.TITAN_SP_PLAN
    return sp_decoder.SP_PLAN if name == "sp_decoder" else tp_reference.hf_plan(name)


def apply_tp(model, mesh, case: Dict[str, Any]) -> None:
    """parallelize_module with the case's plan, or the model's own plan as transformers applies it."""
    if case.get("runtime") == "transformers":
        tp_reference.transformers_tp(model, mesh["tp"], {"dp_shard": mesh.size() // case["tp"], "tp": case["tp"]})
    else:
        parallelize_module(model, mesh["tp"], {k: tp_reference.torch_style(v)
                                               for k, v in plan_of(case["model"], case).items()})


def layers_of(model):
    return model.layers if hasattr(model, "layers") else model.model.layers


def local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


class LocalRecorder(saved_oracle.SavedRecorder):
    """SavedRecorder keyed by the rank's local storage of each saved tensor."""

    def __init__(self, model, params, inputs):
        super().__init__(model, [local(p) for p in params], inputs)

    def pack(self, t: torch.Tensor) -> int:
        handle = super().pack(local(t))
        self.keep[handle] = t  # unpack hands autograd back what it packed
        return handle


def sdpa_model(name: str):
    """The corpus model (which sets attn_implementation "eager") with SDPA, as fsdp-plan-export
    exports it and as one trains it."""
    model = tp_reference.MODELS[name]("cpu")
    model.set_attn_implementation("sdpa")
    return model


def run_case(case: Dict[str, Any]) -> Dict[str, Any]:
    tp = case["tp"]
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=tp, store=FakeStore())
    torch.manual_seed(0)
    model = build(case["model"])
    plan = plan_of(case["model"], case)
    if tp > 1:
        mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))
        apply_tp(model, mesh, case)
    model.train()
    ids = torch.randint(3, 200, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    params = list(model.parameters()) + list(model.buffers())
    rec = LocalRecorder(model, params, [ids])
    with torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
        loss = model(input_ids=ids, labels=ids).loss
    rec.name_nodes([loss])
    loss.backward()
    rec.remove()
    res = saved_oracle.summarise(rec, model, detail=True)
    res.update(model=case["model"], tp=tp, batch=BATCH, seq=SEQ, plan=plan if tp > 1 else None,
               runtime=case.get("runtime", "torch"))
    for r in res["saved"]:
        r.pop("nodes", None)  # backward node names: not compared, and differ between DTensor and plain runs
    res.pop("by_op", None)
    res["tracker"] = tracked_step(case)
    return res


def tracked_step(case: Dict[str, Any]) -> Dict[str, Any]:
    """The second of two training steps of the 2-D model under FSDPMemTracker: its peak."""
    tp = case["tp"]
    dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=2 * tp, store=FakeStore())
    mesh = init_device_mesh("cpu", (2, tp), mesh_dim_names=("dp_shard", "tp"))
    torch.manual_seed(0)
    model = build(case["model"])
    if tp > 1:
        apply_tp(model, mesh, case)
    model.train()
    peak_oracle.apply_fully_shard(model, (type(layers_of(model)[0]),), mesh["dp_shard"], MixedPrecisionPolicy())
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    g = torch.Generator().manual_seed(0)
    kwargs = {"input_ids": torch.randint(3, 200, (BATCH, SEQ), generator=g)}
    kwargs["labels"] = kwargs["input_ids"]
    tracker = FSDPMemTracker(model, optim)
    tracker.track_inputs((kwargs["input_ids"],))
    try:
        res = peak_oracle.two_steps(tracker, model, optim, kwargs)
    except Exception as e:  # noqa: BLE001  (recorded: the tracker may not run on a 2-D mesh)
        return {"error": {"type": type(e).__name__, "message": str(e).splitlines()[0]}}
    return {"peak_bytes": res["peak_bytes"], "peak": {k: v for k, v in res["peak"].items() if v}}


def report(result: Dict[str, Any]) -> None:
    for n, c in result["cases"].items():
        print(f"{n}: {c['total_bytes']} B saved in {c['storages']} storages (params {c['param_saved_bytes']}, "
              f"inputs {c['input_saved_bytes']}); step peak {c['tracker'].get('peak_bytes', c['tracker'])}")


def main(argv: Optional[List[str]] = None) -> int:
    return tp_common.reference_main(__doc__, REFERENCE, CASES, lambda name, case: run_case(case), "saved bytes",
                                    report=report, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
