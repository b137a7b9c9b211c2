"""A small Llama-style decoder for the context-parallel (CP) reference (cp_reference.py).

`CPDecoder`: `embed` (Embedding V x D), `layers` (ModuleList of `DecoderLayer`: `attn_norm` (RMSNorm),
`attn` (`Attention`: q_proj, k_proj, v_proj, o_proj, no bias; RoPE on q and k; causal
`F.scaled_dot_product_attention`), `mlp_norm` (RMSNorm), `mlp` (`SwiGLU`: gate_proj, up_proj,
down_proj)), `norm` (RMSNorm), `head` (Linear D -> V, not tied). Parameters are float32.

forward(input_ids [B, S] int64, labels [B, S] int64, positions [B, S] int64) -> the cross-entropy loss
(mean over the B x S tokens given, logits upcast to float32), so the exported graph has the loss.

The rotary embedding is computed inside forward from `positions` (cos / sin of positions x inv_freq,
inv_freq a non-persistent buffer of head_dim / 2 floats, cast to the activations' dtype as Hugging
Face's Llama does), not read from a [max_seq, ...] table. That one choice serves both uses:

- torch.export with a dynamic `seq` (torch.export.Dim("seq")) on input_ids, labels and positions:
  nothing in the graph depends on a maximum length, every sequence-length use is the symbol;
- CP: every tensor whose dim 1 is the sequence is a forward input, so
  `context_parallel(cp_mesh, buffers=[input_ids, labels, positions], buffer_seq_dims=[1, 1, 1])`
  shards (and, with the head-tail load balancer, reorders) all of them alike: each rank's RoPE is
  the one of its own token positions, which torchtitan gets by passing its `freqs_cis` table as a
  CP buffer (seq dim 0) instead. No model change is needed between the two uses.

With `experts` > 0 each layer's `mlp` is a `moe` instead: ep_models.GroupedMoE (a router and
GroupedExperts, forced balanced routing, `top_k` experts per token), for expert parallelism beside CP.

GQA: `kv_heads` < `heads` gives k_proj / v_proj kv_heads * head_dim outputs. With `repeat_kv`
(the default, torchtitan's Llama 3 and Hugging Face's eager path) K and V are repeated to `heads`
heads (repeat_interleave on the head dim) before SDPA, so SDPA (and CP's K/V exchange) sees H
heads; with repeat_kv=False they go to SDPA as they are with `enable_gqa=True` (the CPU flash
kernel takes GQA natively), so CP exchanges H_kv heads.

    cd /work/main && PYTHONPATH=python:. .venv/bin/python tests/differential/cp_models.py -o /tmp/cp.pt2
    PYTHONPATH=python:. .venv/bin/python -m fsdp_plan.export \\
        --factory tests.differential.cp_models:cp_decoder -o /tmp/cp.pt2
    build/app/fsdp-plan /tmp/cp.pt2 --policy P.json --world-size 8 --dim seq=4096 --format json
"""
import argparse
import os
import sys
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULTS: Dict[str, Any] = dict(vocab=256, dim=64, heads=4, kv_heads=4, head_dim=16, hidden=128, layers=2,
                                batch=2, seq=256, rope_theta=10000.0, repeat_kv=True, loss_upcast=True,
                                experts=0, top_k=0)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int, repeat_kv: bool):
        super().__init__()
        if heads % kv_heads:
            raise ValueError(f"kv_heads {kv_heads} does not divide heads {heads}")
        self.heads, self.kv_heads, self.head_dim, self.repeat_kv = heads, kv_heads, head_dim, repeat_kv
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)  # [B, H, S, Dh]
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, S, Dh]
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        gqa = self.kv_heads != self.heads
        if gqa and self.repeat_kv:
            rep = self.heads // self.kv_heads
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            gqa = False
        # Looked up on the module at call time: context_parallel() monkey-patches F.scaled_dot_product_attention.
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))


class SwiGLU(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _ep_models():
    """ep_models as the caller's path has it (the references import it from this directory; the exporter's
    --factory imports this module from the tests.differential package)."""
    try:
        import ep_models
    except ImportError:
        from tests.differential import ep_models
    return ep_models


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Dict[str, Any]):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg["dim"])
        self.attn = Attention(cfg["dim"], cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["repeat_kv"])
        self.mlp_norm = nn.RMSNorm(cfg["dim"])
        if cfg["experts"]:
            # A mixture of experts for expert parallelism beside CP: ep_models.GroupedMoE (fused experts,
            # forced balanced routing). top_k == experts keeps tokens x top_k a multiple of the experts
            # at every sequence length, so the export's dynamic seq needs no constraint.
            self.moe = _ep_models().GroupedMoE(cfg["dim"], cfg["hidden"], cfg["experts"], cfg["top_k"])
        else:
            self.mlp = SwiGLU(cfg["dim"], cfg["hidden"])

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x), cos, sin)
        return h + (self.moe if hasattr(self, "moe") else self.mlp)(self.mlp_norm(h))


class CPDecoder(nn.Module):
    """embed, layers, norm, head; forward(input_ids, labels, positions) -> cross-entropy loss."""

    _no_split_modules = ["DecoderLayer"]

    def __init__(self, **cfg: Any):
        super().__init__()
        cfg = dict(DEFAULTS, **cfg)
        self.vocab, self.head_dim, self.loss_upcast = cfg["vocab"], cfg["head_dim"], cfg["loss_upcast"]
        self.embed = nn.Embedding(cfg["vocab"], cfg["dim"])
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg["layers"])])
        self.norm = nn.RMSNorm(cfg["dim"])
        self.head = nn.Linear(cfg["dim"], cfg["vocab"], bias=False)
        inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, cfg["head_dim"], 2, dtype=torch.float32)
                                                / cfg["head_dim"]))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rope(self, positions: torch.Tensor, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [B, 1, S, head_dim] of the token positions, in `dtype`."""
        freqs = positions.unsqueeze(-1).to(torch.float32) * self.inv_freq  # [B, S, head_dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        cos, sin = self.rope(positions, h.dtype)
        for layer in self.layers:
            h = layer(h, cos, sin)
        logits = self.head(self.norm(h))
        # torchtitan's loss upcasts the logits to fp32; loss_upcast=False keeps their dtype.
        if self.loss_upcast:
            logits = logits.float()
        return F.cross_entropy(logits.reshape(-1, self.vocab), labels.reshape(-1))


def example_inputs(cfg: Dict[str, Any], seed: int = 0) -> Dict[str, torch.Tensor]:
    """Full-sequence inputs: input_ids, labels (random tokens), positions (0 .. S-1 in every row)."""
    g = torch.Generator().manual_seed(seed)
    b, s = cfg["batch"], cfg["seq"]
    return {"input_ids": torch.randint(0, cfg["vocab"], (b, s), generator=g),
            "labels": torch.randint(0, cfg["vocab"], (b, s), generator=g),
            "positions": torch.arange(s, dtype=torch.int64).unsqueeze(0).expand(b, s).contiguous()}


def build(cfg: Optional[Dict[str, Any]] = None) -> CPDecoder:
    torch.manual_seed(0)
    return CPDecoder(**dict(DEFAULTS, **(cfg or {}))).train()


def dynamic_shapes(dynamic_batch: bool = False) -> Dict[str, Dict[int, Any]]:
    seq = torch.export.Dim("seq", min=2)
    axes: Dict[int, Any] = {1: seq}
    if dynamic_batch:
        axes[0] = torch.export.Dim("batch", min=1)
    return {"input_ids": dict(axes), "labels": dict(axes), "positions": dict(axes)}


def cp_decoder(**overrides: Any) -> Dict[str, Any]:
    """A factory for `fsdp-plan-export --factory` (python/fsdp_plan/export.py: call_factory): the model,
    its full-sequence inputs as keyword arguments and a dynamic `seq` on all three."""
    cfg = dict(DEFAULTS, **overrides)
    return {"module": build(cfg), "args": (), "kwargs": example_inputs(cfg), "dynamic_shapes": dynamic_shapes()}


def export(path: str, cfg: Optional[Dict[str, Any]] = None, dynamic_batch: bool = False) -> Dict[str, Any]:
    """The model of `cfg` (DEFAULTS overridden) exported as the project's exporter does
    (fsdp_plan.export.export_module: torch.export.export(strict=False), stand-in weights, the metadata
    record) to `path`, with a dynamic `seq` (the plan's `--dim seq=N`). Returns the metadata record."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    if os.path.join(root, "python") not in sys.path:
        sys.path.insert(0, os.path.join(root, "python"))
    from fsdp_plan.export import export_module
    cfg = dict(DEFAULTS, **(cfg or {}))
    meta = {"source": "tests/differential/cp_models.py", "cp_models_cfg": cfg}
    return export_module(build(cfg), (), example_inputs(cfg), path, dynamic_shapes(dynamic_batch), meta,
                         what="cp_models.CPDecoder")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override DEFAULTS")
    a = ap.parse_args()
    over: Dict[str, Any] = {}
    for kv in a.set:
        k, v = kv.split("=", 1)
        over[k] = type(DEFAULTS[k])(v) if not isinstance(DEFAULTS[k], bool) else v.lower() in ("1", "true")
    rec = export(a.output, over)
    print(a.output, rec["seconds"])


if __name__ == "__main__":
    # Through the module's own name, so the archive records cp_models.CPDecoder, not __main__.CPDecoder.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cp_models
    cp_models.main()
