#!/usr/bin/env python3
"""fsdp-plan-export against hostile pull-request files (issue 39, item 6): every
bound of docs/limits.md ("fsdp-plan-export") at the limit and one past it, each
refusal one line and exit 2 before anything is built (no traceback, no output
file, within seconds); a config's folder never runs code; and the config
reader property-tested with a seeded random generator (hypothesis is not in
requirements/dev.txt): whatever JSON it is given, it returns or raises its own
error, never another exception.

Usage: test_export_bounds.py   (the venv's Python: torch, transformers, peft)
"""
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "python"))

from fsdp_plan import export as fexport  # noqa: E402
from fsdp_plan import export_bounds as b  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"), os.environ.get("PYTHONPATH", "")]),
           HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": 128,
         "max_position_embeddings": 64}


def write(path, data):
    with open(path, "w" if isinstance(data, str) else "wb") as f:
        f.write(data)
    return path


class Base(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="export-bounds-")
        self.llama = write(os.path.join(self.dir, "llama.json"), json.dumps(LLAMA))

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def export(self, *argv, timeout=120):
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "fsdp_plan.export", *argv], capture_output=True, text=True,
                           env=ENV, cwd=self.dir, timeout=timeout)
        return r, time.monotonic() - t0

    def refused(self, argv, *fragments, out=None):
        out = out or os.path.join(self.dir, "out.pt2")
        r, _ = self.export(*argv, "-o", out)
        what = " ".join(argv)[:200]
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        self.assertEqual(r.returncode, 2, f"{what}: exit {r.returncode}: {r.stderr[-800:]}")
        self.assertEqual(len(lines), 1, f"{what}: {r.stderr[-800:]}")
        self.assertNotIn("Traceback", r.stderr)
        self.assertTrue(lines[0].startswith("fsdp-plan-export: "), lines[0])
        for f in fragments:
            self.assertIn(f, lines[0], what)
        self.assertEqual(r.stdout, "")
        if out.startswith(self.dir) and not out.endswith("fifo.pt2"):
            self.assertFalse(os.path.exists(out), what)
        return lines[0]


class Refusals(Base):
    """The issue's inputs, each refused in one line before torch builds anything."""

    def test_layers(self):
        cfg = write(os.path.join(self.dir, "layers.json"), json.dumps(dict(LLAMA, num_hidden_layers=100000)))
        self.refused([cfg], "num_hidden_layers is 100000", f"({b.MAX_LAYERS};")

    def test_nested_layers(self):
        cfg = dict(LLAMA, text_config={"num_hidden_layers": b.MAX_LAYERS + 1})
        path = write(os.path.join(self.dir, "nested_layers.json"), json.dumps(cfg))
        self.refused([path], "text_config.num_hidden_layers is 1025")

    def test_experts(self):
        cfg = write(os.path.join(self.dir, "experts.json"),
                    json.dumps(dict(LLAMA, num_hidden_layers=512, num_local_experts=1024)))
        self.refused([cfg], "512 layers of 1024 experts")

    def test_big_config(self):
        body = json.dumps(dict(LLAMA, padding="x" * (60 << 20)))
        cfg = write(os.path.join(self.dir, "big.json"), body)
        self.refused([cfg], "more than a model config can be (4194304 bytes)")

    def test_deep_nesting(self):
        for depth in (b.MAX_NESTING + 1, 100000):
            with self.subTest(depth=depth):
                body = '{"model_type": "llama", "x": ' + "[" * depth + "]" * depth + "}"
                cfg = write(os.path.join(self.dir, f"deep{depth}.json"), body)
                self.refused([cfg], f"nested more than {b.MAX_NESTING} deep")

    def test_lora_regex(self):
        adapter = write(os.path.join(self.dir, "adapter.json"),
                        json.dumps({"peft_type": "LORA", "r": 4, "target_modules": "(.*.*)*x"}))
        self.refused([self.llama, "--lora", adapter], "a nested quantifier")

    def test_output_not_writable(self):
        # Not /dev/null: an exporter that replaced it (os.replace, as root) would break the machine.
        fifo = os.path.join(self.dir, "fifo.pt2")
        os.mkfifo(fifo)
        for out in ("/proc/fsdp-plan-export.pt2", "/proc/self/status", fifo):
            with self.subTest(out=out):
                self.refused([self.llama], out.split("/")[-1], out=out)

    def test_step_sizes(self):
        for flag, most in (("--batch", b.MAX_BATCH), ("--seq", b.MAX_SEQ)):
            with self.subTest(flag=flag):
                self.refused([self.llama, flag, str(1 << 40)], f"{flag} {1 << 40}: more than", f"({most};")
                self.refused([self.llama, flag, str(most + 1)], f"({most};")
        self.refused([self.llama, "--batch", str(b.MAX_BATCH), "--seq", str(b.MAX_SEQ)], "tokens, more than")

    def test_fast(self):
        """Refused before torch is imported: well under the seconds a build takes."""
        cfg = write(os.path.join(self.dir, "layers.json"), json.dumps(dict(LLAMA, num_hidden_layers=100000)))
        r, seconds = self.export(cfg, "-o", os.path.join(self.dir, "o.pt2"))
        self.assertEqual(r.returncode, 2)
        self.assertLess(seconds, 60)


class Limits(unittest.TestCase):
    """Each bound at the limit passes, one past it is refused (no torch needed)."""

    def test_layers_and_experts(self):
        b.check_config(dict(LLAMA, num_hidden_layers=b.MAX_LAYERS), "c")
        with self.assertRaises(b.BoundsError):
            b.check_config(dict(LLAMA, num_hidden_layers=b.MAX_LAYERS + 1), "c")
        b.check_config(dict(LLAMA, num_local_experts=b.MAX_EXPERTS), "c")
        with self.assertRaises(b.BoundsError):
            b.check_config(dict(LLAMA, num_local_experts=b.MAX_EXPERTS + 1), "c")
        b.check_config(dict(LLAMA, num_hidden_layers=64, num_local_experts=b.MAX_LAYER_EXPERTS // 64), "c")
        with self.assertRaises(b.BoundsError):
            b.check_config(dict(LLAMA, num_hidden_layers=64, num_local_experts=b.MAX_LAYER_EXPERTS // 64 + 1), "c")

    def test_nesting(self):
        d = tempfile.mkdtemp()
        try:
            for depth, ok in ((b.MAX_NESTING, True), (b.MAX_NESTING + 1, False)):
                p = write(os.path.join(d, "c.json"), "[" * depth + "]" * depth)
                if ok:
                    b.read_bounded_json(p, b.MAX_CONFIG_BYTES, "a model config")
                else:
                    with self.assertRaises(b.BoundsError):
                        b.read_bounded_json(p, b.MAX_CONFIG_BYTES, "a model config")
        finally:
            shutil.rmtree(d)

    def test_step(self):
        b.check_step(b.MAX_BATCH, 1)
        b.check_step(1, b.MAX_SEQ)
        for batch, seq in ((b.MAX_BATCH + 1, 1), (1, b.MAX_SEQ + 1), (0, 1), (b.MAX_BATCH, b.MAX_SEQ)):
            with self.assertRaises(b.BoundsError):
                b.check_step(batch, seq)

    def test_patterns(self):
        for ok in (r"model\.layers\.\d+\.(q|v)_proj", r".*\.(q_proj|v_proj)", "(ab){2}c*", ["q_proj", "v_proj"]):
            b.check_target_modules(ok, "a")
        for bad in ("(.*.*)*x", "(?:a+)+", "((ab)*c)*", "(a|b+)*", "x" * (b.MAX_PATTERN + 1), "(unclosed"):
            with self.subTest(pattern=bad[:40]):
                with self.assertRaises(b.BoundsError):
                    b.check_target_modules(bad, "a")


class RemoteCode(Base):
    """A config's folder never runs code: trust_remote_code stays off unless asked for."""

    def test_auto_map_not_run(self):
        folder = os.path.join(self.dir, "evil")
        os.makedirs(folder)
        marker = os.path.join(self.dir, "ran")
        code = f"open({marker!r}, 'w').write('ran')\nfrom transformers import PretrainedConfig\n" \
               "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n"
        write(os.path.join(folder, "configuration_evil.py"), code)
        write(os.path.join(folder, "modeling_evil.py"), code)
        write(os.path.join(folder, "config.json"), json.dumps({
            "model_type": "evil", "architectures": ["EvilModel"],
            "auto_map": {"AutoConfig": "configuration_evil.EvilConfig",
                         "AutoModelForCausalLM": "modeling_evil.EvilModel"}}))
        r, _ = self.export(folder, "-o", os.path.join(self.dir, "evil.pt2"), timeout=300)
        self.assertEqual(r.returncode, 2, r.stderr[-800:])
        self.assertNotIn("Traceback", r.stderr)
        self.assertFalse(os.path.exists(marker), "the config folder's code ran")


class ConfigReaderProperty(unittest.TestCase):
    """Random JSON (seeded): the bounded reader and check_config return or raise BoundsError, and
    load_config returns a config or raises ExportError; nothing else escapes."""

    SEED = 39

    def random_value(self, rng, depth=0):
        r = rng.random()
        if depth > 6 or r < 0.5:
            return rng.choice([0, 1, -1, 2 ** 63, -(2 ** 70), 1e308, float("inf"), 0.5, True, None, "", "x" * 300,
                               "\u0000\n\x1b", rng.randrange(-10 ** 6, 10 ** 6), "llama", "gpt2"])
        if r < 0.65:
            if rng.random() < 0.05:  # a deep chain: one child per level, past MAX_NESTING
                v = 1
                for _ in range(rng.randrange(60)):
                    v = [v]
                return v
            return [self.random_value(rng, depth + 1) for _ in range(rng.randrange(3))]
        keys = list(b.LAYER_KEYS + b.EXPERT_KEYS) + ["model_type", "text_config", "hidden_size", "vocab_size",
                                                     "num_attention_heads", "architectures", "x"]
        return {rng.choice(keys): self.random_value(rng, depth + 1) for _ in range(rng.randrange(3))}

    def random_text(self, rng):
        base = dict(LLAMA) if rng.random() < 0.5 else {}
        for _ in range(rng.randrange(6)):
            v = self.random_value(rng)
            base[rng.choice(list(LLAMA) + list(b.LAYER_KEYS) + ["text_config", "y"])] = v
        text = json.dumps(base, allow_nan=True)
        if rng.random() < 0.3 and text:  # a byte-level edit
            i = rng.randrange(len(text))
            text = text[:i] + rng.choice(["[", "]", "{", '"', "\\", "\xff", "9" * 5000, ""]) + text[i + 1:]
        return text

    def test_bounded_reader(self):
        rng = random.Random(self.SEED)
        d = tempfile.mkdtemp()
        try:
            path = os.path.join(d, "config.json")
            for i in range(3000):
                write(path, self.random_text(rng).encode("utf-8", "surrogatepass"))
                try:
                    data = b.read_bounded_json(path, b.MAX_CONFIG_BYTES, "a model config")
                    b.check_config(data, path)
                except b.BoundsError as e:
                    self.assertNotIn("\n", str(e), f"case {i}")
        finally:
            shutil.rmtree(d)

    def test_load_config(self):
        rng = random.Random(self.SEED + 1)
        d = tempfile.mkdtemp()
        try:
            path = os.path.join(d, "config.json")
            for i in range(60):
                write(path, self.random_text(rng).encode("utf-8", "surrogatepass"))
                try:
                    fexport.load_config(path)
                except fexport.ExportError as e:
                    self.assertNotIn("\n", str(e).strip(), f"case {i}")
        finally:
            shutil.rmtree(d)


if __name__ == "__main__":
    unittest.main()
