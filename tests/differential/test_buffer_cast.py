#!/usr/bin/env python3
"""Buffers under mixed precision against real FSDP1 (torch 2.13, fake process group, CPU).

FSDP1 casts only floating-point buffers to buffer_dtype
(_runtime_utils._cast_buffers_to_dtype_and_device): an int64 buffer such as
swin's relative_position_index stays int64. The plan's memory.per_rank.buffers_bytes
must be what the buffers hold after FSDP's first forward.

Usage: test_buffer_cast.py FSDP_PLAN_BINARY   (the venv's python: torch 2.13)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision
from torch.distributed.fsdp.wrap import ModuleWrapPolicy
from torch.testing._internal.distributed.fake_pg import FakeStore

BINARY = None


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("index", torch.arange(300, dtype=torch.int64))  # like relative_position_index
        self.register_buffer("scale", torch.ones(100))

    def forward(self, x):
        return self.fc(x) * self.scale[: x.shape[-1]].to(x.dtype) + self.index[0].to(x.dtype)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.register_buffer("steps", torch.zeros(50, dtype=torch.int32))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class BufferCast(unittest.TestCase):
    def test_only_floating_buffers_are_cast(self):
        torch.manual_seed(0)
        model = Net()
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "net.pt")
            torch.jit.save(torch.jit.script(model), path)
            policy = os.path.join(tmp, "policy.json")
            with open(policy, "w") as f:
                json.dump({"module_classes": ["Block"],
                           "mixed_precision": {"param_dtype": "bfloat16", "buffer_dtype": "bfloat16"}}, f)
            r = subprocess.run([BINARY, path, "--policy", policy, "-f", "json", "--world-size", "2"],
                               capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        planned = json.loads(r.stdout)["memory"]["per_rank"]["buffers_bytes"]

        dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
        mp = MixedPrecision(param_dtype=torch.bfloat16, buffer_dtype=torch.bfloat16)
        wrapped = FSDP(model, device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({Block}),
                       mixed_precision=mp)
        wrapped(torch.ones(2, 8))
        dtypes = {n.replace("_fsdp_wrapped_module.", ""): b.dtype for n, b in wrapped.named_buffers()}
        self.assertEqual(dtypes["blocks.0.index"], torch.int64)      # not cast
        self.assertEqual(dtypes["steps"], torch.int32)               # not cast
        self.assertEqual(dtypes["blocks.0.scale"], torch.bfloat16)   # cast
        real = sum(b.numel() * b.element_size() for b in wrapped.buffers())
        self.assertEqual(planned, real)  # 2*(300*8 + 100*2) + 50*4 = 5400; casting all would give 1700


if __name__ == "__main__":
    BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
