#!/usr/bin/env python3
"""Trainable parameters the exported forward never reads (issue 40, item 4), against real FSDP2
(torch 2.13, fake process group, CPU).

DINOv2's mask_token is read only when bool_masked_pos is given. Autograd gives an unread parameter
no gradient, and FSDP2 acts on that: FSDPParamGroup.post_backward passes foreach_reduce only the
parameters whose unsharded gradient is set, the sharded .grad stays None, and AdamW keeps no state
for a parameter without a gradient. The plan must say the same: its memory.per_rank.grads_bytes
and optimizer_bytes equal what the parameters' .grad and AdamW's state hold after a step, and its
reduce-scatter bytes what dist.reduce_scatter_single was given; the fsdp2_unused_param warning
names the parameter. With the mask given at export the parameter is read, and it counts again.

Usage: test_unused_params.py FSDP_PLAN_BINARY   (the venv's python: torch 2.13)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from fsdp_plan.export import export_module  # noqa: E402

BINARY = None
WORLD = 2


class Masked(nn.Module):
    """A mask token in the root group (DINOv2's embeddings.mask_token), two Linear groups."""

    def __init__(self):
        super().__init__()
        self.mask_token = nn.Parameter(torch.zeros(1, 64))
        self.a = nn.Linear(64, 48)
        self.b = nn.Linear(48, 64)

    def forward(self, x, mask=None):
        if mask is not None:
            x = torch.where(mask.unsqueeze(-1), self.mask_token, x)
        return self.b(self.a(x)).sum()


def real_step(inputs):
    """One FSDP2 step as the plan's policy builds it: what the gradients, AdamW's state and the
    reduce-scatters hold on rank 0."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
    torch.manual_seed(0)
    model = Masked()
    fully_shard(model.a)
    fully_shard(model.b)
    fully_shard(model)
    given = []
    # _fsdp_collectives.py: DefaultReduceScatter calls dist.reduce_scatter_single(output=, input=, ...).
    original = dist.reduce_scatter_single

    def recording(*args, **kwargs):
        given.append(kwargs["input"].numel() * kwargs["input"].element_size())
        return original(*args, **kwargs)

    dist.reduce_scatter_single = recording
    try:
        model(*inputs).backward()
    finally:
        dist.reduce_scatter_single = original
    grads = {n: p.grad.to_local().nbytes for n, p in model.named_parameters() if p.grad is not None}
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    optim.step()
    state = sum(t.to_local().nbytes if hasattr(t, "to_local") else t.nbytes
                for s in optim.state.values() for t in s.values() if torch.is_tensor(t))
    return {"grads": grads, "optimizer_bytes": state, "reduce_scatter_bytes": sum(given)}


class UnusedParams(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.policy = os.path.join(cls.tmp.name, "policy.json")
        with open(cls.policy, "w") as f:
            json.dump({"module_classes": ["Linear"], "fsdp": {"version": 2, "world_size": WORLD,
                                                               "optimizer": "adamw"}}, f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()
        if dist.is_initialized():
            dist.destroy_process_group()

    def plan(self, inputs, kwargs):
        path = os.path.join(self.tmp.name, f"masked_{len(kwargs)}.pt2")
        export_module(Masked(), inputs, kwargs, path)
        r = subprocess.run([BINARY, path, "--policy", self.policy, "-f", "json"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def check(self, plan, real):
        per_rank = plan["memory"]["per_rank"]
        self.assertEqual(per_rank["grads_bytes"], sum(real["grads"].values()), real["grads"])
        self.assertEqual(per_rank["optimizer_bytes"], real["optimizer_bytes"])
        self.assertEqual(plan["comm"]["per_step"]["reduce_scatter"]["backward"], real["reduce_scatter_bytes"])

    def test_an_unread_parameter_gets_no_gradient_state_or_reduce_scatter(self):
        x = torch.randn(4, 64)
        plan = self.plan((x,), {})
        real = real_step((x,))
        self.assertNotIn("mask_token", real["grads"])  # what the plan must follow
        self.check(plan, real)
        unused = [w for w in plan["warnings"] if w["kind"] == "fsdp2_unused_param"]
        self.assertEqual([(w["params"], w["severity"]) for w in unused], [(["mask_token"], "warning")])

    def test_read_with_the_mask_it_counts(self):
        x, mask = torch.randn(4, 64), torch.tensor([True, False, True, False])
        plan = self.plan((x,), {"mask": mask})
        real = real_step((x, mask))
        self.assertIn("mask_token", real["grads"])
        self.check(plan, real)
        self.assertNotIn("fsdp2_unused_param", [w["kind"] for w in plan["warnings"]])


if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main(verbosity=2)
