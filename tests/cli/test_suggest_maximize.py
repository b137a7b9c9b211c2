#!/usr/bin/env python3
"""suggest --maximize DIM (issue 30): the largest value of a .pt2's dynamic dimension at which some
policy fits the budget.

The oracle is suggest itself at --dim DIM=V: the answer V must fit (exit 0, a fitting candidate)
and V + 1 must not (exit 1), with the nearest candidate's need there equal to what --maximize
reports. Checked on the dynamic Llama export of the act_exports fixture (batch and seq dynamic), at
several budgets and with the other dimension given; then the edges: nothing fits at 1, the
search's ceiling, and the input errors (an unknown dimension, a TorchScript file, a static .pt2).

Usage: test_suggest_maximize.py FSDP_PLAN_BINARY ACT_EXPORTS_DIR
"""
import json
import os
import subprocess
import sys
import unittest

try:
    import jsonschema
except ImportError:  # scripts/dev installs python3-jsonschema
    jsonschema = None

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "app", "fsdp-plan")
EXPORTS = os.path.join(ROOT, "build", "act_exports")
SCHEMA = os.path.join(ROOT, "docs", "schemas", "suggest.schema.json")


def suggest(model, budget, *extra):
    r = subprocess.run([BINARY, "suggest", model, "--world-size", "2", "--budget", budget, *extra],
                       capture_output=True, text=True, timeout=300)
    return r


class Maximize(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dyn = os.path.join(EXPORTS, "llama_dyn.pt2")
        assert os.path.exists(cls.dyn), cls.dyn

    def answer(self, budget, *extra):
        r = suggest(self.dyn, budget, "--maximize", "seq", "-f", "json", "--top", "1", *extra)
        self.assertIn(r.returncode, (0, 1), r.stderr)
        doc = json.loads(r.stdout)
        if jsonschema:
            with open(SCHEMA) as f:
                jsonschema.validate(doc, json.load(f))
        return r.returncode, doc

    def fits_at(self, budget, value, *extra):
        r = suggest(self.dyn, budget, "--dim", f"seq={value}", "-f", "json", "--top", "1", *extra)
        self.assertIn(r.returncode, (0, 1), r.stderr)
        doc = json.loads(r.stdout)
        return r.returncode == 0, doc["candidates"][0]["needed_bytes"]

    def check_against_suggest(self, budget, *extra):
        code, doc = self.answer(budget, *extra)
        m = doc["maximize"]
        self.assertEqual(code, 0)
        self.assertTrue(m["found"])
        self.assertFalse(m["at_ceiling"])
        self.assertEqual(m["dim"], "seq")
        v = m["value"]
        ok, _ = self.fits_at(budget, v, *extra)
        self.assertTrue(ok, f"{budget}: seq {v} should fit")
        ok, needed = self.fits_at(budget, v + 1, *extra)
        self.assertFalse(ok, f"{budget}: seq {v + 1} should not fit")
        self.assertEqual(m["next_needed_bytes"], needed)
        # The report is the ranking at the answer: its best fits.
        self.assertGreaterEqual(doc["fitting_count"], 1)
        return v

    def test_the_answer_fits_and_one_more_does_not(self):
        values = [self.check_against_suggest(b) for b in ("2MiB", "3MiB", "6MiB")]
        self.assertEqual(values, sorted(values))  # more memory, longer sequences
        self.assertLess(values[0], values[-1])

    def test_the_other_dimension_given_stays(self):
        at_batch_2 = self.check_against_suggest("3MiB")
        at_batch_1 = self.check_against_suggest("3MiB", "--dim", "batch=1")
        self.assertGreater(at_batch_1, at_batch_2)

    def test_text_says_the_value_and_the_next(self):
        r = suggest(self.dyn, "3MiB", "--maximize", "seq", "--top", "1")
        self.assertEqual(r.returncode, 0, r.stderr)
        first = r.stdout.splitlines()[0]
        self.assertRegex(first, r"^maximize  seq \d+ is the largest that fits 3\.0 MiB per rank \(seq \d+: the "
                                r"nearest needs .*\); \d+ suggestions planned; the ranking below is at seq \d+$")

    def test_nothing_fits_at_one(self):
        code, doc = self.answer("1KiB")
        self.assertEqual(code, 1)
        self.assertFalse(doc["maximize"]["found"])
        self.assertEqual(doc["maximize"]["value"], 1)
        self.assertIsNone(doc["maximize"]["next_needed_bytes"])

    def test_the_ceiling(self):
        # Every size fits a budget of 2^60 bytes up to the search's ceiling, 2^24 (no bound recorded).
        code, doc = self.answer("1048576TiB")
        m = doc["maximize"]
        self.assertEqual(code, 0)
        self.assertTrue(m["found"] and m["at_ceiling"])
        self.assertEqual(m["value"], 2 ** 24)
        self.assertEqual(m["ceiling"], 2 ** 24)

    def test_input_errors(self):
        cases = [
            (self.dyn, "nope", "--maximize nope: the program has no such dimension; its dimensions: batch"),
            (os.path.join(ROOT, "sample_models", "tiny_gpt.pt"), "seq", "--maximize seq: the model file records no "
                                                                         "shapes (a TorchScript file)"),
            (os.path.join(ROOT, "sample_models", "tiny_gpt.pt2"), "seq", "--maximize seq: the program has no "
                                                                          "dynamic dimensions"),
        ]
        for model, dim, message in cases:
            r = suggest(model, "3MiB", "--maximize", dim)
            self.assertEqual(r.returncode, 2, r.stderr)
            self.assertEqual(r.stdout, "")
            self.assertIn(message, r.stderr)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = sys.argv.pop(1)
    if len(sys.argv) > 1:
        EXPORTS = sys.argv.pop(1)
    unittest.main(verbosity=1)
