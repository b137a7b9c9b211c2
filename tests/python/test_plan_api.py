#!/usr/bin/env python3
"""fsdp_plan.plan() (issue 41, item 8): class objects are accepted anywhere in a policy dict
(activation_checkpointing's module_classes raised TypeError: Object of type type is not JSON
serializable), and without example_inputs it warns that the peak has no activations. The
exporter refuses a config.json with quantization_config (item 4) instead of planning it unquantized.

Usage: test_plan_api.py FSDP_PLAN_BINARY   (the venv's python: torch)
"""
import os
import sys
import unittest
import warnings

import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import fsdp_plan  # noqa: E402

BINARY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "app", "fsdp-plan")


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class PlanApi(unittest.TestCase):
    def test_class_objects_under_activation_checkpointing(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = fsdp_plan.plan(Net(), {"module_classes": [Block],
                                          "activation_checkpointing": {"module_classes": [Block]}},
                                  binary=BINARY)
        self.assertEqual(plan["policy"]["activation_checkpointing"]["module_classes"], [f"{__name__}.Block"])

    def test_a_value_that_is_no_json_is_an_fsdp_plan_error(self):
        with self.assertRaises(fsdp_plan.FsdpPlanError):
            fsdp_plan.plan(Net(), {"module_classes": [Block], "fsdp": {"world_size": object()}}, binary=BINARY)

    def test_without_example_inputs_it_warns_the_peak_has_no_activations(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plan = fsdp_plan.plan(Net(), [Block], binary=BINARY)
        self.assertTrue(any("no activations" in str(w.message) for w in caught), [str(w.message) for w in caught])
        self.assertEqual(plan["memory"]["activations"]["source"], "unknown")


class Stack(nn.Module):
    """A Sequential whose own forward never runs: its parent iterates over it."""
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class ListedClasses(unittest.TestCase):
    """Issue 40, item 3: the exporter's module_classes name the modules torch.export
    records no class for (their forward never ran). FSDP2's container refusal is then
    exact from a .pt2: a ModuleList is refused (an error, not a warning that its class
    is inferred), and a Sequential, which fully_shard accepts, is not."""
    import torch
    SIZE = {"min_num_params": 300, "fsdp": {"version": 2}}

    def plan(self, module):
        return fsdp_plan.plan(module, self.SIZE, example_inputs=(self.torch.randn(2, 16),), binary=BINARY)

    def codes(self, plan, severity):
        return [(w["kind"], w.get("modules")) for w in plan["warnings"] if w["severity"] == severity]

    def test_a_module_list_is_refused(self):
        plan = self.plan(Net())
        self.assertIn(("fsdp2_container", ["blocks"]), self.codes(plan, "error"))
        self.assertNotIn("inferred", " ".join(w["message"] for w in plan["warnings"]))
        self.assertNotIn("fsdp2_not_called", [c for c, _ in self.codes(plan, "warning")])  # said by the refusal

    def test_a_sequential_is_no_container_but_never_called(self):
        plan = self.plan(Stack())
        self.assertNotIn("fsdp2_container", [c for c, _ in self.codes(plan, "error") + self.codes(plan, "warning")])
        self.assertIn(("fsdp2_not_called", ["blocks"]), self.codes(plan, "warning"))


class Export(unittest.TestCase):
    def test_quantization_config_is_refused_not_planned_unquantized(self):
        # Issue 41, item 4: QLoRA's config.json was planned as bf16, weights ~4x too large.
        import json
        import tempfile

        from fsdp_plan.export import ExportError, load_config
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "config.json")
            with open(path, "w") as f:
                json.dump({"model_type": "llama", "quantization_config": {"quant_method": "bitsandbytes",
                                                                          "load_in_4bit": True}}, f)
            with self.assertRaisesRegex(ExportError, "quantization_config .*bitsandbytes.* is not modelled"):
                load_config(path)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
