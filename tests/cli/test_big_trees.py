#!/usr/bin/python3
"""A chain 100,000 modules deep and a module with 100,000 children plan
correctly, without stack overflow and in bounded memory.

Python's picklers recurse, so the archives are written by hand: data.pkl as
raw pickle opcodes, code/ with the class declarations, no data/ records at all
(the structure-only loader never reads them).

Usage: test_big_trees.py FSDP_PLAN_BINARY
"""
import io
import json
import os
import resource
import struct
import subprocess
import sys
import tempfile
import unittest
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "app", "fsdp-plan")
N = 100_000
# Generous: a plan that is linear in the tree needs a small fraction of this;
# a quadratic one (a path string per module, say) needs tens of gigabytes.
MAX_RSS_BYTES = 2 << 30


class Pickle:
    """Just the opcodes these archives need (protocol 2)."""

    def __init__(self):
        self.out = io.BytesIO()
        self.out.write(b"\x80\x02")

    def raw(self, b):
        self.out.write(b)

    def string(self, text):  # BINUNICODE
        b = text.encode()
        self.raw(b"X" + struct.pack("<I", len(b)) + b)

    def begin_object(self, cls):  # GLOBAL __torch__ cls, EMPTY_TUPLE, NEWOBJ, EMPTY_DICT, MARK
        self.raw(b"c__torch__\n" + cls.encode() + b"\n)\x81}(")

    def end_object(self):  # SETITEMS, BUILD
        self.raw(b"ub")

    def tensor(self, numel):  # torch._utils._rebuild_tensor_v2 on storage "0"
        self.raw(b"ctorch._utils\n_rebuild_tensor_v2\n(")
        self.raw(b"(")
        self.string("storage")
        self.raw(b"ctorch\nFloatStorage\n")
        self.string("0")
        self.string("cpu")
        self.raw(b"J" + struct.pack("<i", numel) + b"tQ")  # BININT numel, TUPLE, BINPERSID
        self.raw(b"K\x00J" + struct.pack("<i", numel) + b"\x85K\x01\x85\x89")  # offset, (numel,), (1,), False
        self.raw(b"ccollections\nOrderedDict\n)Rt")
        self.raw(b"R")

    def bytes(self):
        return self.out.getvalue() + b"."


def write_archive(path, pickle, code):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("big/data.pkl", pickle.bytes())
        z.writestr("big/code/__torch__.py", code)
        z.writestr("big/constants.pkl", b"\x80\x02).")
        z.writestr("big/version", b"3\n")


def deep_chain(path, depth):
    """Chain -> child Chain -> ... ; the last one holds a weight of 6 elements."""
    p = Pickle()
    for i in range(depth):
        p.begin_object("Chain")
        p.string("training")
        p.raw(b"\x88")
        p.string("weight")
        if i == depth - 1:
            p.tensor(6)
            p.string("child")
            p.raw(b"N")
        else:
            p.raw(b"N")
            p.string("child")
    p.raw(b"ub" * depth)
    code = ("class Chain(Module):\n  __parameters__ = [\"weight\", ]\n  __buffers__ = []\n"
            "  weight : Optional[Tensor]\n  training : bool\n  child : Optional[__torch__.Chain]\n")
    write_archive(path, p, code)


def wide(path, width):
    """Wide with `width` Leaf children c0..c{width-1}, each with a weight of 2 elements."""
    p = Pickle()
    p.begin_object("Wide")
    p.string("training")
    p.raw(b"\x88")
    for i in range(width):
        p.string(f"c{i}")
        p.begin_object("Leaf")
        p.string("training")
        p.raw(b"\x88")
        p.string("weight")
        p.tensor(2)
        p.end_object()
        if i % 500 == 499:  # keep the MARK stack shallow: flush items in batches
            p.raw(b"u(")
    p.end_object()
    leaf = ("class Leaf(Module):\n  __parameters__ = [\"weight\", ]\n  __buffers__ = []\n"
            "  weight : Tensor\n  training : bool\n")
    root = ["class Wide(Module):\n  __parameters__ = []\n  __buffers__ = []\n  training : bool\n"]
    root += [f"  c{i} : __torch__.Leaf\n" for i in range(width)]
    write_archive(path, p, leaf + "".join(root))


def run(*args):
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    r = subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=300)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return r, max(before, peak_kib) * 1024


class BigTrees(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.deep = os.path.join(cls.tmp.name, "deep.pt")
        cls.wide = os.path.join(cls.tmp.name, "wide.pt")
        deep_chain(cls.deep, N)
        wide(cls.wide, N)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_deep_chain(self):
        r, rss = run(self.deep, "-f", "json", "--world-size", "8")
        self.assertEqual(r.returncode, 0, r.stderr[:500])
        plan = json.loads(r.stdout)
        self.assertEqual(plan["model"]["num_modules"], N)
        self.assertEqual(len(plan["units"]), 1)
        self.assertEqual(plan["units"][0]["params"][0]["name"], "child." * (N - 1) + "weight")
        self.assertLess(rss, MAX_RSS_BYTES)

    def test_deep_chain_with_a_policy(self):
        # Selection, ignored-module resolution and grouping all walk the whole chain.
        policy = os.path.join(self.tmp.name, "deep.json")
        with open(policy, "w") as f:
            json.dump({"min_num_params": 1, "ignored_modules": ["child.child.child"]}, f)
        r, rss = run(self.deep, "--policy", policy)
        self.assertEqual(r.returncode, 0, r.stderr[:500])
        self.assertIn("100000 modules", r.stdout)
        self.assertIn("6 ignored", r.stdout)
        self.assertLess(rss, MAX_RSS_BYTES)

    def test_wide_module(self):
        policy = os.path.join(self.tmp.name, "leaf.json")
        with open(policy, "w") as f:
            json.dump({"module_classes": ["Leaf"]}, f)
        r, rss = run(self.wide, "--policy", policy, "-f", "json", "--world-size", "8")
        self.assertEqual(r.returncode, 0, r.stderr[:500])
        plan = json.loads(r.stdout)
        self.assertEqual(len(plan["units"]), N + 1)
        self.assertEqual(plan["units"][-1]["path"], f"c{N - 1}")
        self.assertEqual(plan["units"][-1]["params"][0]["name"], f"c{N - 1}.weight")
        self.assertEqual(plan["model"]["param_numel"], 2 * N)
        self.assertLess(rss, MAX_RSS_BYTES)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = sys.argv.pop(1)
    unittest.main(verbosity=2)
