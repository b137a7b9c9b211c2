#!/usr/bin/python3
"""CLI tests for gating CI on a plan: budgets, --expect and `fsdp-plan diff`,
their exit codes and what they print.

Usage: test_gate.py FSDP_PLAN_BINARY   (run by ctest)
"""
import json
import os
import shutil
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_cli  # noqa: E402  (shared helpers: run, Scratch)
from test_cli import GPT, POLICIES, Scratch, run  # noqa: E402

TRANSFORMER = os.path.join(POLICIES, "transformer.json")
SIZE = os.path.join(POLICIES, "size_based.json")


class Budgets(Scratch):
    def gpt(self, *args):
        return run(GPT, "--policy", TRANSFORMER, *args)

    def test_each_budget_passes(self):
        # Units: root 34.94K, three blocks of 49.98K; root share 18.9%.
        for args in (["--max-unit-numel", "49984"], ["--max-units", "4"], ["--max-root-share", "0.19"],
                     ["--fail-on", "empty_unit"], ["--fail-on", "any"]):
            with self.subTest(args=args):
                r = self.gpt(*args)
                self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
                self.assertIn("all met", r.stdout)

    def test_each_budget_fails_with_exit_1_and_names_the_violation(self):
        cases = [(["--max-unit-numel", "49983"], "FAIL  max_unit_numel: 49.98K > 49.98K  (blocks.0, blocks.1, blocks.2)"),
                 (["--max-units", "3"], "FAIL  max_units: 4 > 3"),
                 (["--max-root-share", "0.18"], "FAIL  max_root_share: 18.9% > 18.0%  ((root))")]
        for args, line in cases:
            with self.subTest(args=args):
                r = self.gpt(*args)
                self.assertEqual(r.returncode, 1, r.stderr)
                self.assertIn(line, r.stdout)
                self.assertIn("1 violated", r.stdout)

    def test_fail_on_a_warning_kind(self):
        r = run(GPT, "--policy", SIZE, "--fail-on", "shared_param_across_units", "-f", "json")
        self.assertEqual(r.returncode, 1, r.stderr)
        v = json.loads(r.stdout)["checks"]["violations"]
        self.assertEqual([(x["rule"], x["limit"], x["actual"]) for x in v],
                         [("fail_on", "shared_param_across_units", 1)])
        self.assertEqual(v[0]["units"], ["tok_emb", "lm_head"])
        self.assertEqual(run(GPT, "--policy", SIZE, "--fail-on", "any").returncode, 1)
        self.assertEqual(run(GPT, "--policy", SIZE, "--fail-on", "nested_wrap").returncode, 0)
        # One kind per --fail-on: the model after it is not taken for a kind.
        self.assertEqual(run("--fail-on", "any", "--policy", SIZE, GPT).returncode, 1)

    def test_json_lists_violations(self):
        r = self.gpt("--max-unit-numel", "40000", "--max-units", "8", "-f", "json")
        self.assertEqual(r.returncode, 1)
        checks = json.loads(r.stdout)["checks"]
        self.assertFalse(checks["passed"])
        self.assertEqual(len(checks["results"]), 2)
        self.assertEqual(checks["violations"], [{"rule": "max_unit_numel", "limit": 40000, "actual": 49984,
                                                 "passed": False, "units": ["blocks.0", "blocks.1", "blocks.2"]}])

    def test_no_budgets_no_checks_section(self):
        r = self.gpt("-f", "json")
        self.assertNotIn("checks", json.loads(r.stdout))
        self.assertNotIn("checks", self.gpt().stdout)

    def test_budgets_from_the_policy_and_the_command_line_overrides(self):
        p = self.write("p.json", json.dumps({"module_classes": ["Block"], "checks": {"max_units": 3}}))
        r = run(GPT, "--policy", p)
        self.assertEqual(r.returncode, 1)
        self.assertIn("FAIL  max_units: 4 > 3", r.stdout)
        self.assertEqual(run(GPT, "--policy", p, "--max-units", "4").returncode, 0)

    def test_policy_checks_are_validated(self):
        p = self.write("p.json", json.dumps({"checks": {"max_unit_numels": 5}}))
        self.assert_input_error(run(GPT, "--policy", p), "p.json", 'did you mean "max_unit_numel"')
        p = self.write("q.json", json.dumps({"checks": {"max_peak_bytes": "eighty gigs"}}))
        self.assert_input_error(run(GPT, "--policy", p), "q.json", "not a size")

    def test_max_peak_bytes(self):
        plan = json.loads(run(GPT, "--policy", TRANSFORMER, "-f", "json", "--world-size", "8").stdout)
        peak = plan["memory"]["per_rank"]["peak_bytes"]
        ok = self.gpt("--world-size", "8", "--max-peak-bytes", "80GiB", "-f", "json")
        self.assertEqual(ok.returncode, 0, ok.stderr)
        over = self.gpt("--world-size", "8", "--max-peak-bytes", str(peak - 1), "-f", "json")
        self.assertEqual(over.returncode, 1, over.stderr)
        violation = json.loads(over.stdout)["checks"]["violations"][0]
        self.assertEqual((violation["rule"], violation["limit"], violation["actual"]), ("max_peak_bytes", peak - 1, peak))
        at_limit = self.gpt("--world-size", "8", "--max-peak-bytes", str(peak))
        self.assertEqual(at_limit.returncode, 0, at_limit.stderr)
        # The same budget from the policy's checks.
        p = self.write("p.json", json.dumps({"module_classes": ["Block"], "fsdp": {"world_size": 8},
                                             "checks": {"max_peak_bytes": "1KiB"}}))
        self.assertEqual(run(GPT, "--policy", p).returncode, 1)

    def test_bad_budget_values_are_usage_errors(self):
        for args in (["--max-peak-bytes", "80XB"], ["--max-root-share", "1.5"], ["--max-units", "-1"],
                     ["--fail-on", "empty_unt"], ["--max-unit-numel", "lots"]):
            with self.subTest(args=args):
                r = self.gpt(*args)
                self.assertEqual((r.returncode, r.stdout), (2, ""), r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertIn('did you mean "empty_unit"', self.gpt("--fail-on", "empty_unt").stderr)


class Expect(Scratch):
    def reviewed(self, policy=TRANSFORMER):
        path = os.path.join(self.tmp, "reviewed.json")
        self.assertEqual(run(GPT, "--policy", policy, "-f", "json", "-o", path).returncode, 0)
        return path

    def test_equal_plan_exits_0(self):
        reviewed = self.reviewed()
        r = run(GPT, "--policy", TRANSFORMER, "--expect", reviewed)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("same plan as", r.stdout)
        j = json.loads(run(GPT, "--policy", TRANSFORMER, "--expect", reviewed, "-f", "json").stdout)
        self.assertTrue(j["expect"]["equal"])

    def test_model_path_and_key_order_do_not_matter(self):
        reviewed = self.reviewed()
        with open(reviewed) as f:
            plan = json.load(f)
        plan["model"]["path"] = "somewhere/else.pt"
        with open(reviewed, "w") as f:
            json.dump(plan, f, sort_keys=True, indent=4)
        copy = os.path.join(self.tmp, "copy.pt")
        shutil.copy(GPT, copy)
        self.assertEqual(run(copy, "--policy", TRANSFORMER, "--expect", reviewed).returncode, 0)

    def test_changed_plan_exits_1_with_the_difference(self):
        reviewed = self.reviewed()
        r = run(GPT, "--policy", SIZE, "--expect", reviewed)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("the plan differs from " + reviewed, r.stdout)
        self.assertIn("units added (5)", r.stdout)
        j = json.loads(run(GPT, "--policy", SIZE, "--expect", reviewed, "-f", "json").stdout)
        self.assertFalse(j["expect"]["equal"])
        self.assertEqual(j["expect"]["diff"]["summary"]["units_removed"], 3)

    def test_bad_expect_file_is_an_input_error(self):
        self.assert_input_error(run(GPT, "--expect", os.path.join(self.tmp, "none.json")), "none.json")
        bad = self.write("bad.json", "{")
        self.assert_input_error(run(GPT, "--expect", bad), "bad.json", "invalid JSON")
        notplan = self.write("policy.json", "{}")
        self.assert_input_error(run(GPT, "--expect", notplan), "policy.json", "not a plan")


class Diff(Scratch):
    def plan(self, name, *policy_args):
        path = os.path.join(self.tmp, name)
        r = run(GPT, *policy_args, "-f", "json", "-o", path)
        self.assertEqual(r.returncode, 0, r.stderr)
        return path

    def test_same_plan_exits_0(self):
        a = self.plan("a.json", "--policy", TRANSFORMER)
        r = run("diff", a, a)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.rstrip().endswith("no difference"))

    def test_additions_and_moved_parameters(self):
        a, b = self.plan("a.json"), self.plan("b.json", "--policy", TRANSFORMER)
        r = run("diff", a, b)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("units added (3)\n  + blocks.0 ", r.stdout)
        self.assertIn("(root) -> blocks.0: 12 parameters, 49.98K elements", r.stdout)
        self.assertIn("param_numel:             184.90K -> 34.94K (-149.95K)", r.stdout)

    def test_removals(self):
        a, b = self.plan("a.json", "--policy", TRANSFORMER), self.plan("b.json")
        j = json.loads(run("diff", a, b, "--format", "json").stdout)
        self.assertEqual([u["path"] for u in j["units"]["removed"]], ["blocks.0", "blocks.1", "blocks.2"])
        self.assertEqual(j["summary"]["params_moved"], 36)
        self.assertEqual({m["to"] for m in j["params"]["moved"]}, {""})

    def test_changed_warnings(self):
        a, b = self.plan("a.json", "--policy", TRANSFORMER), self.plan("b.json", "--policy", SIZE)
        r = run("diff", a, b)
        # lm_head is not empty: FSDP1 (use_orig_params=False) flattens its own copy of the tied weight.
        self.assertIn("warnings appeared (1)", r.stdout)
        self.assertIn("+ warning shared_param_across_units", r.stdout)
        self.assertIn("+ lm_head.weight  (in lm_head)", r.stdout)
        back = json.loads(run("diff", b, a, "-f", "json").stdout)
        self.assertEqual(sorted(w["kind"] for w in back["warnings"]["gone"]), ["shared_param_across_units"])
        self.assertEqual(back["warnings"]["appeared"], [])

    def test_text_fits_in_100_columns(self):
        a, b = self.plan("a.json", "--policy", TRANSFORMER), self.plan("b.json", "--policy", SIZE)
        out = run("diff", a, b).stdout
        self.assertTrue(all(len(line) <= 100 for line in out.splitlines()), out)

    def test_output_file_and_errors(self):
        a = self.plan("a.json")
        out = os.path.join(self.tmp, "d.json")
        r = run("diff", a, a, "-f", "json", "-o", out)
        self.assertEqual((r.returncode, r.stdout), (0, ""), r.stderr)
        with open(out) as f:
            self.assertTrue(json.load(f)["equal"])
        self.assert_input_error(run("diff", a, os.path.join(self.tmp, "none.json")), "none.json")
        self.assert_input_error(run("diff", a, self.write("x.json", "[]")), "x.json", "not a plan")
        # A number beyond a double is malformed JSON too, for diff and --expect alike.
        huge = self.write("huge.json", '{"schema_version": 1e400}')
        self.assert_input_error(run("diff", a, huge), "huge.json", "invalid JSON: number overflow")
        self.assert_input_error(run(GPT, "--expect", huge), "huge.json", "invalid JSON: number overflow")
        r = run("diff", a)
        self.assertEqual((r.returncode, r.stdout), (2, ""))
        self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
        self.assertEqual(run("diff", "--help").returncode, 0)

    def test_a_model_named_diff_is_dot_slash_diff(self):
        shutil.copy(GPT, os.path.join(self.tmp, "diff"))
        r = run("./diff", cwd=self.tmp)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("TinyGPT", r.stdout)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        test_cli.BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
