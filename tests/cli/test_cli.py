#!/usr/bin/python3
"""CLI tests: run the fsdp-plan binary on the sample models and on bad input.

Usage: test_cli.py FSDP_PLAN_BINARY   (run by ctest; needs Debian's python3-torch)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.environ.get("FSDP_PLAN", os.path.join(ROOT, "build", "app", "fsdp-plan"))
GPT = os.path.join(ROOT, "sample_models", "tiny_gpt.pt")
CNN = os.path.join(ROOT, "sample_models", "small_cnn.pt")
POLICIES = os.path.join(ROOT, "policies")


def run(*args, **kw):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=120, **kw)


class Scratch(unittest.TestCase):
    def setUp(self):
        self._dir = tempfile.TemporaryDirectory()
        self.tmp = self._dir.name

    def tearDown(self):
        self._dir.cleanup()

    def write(self, name, text):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def assert_input_error(self, result, *needles):
        """Exit 2, nothing on stdout, one line on stderr containing each needle."""
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stdout, "")
        lines = result.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertTrue(lines[0].startswith("fsdp-plan: error: "), lines[0])
        for n in needles:
            self.assertIn(n, lines[0])


class PlanOutput(Scratch):
    def test_text_plan(self):
        r = run(GPT, "--policy", os.path.join(POLICIES, "transformer.json"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        self.assertIn("blocks.0", r.stdout)
        self.assertIn("4 units", r.stdout)
        self.assertTrue(all(len(line) <= 100 for line in r.stdout.splitlines()))

    def test_json_plan_contract(self):
        r = run(GPT, "--policy", os.path.join(POLICIES, "transformer.json"), "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        plan = json.loads(r.stdout)
        self.assertEqual(plan["schema_version"], 2)
        for key in ("path", "root_class", "num_modules", "param_numel", "buffer_numel"):
            self.assertIn(key, plan["model"])
        self.assertEqual([u["path"] for u in plan["units"]], ["", "blocks.0", "blocks.1", "blocks.2"])
        unit_keys = {"index", "path", "class", "qualified_class", "depth", "parent", "param_numel",
                     "param_bytes", "params", "buffer_numel", "buffer_bytes", "buffers", "mixed_precision"}
        for u in plan["units"]:
            self.assertTrue(unit_keys <= set(u), unit_keys - set(u))
        # Every parameter once: the unit totals add up to the model's.
        self.assertEqual(sum(u["param_numel"] for u in plan["units"]), plan["model"]["param_numel"])
        self.assertEqual(plan["units"][0]["params"][0]["name"], "tok_emb.weight")

    def test_output_is_deterministic(self):
        args = [CNN, "--policy", os.path.join(POLICIES, "mixed_precision.json"), "-f", "json"]
        self.assertEqual(run(*args).stdout, run(*args).stdout)

    def test_no_policy_means_one_root_unit(self):
        plan = json.loads(run(GPT, "-f", "json").stdout)
        self.assertEqual(len(plan["units"]), 1)
        self.assertFalse(plan["policy"]["auto_wrap"])

    def test_output_file_written_atomically(self):
        out = os.path.join(self.tmp, "plan.json")
        r = run(GPT, "-f", "json", "-o", out)
        self.assertEqual((r.returncode, r.stdout), (0, ""), r.stderr)
        with open(out) as f:
            self.assertEqual(json.load(f)["schema_version"], 2)
        self.assertEqual(os.listdir(self.tmp), ["plan.json"])  # no temporary left behind
        # A failing run leaves the old file as it was.
        bad = self.write("bad.json", "{")
        r = run(GPT, "--policy", bad, "-o", out)
        self.assertEqual(r.returncode, 2)
        with open(out) as f:
            self.assertEqual(json.load(f)["schema_version"], 2)

    def test_unwritable_output_is_an_error(self):
        r = run(GPT, "-o", os.path.join(self.tmp, "missing-dir", "plan.json"))
        self.assert_input_error(r, "missing-dir/plan.json", "cannot write")

    def test_help_and_version(self):
        r = run("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("Exit codes", r.stdout)
        self.assertEqual(run("--version").returncode, 0)


class MixedPrecisionFields(Scratch):
    """FSDP1's and FSDP2's further MixedPrecision fields: echoed with PyTorch's defaults per
    version in the JSON policy, shown in the text policy line only when away from them."""

    def plan(self, mp, *args):
        policy = self.write("mp.json", json.dumps({"module_classes": ["Block"], "mixed_precision": mp}))
        text, js = run(GPT, "--policy", policy, *args), run(GPT, "--policy", policy, "-f", "json", *args)
        self.assertEqual((text.returncode, js.returncode), (0, 0), text.stderr + js.stderr)
        policy_line = text.stdout.split("\npolicy")[1].split("\nfsdp")[0]
        return " ".join(policy_line.split()), json.loads(js.stdout)["policy"]["mixed_precision"]

    def test_defaults_per_version(self):
        line, mp = self.plan({"param_dtype": "bfloat16"})
        self.assertEqual({k: mp[k] for k in ("keep_low_precision_grads", "cast_forward_inputs",
                                             "cast_root_forward_inputs")}, {
            "keep_low_precision_grads": False, "cast_forward_inputs": False, "cast_root_forward_inputs": True})
        self.assertNotIn("output_dtype", mp)
        self.assertNotIn("cast", line)
        line, mp = self.plan({"param_dtype": "bfloat16"}, "--fsdp-version", "2")
        self.assertEqual((mp["output_dtype"], mp["cast_forward_inputs"]), (None, True))
        self.assertNotIn("keep_low_precision_grads", mp)
        self.assertNotIn("cast", line)

    def test_set_fields_are_echoed(self):
        line, mp = self.plan({"param_dtype": "bfloat16", "keep_low_precision_grads": True,
                              "cast_forward_inputs": True, "cast_root_forward_inputs": False})
        self.assertEqual((mp["keep_low_precision_grads"], mp["cast_forward_inputs"], mp["cast_root_forward_inputs"]),
                         (True, True, False))
        self.assertIn("keep_low_precision_grads, cast_forward_inputs true, cast_root_forward_inputs false", line)
        line, mp = self.plan({"param_dtype": "bfloat16", "output_dtype": "float32", "cast_forward_inputs": False},
                             "--fsdp-version", "2")
        self.assertEqual((mp["output_dtype"], mp["cast_forward_inputs"]), ("float32", False))
        self.assertIn("mixed precision bfloat16, output float32, cast_forward_inputs false", line)

    def test_a_field_the_version_lacks(self):
        policy = self.write("p.json", '{"mixed_precision": {"cast_root_forward_inputs": true}}')
        self.assert_input_error(run(GPT, "--policy", policy, "--fsdp-version", "2"),
                                "FSDP2's MixedPrecisionPolicy has no cast_root_forward_inputs")
        policy = self.write("p.json", '{"mixed_precision": {"output_dtype": "float16"}}')
        self.assert_input_error(run(GPT, "--policy", policy), "FSDP1's MixedPrecision has no output_dtype")

    def test_accelerate_config_under_the_other_version(self):
        # Accelerate derives the dtypes for the version that runs the config, so
        # --fsdp-version planning an FSDP2 config as FSDP1 (and back) is no error.
        config = os.path.join(ROOT, "tests", "accelerate", "configs", "fsdp2_llama.yaml")
        for version, output in (("1", None), ("2", "bfloat16")):
            r = run(GPT, "--policy", config, "--fsdp-version", version, "-f", "json")
            self.assertIn(r.returncode, (0, 1), r.stderr)
            mp = json.loads(r.stdout)["policy"]["mixed_precision"]
            self.assertEqual((mp["param_dtype"], mp.get("output_dtype")), ("bfloat16", output))


class BadInput(Scratch):
    def test_missing_model(self):
        self.assert_input_error(run(os.path.join(self.tmp, "nope.pt")), "nope.pt", "no such file")

    def test_model_is_a_directory(self):
        self.assert_input_error(run(self.tmp), self.tmp, "directory")

    def test_model_not_an_archive(self):
        path = self.write("junk.pt", "this is not a zip file\n")
        self.assert_input_error(run(path), "junk.pt")

    def test_policy_invalid_json(self):
        p = self.write("p.json", '{\n  "module_classes": ["Block"],\n}\n')
        self.assert_input_error(run(GPT, "--policy", p), "p.json", "line 3, column 1")

    def test_policy_unknown_key(self):
        p = self.write("p.json", '{"min_num_param": 10}')
        self.assert_input_error(run(GPT, "--policy", p), "p.json", 'did you mean "min_num_params"')

    def test_policy_missing(self):
        self.assert_input_error(run(GPT, "--policy", os.path.join(self.tmp, "none.json")), "none.json")

    def test_usage_errors(self):
        r = run(GPT, "--format", "yaml")
        self.assertEqual(r.returncode, 2)
        self.assertEqual(r.stdout, "")
        self.assertEqual(len(r.stderr.strip().splitlines()), 1)
        self.assertEqual(run().returncode, 2)


class RefusedModel(Scratch):
    def test_already_wrapped_model_exits_1_with_a_plan(self):
        path = os.path.join(self.tmp, "wrapped.pt")
        script = f"""
import torch, torch.nn as nn
class FullyShardedDataParallel(nn.Module):
    def __init__(self):
        super().__init__()
        self._fsdp_wrapped_module = nn.Linear(4, 4)
    def forward(self, x):
        return self._fsdp_wrapped_module(x)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer = FullyShardedDataParallel()
    def forward(self, x):
        return self.layer(x)
torch.jit.save(torch.jit.script(Net()), {path!r})
"""
        # torch.jit.script reads the class source, so the script must be a file.
        subprocess.run(["/usr/bin/python3", self.write("make.py", script)], check=True)
        r = run(path, "-f", "json")
        self.assertEqual(r.returncode, 1, r.stderr)
        plan = json.loads(r.stdout)
        kinds = [(w["kind"], w["severity"]) for w in plan["warnings"]]
        self.assertIn(("nested_wrap", "error"), kinds)



class ModuleClassesOption(Scratch):
    """--module-classes A,B (plan and suggest): the policy's module_classes from the command
    line; with --policy it replaces the file's list and keeps the rest (docs/install.md)."""

    def plan(self, *args):
        r = run(GPT, "--format", "json", *args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_same_plan_as_the_policy_file(self):
        flag = self.plan("--module-classes", "Block")
        file = self.plan("--policy", os.path.join(POLICIES, "transformer.json"))
        self.assertEqual(flag["units"], file["units"])
        self.assertEqual(flag["policy"], file["policy"])
        self.assertEqual(flag["memory"], file["memory"])

    def test_replaces_the_files_classes_and_keeps_the_rest(self):
        policy = self.write("p.json", json.dumps({"module_classes": ["Linear"], "min_num_params": 100000,
                                                  "mixed_precision": {"param_dtype": "bfloat16"}}))
        got = self.plan("--policy", policy, "--module-classes", " Block , LayerNorm")
        self.assertEqual(got["policy"]["module_classes"], ["Block", "LayerNorm"])
        self.assertEqual(got["policy"]["min_num_params"], 100000)
        self.assertEqual(got["policy"]["mixed_precision"]["param_dtype"], "bfloat16")
        want = self.plan("--policy", self.write("q.json", json.dumps(
            {"module_classes": ["Block", "LayerNorm"], "min_num_params": 100000,
             "mixed_precision": {"param_dtype": "bfloat16"}})))
        self.assertEqual(got["units"], want["units"])

    def test_suggest_takes_it_as_the_base_policy(self):
        r = run("suggest", GPT, "--budget", "1GiB", "--module-classes", "Block", "--format", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        ranked = json.loads(r.stdout)
        base = [c for c in ranked["candidates"] if c["label"] == "base policy"]
        self.assertEqual(len(base), 1, [c["label"] for c in ranked["candidates"]])
        self.assertEqual(base[0]["policy"]["module_classes"], ["Block"])

    def test_bad_lists_are_usage_errors(self):
        for bad, needle in (("Block,,Head", "an empty class name"), ("", "an empty class name"),
                            ("Blo ck", "a space inside")):
            with self.subTest(value=bad):
                self.assert_input_error(run(GPT, "--module-classes", bad), "--module-classes", needle)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = sys.argv.pop(1)
    unittest.main(verbosity=2)
