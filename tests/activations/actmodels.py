"""The models and inputs the activation references share (make_exports, saved_oracle, peak_oracle).

Every model is a corpus model (tests/corpus/corpus.py: HF architectures from configs, seeded random
init), switched to what training uses: train mode, SDPA attention, and a loss in the forward
(`labels` given). A peft LoRA llama (frozen base, r=4 on q_proj/v_proj) is the frozen-parameter case.

    import actmodels
    model = actmodels.build("llama", dtype=torch.bfloat16)
    kwargs = actmodels.inputs("llama", model, batch=2, seq=32)
    loss = model(**kwargs).loss
"""
import contextlib
import json
import os
import sys
import warnings
from typing import Any, Dict, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "corpus"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import corpus  # noqa: E402

# The models every reference covers. "llama_lora" is peft's LoRA on the corpus llama.
MODELS = ["llama", "mistral", "mixtral", "qwen2_moe", "gpt2", "bert", "vit", "t5", "llama_lora"]
# Static shapes (batch, seq). ViT's sequence is fixed by its config (image 32 / patch 8: 16 patches + CLS);
# for it only the batch varies.
SHAPES = [(1, 16), (2, 32)]
DECODERS = ["llama", "mistral", "mixtral", "qwen2_moe", "gpt2", "llama_lora"]
# The decoder layer classes (what FSDP wraps and Accelerate checkpoints): decoder_layer_classes().
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.05, target_modules=["q_proj", "v_proj"])


def corpus_name(name: str) -> str:
    return "llama" if name == "llama_lora" else name


def build(name: str, device: str = "cpu", dtype: torch.dtype = torch.float32, attn: str = "sdpa",
          experts: Optional[str] = None) -> nn.Module:
    """The corpus model in train mode with `attn` attention ("sdpa" or "eager"), cast to `dtype`.

    experts: HF's MoE kernel choice (transformers/integrations/moe.py); None keeps HF's default
    (grouped_mm where torch has it, which torch 2.13 has on CPU)."""
    base = corpus_name(name)
    model = corpus.build(base, device) if base in corpus.SMALL else corpus.build(base, device)
    model.set_attn_implementation(attn)
    if experts is not None and hasattr(model.config, "_experts_implementation"):
        model.set_experts_implementation(experts)
    if name == "llama_lora":
        import peft
        torch.manual_seed(corpus.SEED)
        model = peft.get_peft_model(model, peft.LoraConfig(**LORA))
    model = model.to(dtype).train()
    return model


def decoder_layer_classes(model: nn.Module) -> list:
    """The repeated blocks among HF's `_no_split_modules` (what FSDP wraps per layer and AC
    checkpoints): classes with more than one instance. BERT and ViT also list their embeddings,
    which is one module; sharding it apart from BERT's tied decoder makes fully_shard refuse the
    tied weight."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = corpus.no_split_modules(base)
    count: Dict[str, int] = {}
    for m in base.modules():
        count[type(m).__name__] = count.get(type(m).__name__, 0) + 1
    return [n for n in names if count.get(n, 0) > 1]


def inputs(name: str, model: nn.Module, batch: int, seq: Optional[int], device: Optional[str] = None) -> Dict[str, Any]:
    """Keyword inputs with labels, so that the loss is in the forward."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = base.config
    if device is None:
        device = next(model.parameters()).device
    g = torch.Generator().manual_seed(corpus.SEED + 1000 * batch + (seq or 0))
    vocab = min(getattr(cfg, "vocab_size", corpus.VOCAB), corpus.VOCAB)
    if name == "vit":
        pixels = torch.rand(batch, cfg.num_channels, cfg.image_size, cfg.image_size, generator=g)
        out = {"pixel_values": pixels.to(next(model.parameters()).dtype),  # the model's dtype, as a Trainer feeds it
               "labels": torch.randint(0, cfg.num_labels, (batch,), generator=g)}
    else:
        ids = torch.randint(3, vocab, (batch, seq), generator=g)
        # A distinct tensor: torch.export merges an input passed twice (the graph would embed `labels`).
        labels = torch.randint(3, vocab, (batch, seq), generator=g)
        out = {"input_ids": ids, "labels": labels}
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in out.items()}


def full_size(name: str, device: str = "meta", dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """A corpus full-size model (llama3_8b, llama3_70b) on the meta device, SDPA, train mode."""
    model = corpus.build(name, device)
    model.set_attn_implementation("sdpa")
    return model.to(dtype).train()


def tuple_forward(model: nn.Module, names) -> None:
    """Makes `model(**kwargs)` return a plain tuple (loss, logits, ...): an instance-level forward that
    passes return_dict=False. torch.export.load cannot rebuild HF's ModelOutput classes (they are
    not registered for pytree serialisation), and a return_dict keyword in the exported kwargs would
    sit beside the dynamic inputs under HF's **kwargs, which export's dynamic_shapes refuses. The
    root module stays the HF class (nn_module_stack names it). Undo with `del model.forward`."""
    hf_forward = model.forward
    names = list(names)

    def forward(**kwargs):
        assert sorted(kwargs) == sorted(names), (sorted(kwargs), names)
        return hf_forward(**kwargs, return_dict=False)

    import inspect
    forward.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None) for n in names])
    model.forward = forward


@contextlib.contextmanager
def hf_training_export():
    """Makes torch.export trace the attention HF runs in eager training, not the one HF picks for
    export.

    Under torch.export, transformers 5 (masking_utils.py: `_ignore_causal_mask_sdpa` returns False when
    `is_torchdynamo_exporting()`, and `find_packed_sequence_indices` returns a traced tensor that
    disables `allow_is_causal_skip`) always materialises the causal mask as a [B, 1, S, S] bool
    tensor; SDPA then gets `attn_mask=` instead of `is_causal=True`, and because a mask is given,
    `integrations/sdpa_attention.py: use_gqa_in_sdpa` is false, so grouped-query models copy k and v
    to every head (`repeat_kv`: expand + reshape) instead of passing `enable_gqa=True`. Eager
    training without padding does neither. Inside this context both checks answer as in eager
    (no export, no packed sequences), so the graph has `is_causal=True`, no mask and `enable_gqa`.
    Valid for inputs without padding or packing (what the exports here use); the sliding-window
    models (mistral) still build their mask, as in eager."""
    import transformers.masking_utils as mu
    saved = mu.is_torchdynamo_exporting, mu.find_packed_sequence_indices
    mu.is_torchdynamo_exporting = lambda: False
    mu.find_packed_sequence_indices = lambda *args, **kwargs: None
    try:
        yield
    finally:
        mu.is_torchdynamo_exporting, mu.find_packed_sequence_indices = saved


def dump_cases(doc: Dict[str, Any]) -> str:
    """Stable JSON for the committed references: sorted keys, ints as ints, one case per line under
    "cases" (compact, and a regenerated file diffs case by case)."""
    lines = ["{"]
    items = sorted(doc.items())
    for i, (k, v) in enumerate(items):
        end = "," if i < len(items) - 1 else ""
        if k == "cases" and isinstance(v, dict):
            lines.append(f' "cases": {{')
            cases = sorted(v.items())
            for j, (ck, cv) in enumerate(cases):
                sep = "," if j < len(cases) - 1 else ""
                lines.append(f"  {json.dumps(ck)}: {json.dumps(cv, sort_keys=True, separators=(',', ':'))}{sep}")
            lines.append(f" }}{end}")
        else:
            lines.append(f" {json.dumps(k)}: {json.dumps(v, sort_keys=True, separators=(',', ':'))}{end}")
    lines.append("}")
    return "\n".join(lines) + "\n"
