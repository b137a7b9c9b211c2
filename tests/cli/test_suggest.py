#!/usr/bin/python3
"""CLI tests for `fsdp-plan suggest`: the ranked report, the best policy it
writes, what it says when nothing fits, and bad input.

Every claim is checked by planning again: the written policy, planned with
`fsdp-plan MODEL --policy`, fits the budget; the advised world size fits and
one rank fewer does not.

Usage: test_suggest.py FSDP_PLAN_BINARY   (run by ctest)
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_cli  # noqa: E402
from test_cli import GPT, CNN, ROOT, Scratch, run  # noqa: E402

try:
    import jsonschema
except ImportError:  # the schema check needs it; scripts/dev installs it
    jsonschema = None

SCHEMA = os.path.join(ROOT, "docs", "schemas", "suggest.schema.json")


def peak(model, policy_file, *args):
    r = run(model, "--policy", policy_file, "-f", "json", *args)
    assert r.returncode in (0, 1), r.stderr
    return json.loads(r.stdout)["memory"]["per_rank"]["peak_bytes"]


class Suggest(Scratch):
    def suggest(self, *args):
        return run("suggest", *args)

    def test_report_and_best_policy_fit_the_budget(self):
        out = os.path.join(self.tmp, "best.json")
        r = self.suggest(GPT, "--world-size", "8", "--budget", "1MiB", "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        self.assertIn("budget  1.0 MiB per rank", r.stdout)
        self.assertIn("activations 0 B", r.stdout)  # the allowance is always printed
        self.assertIn("best    ", r.stdout)
        with open(out) as f:
            best = json.load(f)
        self.assertEqual(best["fsdp"]["world_size"], 8)
        # The written policy, planned on its own, is under the budget.
        self.assertLessEqual(peak(GPT, out), 1 << 20)

    def test_accelerate_config_as_base(self):
        # The base may be an Accelerate config, read as the plan reads it: its world size and
        # mixed precision are kept (num_processes 8, bf16), its wrap classes are what suggest varies.
        cfg = os.path.join(ROOT, "policies", "accelerate_fsdp1.yaml")
        out = os.path.join(self.tmp, "best.json")
        r = self.suggest(GPT, "--policy", cfg, "--budget", "1MiB", "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            best = json.load(f)
        self.assertEqual(best["fsdp"]["world_size"], 8)
        self.assertEqual(best["mixed_precision"]["param_dtype"], "bfloat16")
        self.assertLessEqual(peak(GPT, out), 1 << 20)
        # The same command-line settings as the plan's, and the same message for a bad one.
        r = self.suggest(GPT, "--budget", "1MiB", "--world-size", "0")
        self.assertEqual(r.returncode, 2)
        self.assertIn("must be a whole number from 1 to", r.stderr)

    def test_json_report(self):
        r = self.suggest(GPT, "--world-size", "8", "--budget", "1MiB", "-f", "json", "--top", "3")
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual(doc["settings"]["budget_bytes"], 1 << 20)
        self.assertEqual(doc["settings"]["activation_bytes"], 0)
        self.assertEqual(len(doc["candidates"]), 3)
        self.assertEqual([c["rank"] for c in doc["candidates"]], [1, 2, 3])
        self.assertEqual(doc["tried"], doc["ranked_count"] + len(doc["dropped"]) + doc["duplicates"])
        self.assertEqual(doc["best"]["policy"], doc["candidates"][0]["policy"])
        # tok_emb and lm_head share a weight: a policy wrapping one of them is dropped.
        reasons = {d["label"]: d["reason"] for d in doc["dropped"]}
        self.assertEqual(reasons.get("module_classes [Embedding]"), "splits a tied weight across units")
        for c in doc["candidates"]:
            self.assertEqual(c["needed_bytes"], c["peak_bytes"])
            self.assertEqual(c["fits"], c["needed_bytes"] <= 1 << 20)
        if jsonschema:
            with open(SCHEMA) as f:
                jsonschema.validate(doc, json.load(f))

    def test_every_ranked_candidate_plans_as_reported(self):
        r = self.suggest(CNN, "--world-size", "4", "--budget", "10MiB", "-f", "json", "--top", "1000")
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertGreater(len(doc["candidates"]), 5)
        for c in doc["candidates"]:
            p = self.write("c.json", json.dumps(c["policy"]))
            plan = json.loads(run(CNN, "--policy", p, "-f", "json").stdout)
            self.assertEqual(plan["memory"]["per_rank"]["peak_bytes"], c["peak_bytes"], c["label"])
            self.assertEqual(len(plan["units"]), c["units"], c["label"])

    def test_activation_allowance(self):
        r = self.suggest(GPT, "--world-size", "8", "--budget", "1MiB", "--activation-bytes", "1MiB")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("activations 1.0 MiB", r.stdout)
        self.assertIn("nothing fits", r.stdout)

    def test_nothing_fits_names_the_world_size_that_would(self):
        out = os.path.join(self.tmp, "best.json")
        r = self.suggest(GPT, "--world-size", "2", "--budget", "1MiB", "-f", "json", "-o", out, "--top", "1000")
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertFalse(os.path.exists(out))  # nothing fits: no policy written
        doc = json.loads(r.stdout)
        self.assertIsNone(doc["best"])
        advice = {a["setting"]: a for a in doc["advice"]}
        self.assertIn("world_size", advice)
        w = int(advice["world_size"]["value"])
        # The candidate the advice names fits at w ranks and not at w - 1.
        named = [c for c in doc["candidates"] if c["label"] == advice["world_size"]["candidate"]][0]
        p = self.write("named.json", json.dumps(named["policy"]))
        self.assertLessEqual(peak(GPT, p, "--world-size", str(w)), 1 << 20)
        self.assertGreater(peak(GPT, p, "--world-size", str(w - 1)), 1 << 20)
        text = self.suggest(GPT, "--world-size", "2", "--budget", "1MiB").stdout
        self.assertIn("it fits with one change:", text)
        self.assertIn(f"fsdp.world_size: {w}", text)

    def test_nothing_fits_report(self):
        # Issue 24, item 5: when nothing fits, the nearest miss comes first; the world size advised
        # is whole nodes (--gpus-per-node, default 8); the advice lines keep their columns.
        args = (GPT, "--world-size", "8", "--budget", "700KiB", "--top", "1000")
        doc = json.loads(self.suggest(*args, "-f", "json").stdout)
        self.assertIsNone(doc["best"])
        needed = [c["needed_bytes"] for c in doc["candidates"]]
        self.assertEqual(needed, sorted(needed))
        text = self.suggest(*args).stdout
        rows = [line for line in text.splitlines() if line.startswith("   1  ")]
        lowest = text.split("nothing fits: the lowest, ")[1].split(", needs ")[0]
        self.assertEqual(rows[0].split("  ")[2:3], [lowest], rows)
        advice = [line for line in text.split("it fits with one change")[1].splitlines()[1:] if line]
        self.assertTrue(advice, text)
        for line in advice:
            self.assertRegex(line, r"^  \S.*\S   *needs  ", line)
        self.assertIn('mixed_precision.param_dtype: "bfloat16"  ', text)
        for per_node in (None, "5", "1"):
            extra = ("--gpus-per-node", per_node) if per_node else ()
            step = int(per_node or 8)
            for world, budget in (("8", "700KiB"), ("2", "1MiB"), ("8", "500KiB")):
                doc = json.loads(self.suggest(GPT, "--world-size", world, "--budget", budget, "--top", "1000",
                                              "-f", "json", *extra).stdout)
                ws = [a for a in doc["advice"] if a["setting"] == "world_size"]
                if not ws:
                    continue
                w = int(ws[0]["value"])
                self.assertTrue(w <= step or w % step == 0, (per_node, world, budget, w))
                # The candidate named fits at w ranks, and not at the count before it (a node fewer).
                named = [c for c in doc["candidates"] if c["label"] == ws[0]["candidate"]][0]
                p = self.write("named.json", json.dumps(named["policy"]))
                limit = {"700KiB": 700 << 10, "1MiB": 1 << 20, "500KiB": 500 << 10}[budget]
                self.assertLessEqual(peak(GPT, p, "--world-size", str(w)), limit)
                before = w - step if w > step else w - 1
                if before >= int(world):
                    self.assertGreater(peak(GPT, p, "--world-size", str(before)), limit, (per_node, w))
        self.assertEqual(doc["settings"]["gpus_per_node"], 1)
        self.assertIn("--gpus-per-node", self.suggest("--help").stdout)
        self.assert_input_error(self.suggest(GPT, "--budget", "1MiB", "--gpus-per-node", "0"), "--gpus-per-node")

    def test_base_policy_settings_are_kept(self):
        base = self.write("base.json", json.dumps({"mixed_precision": {"param_dtype": "bfloat16"},
                                                   "fsdp": {"world_size": 4, "optimizer": "sgd"}}))
        r = self.suggest(GPT, "--policy", base, "--budget", "1GiB", "-f", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual(doc["settings"]["world_size"], 4)
        for c in doc["candidates"]:
            self.assertEqual(c["policy"]["mixed_precision"], {"param_dtype": "bfloat16"})
            self.assertEqual(c["policy"]["fsdp"]["optimizer"], "sgd")

    def test_emit_hands_off_the_best_policy(self):
        # stdout carries only the hand-off; the ranking goes to stderr.
        best = os.path.join(self.tmp, "best.json")
        r = self.suggest(GPT, "--world-size", "8", "--budget", "1.4MiB", "--emit", "accelerate", "-o", best)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("best    ", r.stderr)
        self.assertIn("distributed_type: FSDP", r.stdout)
        self.assertIn("num_processes: 8", r.stdout)
        yaml_file = self.write("accelerate.yaml", r.stdout)
        # Read back as Accelerate would, the config gives the suggested policy's units.
        units = [json.loads(run(GPT, "--policy", f, "-f", "json").stdout)["units"] for f in (yaml_file, best)]
        self.assertEqual([u["path"] for u in units[0]], [u["path"] for u in units[1]])
        r = self.suggest(GPT, "--world-size", "8", "--budget", "1.4MiB", "--emit", "torch")
        self.assertEqual(r.returncode, 0, r.stderr)
        compile(r.stdout, "apply_fsdp.py", "exec")  # valid Python
        self.assertIn("def apply_fsdp(", r.stdout)

    def test_emit_when_nothing_fits_writes_nothing(self):
        r = self.suggest(GPT, "--world-size", "8", "--budget", "1KiB", "--emit", "torch")
        self.assertEqual(r.returncode, 1)
        self.assertEqual(r.stdout, "")
        self.assertIn("nothing fits", r.stderr)
        self.assertIn("--emit torch: nothing written", r.stderr)
        self.assert_input_error(self.suggest(GPT, "--budget", "1MiB", "--emit", "torch", "-f", "json"), "--format")

    def test_fsdp2_candidates_plan_as_reported(self):
        out = os.path.join(self.tmp, "best.json")
        r = self.suggest(GPT, "--world-size", "8", "--budget", "1MiB", "--fsdp-version", "2", "-f", "json",
                         "--top", "1000", "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual(doc["settings"]["fsdp_version"], 2)
        if jsonschema:
            with open(SCHEMA) as f:
                jsonschema.validate(doc, json.load(f))
        groups = [c for c in doc["candidates"] if c["origin"] == "groups"]
        self.assertTrue(groups)
        # Every candidate is an FSDP2 policy whose plan (fully_shard calls, FSDP2 memory) is as reported.
        for c in doc["candidates"]:
            self.assertEqual(c["policy"]["fsdp"]["version"], 2, c["label"])
        for c in groups + doc["candidates"][:3]:
            p = self.write("c.json", json.dumps(c["policy"]))
            plan = json.loads(run(GPT, "--policy", p, "-f", "json").stdout)
            self.assertEqual(plan["fsdp_version"], 2)
            self.assertEqual(plan["memory"]["per_rank"]["peak_bytes"], c["peak_bytes"], c["label"])
            self.assertEqual(len(plan["units"]), c["units"], c["label"])
            root = [u for u in plan["units"] if u["path"] == ""][0]
            total = sum(u["param_numel"] for u in plan["units"])
            self.assertAlmostEqual(root["param_numel"] / total, c["root_share"], places=6)
        # tok_emb and lm_head share a weight: groups that part them are refused by fully_shard.
        reasons = {d["label"]: d["reason"] for d in doc["dropped"]}
        split = "module_classes [Block] + groups [tok_emb, pos_emb], [ln_f, lm_head]"
        self.assertEqual(reasons.get(split), "FSDP would refuse it: fsdp2_shared_param")
        with open(out) as f:
            best = json.load(f)
        self.assertEqual(best, doc["best"]["policy"])
        self.assertLessEqual(peak(GPT, out), 1 << 20)

    def test_refused_candidates_come_back_fixed(self):
        # tok_emb and lm_head share a weight. FSDP2: a policy parting them is refused, and the same
        # policy with both in one fully_shard call is a candidate; FSDP1: with their units unwrapped.
        for version in ("2", "1"):
            r = self.suggest(GPT, "--world-size", "8", "--budget", "1MiB", "--fsdp-version", version, "-f", "json",
                             "--top", "1000")
            self.assertIn(r.returncode, (0, 1), r.stderr)
            doc = json.loads(r.stdout)
            self.assertEqual(doc["tried"], doc["ranked_count"] + len(doc["dropped"]) + doc["duplicates"])
            dropped = {d["label"] for d in doc["dropped"]}
            fixed = [c for c in doc["candidates"] if c["origin"] == "fix"]
            self.assertTrue(fixed, version)
            for c in fixed:
                self.assertTrue(c["label"].endswith(" + tied weights in one unit"), c["label"])
                self.assertIn(c["label"][:-len(" + tied weights in one unit")], dropped)
                p = self.write("fixed.json", json.dumps(c["policy"]))
                plan = json.loads(run(GPT, "--policy", p, "-f", "json").stdout)
                kinds = [w["kind"] for w in plan["warnings"]]
                self.assertNotIn("shared_param_across_units", kinds, c["label"])
                self.assertFalse([w for w in plan["warnings"] if w["severity"] == "error"], c["label"])
                self.assertEqual(plan["memory"]["per_rank"]["peak_bytes"], c["peak_bytes"], c["label"])
        fixed2 = {c["label"]: c for c in json.loads(self.suggest(
            GPT, "--world-size", "8", "--budget", "1MiB", "--fsdp-version", "2", "-f", "json", "--top", "1000"
        ).stdout)["candidates"]}
        self.assertEqual(fixed2["module_classes [Embedding] + tied weights in one unit"]["policy"]["groups"],
                         [{"modules": ["tok_emb", "lm_head"]}])

    def test_fsdp2_from_the_base_policy(self):
        base = self.write("base.json", json.dumps({"fsdp": {"version": 2, "world_size": 8}}))
        r = self.suggest(GPT, "--policy", base, "--budget", "1MiB", "-f", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        doc = json.loads(r.stdout)
        self.assertEqual(doc["settings"]["fsdp_version"], 2)
        self.assertTrue(all(c["policy"]["fsdp"]["version"] == 2 for c in doc["candidates"]))
        text = self.suggest(GPT, "--policy", base, "--budget", "1MiB").stdout
        self.assertIn("FSDP2 (fully_shard), world size 8", text)
        # FSDP1 says so too, and writes no version.
        r = self.suggest(GPT, "--world-size", "8", "--budget", "1MiB", "-f", "json")
        self.assertEqual(json.loads(r.stdout)["settings"]["fsdp_version"], 1)
        self.assertNotIn("version", json.loads(r.stdout)["candidates"][0]["policy"]["fsdp"])

    def test_fsdp2_bad_settings(self):
        self.assert_input_error(self.suggest(GPT, "--budget", "1MiB", "--fsdp-version", "3"), "--fsdp-version")
        self.assert_input_error(self.suggest(GPT, "--budget", "1MiB", "--fsdp-version", "2", "--sharding-strategy",
                                             "SHARD_GRAD_OP"), "FSDP2 has no sharding strategy SHARD_GRAD_OP")

    def test_bad_input(self):
        self.assert_input_error(self.suggest(GPT, "--budget", "lots"), "lots", "is not a size")
        self.assert_input_error(self.suggest(GPT), "--budget")
        self.assert_input_error(self.suggest(os.path.join(self.tmp, "none.pt"), "--budget", "1GiB"), "none.pt")
        bad = self.write("bad.json", "{")
        self.assert_input_error(self.suggest(GPT, "--budget", "1GiB", "--policy", bad), "bad.json")
        out = os.path.join(self.tmp, "no", "such", "dir.json")
        self.assert_input_error(self.suggest(GPT, "--budget", "1GiB", "-o", out), "dir.json")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        test_cli.BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
