#!/usr/bin/python3
"""The text plan's communication and step-time lines (issue 27), checked against the same plan's JSON:
bytes per collective kind (exact), the step-time line marked as an ESTIMATE with its preset and
efficiencies, what it says without FLOPs, --wide's per-unit columns, and FSDP_PLAN_SKIP_TIME.

Usage: test_time_text.py FSDP_PLAN_BINARY
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "app", "fsdp-plan")
GPT = os.path.join(ROOT, "sample_models", "tiny_gpt.pt")
POLICY = os.path.join(ROOT, "policies", "transformer.json")


def fmt_bytes(n: int) -> str:
    """lib/util/strings.cpp format_bytes: 1024-based, one decimal (printf, ties to even)."""
    names = [" B", " KiB", " MiB", " GiB", " TiB", " PiB"]
    v, u = float(n), 0
    while v >= 1024 and u + 1 < len(names):
        v /= 1024
        u += 1
    return str(n) + names[0] if u == 0 else "%.1f%s" % (v, names[u])


def run(*args, env=None):
    r = subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **(env or {})})
    return r


def text_and_json(*args, env=None):
    t = run(GPT, "--policy", POLICY, *args, env=env)
    j = run(GPT, "--policy", POLICY, *args, "--format", "json", env=env)
    assert t.returncode == 0, t.stderr
    assert j.returncode == 0, j.stderr
    return t.stdout, json.loads(j.stdout)


def joined(text: str, prefix: str) -> str:
    """The line starting with `prefix` and its wrapped continuation lines (indented by 10), as one line."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith(prefix):
            out = line
            for more in lines[i + 1:]:
                if not more.startswith(" " * 10) or more.strip() == "":
                    break
                out += " " + more.strip()
            return out
    raise AssertionError(f"no line starting {prefix!r} in:\n{text}")


class TimeText(unittest.TestCase):
    def test_comm_line_bytes_by_kind(self):
        text, plan = text_and_json("--world-size", "8")
        s = plan["comm"]["per_step"]
        ag_f, ag_b = s["all_gather"]["forward"], s["all_gather"]["backward"]
        want = (f"comm    per rank per step, exact bytes: all-gather {fmt_bytes(ag_f + ag_b)} (forward "
                f"{fmt_bytes(ag_f)}, backward {fmt_bytes(ag_b)}), reduce-scatter "
                f"{fmt_bytes(s['reduce_scatter']['backward'])}; {s['calls']} collectives")
        self.assertEqual(joined(text, "comm    "), want)
        self.assertGreater(ag_f, 0)
        self.assertNotIn("all-reduce", want)

    def test_hsdp_all_reduce(self):
        text, plan = text_and_json("--world-size", "16", "--sharding-strategy", "HYBRID_SHARD",
                                   "--shard-group-size", "8")
        ar = plan["comm"]["per_step"]["all_reduce"]["backward"]
        self.assertGreater(ar, 0)
        self.assertIn(f"all-reduce {fmt_bytes(ar)}; ", joined(text, "comm    "))

    def test_one_rank(self):
        text, plan = text_and_json("--world-size", "1")
        line = joined(text, "comm    ")
        self.assertTrue(line.endswith("each in a one-rank group (it moves nothing)"), line)
        self.assertNotIn("all-gather", line)  # NO_SHARD at one rank: its all-reduces only

    def test_time_line_without_flops(self):
        text, plan = text_and_json("--world-size", "8")
        t = plan["time"]
        self.assertFalse(t["flops_known"])
        line = joined(text, "time    ")
        self.assertTrue(line.startswith("time    ESTIMATE: exposed communication "), line)
        self.assertIn("no step time: no FLOPs in a TorchScript file (--flops FILE)", line)
        self.assertIn("H100 SXM5 80GB (--hardware h100), efficiency 0.5 compute, 0.8 comm", line)
        self.assertNotIn(" step ", line.replace("no step time", ""))

    def test_time_line_with_flops_and_overrides(self):
        with tempfile.TemporaryDirectory() as d:
            flops = os.path.join(d, "flops.json")
            # FLOPs per module (hierarchical: a module's figure includes its submodules').
            mods = {"": {"forward": 4_000_000_000, "backward": 8_000_000_000}}
            for i in range(3):
                mods[f"blocks.{i}"] = {"forward": 1_000_000_000, "backward": 2_000_000_000}
            with open(flops, "w") as f:
                json.dump({"modules": mods}, f)
            text, plan = text_and_json("--world-size", "8", "--flops", flops, "--hardware", "a100",
                                       "--efficiency", "0.4")
        t = plan["time"]
        self.assertTrue(t["flops_known"])
        line = joined(text, "time    ")
        m = re.match(r"time    ESTIMATE: step (\S+ \S+) = compute (\S+ \S+) \+ exposed communication (\S+ \S+) "
                     r"\+ optimizer (\S+ \S+); (.*)$", line)
        self.assertIsNotNone(m, line)
        self.assertIn("(--hardware a100), efficiency 0.4 compute, 0.8 comm", m.group(5))
        self.assertIn("overridden: compute_efficiency", m.group(5))
        self.assertIn("FLOPs from --flops " + flops, m.group(5))

        def seconds(s):
            v, unit = s.split()
            return float(v) * {"s": 1, "ms": 1e-3, "us": 1e-6}[unit]
        # Each figure as printed is the JSON's, to the printed precision (three figures).
        for got, key in zip(m.groups()[:4], ("step_s", "compute_s", "exposed_comm_s", "optimizer_s")):
            self.assertAlmostEqual(seconds(got), t[key], delta=max(t[key] * 0.006, 1e-8), msg=key)

    def test_wide_columns(self):
        default, _ = text_and_json("--world-size", "8")
        wide, plan = text_and_json("--world-size", "8", "--wide")
        self.assertNotIn("comm/step", default)
        header = next(line for line in wide.splitlines() if line.lstrip().startswith("#  unit"))
        self.assertIn("comm/step", header)
        self.assertIn("exposed est", header)
        rows = [line for line in wide.splitlines() if re.match(r"^ +\d+  ", line)]
        self.assertEqual(len(rows), len(plan["units"]))
        for row, u in zip(rows, plan["units"]):
            c = u["comm"]
            total = c["all_gather_forward_bytes"] + c["all_gather_backward_bytes"] + c["reduce_scatter_bytes"] + \
                c["all_reduce_bytes"]
            self.assertIn(" " + (fmt_bytes(total) if total else "-") + " ", row + " ", row)
            t = u["time"]
            exposed = t["exposed_forward_s"] + t["exposed_backward_s"] + t["exposed_tail_s"]
            self.assertRegex(row, r" (\d+(\.\d+)? (s|ms|us)|0 s)$" if exposed > 0 else r" 0 s$")

    def test_default_stays_compact(self):
        text, _ = text_and_json("--world-size", "8")
        self.assertEqual(sum(1 for line in text.splitlines() if line.startswith(("comm    ", "time    "))), 2)
        # Each is at most 100 columns, continuation lines included.
        self.assertTrue(all(len(line) <= 100 for line in text.splitlines()), text)

    def test_skip_switch(self):
        text, plan = text_and_json("--world-size", "8", env={"FSDP_PLAN_SKIP_TIME": "1"})
        self.assertNotIn("comm    ", text)
        self.assertNotIn("time    ", text)
        self.assertNotIn("comm", plan)
        self.assertNotIn("time", plan)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = sys.argv.pop(1)
    unittest.main()
