"""Ground truth for 2-D plans: real parallelize_module + fully_shard on a fake-backend device mesh.

For each case (a corpus decoder, a mesh, a tensor-parallel plan written in the policy's own
"tensor_parallel.plan" language), this script builds the model on the meta device, rank 0 of a
single-process "fake" process group, makes the mesh with init_device_mesh("cpu", ...,
mesh_dim_names=("dp_shard", "tp")) (or ("dp_replicate", "dp_shard", "tp")), runs torch 2.13's
parallelize_module on the "tp" sub-mesh and then fully_shard on each decoder layer and the root
on the "dp_shard" (or ("dp_replicate", "dp_shard")) sub-mesh, and records per parameter:

- `tp_placement`, `tp_local_shape`: the DTensor placement on the tp mesh and rank 0's local
  shape after parallelize_module ("none" and the full shape for a parameter no style touched);
- `placements`, `mesh_dims`: the sharded DTensor's placements after fully_shard;
- `local_shape`: rank 0's local shard (to_local()), `padded_shard_shape`: FSDP2's padded
  sharded size (FSDPParam.padded_sharded_param_size);
- the warnings parallelize_module raised (a plan key that resolves to no module);
- for the cases that fail (tp not dividing the attention or key-value heads), one forward and
  backward on meta inputs run to the error, whose type and message are recorded;
- for the cases torch plans, `tracker`: two training steps (AdamW, foreach=False, a (2, 16)
  batch of token ids) under FSDPMemTracker on the 2-D mesh, as tests/differential/test_fsdp2.py
  runs them on a 1-D one (but on real CPU tensors of the small models, a few hundred KB:
  sequence parallelism's redistribute calls .tolist(), which FakeTensorMode refuses), with the
  fake backend's collectives: the second step's sharded parameters,
  sharded gradients, optimizer state and buffers, and the largest sum of the non-activation
  categories (`non_activation_peak`, with the categories at that moment). Where the step fails
  (torchtitan's sequence-parallel plan on HF's Llama: HF computes the rotary embeddings for the
  whole sequence outside the layers, the sequence-sharded residual holds half of it), `tracker`
  holds the error instead.

    /work/main/.venv/bin/python tests/tensor_parallel/tp_reference.py [--out FILE] [-k SUBSTRING]

With --check, compares against the stored reference instead of writing it (exit 1 on a
difference). Runs in about half a minute (imports included).
"""
import os
import re
import sys
import warnings
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "corpus"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: E402
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,  # noqa: E402
                                               PrepareModuleOutput, RowwiseParallel, SequenceParallel,
                                               parallelize_module)
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import corpus  # noqa: E402
import sp_decoder  # noqa: E402
import tp_common  # noqa: E402  (reference_main)
import transformers as T  # noqa: E402
from transformers.distributed.configuration_utils import DistributedConfig  # noqa: E402
from transformers.distributed.tensor_parallel import apply_tensor_parallelism  # noqa: E402

sys.path.insert(0, os.path.join(HERE, "..", "differential"))
import test_fsdp2  # noqa: E402  (its FSDPMemTracker with the non-activation peak, two_tracked_steps)

REFERENCE = os.path.join(HERE, "reference.json")

# A Llama with as many key-value heads as heads, so that tp 4 divides both (the corpus Llama has
# 4 heads and 2 key-value heads: tp 4 is its failing case).
_KV4 = {**corpus._LLAMA_SMALL, "num_key_value_heads": 4}
MODELS = {
    "llama": corpus.SMALL["llama"],
    "mistral": corpus.SMALL["mistral"],
    "llama_kv4": corpus._decoder(T.LlamaConfig, T.LlamaForCausalLM, **_KV4, tie_word_embeddings=False),
    "mixtral": corpus.SMALL["mixtral"],
    "qwen2_moe": corpus.SMALL["qwen2_moe"],
    # The MoE decoders with 4 key-value heads, so that tp 4 divides them (as llama_kv4).
    "mixtral_kv4": corpus._decoder(T.MixtralConfig, T.MixtralForCausalLM, **_KV4, num_local_experts=4,
                                   num_experts_per_tok=2),
    "qwen2_moe_kv4": corpus._decoder(T.Qwen2MoeConfig, T.Qwen2MoeForCausalLM, **_KV4, num_experts=4,
                                     num_experts_per_tok=2, moe_intermediate_size=32,
                                     shared_expert_intermediate_size=64, decoder_sparse_step=1),
    # Qwen3-MoE: its plan adds replicated_with_grad_allreduce on the per-head q / k norms.
    "qwen3_moe": corpus._decoder(T.Qwen3MoeConfig, T.Qwen3MoeForCausalLM, **corpus._LLAMA_SMALL, num_experts=4,
                                 num_experts_per_tok=2, moe_intermediate_size=32, decoder_sparse_step=1),
    # sp_decoder.py's model (sequence parallelism; the emitted code of torchtitan's plan is run on it).
    "sp_decoder": sp_decoder.build,
}

# torchtitan's Llama plan (torchtitan/models/llama3/infra/parallelize.py: apply_tp), with HF's
# module names: embedding rowwise into a sequence-sharded residual, norms sequence-parallel,
# attention and MLP colwise -> rowwise, the head colwise gathering its output.
TITAN_PLAN = {
    "model.embed_tokens": {"style": "rowwise", "input_layouts": "replicate", "output_layouts": "shard(1)"},
    "model.norm": "sequence_parallel",
    "lm_head": {"style": "colwise", "input_layouts": "shard(1)", "output_layouts": "replicate"},
    "model.layers.*.input_layernorm": "sequence_parallel",
    "model.layers.*.post_attention_layernorm": "sequence_parallel",
    "model.layers.*.self_attn.q_proj": "colwise",
    "model.layers.*.self_attn.k_proj": "colwise",
    "model.layers.*.self_attn.v_proj": "colwise",
    "model.layers.*.self_attn.o_proj": {"style": "rowwise", "output_layouts": "shard(1)"},
    "model.layers.*.mlp.gate_proj": "colwise",
    "model.layers.*.mlp.up_proj": "colwise",
    "model.layers.*.mlp.down_proj": {"style": "rowwise", "output_layouts": "shard(1)"},
}


def hf_plan(name: str) -> Dict[str, Any]:
    """The model's own plan: the config's base_model_tp_plan under the base model's prefix, and
    the head's _tp_plan entry ("colwise_gather_output": colwise with a replicated output)."""
    model = MODELS[name]("meta")
    prefix = model.base_model_prefix + "."
    plan: Dict[str, Any] = {prefix + k: v for k, v in model.config.base_model_tp_plan.items()}
    for k, v in (type(model)._tp_plan or {}).items():
        plan[k] = {"style": "colwise", "output_layouts": "replicate"} if v == "colwise_gather_output" else v
    return plan


CASES: Dict[str, Dict[str, Any]] = {
    "llama_hf_4x2": dict(model="llama", mesh={"dp_shard": 4, "tp": 2}, plan="hf", forward=True),
    "llama_titan_4x2": dict(model="llama", mesh={"dp_shard": 4, "tp": 2}, plan=TITAN_PLAN),
    "mistral_hf_4x2": dict(model="mistral", mesh={"dp_shard": 4, "tp": 2}, plan="hf", forward=True),
    "llama_kv4_titan_2x4": dict(model="llama_kv4", mesh={"dp_shard": 2, "tp": 4}, plan=TITAN_PLAN),
    "mistral_hsdp_2x2x2": dict(model="mistral", mesh={"dp_replicate": 2, "dp_shard": 2, "tp": 2}, plan="hf"),
    # A key that resolves to no module: parallelize_module warns and skips it.
    "llama_unmatched_4x2": dict(model="llama", mesh={"dp_shard": 4, "tp": 2},
                                plan={**TITAN_PLAN, "model.layers.*.attn.q_proj": "colwise"}),
    # colwise on an RMSNorm: ColwiseParallel takes only nn.Linear and nn.Embedding.
    "llama_colwise_norm_4x2": dict(model="llama", mesh={"dp_shard": 4, "tp": 2},
                                   plan={**TITAN_PLAN, "model.norm": "colwise"}),
    # tp 4 > 2 key-value heads: k_proj and v_proj split into 4 rows of a head_dim-8 head.
    "llama_kv_heads_2x4": dict(model="llama", mesh={"dp_shard": 2, "tp": 4}, plan="hf", forward=True),
    # tp 3 divides neither the 4 heads nor the 2 key-value heads (world 6 as 2 x 3).
    "llama_heads_2x3": dict(model="llama", mesh={"dp_shard": 2, "tp": 3}, plan="hf", forward=True),
    # The model's own plan as transformers applies it (runtime "transformers": plan "model"):
    # model.tp_plan, expanded by _resolve_parallel_plans, applied by apply_tensor_parallelism,
    # then fully_shard as above. MoE experts: packed_colwise / rowwise on their 3-D parameters.
    "llama_tfm_4x2": dict(model="llama", mesh={"dp_shard": 4, "tp": 2}, plan="model", forward=True),
    "llama_tfm_kv_heads_2x4": dict(model="llama", mesh={"dp_shard": 2, "tp": 4}, plan="model", forward=True),
    "mixtral_tfm_4x2": dict(model="mixtral", mesh={"dp_shard": 4, "tp": 2}, plan="model", forward=True),
    "mixtral_kv4_tfm_2x4": dict(model="mixtral_kv4", mesh={"dp_shard": 2, "tp": 4}, plan="model", forward=True),
    "mixtral_tfm_kv_heads_2x4": dict(model="mixtral", mesh={"dp_shard": 2, "tp": 4}, plan="model", forward=True),
    "mixtral_tfm_hsdp_2x2x2": dict(model="mixtral", mesh={"dp_replicate": 2, "dp_shard": 2, "tp": 2},
                                   plan="model"),
    "qwen2_moe_tfm_4x2": dict(model="qwen2_moe", mesh={"dp_shard": 4, "tp": 2}, plan="model", forward=True),
    "qwen2_moe_kv4_tfm_2x4": dict(model="qwen2_moe_kv4", mesh={"dp_shard": 2, "tp": 4}, plan="model",
                                  forward=True),
    "qwen3_moe_tfm_4x2": dict(model="qwen3_moe", mesh={"dp_shard": 4, "tp": 2}, plan="model", forward=True),
}

LAYOUT = re.compile(r"^(replicate|shard\((-?\d+)\))$")


def layout(text: Optional[str]):
    if text is None:
        return None
    m = LAYOUT.match(text)
    if not m:
        raise ValueError(f"bad layout {text!r}")
    return Replicate() if m.group(1) == "replicate" else Shard(int(m.group(2)))


def torch_style(spec: Any):
    """A policy plan entry ("colwise" or {"style": "colwise", "output_layouts": ...}) as torch's
    ParallelStyle."""
    if isinstance(spec, str):
        spec = {"style": spec}
    style = spec["style"]
    if style in ("prepare_module_input", "prepare_module_output"):
        side = "input" if style.endswith("input") else "output"
        have, want = spec.get(side + "_layouts"), spec.get("desired_" + side + "_layouts")
        as_tuple = (lambda v: tuple(layout(x) for x in (v if isinstance(v, list) else [v])))
        kw = {side + "_layouts": as_tuple(have), "desired_" + side + "_layouts": as_tuple(want)} if have else {}
        if "use_local_output" in spec:
            kw["use_local_output"] = spec["use_local_output"]
        return (PrepareModuleInput if side == "input" else PrepareModuleOutput)(**kw)
    kw = {}
    for key in ("input_layouts", "output_layouts"):
        if key in spec:
            kw[key] = layout(spec[key])
    if "use_local_output" in spec:
        kw["use_local_output"] = spec["use_local_output"]
    if style == "colwise":
        return ColwiseParallel(**kw)
    if style == "rowwise":
        return RowwiseParallel(**kw)
    if style == "sequence_parallel":
        return SequenceParallel(**({"sequence_dim": spec["sequence_dim"]} if "sequence_dim" in spec else {}))
    raise ValueError(f"style {style!r} not in this script")


def placement_text(p) -> str:
    return repr(p)  # "Shard(dim=0)", "_StridedShard(dim=0, sf=2)", "Replicate()"


def run_case(name: str, case: Dict[str, Any]) -> Dict[str, Any]:
    mesh_shape = case["mesh"]
    dims = [d for d in ("dp_replicate", "dp_shard", "tp") if d in mesh_shape]
    sizes = [mesh_shape[d] for d in dims]
    world = 1
    for s in sizes:
        world *= s
    runtime = "transformers" if case["plan"] == "model" else "torch"
    plan = {"hf": hf_plan, "model": model_plan}[case["plan"]](case["model"]) \
        if isinstance(case["plan"], str) else case["plan"]
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    mesh = init_device_mesh("cpu", tuple(sizes), mesh_dim_names=tuple(dims))
    dp_mesh = mesh[tuple(d for d in dims if d != "tp")] if "dp_replicate" in dims else mesh["dp_shard"]
    model = MODELS[case["model"]]("meta")
    full = {n: list(p.shape) for n, p in model.named_parameters()}
    out: Dict[str, Any] = {"model": case["model"], "mesh": mesh_shape, "world_size": world,
                           "plan": plan, "runtime": runtime, "error": None}
    if runtime == "transformers":
        out["warnings"] = transformers_tp(model, mesh["tp"], mesh_shape)
    else:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                parallelize_module(model, mesh["tp"], {k: torch_style(v) for k, v in plan.items()})
            except Exception as e:  # a style on a module it cannot split: the error is the point
                out["error"] = {"type": type(e).__name__, "message": str(e).splitlines()[0]}
                out["params"], out["warnings"] = {}, []
                return out
        out["warnings"] = sorted({re.sub(r" in module .*, skipping", ", skipping", str(w.message), flags=re.S)
                                  for w in caught if "could not be resolved" in str(w.message)})
    params: Dict[str, Dict[str, Any]] = {}
    for n, p in model.named_parameters():
        if isinstance(p, DTensor):
            params[n] = {"tp_placement": placement_text(p.placements[0]), "tp_local_shape": list(p.to_local().shape)}
        else:
            params[n] = {"tp_placement": "none", "tp_local_shape": list(p.shape)}
        params[n]["shape"] = full[n]
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    padded = {}
    for mod in model.modules():
        state = getattr(mod, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state else None
        if group is None:
            continue
        for fp in group.fsdp_params:
            padded[id(fp.sharded_param)] = list(fp.padded_sharded_param_size)
    for n, p in model.named_parameters():
        params[n].update(placements=[placement_text(x) for x in p.placements],
                         mesh_dims=list(p.device_mesh.mesh_dim_names),
                         local_shape=list(p.to_local().shape), padded_shard_shape=padded[id(p)])
    out["params"] = params
    if case.get("forward"):
        out["error"] = first_forward(case["model"], mesh["tp"], plan, mesh_shape if runtime == "transformers" else None)
    if out["error"] is None and (not out["warnings"] or runtime == "transformers"):
        try:
            out["tracker"] = tracked_steps(model)
        except Exception as e:  # noqa: BLE001  (HF's model under sequence parallelism: recorded)
            out["tracker"] = {"error": {"type": type(e).__name__, "message": str(e).splitlines()[0]}}
    return out


def tracked_steps(model: nn.Module) -> Dict[str, Any]:
    """Two training steps of the 2-D model (parallelize_module and fully_shard already applied,
    on the meta device) under FSDPMemTracker, on real CPU tensors (FakeTensorMode refuses
    DTensor's redistribute of a sequence-sharded activation: it calls .tolist()): the second
    step's categories (bytes, rank 0) and its non-activation peak."""
    torch.manual_seed(0)
    model.to_empty(device="cpu")
    for p in model.parameters():  # to_empty leaves garbage: keep the steps finite
        torch.nn.init.normal_(p.to_local(), std=0.02)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    inputs = (torch.randint(3, 200, (2, 16)),)
    tracker = test_fsdp2.PeakTracker(model, optim)
    tracker.track_inputs(inputs)
    after_backward, after_step = test_fsdp2.two_tracked_steps(tracker, model, optim, inputs)
    cat = test_fsdp2.category
    return {"sharded_params": cat(after_step, "Sharded Param"), "sharded_grads": cat(after_backward, "Sharded Grad"),
            "optimizer_state": cat(after_step, "OptState"), "buffers": cat(after_step, "Buffer"),
            "non_activation_peak": tracker.non_act_peak,
            "at_peak": {k: v for k, v in sorted(tracker.non_act_snap.items()) if v}}


def first_forward(model_name: str, tp_mesh, plan: Dict[str, Any],
                  tfm_mesh: Optional[Dict[str, int]] = None) -> Optional[Dict[str, str]]:
    """One forward of the tensor-parallel model (no FSDP: fully_shard refuses meta parameters in
    forward; nor do meta tensors: HF's mask calls .item()) on the CPU, where the small model's
    real weights cost a few hundred KB and the fake backend's collectives do nothing: its error,
    or None. With `tfm_mesh`, transformers applies the model's own plan (transformers_tp)."""
    model = MODELS[model_name]("cpu")
    if tfm_mesh is not None:
        transformers_tp(model, tp_mesh, tfm_mesh)
    else:
        parallelize_module(model, tp_mesh, {k: torch_style(v) for k, v in plan.items()})
    ids = torch.randint(3, 200, (1, 4))
    try:
        model(input_ids=ids)
    except Exception as e:  # the failure is the point: record it
        return {"type": type(e).__name__, "message": str(e).splitlines()[0]}
    return None


def model_plan(name: str) -> Dict[str, str]:
    """The model's own plan as transformers 5.x resolves it (PreTrainedModel.tp_plan: the head's
    _tp_plan, then the base model's, which init_parallel_plans starts with "embed_tokens":
    "embedding_rowwise"), in its order."""
    return dict(MODELS[name]("meta").tp_plan)


def transformers_tp(model: nn.Module, tp_mesh, mesh_shape: Dict[str, int]) -> List[str]:
    """What from_pretrained(distributed_config=DistributedConfig(tp_size=...)) does for tensor
    parallelism (transformers/distributed/mixin.py: maybe_distribute_model): the model's plan
    expanded to its modules and parameters (_resolve_parallel_plans), applied by
    apply_tensor_parallelism. The rules that match nothing, as transformers logs them."""
    import logging
    logged: List[str] = []

    class Catch(logging.Handler):
        def emit(self, record):
            logged.append(record.getMessage())
    handler = Catch()
    log = T.utils.logging.get_logger("transformers")
    log.addHandler(handler)
    level = T.utils.logging.get_verbosity()
    T.utils.logging.set_verbosity_warning()
    try:
        cfg = DistributedConfig(tp_size=mesh_shape["tp"], fsdp_size=mesh_shape["dp_shard"],
                                dp_replicate_size=mesh_shape.get("dp_replicate", 1))
        tp_plan, _, _ = model._resolve_parallel_plans(cfg)
        apply_tensor_parallelism(model, tp_mesh, tp_plan)
    finally:
        log.removeHandler(handler)
        T.utils.logging.set_verbosity(level)
    return sorted(m for m in logged if "match nothing" in m)


def main(argv: Optional[List[str]] = None) -> int:
    return tp_common.reference_main(__doc__, REFERENCE, CASES, run_case, "result",
                                    extra={"transformers": T.__version__}, argv=argv)


if __name__ == "__main__":
    sys.exit(main())
