#!/usr/bin/env python3
"""Accelerate's fp32 master weights (issue 41, item 1), against Accelerate 1.15 itself.

With mixed_precision bf16 (any mode but 'no'), Accelerate casts trainable parameters that are
not float32 to float32 before FSDP shards them (FSDP2: fsdp2_prepare_model, "Upcast to fp32 master
weights"; FSDP1: Accelerator.prepare_model casts each FlatParameter that requires grad). For a
bf16 and an fp32 TorchScript export of a small Llama, FSDP1 and FSDP2, this runs Accelerate's own
Accelerator.prepare (fake process group, one rank, CPU) in the environment `accelerate launch`
sets, and checks that the plan's sharded parameter bytes (--world-size 1) and its all-gather
dtypes are what Accelerate's prepared model holds and gathers in.

Usage: test_master_weights.py FSDP_PLAN_BINARY   (the venv's python: torch, accelerate, transformers)
"""
import json
import os
import sys
import tempfile
import unittest
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_accelerate as T  # noqa: E402  (its helpers: launch environment, fake world, models)

CONFIGS = ["fsdp1_llama_layers.yaml", "fsdp2_llama.yaml"]


def save_llama(path, dtype):
    torch.manual_seed(0)
    model = T.build("llama").to(dtype)
    model.config.use_cache = False
    forward = model.forward
    model.forward = lambda ids: forward(input_ids=ids).logits
    torch.jit.trace(model, (torch.randint(0, 100, (1, 8)),), strict=False, check_trace=False).save(path)


def accelerate_prepared(config_path, dtype):
    """(sharded parameter bytes, all-gather dtypes) of the Llama in `dtype` after Accelerate's own
    Accelerator.prepare, on one rank of the fake backend."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, patch_environment

    _, env = T.accelerate_launch_env(config_path)
    env.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", ACCELERATE_TORCH_DEVICE="cpu")
    backend = mock.patch.object(PartialState, "_prepare_backend",
                                lambda *a, **k: ("fake", DistributedType.MULTI_GPU))
    model = T.build("llama").to(dtype)
    with T.fake_world(1), backend, patch_environment(**env):
        try:
            accelerator = Accelerator()
            if accelerator.is_fsdp2:  # FSDP2 prepares a model only with its optimizer
                model, _ = accelerator.prepare(model, torch.optim.AdamW(model.parameters()))
                return fsdp2_state(model)
            return fsdp1_state(accelerator.prepare_model(model))
        finally:
            AcceleratorState._reset_state(True)
            PartialState._reset_state()


def fsdp1_state(model):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    nbytes, gathers = 0, set()
    for module in FSDP.fsdp_modules(model):
        if module._has_params:
            flat = module._flat_param
            nbytes += flat.numel() * flat.element_size()
            gathers.add(str(module._handle._fwd_bwd_param_dtype).replace("torch.", ""))
    return nbytes, gathers


def fsdp2_state(model):
    nbytes, gathers = 0, set()
    for p in model.parameters():
        local = p.to_local()
        nbytes += local.numel() * local.element_size()
    for m in model.modules():
        state = getattr(m, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state else None
        if group is not None:
            # FSDPParam.init_dtype_attrs (at lazy init): param_dtype where it differs from the original.
            want = group.mp_policy.param_dtype
            for fp in group.fsdp_params:
                gathers.add(str(want if want is not None else fp.orig_dtype).replace("torch.", ""))
    return nbytes, gathers


def plan_json(model_file, config, *flags):
    r = T.run_plan(model_file, "--policy", config, "--format", "json", "--collectives", *flags)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


class MasterWeights(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.models = {}
        for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
            cls.models[name] = os.path.join(cls.tmp.name, f"llama_{name}.pt")
            save_llama(cls.models[name], dtype)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_plan_holds_what_accelerate_holds(self):
        for config in CONFIGS:
            for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
                with self.subTest(config=config, export=name):
                    path = os.path.join(T.CONFIGS, config)
                    want_bytes, want_gathers = accelerate_prepared(path, dtype)
                    plan = plan_json(self.models[name], path, "--world-size", "1")
                    self.assertEqual(plan["memory"]["per_rank"]["params_bytes"], want_bytes)
                    # The gathers at the config's world size (one rank gathers nothing).
                    gathers = {c["dtype"] for c in plan_json(self.models[name], path)["comm"]["collectives"]
                               if c["kind"] == "all_gather"}
                    self.assertEqual(gathers, want_gathers)
                    notes = [w for w in plan["warnings"] if w["kind"] == "fp32_master_weights"]
                    self.assertEqual(len(notes), 1 if name == "bf16" else 0, plan["warnings"])


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
