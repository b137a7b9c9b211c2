#!/usr/bin/python3
"""Both loaders give byte-identical plans for every sample model under every
example policy. Usage: test_loader_plans.py FSDP_PLAN_BINARY"""
import glob
import os
import subprocess
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "app", "fsdp-plan")


class LoadersAgree(unittest.TestCase):
    def test_sample_models_under_every_policy(self):
        models = sorted(glob.glob(os.path.join(ROOT, "sample_models", "*.pt")))
        policies = [None] + sorted(p for p in glob.glob(os.path.join(ROOT, "policies", "*.json"))
                                   if not p.endswith(".schema.json"))
        self.assertGreaterEqual(len(models), 3)
        for model in models:
            for policy in policies:
                args = [BINARY, model, "-f", "json", "--world-size", "8"] + (["--policy", policy] if policy else [])
                with self.subTest(model=os.path.basename(model), policy=policy and os.path.basename(policy)):
                    archive = subprocess.run(args + ["--loader", "archive"], capture_output=True, text=True)
                    jit = subprocess.run(args + ["--loader", "jit"], capture_output=True, text=True)
                    self.assertEqual(archive.returncode, jit.returncode, archive.stderr + jit.stderr)
                    self.assertEqual(archive.stdout, jit.stdout)
                    self.assertTrue(archive.stdout.startswith("{"))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = sys.argv.pop(1)
    unittest.main(verbosity=2)
