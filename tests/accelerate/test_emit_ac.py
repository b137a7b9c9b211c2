#!/usr/bin/env python3
"""--emit with activation checkpointing (issue 30), checked against torch 2.13 and Accelerate 1.15.

A plan with "activation_checkpointing" must hand the same checkpointing to the training job:
  1. --emit torch, FSDP1 and FSDP2: the Python runs on the model under the fake backend; the modules
     torch's checkpoint_wrapper ends up around are the plan's checkpointed modules, and the FSDP
     units are still the plan's (apply_fsdp checks them itself); the code passes ruff check.
  2. --emit accelerate: the YAML turns fsdp_activation_checkpointing on, and Accelerate's own code
     (FSDP1: apply_activation_checkpointing after wrapping, as Accelerator.prepare_model calls it;
     FSDP2: fsdp2_apply_ac) checkpoints the plan's modules; fsdp-plan reads the YAML back to the
     same checkpointed modules.
  3. What Accelerate cannot say (one block of two checkpointed) is refused, nothing written.

Usage: test_emit_ac.py FSDP_PLAN_BINARY   (the venv's python: torch 2.13, accelerate)
"""
import functools
import importlib.util
import json
import os
import subprocess
import sys
import types
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_accelerate as ta  # noqa: E402  (its model builders, plugin loader and fake world)

import torch  # noqa: E402
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # noqa: E402
    CheckpointImpl,
    CheckpointWrapper,
    apply_activation_checkpointing,
    checkpoint_wrapper,
)

LAYERS = {"module_classes": ["LlamaDecoderLayer"]}
# FSDP2: Accelerate groups more than the layers (the embedding, [final norm, lm_head]), so its plans
# come from Accelerate's own config, and the refused ones from that plan's policy with other modules
# checkpointed.
with open(os.path.join(HERE, "configs", "fsdp2_llama.yaml")) as f:
    FSDP2_YAML = f.read().replace("fsdp_activation_checkpointing: false", "fsdp_activation_checkpointing: true")
POLICIES = {
    # label: (policy: a JSON object, or an Accelerate config's text; what --emit accelerate does with it)
    "fsdp1_layers": ({**LAYERS, "activation_checkpointing": {"module_classes": ["LlamaDecoderLayer"]}}, "same"),
    "fsdp1_one_layer": ({**LAYERS, "activation_checkpointing": {"modules": ["model.layers.1"]}}, "refused"),
    "fsdp1_mlps": ({**LAYERS, "activation_checkpointing": {"module_classes": ["LlamaMLP"]}}, "refused"),
    "fsdp2_layers": (FSDP2_YAML, "same"),
    "fsdp2_one_layer": ({"modules": ["model.layers.1"]}, "refused"),
    # Checkpointed modules inside the groups: apply_fsdp must find them through the wrappers.
    "fsdp2_mlps": ({"module_classes": ["LlamaMLP"]}, "refused"),
    # Selective (issue 42, item 4): --emit torch writes the policy as context_fn; Accelerate has no key.
    "fsdp1_selective": ({**LAYERS, "activation_checkpointing": {"module_classes": ["LlamaDecoderLayer"],
                                                                 "mode": "selective"}}, "refused"),
    "fsdp2_selective": ({"module_classes": ["LlamaDecoderLayer"], "mode": "selective"}, "refused"),
}


def path_of(name):
    """A module path with FSDP1's and checkpoint_wrapper's inserted names taken out."""
    return ".".join(p for p in name.split(".") if p not in ("_fsdp_wrapped_module", "_checkpoint_wrapped_module"))


def checkpointed(model):
    return sorted(path_of(n) for n, m in model.named_modules() if isinstance(m, CheckpointWrapper))


def without_nulls(obj):
    """A plan's policy object as a policy file says it: unset keys left out."""
    if isinstance(obj, dict):
        return {k: without_nulls(v) for k, v in obj.items() if v is not None}
    return [without_nulls(v) for v in obj] if isinstance(obj, list) else obj


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class EmitCheckpointing(ta.SavedModels):
    MODEL_NAMES = {"llama"}

    def policy_file(self, label):
        policy, _ = POLICIES[label]
        if isinstance(policy, str):  # an Accelerate config, two ranks
            path = os.path.join(self.tmp.name, label + ".yaml")
            with open(path, "w") as f:
                f.write(policy.replace("num_processes: 8", "num_processes: 2"))
            return path
        if label.startswith("fsdp2_"):  # the Accelerate plan's policy, other modules checkpointed
            _, plan = ta.plan_json(self.models["llama"], self.policy_file("fsdp2_layers"))
            policy = without_nulls({k: v for k, v in plan["policy"].items() if k != "auto_wrap"})
            policy["activation_checkpointing"] = POLICIES[label][0]
            policy["mixed_precision"].pop("ignore_classes")  # FSDP1's default, which FSDP2 does not use
        else:
            policy = {**policy, "fsdp": {"world_size": 2}}
        path = os.path.join(self.tmp.name, label + ".json")
        with open(path, "w") as f:
            json.dump(policy, f)
        return path

    def plan(self, label):
        code, plan = ta.plan_json(self.models["llama"], self.policy_file(label))
        self.assertEqual(code, 0, label)
        want = sorted(c["path"] for c in plan["memory"]["activations"]["checkpointed"])
        self.assertTrue(want, f"{label}: the plan checkpoints nothing")
        return plan, want

    def test_emit_torch(self):
        files = []
        for label in sorted(POLICIES):
            with self.subTest(label=label):
                plan, want = self.plan(label)
                out = os.path.join(self.tmp.name, "apply_" + label + ".py")
                r = ta.run_plan(self.models["llama"], "--policy", self.policy_file(label), "--emit", "torch", "-o", out)
                self.assertEqual(r.returncode, 0, f"{label}: {r.stderr}")
                files.append(out)
                module = load(out, "emitted_" + label)
                with ta.fake_world(2):
                    if label.startswith("fsdp2_"):
                        model = ta.build("llama", "meta")
                        module.apply_fsdp(model, device_type="cpu")
                    else:
                        model = module.apply_fsdp(ta.build("llama"), device_id=torch.device("cpu"))
                        self.assertEqual(sorted(p for p in ta.fsdp_units(model) if p), ta.plan_units(plan), label)
                    self.assertEqual(checkpointed(model), want, f"{label}: torch's checkpoint wrappers")
                    # A selective plan's wrappers carry its policy (tests/activations/test_sac.py runs it).
                    context_fns = {m.checkpoint_fn.keywords.get("context_fn") is not None
                                   for m in model.modules() if isinstance(m, CheckpointWrapper)}
                    self.assertEqual(context_fns, {label.endswith("_selective")}, label)
        r = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--output-format",
                            "concise", *files], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_emit_accelerate(self):
        for label in sorted(POLICIES):
            with self.subTest(label=label):
                plan, want = self.plan(label)
                out = os.path.join(self.tmp.name, "emitted_" + label + ".yaml")
                r = ta.run_plan(self.models["llama"], "--policy", self.policy_file(label), "--emit", "accelerate",
                                "-o", out)
                if POLICIES[label][1] == "refused":
                    self.assertEqual(r.returncode, 2, f"{label}: {r.stderr}")
                    self.assertFalse(os.path.exists(out), f"{label}: a refused emit wrote {out}")
                    self.assertIn("Accelerate has no key for it" if label.endswith("_selective") else
                                  "activation checkpointing: Accelerate checkpoints the modules its wrap policy picks",
                                  r.stderr, label)
                    continue
                self.assertEqual(r.returncode, 0, f"{label}: {r.stderr}")
                with open(out) as f:
                    self.assertIn("  fsdp_activation_checkpointing: true\n", f.read(), label)
                self.assertEqual(self.accelerate_checkpoints(out, label.startswith("fsdp2_")), want,
                                 f"{label}: Accelerate's checkpoint wrappers")
                code, again = ta.plan_json(self.models["llama"], out)
                self.assertEqual(code, 0, label)
                self.assertEqual(sorted(c["path"] for c in again["memory"]["activations"]["checkpointed"]), want,
                                 f"{label}: round trip")

    def accelerate_checkpoints(self, config, fsdp2):
        """The modules Accelerate's own code checkpoints with this config, on the live model."""
        plugin, _ = ta.accelerate_plugin(config)
        self.assertTrue(plugin.activation_checkpointing)
        model = ta.build("llama")
        if fsdp2:
            from accelerate.utils.fsdp_utils import fsdp2_apply_ac

            plugin.set_auto_wrap_policy(model)
            accelerator = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin))
            return checkpointed(fsdp2_apply_ac(accelerator, model))
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        plugin.set_auto_wrap_policy(ta.build("llama", "meta"))
        with ta.fake_world(1):
            wrapped = FSDP(model, auto_wrap_policy=plugin.auto_wrap_policy, use_orig_params=plugin.use_orig_params,
                           device_id=torch.device("cpu"))
            # accelerator.py, prepare_model: after wrapping, with the plugin's wrap policy.
            apply_activation_checkpointing(
                wrapped,
                checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
                auto_wrap_policy=plugin.auto_wrap_policy,
            )
            return checkpointed(wrapped)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        ta.BINARY = sys.argv.pop(1)
    unittest.main(verbosity=2)
