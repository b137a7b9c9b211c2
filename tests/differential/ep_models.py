"""Small mixture-of-experts decoders for the expert-parallel (EP) references (ep_reference.py).

Routing is forced balanced and static, as torchtitan's TokenChoiceTopKRouter does under
`_debug_force_load_balance` (torchtitan/models/common/moe.py: `_debug_force_load_balance_routing`):
token t's k-th expert is `(t * K + k) % E`, and its weight is the router's softmax score for that
expert. So torch.export traces the models without data-dependent shapes, every expert gets
exactly T*K/E routed rows, and the EP all-to-all splits are equal.

- `FusedMoE`: the experts of each layer are one `GroupedExperts` module with fused parameters
  w1 [E, F, D], w2 [E, D, F], w3 [E, F, D] (torchtitan's layout). Its forward takes
  `(x [T, D], top_k_index [T, K] int64, top_k_weights [T, K])`, as transformers 5's fused
  `*Experts` modules do, sorts the T*K routed rows by expert (a static permutation), runs SwiGLU
  per expert with torch.bmm on a [E, T*K/E, D] view, and index-adds the rows back weighted.
- `PerExpertMoE`: the same, with the experts an nn.ModuleList `experts` of E `ExpertMLP`
  modules (three Linears without bias) inside a `PerExpertMoEBlock`; each expert runs on its
  static slice of the sorted rows.

Both decoders: `embed` (Embedding V x D), `layers` (ModuleList of `DecoderLayer`: `attn_norm`,
`attn` (a two-Linear mixer, not attention), `moe_norm`, `moe`), `norm`, `head` (Linear D -> V, not
tied); the forward takes `input_ids` [B, S] and `labels` [B, S] and returns the cross-entropy loss,
so the exported graph has the loss. Parameters are float32.

Factories for `fsdp-plan-export --factory` (python/fsdp_plan/export.py: call_factory) return
(module, args, kwargs): `fused_moe()` and `per_expert_moe()`, with V=256, D=64, F=96, E=8, K=2,
2 layers and a batch of 2 x 16 tokens (T = 32, T*K/E = 8 rows per expert).

    cd /work/main && PYTHONPATH=python:. .venv/bin/python -m fsdp_plan.export \\
        --factory tests.differential.ep_models:fused_moe -o /tmp/ep_fused.pt2
"""
from typing import Any, Dict, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

DEFAULTS: Dict[str, int] = dict(vocab=256, dim=64, hidden=96, experts=8, top_k=2, layers=2, batch=2, seq=16)


def forced_routing(num_tokens: int, top_k: int, num_experts: int, device: torch.device) -> torch.Tensor:
    """[T, K] int64: token t's k-th expert is (t * K + k) % E (torchtitan's balanced round robin)."""
    return (torch.arange(num_tokens * top_k, device=device, dtype=torch.int64) % num_experts).reshape(
        num_tokens, top_k)


def sort_by_expert(top_k_index: torch.Tensor, top_k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(order [T*K], token [T*K]): the routed rows (token, k) in expert order (stable, as
    torchtitan's LocalTokenDispatcher._local_reorder) and the token each sorted row came from."""
    order = torch.argsort(top_k_index.reshape(-1), stable=True)
    return order, order // top_k


class GroupedExperts(nn.Module):
    """E SwiGLU experts in fused parameters (torchtitan's GroupedExperts layout).

    forward(x [T, D], top_k_index [T, K], top_k_weights [T, K]) -> [T, D]. The routing must
    be balanced (every expert T*K/E rows): the sorted rows are viewed as [E, T*K/E, D]."""

    def __init__(self, dim: int, hidden: int, num_experts: int):
        super().__init__()
        self.num_experts = num_experts
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden))
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden, dim))
        for w in (self.w1, self.w2, self.w3):
            nn.init.normal_(w, std=0.02)

    @staticmethod
    def swiglu(rows: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor) -> torch.Tensor:
        """rows [e, n, D] through e experts' weights ([e, F, D], [e, D, F], [e, F, D]) -> [e, n, D]."""
        h = F.silu(torch.bmm(rows, w1.transpose(1, 2))) * torch.bmm(rows, w3.transpose(1, 2))
        return torch.bmm(h, w2.transpose(1, 2))

    def forward(self, x: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor) -> torch.Tensor:
        num_tokens, dim = x.shape
        top_k = top_k_index.shape[1]
        rows_total = num_tokens * top_k
        assert rows_total % self.num_experts == 0, "balanced routing needs T*K divisible by E"
        order, token = sort_by_expert(top_k_index, top_k)
        rows = x[token].view(self.num_experts, rows_total // self.num_experts, dim)
        out = self.swiglu(rows, self.w1, self.w2, self.w3).reshape(rows_total, dim)
        out = out * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(out.dtype)
        return torch.zeros_like(x).index_add(0, token, out)


class ExpertMLP(nn.Module):
    """One SwiGLU expert: w2(silu(w1 x) * w3 x), three Linears without bias."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class GroupedMoE(nn.Module):
    """router (Linear D -> E, no bias; its softmax scores weight the experts) + GroupedExperts."""

    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int):
        super().__init__()
        self.num_experts, self.top_k = num_experts, top_k
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = GroupedExperts(dim, hidden, num_experts)

    def route(self, x_td: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        scores = torch.softmax(self.router(x_td).float(), dim=-1)
        top_k_index = forced_routing(x_td.shape[0], self.top_k, self.num_experts, x_td.device)
        return top_k_index, scores.gather(-1, top_k_index)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x_td = x.reshape(-1, shape[-1])
        top_k_index, top_k_weights = self.route(x_td)
        return self.experts(x_td, top_k_index, top_k_weights).reshape(shape)


class PerExpertMoEBlock(GroupedMoE):
    """router + `experts`, an nn.ModuleList of E ExpertMLP; each expert runs on its own slice
    of the rows sorted by expert (T*K/E rows each)."""

    def __init__(self, dim: int, hidden: int, num_experts: int, top_k: int):
        nn.Module.__init__(self)
        self.num_experts, self.top_k = num_experts, top_k
        self.router = nn.Linear(dim, num_experts, bias=False)
        self.experts = nn.ModuleList([ExpertMLP(dim, hidden) for _ in range(num_experts)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x_td = x.reshape(-1, shape[-1])
        top_k_index, top_k_weights = self.route(x_td)
        rows_total = x_td.shape[0] * self.top_k
        assert rows_total % self.num_experts == 0, "balanced routing needs T*K divisible by E"
        order, token = sort_by_expert(top_k_index, self.top_k)
        rows = x_td[token].view(self.num_experts, rows_total // self.num_experts, shape[-1])
        out = torch.cat([expert(rows[e]) for e, expert in enumerate(self.experts)], dim=0)
        out = out * top_k_weights.reshape(-1)[order].unsqueeze(-1).to(out.dtype)
        return torch.zeros_like(x_td).index_add(0, token, out).reshape(shape)


class Mixer(nn.Module):
    """Stands in for attention: two Linears (D -> D)."""

    def __init__(self, dim: int):
        super().__init__()
        self.in_proj = nn.Linear(dim, dim, bias=False)
        self.out_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_proj(F.silu(self.in_proj(x)))


class DecoderLayer(nn.Module):
    def __init__(self, dim: int, moe: nn.Module):
        super().__init__()
        self.attn_norm = nn.RMSNorm(dim)
        self.attn = Mixer(dim)
        self.moe_norm = nn.RMSNorm(dim)
        self.moe = moe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + self.attn(self.attn_norm(x))
        return h + self.moe(self.moe_norm(h))


class MoEDecoder(nn.Module):
    """embed, layers, norm, head (not tied); forward(input_ids, labels) -> cross-entropy loss."""

    _no_split_modules = ["DecoderLayer"]

    def __init__(self, moe_class: type, vocab: int, dim: int, hidden: int, experts: int, top_k: int, layers: int):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList([DecoderLayer(dim, moe_class(dim, hidden, experts, top_k))
                                     for _ in range(layers)])
        self.norm = nn.RMSNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h)
        logits = self.head(self.norm(h))
        return F.cross_entropy(logits.float().reshape(-1, self.vocab), labels.reshape(-1))


class FusedMoE(MoEDecoder):
    def __init__(self, vocab: int = 256, dim: int = 64, hidden: int = 96, experts: int = 8, top_k: int = 2,
                 layers: int = 2):
        super().__init__(GroupedMoE, vocab, dim, hidden, experts, top_k, layers)


class PerExpertMoE(MoEDecoder):
    def __init__(self, vocab: int = 256, dim: int = 64, hidden: int = 96, experts: int = 8, top_k: int = 2,
                 layers: int = 2):
        super().__init__(PerExpertMoEBlock, vocab, dim, hidden, experts, top_k, layers)


def example_inputs(vocab: int, batch: int, seq: int, seed: int = 0) -> Dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"input_ids": torch.randint(0, vocab, (batch, seq), generator=g),
            "labels": torch.randint(0, vocab, (batch, seq), generator=g)}


def _factory(cls: type, **overrides: int) -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
    cfg = dict(DEFAULTS, **overrides)
    if (cfg["batch"] * cfg["seq"] * cfg["top_k"]) % cfg["experts"]:
        raise ValueError(f"balanced routing needs batch*seq*top_k divisible by experts: {cfg}")
    torch.manual_seed(0)
    model = cls(cfg["vocab"], cfg["dim"], cfg["hidden"], cfg["experts"], cfg["top_k"], cfg["layers"]).train()
    inputs = example_inputs(cfg["vocab"], cfg["batch"], cfg["seq"])
    return model, (inputs["input_ids"],), {"labels": inputs["labels"]}


def fused_moe(**overrides: int) -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
    """(FusedMoE, (input_ids,), {"labels": labels}); keyword overrides of DEFAULTS."""
    return _factory(FusedMoE, **overrides)


def per_expert_moe(**overrides: int) -> Tuple[nn.Module, Tuple[Any, ...], Dict[str, Any]]:
    """(PerExpertMoE, (input_ids,), {"labels": labels}); keyword overrides of DEFAULTS."""
    return _factory(PerExpertMoE, **overrides)


FACTORIES = {"fused": fused_moe, "per_expert": per_expert_moe}
