#!/usr/bin/python3
"""CLI tests for the memory estimate's settings. Usage: test_memory_cli.py FSDP_PLAN_BINARY"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "app", "fsdp-plan")
GPT = os.path.join(ROOT, "sample_models", "tiny_gpt.pt")
POLICY = os.path.join(ROOT, "policies", "transformer.json")


def plan(*args):
    r = subprocess.run([BINARY, GPT, "--policy", POLICY, "-f", "json", *args], capture_output=True, text=True,
                       timeout=120)
    return r, (json.loads(r.stdout) if r.returncode in (0, 1) else None)


class MemoryCli(unittest.TestCase):
    def test_defaults(self):
        r, p = plan()
        self.assertEqual(r.returncode, 0, r.stderr)
        m = p["memory"]
        self.assertEqual((m["world_size"], m["sharding_strategy"], m["requested_sharding_strategy"]),
                         (1, "NO_SHARD", "FULL_SHARD"))
        # A TorchScript file has no shapes: the note says activations are left out and how to get them.
        unknown = [n for n in m["notes"] if n.startswith("activations not included: ")]
        self.assertEqual(len(unknown), 1, m["notes"])
        self.assertIn("fsdp-plan-export", unknown[0])
        self.assertEqual(m["activations"]["source"], "unknown")
        for u in p["units"]:
            self.assertEqual(u["memory"]["sharded_numel"], u["param_numel"])

    def test_world_size_shards(self):
        _, p1 = plan("--world-size", "1")
        _, p8 = plan("--world-size", "8")
        self.assertEqual(p8["memory"]["sharding_strategy"], "FULL_SHARD")
        for u in p8["units"]:
            self.assertEqual(u["memory"]["sharded_numel"], -(-u["param_numel"] // 8))
        self.assertLess(p8["memory"]["per_rank"]["steady_bytes"], p1["memory"]["per_rank"]["steady_bytes"])
        self.assertGreaterEqual(p8["memory"]["per_rank"]["peak_bytes"], p8["memory"]["per_rank"]["steady_bytes"])

    def test_command_line_overrides_policy(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"module_classes": ["Block"],
                       "fsdp": {"world_size": 4, "sharding_strategy": "SHARD_GRAD_OP", "optimizer": "sgd"}}, f)
        try:
            r = subprocess.run([BINARY, GPT, "--policy", f.name, "-f", "json", "--world-size", "16"],
                               capture_output=True, text=True)
            m = json.loads(r.stdout)["memory"]
            self.assertEqual((m["world_size"], m["sharding_strategy"], m["optimizer"]), (16, "SHARD_GRAD_OP", "sgd"))
            self.assertEqual(m["per_rank"]["optimizer_bytes"], 0)
        finally:
            os.unlink(f.name)

    def test_bad_settings_are_usage_errors(self):
        for args in (["--world-size", "0"], ["--sharding-strategy", "ZERO3"], ["--optimizer", "lion"],
                     ["--world-size", "12", "--sharding-strategy", "HYBRID_SHARD", "--shard-group-size", "8"]):
            r, _ = plan(*args)
            self.assertEqual(r.returncode, 2, args)
            self.assertEqual(r.stdout, "")
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = sys.argv.pop(1)
    unittest.main(verbosity=2)
