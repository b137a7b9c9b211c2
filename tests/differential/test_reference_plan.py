#!/usr/bin/python3
"""Checks reference_plan.py (the oracle) on hand-built models whose plans can
be worked out by hand from wrap.py and the seed. No fsdp-plan binary needed.

    /usr/bin/python3 tests/differential/test_reference_plan.py
"""
import os
import sys
import unittest

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_plan as rp  # noqa: E402


def summary(plan):
    """[(path, [param names], [buffer names], mixed_precision)]"""
    return [(u["path"], [p["name"] for p in u["params"]], [b["name"] for b in u["buffers"]],
             u["mixed_precision"]) for u in plan["units"]]


def paths(plan):
    return [u["path"] for u in plan["units"]]


class TiedPair(nn.Module):
    """a and b share one weight; b has its own bias."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(10, 10)
        self.b = nn.Linear(10, 10)
        self.b.weight = self.a.weight


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
        self.head = nn.Linear(4, 20, bias=False)
        self.head.weight = self.emb.weight


class RootOwnsTied(nn.Module):
    """The root holds a parameter directly that a wrapped child also holds."""

    def __init__(self):
        super().__init__()
        self.child = nn.Linear(3, 3)
        self.scale = self.child.weight  # same Parameter, registered on the root


class Enc(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2)   # 4*64 + 4*8 = 288 params
        self.ff = nn.Linear(8, 8)                 # 72 params


class ListModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(10, 10) for _ in range(3)])  # 110 each
        self.bn = nn.BatchNorm1d(10)


def recording(policy_fn, log):
    # torch 1.13 passes `unwrapped_params`, 2.x `nonwrapped_numel`.
    def rec(module, recurse, **numel):
        log.append((type(module).__name__, recurse, next(iter(numel.values()))))
        return policy_fn(module=module, recurse=recurse, **numel)
    return rec


class ReferencePlanTest(unittest.TestCase):
    def test_empty_policy_is_root_only(self):
        m = TiedLM()
        plan = rp.reference_plan(m, {})
        self.assertEqual(summary(plan), [
            ("", ["emb.weight", "body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias"], [], None)])

    def test_tied_weight_split_across_units(self):
        m = TiedPair()
        # FSDP1 builds a, then b, then the root. Without use_orig_params each
        # unit flattens its own copy; with it the first unit built holds it.
        plan = rp.reference_plan(m, {"module_classes": ["Linear"]})
        self.assertEqual(summary(plan), [
            ("", [], [], None),
            ("a", ["a.weight", "a.bias"], [], None),
            ("b", ["b.weight", "b.bias"], [], None),
        ])
        plan = rp.reference_plan(m, {"module_classes": ["Linear"]}, use_orig_params=True)
        self.assertEqual(summary(plan)[1:], [("a", ["a.weight", "a.bias"], [], None), ("b", ["b.bias"], [], None)])

    def test_tied_head_to_root_then_embedding_unit(self):
        m = TiedLM()
        # Only Linear wrapped: head (built before the root) and the root each flatten a copy.
        plan = rp.reference_plan(m, {"module_classes": ["Linear"]})
        self.assertEqual(summary(plan), [
            ("", ["emb.weight"], [], None),
            ("body.0", ["body.0.weight", "body.0.bias"], [], None),
            ("body.2", ["body.2.weight", "body.2.bias"], [], None),
            ("head", ["head.weight"], [], None),
        ])
        # With use_orig_params, head is built first and holds it; the root has none left.
        plan = rp.reference_plan(m, {"module_classes": ["Linear"]}, use_orig_params=True)
        self.assertEqual(summary(plan)[0], ("", [], [], None))
        self.assertEqual(summary(plan)[-1], ("head", ["head.weight"], [], None))
        # Embedding wrapped too: emb is built before head.
        plan = rp.reference_plan(m, {"module_classes": ["Embedding", "Linear"]}, use_orig_params=True)
        self.assertEqual(summary(plan)[1], ("emb", ["emb.weight"], [], None))
        self.assertEqual(summary(plan)[-1], ("head", [], [], None))

    def test_root_direct_param_precedes_children(self):
        m = RootOwnsTied()
        plan = rp.reference_plan(m, {"module_classes": ["Linear"]})
        # The child is built first and flattens its own copy; the root still lists its own first.
        self.assertEqual(summary(plan), [("", ["scale"], [], None), ("child", ["child.weight", "child.bias"], [], None)])
        plan = rp.reference_plan(m, {"module_classes": ["Linear"]}, use_orig_params=True)
        self.assertEqual(summary(plan), [("", [], [], None), ("child", ["child.weight", "child.bias"], [], None)])

    def test_negative_remainder_with_tied_weights(self):
        m = TiedPair()
        # n(root) = 100 + 10 + 10 = 120 (tied weight once); a: 110, b: 110.
        log = []
        pol = rp.build_policy({"min_num_params": 110}, m)
        ign_m, ign_p = rp.ignored_sets({}, m)
        rp.get_fully_sharded_module_to_states(m, recording(pol, log), ign_m, ign_p)
        self.assertIn(("TiedPair", True, 120), log)
        self.assertIn(("TiedPair", False, 120 - 220), log)   # negative remainder
        plan = rp.reference_plan(m, {"min_num_params": 110})
        self.assertEqual(summary(plan), [
            ("", [], [], None), ("a", ["a.weight", "a.bias"], [], None), ("b", ["b.weight", "b.bias"], [], None)])

    def test_force_leaf_is_not_descended_nor_wrapped(self):
        m = Enc()
        # 360 >= 50: root recurses; attn (288) is a force leaf -> returns 0 and
        # is NOT wrapped itself; ff (72) wrapped; root remainder 288 -> wrapped.
        plan = rp.reference_plan(m, {"min_num_params": 50})
        self.assertEqual(paths(plan), ["", "ff"])
        self.assertEqual([p["name"] for p in plan["units"][0]["params"]],
                         ["attn.in_proj_weight", "attn.in_proj_bias",
                          "attn.out_proj.weight", "attn.out_proj.bias"])
        # Without force leaves, attn's out_proj (72) and then attn's remainder (216) are wrapped.
        plan = rp.reference_plan(m, {"min_num_params": 50, "force_leaf_modules": []})
        self.assertEqual(paths(plan), ["", "attn", "attn.out_proj", "ff"])
        self.assertEqual(summary(plan)[0], ("", [], [], None))

    def test_module_classes_override_force_leaf(self):
        m = Enc()
        # _or_policy: the class policy always recurses, so the force leaf no longer stops descent.
        plan = rp.reference_plan(m, {"min_num_params": 10 ** 9, "module_classes": ["torch.nn.Linear"]})
        self.assertEqual(paths(plan), ["", "attn.out_proj", "ff"])  # NonDynamicallyQuantizableLinear is a Linear

    def test_exclude_wrap_modules(self):
        m = ListModel()  # layers: 330, bn: 20
        plan = rp.reference_plan(m, {"min_num_params": 200})
        self.assertEqual(paths(plan), [""])  # ModuleList excluded; children too small
        plan = rp.reference_plan(m, {"min_num_params": 200, "exclude_wrap_modules": []})
        self.assertEqual(paths(plan), ["", "layers"])
        self.assertEqual(summary(plan)[0], ("", ["bn.weight", "bn.bias"],
                                            ["bn.running_mean", "bn.running_var", "bn.num_batches_tracked"], None))

    def test_class_name_resolution(self):
        m = ListModel()
        names = lambda spec: {c.__name__ for c in rp.resolve_classes(spec, m)}  # noqa: E731
        self.assertIn("Linear", names(["torch.nn.Linear"]))
        self.assertIn("_BatchNorm", names(["torch.nn.modules.batchnorm._BatchNorm"]))
        self.assertEqual(names(["nn.Linear"]), set())          # prefix must be the module path's start
        self.assertEqual(names(["torch.nn.linear.Linear"]), set())
        self.assertEqual(names(["NoSuchClass"]), set())
        plan = rp.reference_plan(m, {"module_classes": ["_BatchNorm"]})
        self.assertEqual(paths(plan), ["", "bn"])

    def test_mixed_precision(self):
        m = ListModel()
        # MP alone: no auto-wrap policy, root only.
        plan = rp.reference_plan(m, {"mixed_precision": {"param_dtype": "bfloat16"}})
        self.assertEqual(paths(plan), [""])
        self.assertEqual(plan["units"][0]["mixed_precision"], True)
        # With another policy: every _BatchNorm is its own unit with MP off.
        plan = rp.reference_plan(m, {"min_num_params": 10 ** 9, "mixed_precision": {}})
        self.assertEqual([(u["path"], u["mixed_precision"]) for u in plan["units"]],
                         [("", True), ("bn", False)])
        plan = rp.reference_plan(m, {"module_classes": ["Linear"],
                                     "mixed_precision": {"ignore_classes": ["Linear"]}})
        self.assertEqual([(u["path"], u["mixed_precision"]) for u in plan["units"]],
                         [("", True), ("layers.0", False), ("layers.1", False), ("layers.2", False)])

    def test_ignored_modules_and_params(self):
        m = ListModel()
        plan = rp.reference_plan(m, {"module_classes": ["Linear"], "ignored_modules": ["layers.1", "bn"]})
        # Ignored modules are not wrapped; their params are owned by nobody;
        # their buffers are still grouped (the seed does not filter buffers).
        self.assertEqual(summary(plan), [
            ("", [], ["bn.running_mean", "bn.running_var", "bn.num_batches_tracked"], None),
            ("layers.0", ["layers.0.weight", "layers.0.bias"], [], None),
            ("layers.2", ["layers.2.weight", "layers.2.bias"], [], None),
        ])
        plan = rp.reference_plan(m, {"module_classes": ["Linear"], "ignored_params": ["*.bias"]})
        self.assertEqual(summary(plan)[0][1], ["bn.weight"])
        self.assertEqual(summary(plan)[1][1], ["layers.0.weight"])
        # `*` crosses dots; globs are anchored at both ends.
        plan = rp.reference_plan(m, {"ignored_modules": ["lay*"]})
        self.assertEqual(summary(plan)[0][1], ["bn.weight", "bn.bias"])
        plan = rp.reference_plan(m, {"ignored_params": ["layers"]})
        self.assertEqual(len(summary(plan)[0][1]), 8)

    def test_ignored_params_reduce_counts(self):
        m = ListModel()
        # Ignoring weights leaves 10 per Linear: none reaches 50, so nothing but the root.
        plan = rp.reference_plan(m, {"min_num_params": 50, "ignored_params": ["layers.*.weight"],
                                     "exclude_wrap_modules": []})
        self.assertEqual(paths(plan), [""])
        plan = rp.reference_plan(m, {"min_num_params": 50, "exclude_wrap_modules": []})
        self.assertEqual(paths(plan), ["", "layers.0", "layers.1", "layers.2"])

    def test_ignored_tied_param_via_module(self):
        m = TiedLM()
        # Ignoring head ignores its (tied) weight, so emb.weight is owned by nobody.
        plan = rp.reference_plan(m, {"ignored_modules": ["head"]})
        self.assertEqual(summary(plan)[0][1], ["body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias"])

    def test_tied_trunk_negative_remainder_below_root(self):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sample_models"))
        import models
        m = models.build("tied_trunk")
        log = []
        pol = rp.build_policy({"min_num_params": 2000}, m)
        rp.get_fully_sharded_module_to_states(m, recording(pol, log), set(), set())
        self.assertIn(("Trunk", True, 10550), log)
        self.assertIn(("Trunk", False, -2000), log)
        plan = rp.reference_plan(m, {"min_num_params": 2000})
        self.assertEqual(summary(plan), [
            ("", ["proj", "trunk.scale", "norm.weight", "norm.bias", "out.weight", "out.bias"], ["table", "steps"], None),
            ("trunk.enc", ["trunk.enc.weight"], [], None),
            ("trunk.dec", ["trunk.dec.weight"], [], None),  # its own copy of enc's weight
            ("trunk.extra", ["trunk.extra.weight", "trunk.extra.bias"], [], None),  # and the root one of proj
        ])
        self.assertEqual([p["dtype"] for p in plan["units"][0]["params"]][-2:], ["float64", "float64"])
        self.assertEqual([(b["shape"], b["dtype"]) for b in plan["units"][0]["buffers"]],
                         [([4, 4], "bfloat16"), ([], "int64")])

    def test_sample_models_script_to_same_tree(self):
        import tempfile
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sample_models"))
        import models
        for name in models.SAMPLE_MODELS:
            eager = models.build(name)
            with tempfile.TemporaryDirectory() as d:
                p = os.path.join(d, name + ".pt")
                torch.jit.save(torch.jit.script(eager), p)
                loaded = torch.jit.load(p)
            self.assertEqual([n for n, _ in eager.named_modules()], [n for n, _ in loaded.named_modules()], name)
            self.assertEqual([(n, tuple(t.shape)) for n, t in eager.named_parameters()],
                             [(n, tuple(t.shape)) for n, t in loaded.named_parameters()], name)
            self.assertEqual([(n, tuple(t.shape)) for n, t in eager.named_buffers()],
                             [(n, tuple(t.shape)) for n, t in loaded.named_buffers()], name)


class CompareTest(unittest.TestCase):
    """test_differential.compare_plans reports each kind of difference."""

    def setUp(self):
        import copy
        import test_differential as td
        self.td = td
        self.expected = rp.reference_plan(TiedLM(), {"module_classes": ["Linear"], "mixed_precision": {}})
        self.copy = lambda: copy.deepcopy(self.expected)

    def diff(self, actual):
        return self.td.compare_plans(self.expected, actual)

    def test_equal(self):
        self.assertEqual(self.diff(self.copy()), [])

    def test_moved_param(self):
        a = self.copy()
        a["units"][0]["params"].append(a["units"][1]["params"].pop(0))
        d = self.diff(a)
        self.assertEqual(d[0], "unit 1 'body.0': param 'body.0.weight' expected in this unit, plan has it in unit 0 ''")

    def test_missing_extra_and_reordered_units(self):
        a = self.copy()
        a["units"].pop(1)
        self.assertIn("units missing from the plan: ['body.0']", self.diff(a))
        a = self.copy()
        a["units"].append(dict(a["units"][-1], path="extra", params=[], buffers=[]))
        self.assertIn("units in the plan that PyTorch does not make: ['extra']", self.diff(a))
        a = self.copy()
        a["units"][1], a["units"][2] = a["units"][2], a["units"][1]
        self.assertIn("unit order differs at unit 1: expected 'body.0', plan has 'body.2'", self.diff(a))

    def test_order_shape_dtype_mp_class(self):
        a = self.copy()
        a["units"][1]["params"].reverse()
        self.assertIn("order differs", self.diff(a)[0])
        a = self.copy()
        a["units"][1]["params"][0]["dtype"] = "bfloat16"
        self.assertIn("param expected 'body.0.weight' [4, 4] float32, plan has 'body.0.weight' [4, 4] bfloat16",
                      self.diff(a)[0])
        a = self.copy()
        a["units"][2]["mixed_precision"] = False
        self.assertEqual(self.diff(a), ["unit 2 'body.2': mixed_precision expected true, plan has false"])
        a = self.copy()
        a["units"][0]["class"] = "Other"
        self.assertEqual(self.diff(a), ["unit 0 '': class expected 'TiedLM', plan has 'Other'"])

    def test_unowned_and_foreign_tensor(self):
        a = self.copy()
        a["units"][0]["params"] = []
        self.assertEqual(self.diff(a), ["unit 0 '': param 'emb.weight' expected in this unit, plan has it in no unit"])
        a = self.copy()
        a["units"][3]["params"].append({"name": "head.scale", "shape": [20], "dtype": "float32", "numel": 20})
        self.assertEqual(self.diff(a), ["unit 3 'head': plan has param 'head.scale', which PyTorch assigns to no unit"])


if __name__ == "__main__":
    unittest.main(verbosity=2)
