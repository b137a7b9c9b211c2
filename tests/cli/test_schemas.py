#!/usr/bin/python3
"""Real outputs against the shipped JSON Schemas (Debian's python3-jsonschema):
plans of every sample model under every sample policy, plans with checks and
expect sections, diffs, and the sample policies themselves.

Usage: test_schemas.py FSDP_PLAN_BINARY   (run by ctest)
"""
import glob
import itertools
import json
import os
import subprocess
import sys
import tempfile
import unittest

import jsonschema

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.environ.get("FSDP_PLAN", os.path.join(ROOT, "build", "app", "fsdp-plan"))
MODELS = sorted(glob.glob(os.path.join(ROOT, "sample_models", "*.pt")))
POLICIES = sorted(p for p in glob.glob(os.path.join(ROOT, "policies", "*.json")) if not p.endswith(".schema.json"))


def load(path):
    with open(path) as f:
        return json.load(f)


PLAN_SCHEMA = load(os.path.join(ROOT, "docs", "schemas", "plan.schema.json"))
DIFF_SCHEMA = load(os.path.join(ROOT, "docs", "schemas", "diff.schema.json"))
POLICY_SCHEMA = load(os.path.join(ROOT, "policies", "policy.schema.json"))


def validator(schema):
    jsonschema.Draft202012Validator.check_schema(schema)
    # The plan's "expect" section refers to the diff schema by relative $id.
    resolver = jsonschema.RefResolver.from_schema(schema, store={DIFF_SCHEMA["$id"]: DIFF_SCHEMA})
    return jsonschema.Draft202012Validator(schema, resolver=resolver)


def run(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=120)


class Schemas(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.plan = validator(PLAN_SCHEMA)
        cls.diff = validator(DIFF_SCHEMA)
        cls.policy = validator(POLICY_SCHEMA)
        cls._dir = tempfile.TemporaryDirectory()
        cls.tmp = cls._dir.name

    @classmethod
    def tearDownClass(cls):
        cls._dir.cleanup()

    def plan_json(self, *args):
        r = run(*args, "--format", "json")
        self.assertIn(r.returncode, (0, 1), r.stderr)
        return json.loads(r.stdout)

    def test_sample_policies_match_the_policy_schema(self):
        self.assertTrue(POLICIES)
        for p in POLICIES:
            with self.subTest(policy=os.path.basename(p)):
                self.policy.validate(load(p))

    def test_every_warning_kind_is_documented(self):
        """The kinds --fail-on accepts (its error lists them) are the policy schema's fail_on enum,
        named in the plan schema's warnings[].kind and in docs/warnings.md's tables of kinds."""
        import re
        r = run(MODELS[0], "--fail-on", "no_such_kind")
        self.assertEqual(r.returncode, 2, r.stderr)
        kinds = re.search(r"one of ([a-z0-9_, ]+)\)", r.stderr).group(1).split(", ")
        self.assertIn("mixed_requires_grad", kinds)
        fail_on = POLICY_SCHEMA["properties"]["checks"]["properties"]["fail_on"]["items"]["enum"]
        self.assertEqual(sorted(kinds), sorted(fail_on))
        described = PLAN_SCHEMA["properties"]["warnings"]["items"]["properties"]["kind"]["description"]
        with open(os.path.join(ROOT, "docs", "warnings.md")) as f:
            readme = f.read()
        for k in kinds:
            if k == "any":
                continue
            with self.subTest(kind=k):
                self.assertRegex(described, rf"\b{k}\b")
                self.assertIn(f"| `{k}` |", readme)

    def test_policy_schema_accepts_checks_and_rejects_typos(self):
        self.policy.validate({"checks": {"max_unit_numel": 1e6, "max_units": 10, "max_root_share": 0.25,
                                         "max_peak_bytes": "80GiB", "fail_on": ["any", "empty_unit"]}})
        for bad in ({"max_unit_numels": 1}, {"max_root_share": 2}, {"fail_on": ["empty_unt"]},
                    {"max_peak_bytes": "80XB"}):
            with self.subTest(checks=bad):
                self.assertFalse(self.policy.is_valid({"checks": bad}))

    def test_plans_of_all_sample_models_and_policies(self):
        self.assertTrue(MODELS)
        for model, policy in itertools.product(MODELS, [None] + POLICIES):
            args = [model] + (["--policy", policy] if policy else [])
            with self.subTest(model=os.path.basename(model), policy=policy and os.path.basename(policy)):
                self.plan.validate(self.plan_json(*args))

    def test_plans_with_checks_and_expect(self):
        gpt = os.path.join(ROOT, "sample_models", "tiny_gpt.pt")
        transformer = os.path.join(ROOT, "policies", "transformer.json")
        size = os.path.join(ROOT, "policies", "size_based.json")
        reviewed = os.path.join(self.tmp, "reviewed.json")
        self.assertEqual(run(gpt, "--policy", transformer, "-f", "json", "-o", reviewed).returncode, 0)
        for policy in (transformer, size):
            plan = self.plan_json(gpt, "--policy", policy, "--max-unit-numel", "40000", "--max-units", "5",
                                  "--max-root-share", "0.5", "--fail-on", "any", "--expect", reviewed)
            self.assertIn("checks", plan)
            self.assertIn("expect", plan)
            self.plan.validate(plan)
            self.diff.validate(plan["expect"]["diff"])

    def test_comm_and_time_in_every_shape(self):
        # Schema 2's comm and time (docs/plan-format.md), with and without --collectives: FLOPs
        # (a .pt2: timeline), CPU offload (host copies), HSDP (two groups), FSDP1 and a 2-D plan,
        # with and without FLOPs.
        pt2 = os.path.join(ROOT, "sample_models", "tiny_gpt.pt2")
        pt = os.path.join(ROOT, "sample_models", "tiny_gpt.pt")

        def policy(name, extra):
            path = os.path.join(self.tmp, name + ".json")
            with open(path, "w") as f:
                json.dump(dict({"module_classes": ["Block"]}, **extra), f)
            return path
        offload = policy("offload", {"fsdp": {"version": 2, "world_size": 8, "cpu_offload": True}})
        hsdp = policy("hsdp", {"fsdp": {"version": 2, "world_size": 16, "sharding_strategy": "HYBRID_SHARD",
                                        "shard_group_size": 8}})
        tp = policy("tp", {"fsdp": {"version": 2, "world_size": 8}, "tensor_parallel": {
            "degree": 2, "plan": {"blocks.*.attn.qkv": "colwise", "blocks.*.attn.proj": "rowwise",
                                  "blocks.*.mlp.fc": "colwise", "blocks.*.mlp.out": "rowwise"}}})
        for model, pol, flops, offloads in ((pt2, None, True, False), (pt2, offload, True, True),
                                            (pt, offload, False, True), (pt2, hsdp, True, False),
                                            (pt2, tp, True, False), (pt, tp, False, False)):
            with self.subTest(model=os.path.basename(model), policy=pol and os.path.basename(pol)):
                args = [model, *(["--policy", pol] if pol else ["--world-size", "8"])]
                # Without --collectives: the sums only, no events.
                brief = self.plan_json(*args)
                self.plan.validate(brief)
                self.assertNotIn("collectives", brief["comm"])
                self.assertNotIn("timeline", brief["time"])
                self.assertNotIn("collectives", brief["comm"].get("tensor_parallel", {}))
                plan = self.plan_json(*args, "--collectives")
                self.plan.validate(plan)
                self.assertEqual(plan["units"], brief["units"])
                self.assertEqual(plan["comm"]["per_step"]["calls"], len(plan["comm"]["collectives"]))
                comm, time = plan["comm"], plan["time"]
                self.assertEqual(plan["schema_version"], 2)
                self.assertEqual(time["flops_known"], flops)
                self.assertNotIn("collectives", time)
                self.assertEqual(bool(time["timeline"]), flops)
                for c in comm["collectives"]:
                    group = comm["groups"][c["group"]]
                    self.assertIn(c["kind"], group["time"]["latency_s"])
                    self.assertEqual("host_copy_bytes" in c, offloads)
                    self.assertEqual("host_copy_s" in c["time"], offloads)
                    self.assertGreaterEqual(c["time"]["seconds"], group["time"]["latency_s"][c["kind"]])
                for s in time["timeline"]:
                    self.assertEqual("collective" in s, s["what"] != "compute")
                    if "collective" in s:
                        self.assertEqual(comm["collectives"][s["collective"]]["kind"], s["what"])
                for u in plan["units"]:
                    self.assertEqual("forward_flops" in u["time"], flops)
                    self.assertEqual("host_to_device_bytes" in u["comm"], offloads)
                    self.assertNotIn("exposed_s", u["time"])
                if pol == hsdp:
                    self.assertEqual([(g["size"], g["stride"]) for g in comm["groups"]], [(8, 1), (2, 8)])
                if pol == tp:
                    t = comm["tensor_parallel"]
                    self.assertEqual("unknown_reason" in t, not t["sizes_known"])
                    self.assertEqual(t["sizes_known"], flops)
                    self.assertEqual("time" in t, bool(t["collectives"]))
                    self.assertEqual(all("tp_forward_s" in u["time"] for u in plan["units"]), flops)
                    seconds = sum(c["time"]["seconds"] for c in t["collectives"])
                    self.assertAlmostEqual(seconds, time["tensor_parallel"]["comm_s"], delta=1e-12)

    def test_diffs_between_policies(self):
        gpt = os.path.join(ROOT, "sample_models", "tiny_gpt.pt")
        plans = []
        for i, policy in enumerate([None] + POLICIES):
            out = os.path.join(self.tmp, f"p{i}.json")
            r = run(gpt, *(["--policy", policy] if policy else []), "-f", "json", "-o", out)
            self.assertIn(r.returncode, (0, 1), r.stderr)
            plans.append(out)
        for a, b in itertools.permutations(plans, 2):
            with self.subTest(old=a, new=b):
                r = run("diff", a, b, "--format", "json")
                self.assertIn(r.returncode, (0, 1), r.stderr)
                d = json.loads(r.stdout)
                self.diff.validate(d)
                self.assertEqual(r.returncode == 0, d["equal"])


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=1)
