"""Shared pieces of the timing oracles (comm_oracle.py, flop_oracle.py, model_check.py).

Models: the corpus decoders (tests/corpus/corpus.py: small HF configs, and Llama-3-8B dimensions),
and the sample `tiny_gpt` (sample_models/models.py). Everything runs on the CPU of this machine,
under torch 2.13 (the project's venv); the comm oracle uses the single-process `fake`
process-group backend, which completes every collective at once and moves no data.
"""
import json
import os
import sys
import warnings
from typing import Any, Callable, Dict, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "corpus"))
sys.path.insert(0, os.path.join(REPO, "sample_models"))
REFERENCE = os.path.join(HERE, "reference")

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import corpus  # noqa: E402  (HF architectures from configs)
import models as sample_models  # noqa: E402  (sample_models/models.py)

# Model name -> (source, corpus/sample name). "llama3_8b_4l" is Llama-3-8B's layer shape cut to
# 4 decoder layers (FULL["llama3_8b"] with num_hidden_layers=4): full-size per-unit numbers at a
# fraction of the CPU time; "llama3_8b" is the whole 32-layer model.
MODELS = ("llama", "mixtral", "mixtral_gmm", "gpt2", "tiny_gpt", "odd_lm", "llama3_8b_4l", "llama3_8b")


class OddBlock(nn.Module):
    """A pre-norm MLP block whose sizes are not multiples of 4 or 8 elements, so that FSDP1's
    use_orig_params alignment padding (16 bytes per parameter) and the world-size padding show."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class OddLM(nn.Module):
    def __init__(self, vocab: int = 53, d: int = 22, hidden: int = 69, layers: int = 3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([OddBlock(d, hidden) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = self.emb(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))
DEFAULT_BATCH, DEFAULT_SEQ = 2, 16


def build(name: str, attn: str = "eager") -> nn.Module:
    """The model in training mode, built on the CPU in the current mode (call under FakeTensorMode
    for no real storage). `attn` is the HF attention implementation ("eager" as the corpus uses,
    or "sdpa", HF's default)."""
    if name == "tiny_gpt":
        torch.manual_seed(sample_models.SEED)
        return sample_models.TinyGPT().train()
    if name == "odd_lm":
        torch.manual_seed(0)
        return OddLM().train()
    import transformers as T
    if name in ("llama3_8b", "llama3_8b_4l"):
        kw = dict(corpus.COMMON, **corpus._LLAMA3, hidden_size=4096, intermediate_size=14336,
                  num_hidden_layers=32 if name == "llama3_8b" else 4, num_attention_heads=32,
                  num_key_value_heads=8)
        kw["attn_implementation"] = attn
        cfg = T.LlamaConfig(**kw)
        torch.manual_seed(corpus.SEED)
        model = T.LlamaForCausalLM(cfg)
    else:
        # mixtral_gmm: made in bf16 (no .to() under FakeTensorMode: it cannot swap fake parameters).
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16 if name == "mixtral_gmm" else prev)
        try:
            model = corpus.build("mixtral" if name == "mixtral_gmm" else name, "cpu")
        finally:
            torch.set_default_dtype(prev)
        if attn != "eager":
            model.set_attn_implementation(attn)
    # HF's default experts kernel (grouped_mm: aten._grouped_mm) has a fake / meta path in bf16
    # only (mixtral_gmm), and the eager one loops over the routed experts with data-dependent shapes; batched_mm gathers the
    # k experts' weights per token and runs bmm (transformers/integrations/moe.py).
    if attn == "sdpa" and model.config.model_type == "gpt2":
        # GPT-2 passes its attention dropout to SDPA; with dropout_p > 0 the CPU picks SDPA's math
        # kernel (backward: 4 bmm, no recompute of the scores) where a GPU runs the fused flash /
        # efficient kernels that FlopCounterMode counts with sdpa_backward_flop (5 bmm). Dropout
        # moves no FLOP count otherwise, so the FLOP oracle turns the attention dropout off.
        for m in model.modules():
            if hasattr(m, "attn_dropout") and isinstance(m.attn_dropout, nn.Dropout):
                m.attn_dropout.p = 0.0
    if name == "mixtral_gmm":
        # HF's default kernel, aten._grouped_mm: its meta kernel (FakeTensorMode, export on meta)
        # takes bf16 only.
        model.config._experts_implementation = "grouped_mm"
        return model.train()
    if hasattr(model.config, "_experts_implementation"):
        model.config._experts_implementation = "batched_mm"
    return model.train()


def decoder_layer_class(model: nn.Module) -> type:
    """The class FSDP wraps per decoder layer: HF's `_no_split_modules`, or tiny_gpt's Block."""
    if isinstance(model, sample_models.TinyGPT):
        return sample_models.Block
    if isinstance(model, OddLM):
        return OddBlock
    names = set(corpus.no_split_modules(model))
    for m in model.modules():
        if type(m).__name__ in names:
            return type(m)
    raise RuntimeError(f"no decoder layer class among {names}")


def vocab_size(model: nn.Module) -> int:
    if hasattr(model, "config"):
        return model.config.vocab_size
    return next(m for m in model.modules() if isinstance(m, nn.Embedding)).num_embeddings


def make_batch(model: nn.Module, batch: int = DEFAULT_BATCH, seq: int = DEFAULT_SEQ) -> torch.Tensor:
    """Token ids (the labels are the same ids: HF shifts them inside its loss)."""
    g = torch.Generator().manual_seed(1)
    return torch.randint(3, min(vocab_size(model), 256), (batch, seq), generator=g)


def loss_of(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The training loss, computed inside the model's forward for HF models (labels=ids, so the
    vocabulary-sized cross-entropy is part of the step); tiny_gpt returns logits, and its loss is
    next-token cross-entropy outside the model (the same as HF's shift)."""
    out = model(input_ids=ids, labels=ids) if hasattr(model, "config") else model(ids)
    if hasattr(out, "loss"):
        return out.loss
    return F.cross_entropy(out[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def clean_fqn(name: str) -> str:
    """A module path without the wrappers' inner names (FSDP1 `_fsdp_wrapped_module`,
    checkpoint_wrapper's `_checkpoint_wrapped_module`)."""
    parts = [p for p in name.split(".") if p not in ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")]
    return ".".join(parts)


def write_json(path: str, doc: Any) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


def versions() -> Dict[str, str]:
    import transformers
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def first_difference(a: Any, b: Any, path: str = "") -> Optional[str]:
    """Where two JSON values first differ, or None."""
    if type(a) is not type(b):
        return f"{path or '.'}: {a!r} vs {b!r}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: only in {'second' if k not in a else 'first'}"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path or '.'}: {a!r} vs {b!r}"


def select(names, patterns) -> list:
    """The names containing any of the substrings in `patterns` (all when there are none)."""
    if not patterns:
        return list(names)
    return [n for n in names if any(p in n for p in patterns)]


Builder = Callable[[], nn.Module]
Shape = Tuple[int, ...]


def json_round_trip(doc: Any) -> Any:
    """`doc` as it reads back from its JSON (tuples become lists, keys strings)."""
    return json.loads(json.dumps(doc, sort_keys=True))
