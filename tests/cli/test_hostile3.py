#!/usr/bin/env python3
"""Issue 39 (hostile input, round three), by its item numbers: each input runs
under test_hostile.py's limits (10 s of CPU, 1 GiB) and is planned or refused
in one line with exit 2; none exits 3, none plans a wrapped number.

Item 3 (mesh sizes) is the mesh helper's; item 6 (the exporter) is
tests/python/test_export_bounds.py.

Usage: test_hostile3.py FSDP_PLAN_BINARY   (the venv's Python)
"""
import json
import os
import sys
import unittest
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile_inputs as h  # noqa: E402
import test_hostile as th  # noqa: E402

ROOT = h.ROOT
DYN = os.path.join(ROOT, "tests", "export", "data", "llama_dyn.pt2")
PT2_JSON = "tiny_gpt/models/model.json"


def tp_policy(plan, **extra):
    return {"fsdp": {"version": 2}, "tensor_parallel": dict({"degree": 2, "plan": plan}, **extra)}


class Base(th.Base):
    def write_json(self, name, doc):
        h.write(self.path(name), json.dumps(doc))
        return name

    def planned(self, argv, codes=(0, 1)):
        """Planned (exit 0 or 1: a warning the gate fails on), within the limits, something on stdout."""
        r = th.Run(argv, self.dir)
        what = " ".join(argv)[:120]
        self.assertGreaterEqual(r.code, 0, f"{what}: killed by signal {-r.code}: {r.stderr[-500:]}")
        self.assertIn(r.code, codes, f"{what}: {r.stderr[-800:]}")
        self.assertLessEqual(r.max_rss, th.MEMORY * (3 if th.ASAN else 1), what)
        return r

    def usage_refused(self, argv, *fragments):
        """An option's value refused: exit 2, one line, no stack trace, nothing written."""
        r = th.Run(argv, self.dir)
        what = " ".join(argv)[:120]
        self.assertEqual(r.code, 2, f"{what}: {r.stderr[-500:]}")
        lines = r.stderr.strip().splitlines()
        self.assertTrue(lines and all("Traceback" not in ln for ln in lines), what)
        for f in fragments:
            self.assertIn(f, r.stderr, what)
        self.assertEqual(r.stdout, "", what)
        return r.stderr

    def pt2_with(self, name, change, source=h.PT2, record=PT2_JSON):
        """source with its model.json changed by change(doc)."""
        with zipfile.ZipFile(source) as z:
            doc = json.loads(z.read(record))
        change(doc)
        h.write_zip(self.path(name), h.replaced(source, record, json.dumps(doc).encode()))
        return name


class Item1Globs(Base):
    """tensor_parallel.plan keys: linear-time glob matching, keys not matched quadratically."""

    def test_stars(self):
        for stars in (60, 4000):
            with self.subTest(stars=stars):
                pol = self.write_json(f"stars{stars}.json", tp_policy({"*" * stars + "X": "colwise"}))
                self.planned([h.GPT, "--policy", pol, "--world-size", "4"])

    def test_many_keys(self):
        for n in (20000, 100000):
            with self.subTest(keys=n):
                plan = {f"blocks.{i}.attn.nothing{i}": "colwise" for i in range(n)}
                pol = self.write_json(f"keys{n}.json", tp_policy(plan))
                self.planned([h.GPT, "--policy", pol, "--world-size", "4", "-f", "json"])
        plan = {f"k{i}": "colwise" for i in range(100001)}
        pol = self.write_json("keys100001.json", tp_policy(plan))
        self.refused([h.GPT, "--policy", pol, "--world-size", "4"], pol, "100001 keys, more than a plan can (100000)")


class Item2GraphBytes(Base):
    """Graph tensors: every size and byte product checked."""

    def logits(self, sizes, strides):
        def change(doc):
            tv = doc["graph_module"]["graph"]["tensor_values"]["linear_12"]
            tv["sizes"] = [{"as_int": s} for s in sizes]
            tv["strides"] = [{"as_int": s} for s in strides]
        return change

    def test_huge_logits(self):
        name = self.pt2_with("huge.pt2", self.logits([1, 1, 1 << 62], [1 << 62, 1 << 62, 1]))
        self.refused([name], name, "tensor linear_12 would hold", "2^48 bytes")
        self.refused(["suggest", name, "--budget", "10MiB"], name, "tensor linear_12 would hold")

    def test_negative_size(self):
        name = self.pt2_with("negative.pt2", self.logits([2, 16, -512], [8192, 512, 1]))
        self.refused([name], name, "negative size")

    def test_negative_size_expression(self):
        """A size expression negative at the traced sizes (the loader reads expressions unevaluated)."""
        def change(doc):
            tv = doc["graph_module"]["graph"]["tensor_values"]["to_14"]
            tv["sizes"][1] = {"as_expr": {"expr_str": "Add(Symbol('s38', positive=True, integer=True), "
                                                      "Integer(-100000))", "hint": {"as_int": -99968}}}
        name = self.pt2_with("negative_expr.pt2", change, source=DYN, record="llama_dyn/models/model.json")
        self.refused([name], name, "tensor to_14 has the negative size")
        self.refused([name, "--dim", "seq=64"], name, "tensor to_14 has the negative size")


class Item4Exit3(Base):
    """What exited 3 (an internal error) on input."""

    def test_dim_without_bound(self):
        for dim in ("batch", "seq"):
            with self.subTest(dim=dim):
                self.refused([DYN, "--dim", f"{dim}={1 << 40}"], DYN, "would hold")

    def flops(self, name, modules):
        return self.write_json(name, {"modules": modules})

    def test_flops_children(self):
        # Not backward: real FlopCounterMode profiles give a child more than its parent.
        for field in ("forward", "recompute"):
            with self.subTest(field=field):
                root = {"forward": 100, "backward": 200, "recompute": 50}
                child = dict(root, **{field: root[field] + 1})
                f = self.flops(f"child_{field}.json", {"": root, "blocks.0": child})
                self.refused([h.GPT, "--flops", f], f, f"its submodules' {field} FLOPs add up to more than its own")
        big = 1 << 62
        f = self.flops("wrap.json", {"": {"forward": big, "backward": big},
                                     "blocks.0": {"forward": big, "backward": 1},
                                     "blocks.1": {"forward": big, "backward": 1}})
        self.refused([h.GPT, "--flops", f], f, "forward FLOPs add up to more")

    def test_output_over_flops(self):
        f = self.flops("flops.json", {"": {"forward": 100, "backward": 200}})
        for argv in ([h.GPT, "--flops", f, "-o", f], ["suggest", h.GPT, "--budget", "1GiB", "--flops", f, "-o", f]):
            with self.subTest(argv=argv[0]):
                self.refused(argv, f, "is the FLOP profile (--flops)")
        with open(self.path(f)) as fh:
            self.assertIn('"forward": 100', fh.read())


class Item5TreeJson(Base):
    def test_num_tensors_up_front(self):
        doc = {"tree_format": 1, "modules": [{"path": "", "type": "Net", "params": [], "buffers": []}],
               "num_tensors": 15_000_000, "padding": "x" * (15 << 20)}
        name = self.write_json("tensors.tree.json", doc)
        self.refused([name], name, "num_tensors is 15000000, but the modules hold 0 parameter and buffer slots")


class Item7Smaller(Base):
    def test_layout_and_sequence_dim(self):
        cases = {
            "layout_huge.json": ({"blocks.*.mlp.fc2": {"style": "rowwise", "output_layouts": "shard(99999999999999999999)"}},
                                 "must be \"replicate\" or \"shard(DIM)\""),
            "layout_64.json": ({"blocks.*.mlp.fc2": {"style": "rowwise", "output_layouts": "shard(64)"}},
                               "must be \"replicate\" or \"shard(DIM)\""),
            "seqdim.json": ({"blocks.*.ln1": {"style": "sequence_parallel", "sequence_dim": 100}},
                            "a tensor has at most 64 dimensions"),
            "seqdim_huge.json": ({"blocks.*.ln1": {"style": "sequence_parallel", "sequence_dim": 2 ** 64 - 1}},
                                 "a tensor has at most 64 dimensions"),
        }
        for name, (plan, fragment) in cases.items():
            with self.subTest(name=name):
                self.write_json(name, tp_policy(plan))
                self.refused([h.GPT, "--policy", name, "--world-size", "4"], name, fragment)

    def test_efficiency(self):
        """A denormal efficiency or bandwidth (the command line's reader refuses one as out of range;
        a policy's JSON reads it) made an infinite step time."""
        for key, value, fragment in (("compute_efficiency", 1e-310, "from 0.001 to 1"),
                                     ("comm_efficiency", 5e-324, "from 0.001 to 1"),
                                     ("memory_efficiency", 0.0009, "from 0.001 to 1"),
                                     ("intra_node_bandwidth", 1e-300, "at least 0.001")):
            with self.subTest(key=key):
                pol = self.write_json(f"{key}.json", {"hardware": {key: value}})
                self.refused([h.GPT, "--policy", pol], pol, fragment)
        self.usage_refused([h.GPT, "--intra-node-bandwidth", "1e-300"], "at least 0.001")
        pol = self.write_json("efficiency_floor.json", {"hardware": {"compute_efficiency": 0.001}})
        self.planned([h.GPT, "--policy", pol])

    def test_activation_bytes(self):
        for cmd in ([h.GPT], ["suggest", h.GPT, "--budget", "80GiB"]):
            with self.subTest(cmd=cmd[0]):
                self.usage_refused([*cmd, "--activation-bytes", str(2 ** 63 - 1)], "more than an allowance can be")
        self.planned([h.GPT, "--activation-bytes", "4PiB", "-f", "json"])

    def test_plan_key_control_characters(self):
        pol = self.write_json("newline.json", tp_policy({"blocks.0.attn\n.q": "colwise"}))
        self.refused([h.GPT, "--policy", pol, "--world-size", "4", "--emit", "torch"], pol,
                     "has a control character: not a module path pattern")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        th.BINARY = os.path.abspath(sys.argv.pop(1))
    th.ASAN = th.sanitized(th.BINARY)
    unittest.main(verbosity=2)
