"""Real Hugging Face architectures, built from configs with random init.

No download from any hub: every model comes from a `transformers` config class
with small dimensions (a few hundred KB each), or with full-size dimensions on
the meta device (no weight is ever allocated). Run with the project's venv
(torch 2.13, transformers):

    import corpus
    model = corpus.build("llama")                       # eager, seeded random init
    model = corpus.build("llama3_70b", device="meta")   # structure only
    corpus.save(model, corpus.example_inputs("llama", model), "llama.pt")

`SMALL` lists the small models (the differential suite plans each of them),
`FULL` the full-size configurations (meta device only).

Every model is traced, not scripted (HF modules do not script): `save` swaps in
an instance-level forward that returns the first output tensor, because the
tracer cannot return HF's ModelOutput classes. The module tree, parameters and
buffers of the saved archive are those of the HF model; `tree_signature`
checks it.
"""
import os
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")  # tracer chatter about Python values becoming constants

import transformers as T  # noqa: E402

SEED = 0
VOCAB = 256
# Every config: eager attention (traceable), no KV cache, special tokens inside the small vocabulary.
COMMON = dict(use_cache=False, attn_implementation="eager", pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _decoder(cls_cfg, cls_model, **kw) -> Callable[..., nn.Module]:
    def build(device: str = "cpu") -> nn.Module:
        return _make(cls_model, cls_cfg(**{**COMMON, **kw}), device)
    build.inputs = ("input_ids",)
    return build


def _make(cls_model, cfg, device: str) -> nn.Module:
    torch.manual_seed(SEED)
    with torch.device(device):
        return cls_model(cfg).eval()


_LLAMA_SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _t5(device: str = "cpu") -> nn.Module:
    cfg = T.T5Config(**{**COMMON, "decoder_start_token_id": 0}, vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64,
                     num_layers=2, num_decoder_layers=2, num_heads=4, relative_attention_num_buckets=8)
    return _make(T.T5ForConditionalGeneration, cfg, device)


_t5.inputs = ("input_ids", "decoder_input_ids")


def _bert(device: str = "cpu") -> nn.Module:
    cfg = T.BertConfig(**COMMON, vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=64)
    return _make(T.BertForMaskedLM, cfg, device)


_bert.inputs = ("input_ids",)


def _vit(device: str = "cpu") -> nn.Module:
    cfg = T.ViTConfig(attn_implementation="eager", image_size=32, patch_size=8, num_channels=3, hidden_size=32,
                      num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, num_labels=10)
    return _make(T.ViTForImageClassification, cfg, device)


_vit.inputs = ("pixel_values",)


def _whisper(device: str = "cpu") -> nn.Module:
    cfg = T.WhisperConfig(**{**COMMON, "decoder_start_token_id": 1}, vocab_size=VOCAB, num_mel_bins=16,
                          d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                          decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                          max_source_positions=16, max_target_positions=32)
    return _make(T.WhisperForConditionalGeneration, cfg, device)


_whisper.inputs = ("input_features", "decoder_input_ids")

# name -> builder(device) -> nn.Module; builder.inputs names the forward arguments traced.
SMALL: Dict[str, Callable[..., nn.Module]] = {
    "gpt2": None,  # filled below (GPT-2's config names differ)
    "llama": _decoder(T.LlamaConfig, T.LlamaForCausalLM, **_LLAMA_SMALL, tie_word_embeddings=False),
    "llama_tied": _decoder(T.LlamaConfig, T.LlamaForCausalLM, **_LLAMA_SMALL, tie_word_embeddings=True),
    "mistral": _decoder(T.MistralConfig, T.MistralForCausalLM, **_LLAMA_SMALL, sliding_window=16),
    "mixtral": _decoder(T.MixtralConfig, T.MixtralForCausalLM, **_LLAMA_SMALL, num_local_experts=4,
                        num_experts_per_tok=2),
    "qwen2_moe": _decoder(T.Qwen2MoeConfig, T.Qwen2MoeForCausalLM, **_LLAMA_SMALL, num_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                          decoder_sparse_step=1),
    "bert": _bert,
    "t5": _t5,
    "vit": _vit,
    "whisper": _whisper,
}
SMALL["gpt2"] = _decoder(T.GPT2Config, T.GPT2LMHeadModel, vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                         n_positions=64)

# Full-size configurations: meta device only (Llama 3 8B and 70B dimensions).
_LLAMA3 = dict(vocab_size=128256, max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False)
FULL: Dict[str, Callable[..., nn.Module]] = {
    "llama3_8b": _decoder(T.LlamaConfig, T.LlamaForCausalLM, **_LLAMA3, hidden_size=4096, intermediate_size=14336,
                          num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8),
    "llama3_70b": _decoder(T.LlamaConfig, T.LlamaForCausalLM, **_LLAMA3, hidden_size=8192,
                           intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                           num_key_value_heads=8),
}


def builder(name: str) -> Callable[..., nn.Module]:
    if name in SMALL:
        return SMALL[name]
    if name in FULL:
        return FULL[name]
    raise KeyError(f"unknown corpus model {name!r}; known: {sorted(SMALL) + sorted(FULL)}")


def build(name: str, device: Optional[str] = None) -> nn.Module:
    """The eager model, seeded. Full-size models default to (and need) the meta device."""
    if device is None:
        device = "meta" if name in FULL else "cpu"
    return builder(name)(device)


def example_inputs(name: str, model: nn.Module) -> Tuple[torch.Tensor, ...]:
    """Tiny inputs for tracing, on the model's device."""
    device = next(model.parameters()).device
    cfg = model.config
    g = torch.Generator().manual_seed(SEED)
    out = []
    for arg in builder(name).inputs:
        if arg == "pixel_values":
            t = torch.rand(1, cfg.num_channels, cfg.image_size, cfg.image_size, generator=g)
        elif arg == "input_features":
            t = torch.rand(1, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=g)
        else:
            t = torch.randint(3, min(cfg.vocab_size, VOCAB), (1, 4), generator=g)
        out.append(t.to(device))
    return tuple(out)


def no_split_modules(model: nn.Module) -> List[str]:
    """The class names HF (and Accelerate's FSDP plugin) wrap: `_no_split_modules`."""
    return sorted(set(getattr(model, "_no_split_modules", None) or []))


def trace(model: nn.Module, name: str, inputs: Tuple[torch.Tensor, ...]) -> torch.jit.ScriptModule:
    """torch.jit.trace of the HF model itself (not of a wrapper: the root stays the HF class)."""
    arg_names = builder(name).inputs
    hf_forward = model.forward

    def forward(*args):
        out = hf_forward(**dict(zip(arg_names, args)))
        return out[0] if not isinstance(out, torch.Tensor) else out

    model.forward = forward
    try:
        with torch.no_grad():
            return torch.jit.trace(model, inputs, strict=False, check_trace=False)
    finally:
        del model.forward


def save(model: nn.Module, name: str, path: str) -> torch.jit.ScriptModule:
    """Traces and saves; a meta-device model is saved structure-only (empty data records)."""
    traced = trace(model, name, example_inputs(name, model))
    torch.jit.save(traced, path)
    return traced


def tree_signature(mod: nn.Module):
    """Module paths, parameters and buffers with shape and dtype, in order."""
    return ([n for n, _ in mod.named_modules()],
            [(n, tuple(t.shape), t.dtype) for n, t in mod.named_parameters()],
            [(n, tuple(t.shape), t.dtype) for n, t in mod.named_buffers()])
