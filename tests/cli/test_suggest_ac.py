#!/usr/bin/env python3
"""suggest with activation checkpointing candidates (issue 30).

A .pt2 whose graph sizes activations: each per-block candidate is also tried with its blocks
checkpointed, fully and selectively (torchtitan's policy; issue 42, item 3), and compiled (the
partitioner's saves: behind the plain plan when both fit, ahead of checkpointing). Checkpointing is for
memory, so the plan without it ranks first when both fit, then the selective one (it recomputes
less); when only a checkpointed one fits, it is the best. A TorchScript file (activations unknown) and a base
policy that sets checkpointing get no such variants. The peaks come from plans of the same policies.

Usage: test_suggest_ac.py FSDP_PLAN_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "app", "fsdp-plan")
PT2 = os.path.join(ROOT, "sample_models", "tiny_gpt.pt2")
PT = os.path.join(ROOT, "sample_models", "tiny_gpt.pt")
AC = " + activation checkpointing [Block]"
SAC = " + selective activation checkpointing (torchtitan's policy) [Block]"
COMPILED = " + compiled blocks [Block]"


def run(*args):
    r = subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=120)
    return r


class SuggestCheckpointing(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.ac_policy = os.path.join(cls.tmp.name, "ac.json")
        with open(cls.ac_policy, "w") as f:
            json.dump({"module_classes": ["Block"], "activation_checkpointing": {"module_classes": ["Block"]}}, f)

        def peak(*policy):
            r = run(PT2, "--world-size", "2", *policy, "-f", "json")
            assert r.returncode == 0, r.stderr
            return json.loads(r.stdout)["memory"]["per_rank"]["peak_bytes"]

        cls.plain = peak("--module-classes", "Block")
        cls.checkpointed = peak("--policy", cls.ac_policy)
        sac_policy = os.path.join(cls.tmp.name, "sac.json")
        with open(sac_policy, "w") as f:
            json.dump({"module_classes": ["Block"],
                       "activation_checkpointing": {"module_classes": ["Block"], "mode": "selective"}}, f)
        cls.selective = peak("--policy", sac_policy)
        cls.compiled = peak("--module-classes", "Block", "--compile", "Block")
        assert cls.checkpointed < cls.selective < cls.compiled < cls.plain, (
            cls.checkpointed, cls.selective, cls.compiled, cls.plain)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def suggest(self, model, budget, *extra):
        r = run("suggest", model, "--world-size", "2", "--budget", str(budget), "-f", "json", "--top", "100", *extra)
        self.assertIn(r.returncode, (0, 1), r.stderr)
        return json.loads(r.stdout)

    def rank(self, report, label):
        return next(c for c in report["candidates"] if c["label"] == label)

    def written_peak(self, budget, name):
        """The peak of the best policy suggest writes with -o at `budget` (and suggest's text)."""
        out = os.path.join(self.tmp.name, name + ".json")
        r = run("suggest", PT2, "--world-size", "2", "--budget", str(budget), "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        plan = run(PT2, "--world-size", "2", "--policy", out, "-f", "json")
        return json.loads(plan.stdout)["memory"]["per_rank"]["peak_bytes"], r.stdout

    def test_both_fit_the_plain_plan_first(self):
        report = self.suggest(PT2, "80GiB")
        self.assertEqual(report["best"]["label"], "module_classes [Block]")
        plain, ac = self.rank(report, "module_classes [Block]"), self.rank(report, "module_classes [Block]" + AC)
        sac = self.rank(report, "module_classes [Block]" + SAC)
        self.assertLess(plain["rank"], sac["rank"])
        self.assertLess(sac["rank"], ac["rank"])
        self.assertEqual((plain["checkpointed"], ac["checkpointed"], sac["checkpointed"]), (False, True, True))
        self.assertEqual([c["checkpoint_mode"] for c in (plain, ac, sac)], ["none", "full", "selective"])
        self.assertEqual(ac["policy"]["activation_checkpointing"], {"module_classes": ["Block"]})
        self.assertEqual(sac["policy"]["activation_checkpointing"], {"module_classes": ["Block"], "mode": "selective",
                                                                    "save_ops": "torchtitan"})
        self.assertEqual((plain["peak_bytes"], ac["peak_bytes"], sac["peak_bytes"]),
                         (self.plain, self.checkpointed, self.selective))

    def test_the_compiled_variant_behind_the_plain_plan_ahead_of_checkpointing(self):
        report = self.suggest(PT2, "80GiB")
        plain, compiled, sac = (self.rank(report, "module_classes [Block]" + suffix) for suffix in ("", COMPILED, SAC))
        self.assertLess(plain["rank"], compiled["rank"])
        self.assertLess(compiled["rank"], sac["rank"])
        self.assertEqual((plain["compiled"], compiled["compiled"], sac["compiled"]), (False, True, False))
        self.assertEqual(compiled["checkpoint_mode"], "none")
        self.assertEqual(compiled["policy"]["compile"], {"module_classes": ["Block"]})
        self.assertEqual(compiled["peak_bytes"], self.compiled)

    def test_only_the_compiled_plan_fits(self):
        budget = (self.plain + self.compiled) // 2
        report = self.suggest(PT2, budget)
        self.assertEqual(report["best"]["label"], "module_classes [Block]" + COMPILED)
        self.assertFalse(self.rank(report, "module_classes [Block]")["fits"])
        self.assertEqual(self.written_peak(budget, "best_compiled")[0], self.compiled)

    def test_only_the_selective_plan_fits(self):
        budget = (self.plain + self.selective) // 2
        report = self.suggest(PT2, budget)
        self.assertEqual(report["best"]["label"], "module_classes [Block]" + SAC)
        self.assertFalse(self.rank(report, "module_classes [Block]")["fits"])
        peak, text = self.written_peak(budget, "best_sac")
        self.assertIn("fits with selective checkpointing", text)
        self.assertEqual(peak, self.selective)

    def test_only_the_checkpointed_plan_fits(self):
        budget = (self.selective + self.checkpointed) // 2
        report = self.suggest(PT2, budget)
        self.assertEqual(report["best"]["label"], "module_classes [Block]" + AC)
        self.assertFalse(self.rank(report, "module_classes [Block]")["fits"])
        self.assertFalse(self.rank(report, "module_classes [Block]" + SAC)["fits"])
        # The policy it writes checkpoints the blocks, and plans to the same peak.
        self.assertEqual(self.written_peak(budget, "best")[0], self.checkpointed)

    def test_no_variants_without_a_graph_or_with_the_base_setting_it(self):
        for model, extra in ((PT, ()), (PT2, ("--policy", self.ac_policy))):
            report = self.suggest(model, "80GiB", *extra)
            labels = [c["label"] for c in report["candidates"]]
            self.assertFalse([x for x in labels if AC in x or SAC in x or COMPILED in x], (model, extra))
            self.assertFalse([c for c in report["candidates"] if c["checkpointed"] or c["compiled"]], (model, extra))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = sys.argv.pop(1)
    unittest.main(verbosity=2)
