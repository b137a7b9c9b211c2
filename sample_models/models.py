"""Eager model definitions for the fsdp-plan sample models.

`make_models.py` scripts and saves these; `tests/differential/` rebuilds them
eagerly (same constructors, same seed) to compute PyTorch's own FSDP plan.
Import this file as the top-level module ``models`` (put ``sample_models/``
on ``sys.path``): TorchScript records the class as ``__torch__.models.Block``,
so the dotted class names in policies ("models.Block") agree with Python's
``Block.__module__``.

Rules kept on purpose, because the planner sees only the TorchScript archive:
- No module object is registered under two names (TorchScript would duplicate it).
- User classes derive directly from ``nn.Module`` (a scripted archive does not
  record Python base classes, so a user class hierarchy cannot be recovered).
"""
import math
from typing import Dict

import torch
import torch.nn as nn
import torch.nn.functional as F


# --------------------------------------------------------------------------
# tiny_gpt: decoder-only transformer with tied lm_head / token embedding.
# --------------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, block_size: int):
        super().__init__()
        assert d_model % n_head == 0
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(0.0)
        mask = torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size)
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.size()
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(b, t, self.n_head, self.head_dim).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        att = self.drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.proj(y)


class MLP(nn.Module):
    def __init__(self, d_model: int):
        super().__init__()
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.act(self.fc(x)))


class Block(nn.Module):
    def __init__(self, d_model: int, n_head: int, block_size: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, block_size)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = MLP(d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class TinyGPT(nn.Module):
    def __init__(self, vocab_size: int = 512, block_size: int = 32, d_model: int = 64,
                 n_head: int = 4, n_layer: int = 3):
        super().__init__()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(block_size, d_model)
        self.blocks = nn.ModuleList([Block(d_model, n_head, block_size) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False)
        # Tied weights: one Parameter object reachable from two modules.
        self.lm_head.weight = self.tok_emb.weight

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device).unsqueeze(0)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# --------------------------------------------------------------------------
# small_cnn: Conv-BN-ReLU blocks in Sequentials, plus a classifier head.
# --------------------------------------------------------------------------
class ConvBNReLU(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class SmallCNN(nn.Module):
    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.stem = ConvBNReLU(3, 16)
        self.stage1 = nn.Sequential(ConvBNReLU(16, 32, 2), ConvBNReLU(32, 32))
        self.stage2 = nn.Sequential(ConvBNReLU(32, 64, 2), ConvBNReLU(64, 64), ConvBNReLU(64, 64))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64, 128),
            nn.BatchNorm1d(128),
            nn.ReLU(),
            nn.Linear(128, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        x = self.stage1(x)
        x = self.stage2(x)
        return self.head(self.pool(x))


# --------------------------------------------------------------------------
# mha_encoder: nn.TransformerEncoder (MultiheadAttention, whose out_proj is a
# NonDynamicallyQuantizableLinear) between an embedding and a head.
# --------------------------------------------------------------------------
class MHAEncoder(nn.Module):
    def __init__(self, vocab_size: int = 256, d_model: int = 64, nhead: int = 4,
                 dim_ff: int = 128, num_layers: int = 2, num_classes: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward=dim_ff,
                                           dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers, norm=nn.LayerNorm(d_model),
                                             enable_nested_tensor=False)
        self.heads = nn.ModuleDict({
            "cls": nn.Linear(d_model, num_classes),
            "aux": nn.Linear(d_model, 1),
        })

    def forward(self, tokens: torch.Tensor) -> Dict[str, torch.Tensor]:
        h = self.encoder(self.embed(tokens))
        pooled = h.mean(dim=1)
        return {"cls": self.heads["cls"](pooled), "aux": self.heads["aux"](pooled)}


# --------------------------------------------------------------------------
# tied_trunk: tensors shared across units at several levels, so that
# _recursive_wrap's remainder goes negative below the root, plus non-float32
# dtypes and a 0-dim buffer.
# --------------------------------------------------------------------------
class Trunk(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3000))  # own parameter, next to children
        self.enc = nn.Embedding(100, 50)               # 5000
        self.dec = nn.Linear(50, 100, bias=False)      # 5000, tied to enc.weight
        self.dec.weight = self.enc.weight
        self.extra = nn.Linear(50, 50)                 # 2550

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.extra(self.enc(idx)) * self.scale[:50]
        return self.dec(h)


class TiedTrunk(nn.Module):
    """With min_num_params=2000, Trunk counts 3000 + 5000 + 2550 = 10550 but its
    children report 5000 + 5000 + 2550 wrapped, so its remainder is -2000 and it
    is not wrapped (counting the tied weight once would give 3000 and wrap it)."""

    def __init__(self):
        super().__init__()
        self.trunk = Trunk()
        self.norm = nn.LayerNorm(100)
        self.out = nn.Linear(100, 10).to(torch.float64)
        # Registered on the root and tied to a grandchild's parameter.
        self.proj = self.trunk.extra.weight
        self.register_buffer("table", torch.arange(16, dtype=torch.float32).to(torch.bfloat16).view(4, 4))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.trunk(idx))
        h = h + self.proj.sum() + self.table.float().sum() + self.steps.float()
        return self.out(h.double())


# name -> (constructor, example input builder); seeds fixed per model.
SAMPLE_MODELS = {
    "tiny_gpt": (TinyGPT, lambda: torch.randint(0, 512, (2, 16))),
    "small_cnn": (SmallCNN, lambda: torch.randn(2, 3, 32, 32)),
    "mha_encoder": (MHAEncoder, lambda: torch.randint(0, 256, (2, 12))),
    "tied_trunk": (TiedTrunk, lambda: torch.randint(0, 100, (2, 5))),
}

SEED = 0


def build(name: str) -> nn.Module:
    """Builds the eager sample model `name` deterministically (eval mode)."""
    ctor, _ = SAMPLE_MODELS[name]
    torch.manual_seed(SEED)
    model = ctor()
    model.eval()
    return model


def example_input(name: str) -> torch.Tensor:
    _, make_input = SAMPLE_MODELS[name]
    torch.manual_seed(SEED + 1)
    return make_input()
