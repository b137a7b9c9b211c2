#!/usr/bin/python3
"""What a demanding new user tripped over (issue 17): the command line's
hints, -vv, --dump-tree -f text, frozen models, the text table's widths, and
HYBRID_SHARD's default group. Error messages themselves are in docs/errors.md
(test_errors.py).

Usage: test_usability.py FSDP_PLAN_BINARY   (Debian's python3-torch)
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch
import torch.nn as nn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "app", "fsdp-plan")
GPT = os.path.join(ROOT, "sample_models", "tiny_gpt.pt")
TRANSFORMER = os.path.join(ROOT, "policies", "transformer.json")


def run(*args, env=None):
    e = dict(os.environ)
    e.pop("COLUMNS", None)
    e.update(env or {})
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=120, env=e)


class Scratch(unittest.TestCase):
    def setUp(self):
        self._dir = tempfile.TemporaryDirectory()
        self.tmp = self._dir.name

    def tearDown(self):
        self._dir.cleanup()

    def path(self, name):
        return os.path.join(self.tmp, name)

    def policy(self, obj):
        with open(self.path("policy.json"), "w") as f:
            json.dump(obj, f)
        return self.path("policy.json")


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return self.proj(x)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleDict({"window_attention": Attention(), "grid_attention": Attention()})

    def forward(self, x):
        return self.layers["grid_attention"](self.layers["window_attention"](x))


class LongPaths(nn.Module):
    """maxvit_t's shape: blocks.N.layers.M.layers.{window,grid}_attention."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.ModuleDict({"layers": nn.ModuleList([Layer(), Layer()])}) for _ in range(2)])

    def forward(self, x):
        for b in self.blocks:
            for layer in b["layers"]:
                x = layer(x)
        return x


class CommandLine(Scratch):
    def test_vv_adds_debug_output(self):
        v = run(GPT, "--policy", TRANSFORMER, "-v")
        vv = run(GPT, "--policy", TRANSFORMER, "-vv")
        self.assertEqual(v.returncode, 0, v.stderr)
        self.assertEqual(vv.stdout, v.stdout)
        self.assertNotIn(": debug: ", v.stderr)
        self.assertIn("fsdp-plan: debug: unit 1 'blocks.0'", vv.stderr)
        self.assertIn("fsdp-plan: debug: memory settings: world size 1", vv.stderr)

    def test_max_unit_numel_takes_exponents(self):
        r = run(GPT, "--policy", TRANSFORMER, "--max-unit-numel", "1e6", "-f", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["checks"]["results"][0]["limit"], 1000000)
        self.assertEqual(run(GPT, "--max-unit-numel", "4e4", "--policy", TRANSFORMER).returncode, 1)

    def test_dump_tree_text(self):
        r = run(GPT, "--dump-tree", "-f", "text")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertTrue(lines[0].startswith("(root)  "), lines[0])
        self.assertIn("  blocks  torch.nn.modules.container.ModuleList", lines)
        self.assertTrue(any(line.strip().startswith("param  weight [") for line in lines))
        # Without -f it stays JSON, as before.
        self.assertIn("modules", json.loads(run(GPT, "--dump-tree").stdout))

    def test_frozen_model_says_why_it_has_no_parameters(self):
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 4)

            def forward(self, x):
                return self.fc(x)
        frozen = torch.jit.freeze(torch.jit.script(Net().eval()))
        torch.jit.save(frozen, self.path("frozen.pt"))
        r = run(self.path("frozen.pt"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("params  0 (0 B)", r.stdout)
        self.assertIn("the model has no parameters", r.stderr)
        self.assertIn("torch.jit.freeze'd model has its parameters folded into constants", r.stderr)

    def test_unmatched_class_is_said_first_on_stderr_and_in_the_plan(self):
        r = run(GPT, "--policy", self.policy({"module_classes": ["block"]}))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, 'fsdp-plan: warning: "module_classes" names block, which matches no module in '
                                   'the model; did you mean Block?\n')
        table = r.stdout.index("   #  unit")
        self.assertLess(r.stdout.index("unmatched_class"), table)
        self.assertEqual(r.stdout.count("unmatched_class"), 1)
        # Made fatal as documented:
        self.assertEqual(run(GPT, "--policy", self.path("policy.json"), "--fail-on", "unmatched_class").returncode, 1)


class HybridShard(Scratch):
    def test_default_group_divides_the_world_size(self):
        r = run(GPT, "--world-size", "12", "--sharding-strategy", "HYBRID_SHARD", "-f", "json")
        self.assertEqual(r.returncode, 0, r.stderr)
        memory = json.loads(r.stdout)["memory"]
        self.assertEqual(memory["shard_group_size"], 6)
        self.assertIn("assumed 6 GPUs per node", " ".join(memory["notes"]))
        text = run(GPT, "--world-size", "12", "--sharding-strategy", "HYBRID_SHARD").stdout
        self.assertIn("HYBRID_SHARD (groups of 6, assumed GPUs per node)", " ".join(text.split()))

    def test_group_size_with_another_strategy_is_ignored_with_a_warning(self):
        r = run(GPT, "--world-size", "8", "--shard-group-size", "4")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "fsdp-plan: warning: the shard group size (4) is ignored: only HYBRID_SHARD "
                                   "uses it, and the strategy is FULL_SHARD\n")
        r = run(GPT, "--world-size", "8", "--shard-group-size", "4", "--sharding-strategy", "HYBRID_SHARD")
        self.assertEqual(r.stderr, "")


class TextWidth(Scratch):
    def rows(self, text):
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("   #  unit")) + 1
        end = lines.index("", start)
        return lines[start:end]

    def test_long_paths_stay_distinct_and_fit(self):
        torch.jit.save(torch.jit.script(LongPaths()), self.path("long.pt"))
        policy = self.policy({"module_classes": ["Attention"]})
        r = run(self.path("long.pt"), "--policy", policy, env={"COLUMNS": "100"})
        self.assertEqual(r.returncode, 0, r.stderr)
        rows = self.rows(r.stdout)
        self.assertEqual(len(rows), 9)
        self.assertEqual(len(set(rows)), 9)
        self.assertTrue(all(len(row) <= 100 for row in rows), rows)
        self.assertIn("  blocks.0.*.0.layers.window_attention  ", rows[1])
        self.assertIn("  blocks.1.*.1.layers.grid_attention  ", rows[-1])
        # Narrower: more names go, never an index; rows stay distinct.
        rows = self.rows(run(self.path("long.pt"), "--policy", policy, env={"COLUMNS": "80"}).stdout)
        self.assertEqual(len(set(rows)), 9)
        self.assertIn("  blocks.1.*.1.*.grid_attention  ", rows[-1])
        # --wide: every path whole, whatever the width.
        wide = self.rows(run(self.path("long.pt"), "--policy", policy, "--wide", env={"COLUMNS": "80"}).stdout)
        self.assertIn("blocks.1.layers.1.layers.grid_attention", wide[-1])
        # Wide enough a terminal needs no shortening. (--wide also adds comm/step and exposed est, 11 + 13
        # columns at the end of each row: lib/report/text_writer.cpp.)
        self.assertEqual(self.rows(run(self.path("long.pt"), "--policy", policy, env={"COLUMNS": "200"}).stdout),
                         [row[:-24] for row in wide])


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
