#!/usr/bin/env python3
"""FSDP1 MixedPrecision(keep_low_precision_grads=True) against real FSDP1 (torch 2.13, fake process group, CPU).

torch 2.13: sharded strategies still cast the reduce-scattered gradient to the parameter dtype
(_runtime_utils._accumulate_sharded_grad) and hold it so through backward; the post-backward
callback (FlatParamHandle.prepare_gradient_for_optim) then casts it to param_dtype for the
optimizer. NO_SHARD skips the cast (_reduce_grad_no_shard) and keeps the gradient in the
reduce dtype. The plan's memory.per_rank.grads_bytes must be what the parameters' .grad hold
after backward, exactly, and its peak must agree with MemTracker's peak of every category but
Activation within test_fsdp2.TOLERANCE over two steps (test_suggest_fsdp's FSDP1 comparison).
torch.optim.SGD is used, with and without momentum (its momentum buffer, a clone of the first
gradient, is then bf16 too): Adam/AdamW raise on fp32 parameters with bf16 gradients
("expected dtype float for `end` but got dtype c10::BFloat16"); the plan says so in a note.

Usage: test_low_precision_grads.py FSDP_PLAN_BINARY   (the venv's python: torch 2.13)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, ShardingStrategy  # noqa: E402
from torch.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: E402

import test_fsdp2  # noqa: E402
import test_torch2  # noqa: E402

BINARY = None
Tracker = test_fsdp2.non_activation_tracker(MemTracker, ["Parameter", "Buffer", "Gradient", "Temp", "Optstate", "Other"])
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, None: None}


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(256, 256)

    def forward(self, x):
        return torch.relu(self.fc(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(4)])
        self.head = nn.Linear(256, 10)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


class KeepLowPrecisionGrads(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.manual_seed(0)
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model_file = os.path.join(cls.tmp.name, "net.pt")
        torch.jit.save(torch.jit.script(Net()), cls.model_file)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def plan(self, mp, world, strategy, optimizer):
        policy = os.path.join(self.tmp.name, "policy.json")
        with open(policy, "w") as f:
            json.dump({"module_classes": ["Block"], "mixed_precision": mp,
                       "fsdp": {"sharding_strategy": strategy, "optimizer": optimizer}}, f)
        r = subprocess.run([BINARY, self.model_file, "--policy", policy, "-f", "json", "--world-size", str(world)],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def real(self, mp, world, strategy, optimizer):
        """Gradient bytes after backward, optimizer state bytes after the step, and MemTracker's
        non-activation peak of the second of two steps."""
        test_torch2.init_fake(world)
        torch.manual_seed(0)
        fsdp = FSDP(Net(), device_id=torch.device("cpu"), auto_wrap_policy=ModuleWrapPolicy({Block}),
                    sharding_strategy=ShardingStrategy[strategy],
                    mixed_precision=MixedPrecision(param_dtype=DTYPES[mp.get("param_dtype")],
                                                   reduce_dtype=DTYPES[mp.get("reduce_dtype")],
                                                   keep_low_precision_grads=mp.get("keep_low_precision_grads", False)))
        optim = torch.optim.SGD(fsdp.parameters(), lr=1e-3, foreach=False,
                                momentum=0.9 if optimizer == "sgd-momentum" else 0)
        tracker = Tracker()
        tracker.track_external(fsdp, optim)
        with tracker:
            for it in range(2):
                if it == 1:
                    tracker.reset_mod_stats()
                    tracker.non_act_peak = 0
                fsdp(torch.ones(4, 256)).float().sum().backward()
                grads = {p.grad.dtype for p in fsdp.parameters()}
                grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in fsdp.parameters())
                optim.step()
                optim.zero_grad()
        state_bytes = sum(t.numel() * t.element_size() for st in optim.state.values() for t in st.values()
                          if torch.is_tensor(t))
        return grad_bytes, grads, state_bytes, tracker.non_act_peak

    def check(self, mp, world, strategy, want_dtype, optimizer="sgd"):
        plan = self.plan(mp, world, strategy, optimizer)
        grad_bytes, dtypes, state_bytes, peak = self.real(mp, world, strategy, optimizer)
        self.assertEqual(dtypes, {want_dtype})
        per_rank = plan["memory"]["per_rank"]
        self.assertEqual(per_rank["grads_bytes"], grad_bytes)
        self.assertEqual(per_rank["optimizer_bytes"], state_bytes)
        off = (per_rank["peak_bytes"] - peak) / peak
        print(f"  {strategy} world {world} {mp}: grads {grad_bytes} B ({want_dtype}), "
              f"{optimizer} state {state_bytes} B, peak MemTracker {peak}, plan {per_rank['peak_bytes']} ({off:+.1%})")
        self.assertLess(abs(off), test_fsdp2.TOLERANCE)
        return per_rank

    def test_full_shard_keeps_param_dtype_after_backward(self):
        mp = {"param_dtype": "bfloat16", "reduce_dtype": "float32"}
        full = self.check(mp, 4, "FULL_SHARD", torch.float32)
        low = self.check(dict(mp, keep_low_precision_grads=True), 4, "FULL_SHARD", torch.bfloat16)
        self.assertEqual(low["grads_bytes"] * 2, full["grads_bytes"])

    def test_momentum_buffer_takes_the_gradient_dtype(self):
        # SGD's momentum buffer is a clone of the first gradient: bf16 when the gradient is kept low.
        mp = {"param_dtype": "bfloat16", "reduce_dtype": "float32"}
        full = self.check(mp, 4, "FULL_SHARD", torch.float32, "sgd-momentum")
        low = self.check(dict(mp, keep_low_precision_grads=True), 4, "FULL_SHARD", torch.bfloat16, "sgd-momentum")
        self.assertEqual(low["optimizer_bytes"] * 2, full["optimizer_bytes"])

    def test_no_shard_keeps_reduce_dtype(self):
        # reduce_dtype float32: the all-reduced gradient stays float32 despite the flag;
        # reduce_dtype unset reduces (and keeps) in param_dtype.
        self.check({"param_dtype": "bfloat16", "reduce_dtype": "float32", "keep_low_precision_grads": True},
                   2, "NO_SHARD", torch.float32)
        self.check({"param_dtype": "bfloat16", "keep_low_precision_grads": True}, 2, "NO_SHARD", torch.bfloat16)


if __name__ == "__main__":
    BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
