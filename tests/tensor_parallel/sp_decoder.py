"""A small decoder that runs under sequence parallelism, for the activation oracle (tp_act_reference.py).

Hugging Face's Llama fails under a sequence-parallel plan (it computes the rotary embeddings for the
whole sequence outside the layers; reference.json records the error), so the sequence-parallel
case uses this model: token embedding, blocks of RMSNorm -> attention (q, k, v, o; SDPA, causal,
no rotary) -> residual -> RMSNorm -> SiLU MLP (up, down) -> residual, a final RMSNorm, the head and
the cross-entropy loss in the forward. Its plan (SP_PLAN, the policy's language) is torchtitan's
with the all-gathers at the linears: the embedding reduce-scattered into a sequence-sharded
residual, the norms sequence-parallel, q / k / v and up colwise with input_layouts shard(1) (each
all-gathers the sequence-sharded input), o and down rowwise reduce-scattering back to shard(1),
the head colwise from shard(1) gathering its logits.

`factory` is fsdp-plan-export's --factory (module, args, kwargs) at BATCH x SEQ.
"""
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, HIDDEN, HEADS, FFN, LAYERS = 256, 32, 4, 64, 2
BATCH, SEQ = 2, 16

SP_PLAN = {
    "embed": {"style": "rowwise", "input_layouts": "replicate", "output_layouts": "shard(1)"},
    "layers.*.norm1": "sequence_parallel",
    "layers.*.attn.q": {"style": "colwise", "input_layouts": "shard(1)"},
    "layers.*.attn.k": {"style": "colwise", "input_layouts": "shard(1)"},
    "layers.*.attn.v": {"style": "colwise", "input_layouts": "shard(1)"},
    "layers.*.attn.o": {"style": "rowwise", "output_layouts": "shard(1)"},
    "layers.*.norm2": "sequence_parallel",
    "layers.*.mlp.up": {"style": "colwise", "input_layouts": "shard(1)"},
    "layers.*.mlp.down": {"style": "rowwise", "output_layouts": "shard(1)"},
    "norm": "sequence_parallel",
    "head": {"style": "colwise", "input_layouts": "shard(1)", "output_layouts": "replicate"},
}


# torchtitan's own plan (torchtitan/models/llama3/infra/parallelize.py: apply_tp): each block's
# attention and MLP gather the sequence-sharded input once, with prepare_module_input, for all their
# colwise linears (whose input is then a Replicate DTensor: no collective of their own).
TITAN_SP_PLAN = {
    "embed": {"style": "rowwise", "input_layouts": "replicate", "output_layouts": "shard(1)"},
    "layers.*.norm1": "sequence_parallel",
    "layers.*.attn": {"style": "prepare_module_input", "input_layouts": ["shard(1)"],
                      "desired_input_layouts": ["replicate"]},
    "layers.*.attn.q": "colwise",
    "layers.*.attn.k": "colwise",
    "layers.*.attn.v": "colwise",
    "layers.*.attn.o": {"style": "rowwise", "output_layouts": "shard(1)"},
    "layers.*.norm2": "sequence_parallel",
    "layers.*.mlp": {"style": "prepare_module_input", "input_layouts": ["shard(1)"],
                     "desired_input_layouts": ["replicate"]},
    "layers.*.mlp.up": "colwise",
    "layers.*.mlp.down": {"style": "rowwise", "output_layouts": "shard(1)"},
    "norm": "sequence_parallel",
    "head": {"style": "colwise", "input_layouts": "shard(1)", "output_layouts": "replicate"},
}


class Output(NamedTuple):
    """`.loss`, as a Hugging Face model's output has it (and a pytree torch.export can return)."""
    loss: torch.Tensor


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(HIDDEN, HIDDEN, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads: the local heads under tensor parallelism.
        q, k, v = (p(x).view(b, s, -1, HIDDEN // HEADS).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(HIDDEN, FFN, bias=False)
        self.down = nn.Linear(FFN, HIDDEN, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.up(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1, self.norm2 = nn.RMSNorm(HIDDEN), nn.RMSNorm(HIDDEN)
        self.attn, self.mlp = Attention(), Mlp()

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class SpDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.RMSNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)
        self.plain_loss = False  # the export returns the loss tensor (a NamedTuple needs registering to be saved)

    def forward(self, input_ids, labels):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x))
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), labels.view(-1))
        return loss if self.plain_loss else Output(loss)


def build(device: str = "cpu") -> SpDecoder:
    torch.manual_seed(0)
    with torch.device(device):
        return SpDecoder()


def inputs():
    ids = torch.randint(3, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    return {"input_ids": ids, "labels": ids}


def factory():
    model = build("cpu")
    model.plain_loss = True
    return model, (), inputs()
