#!/usr/bin/env python3
"""Issue 29's "done when", checked: every hostile input of the issue (and the
fuzzers' finds in tests/fuzz/regressions/) runs under a 10 s CPU / 1 GiB
limit (resource.setrlimit in the child), exits 2 with one line on stderr
naming the file, no signal, no exit 3, no stack trace, nothing on stdout and
no output file. Then each reader's documented limit (docs/limits.md) at the
limit and one past it; the YAML reader against the venv's PyYAML (safe_load,
which Accelerate reads configs with); fsdp_ignored_modules against Python's
re.fullmatch; and the issue's experiment of 20 random one-byte edits of a
code/ record, against torch.jit.load.

Usage: test_hostile.py FSDP_PLAN_BINARY   (the venv's Python: PyYAML, torch)
"""
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile_inputs as h  # noqa: E402

ROOT = h.ROOT
BINARY = os.path.join(ROOT, "build", "app", "fsdp-plan")
REGRESSIONS = os.path.join(ROOT, "tests", "fuzz", "regressions")
CPU_SECONDS = 10
MEMORY = 1 << 30


def sanitized(binary):
    """AddressSanitizer reserves terabytes of address space: RLIMIT_AS cannot apply to it."""
    with open(binary, "rb") as f:
        return b"__asan_init" in f.read()


class Run:
    def __init__(self, argv, cwd, stdin=None, pass_fds=()):
        limit_memory = not ASAN

        def limits():
            resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS * (6 if ASAN else 1),) * 2)
            if limit_memory:
                resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))

        before = set(os.listdir(cwd))
        p = subprocess.Popen([BINARY, *argv], cwd=cwd, stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             preexec_fn=limits, pass_fds=pass_fds)
        out, err = p.communicate(timeout=CPU_SECONDS * (12 if ASAN else 3))
        self.code = p.returncode
        self.stdout = out.decode("utf-8", "replace")
        self.stderr = err.decode("utf-8", "replace")
        self.left = set(os.listdir(cwd)) - before
        # The largest child so far: every run must stay under the limit, so the running maximum does.
        self.max_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


ASAN = False


class Base(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="hostile-")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.dir, name)

    def refused(self, argv, file, *fragments, **kw):
        """Exit 2, one line 'fsdp-plan: error: FILE: ...' holding each fragment, within the limits."""
        r = Run(argv, self.dir, **kw)
        what = " ".join(argv)[:120]
        self.assertGreaterEqual(r.code, 0, f"{what}: killed by signal {-r.code}: {r.stderr[-500:]}")
        self.assertNotEqual(r.code, 3, f"{what}: internal error: {r.stderr}")
        self.assertEqual(r.code, 2, f"{what}: {r.stderr[-500:]}")
        self.assertEqual(r.stdout, "", what)
        lines = r.stderr.splitlines()
        self.assertEqual(len(lines), 1, f"{what}: {r.stderr[:1000]}")
        self.assertTrue(lines[0].startswith(f"fsdp-plan: error: {file}: "), f"{what}: {lines[0][:300]}")
        self.assertTrue(all(32 <= ord(c) < 127 for c in lines[0]), f"{what}: not printable ASCII: {lines[0]!r:.300}")
        self.assertLessEqual(len(lines[0]), 4300, what)
        self.assertNotIn("Traceback", r.stderr)
        for fragment in fragments:
            self.assertIn(fragment, lines[0], what)
        self.assertEqual(r.left, set(), f"{what}: left files behind")
        self.assertLessEqual(r.max_rss, MEMORY * (3 if ASAN else 1), f"{what}: {r.max_rss} bytes")
        return lines[0]


class Hostile(Base):
    """Issue 29's inputs, by its item numbers."""

    # --- items 1, 2, 8: YAML ---

    def test_yaml(self):
        cases = {
            "self_alias.yaml": ("x: &a [*a]\n", "recursive structure"),
            "self_merge.yaml": ("fsdp_config: &f\n  <<: *f\n", "recursive structure"),
            "laughs6.yaml": (h.laughs(6), "values once its aliases are expanded"),
            "laughs10.yaml": (h.laughs(10), "values once its aliases are expanded"),
            "unterminated.yaml": ('mixed_precision: "bf16\n', "found unexpected end of stream (line 4, column 1)"),
            "python_tag.yaml": ('x: !!python/object/apply:os.system ["echo hi"]\n',
                                "could not determine a constructor for the tag"),
            "documents.yaml": ("---\ndistributed_type: FSDP\n", "expected a single document in the stream"),
            "escape_key.yaml": ("x\x1b[31m: 1\n", "unacceptable character #x001b"),
            "nul.yaml": ('x: "\x00"\n', "unacceptable character #x0000"),
            "tab.yaml": ("mixed_precision:\tbf16\n", "found character '\\t' that cannot start any token"),
            "deep.yaml": ("x: " + "[" * 100000 + "]" * 100000 + "\n", "nested more than 64 deep"),
            "undefined_alias.yaml": ("x: *nowhere\n", "found undefined alias 'nowhere'"),
        }
        for name, (body, fragment) in cases.items():
            with self.subTest(name=name):
                h.accelerate(self.path(name), body)
                self.refused([h.GPT, "--policy", name], name, fragment)
        with self.subTest(name="bad-utf8"):
            h.write(self.path("utf8.yaml"), b"distributed_type: FSDP\nx: \xff\n")
            self.refused([h.GPT, "--policy", "utf8.yaml"], "utf8.yaml", "invalid start byte")

    # --- item 3: regular expressions ---

    def test_regex(self):
        cases = {
            "nested": ("(" * 30000 + "x" + ")" * 30000, "nests groups more than 100 deep"),
            "backref": (r"(blocks)\.\1", "a backreference (\\1)"),
            "lookahead": (r"blocks\.(?!0)\d+", "a lookahead ((?!...)"),
            "lookbehind": (r"(?<=blocks\.)\d+", "a lookbehind ((?<=...)"),
            "atomic": (r"(?>blocks)\.\d+", "an atomic group"),
            "possessive": (r"blocks\.\d++", "a possessive quantifier"),
            "repeat": (r"blocks\.\d{1001}", "a repetition count above 1000"),
        }
        for name, (pattern, fragment) in cases.items():
            with self.subTest(name=name):
                h.accelerate(self.path(name + ".yaml"), "fsdp_config:\n  fsdp_ignored_modules: '%s'\n" % pattern)
                self.refused([h.GPT, "--policy", name + ".yaml"], name + ".yaml", fragment)

    # --- item 4: non-regular files ---

    def test_non_regular_files(self):
        for argv, file in ((["--policy", "/dev/zero"], "/dev/zero"), (["--policy", "/dev/urandom"], "/dev/urandom"),
                           (["--expect", "/dev/zero"], "/dev/zero")):
            with self.subTest(argv=argv):
                self.refused([h.GPT, *argv], file, "is a device, not a file")
        with self.subTest(argv="diff"):
            self.refused(["diff", "/dev/zero", h.PLAN], "/dev/zero", "is a device, not a file")
        with self.subTest(argv="endless pipe"):
            r, w = os.pipe()
            writer = subprocess.Popen(["yes", "{}"], stdout=w, stderr=subprocess.DEVNULL)
            os.close(w)
            try:
                self.refused([h.GPT, "--policy", f"/dev/fd/{r}"], f"/dev/fd/{r}", "more than a policy can be (16 MiB)",
                             pass_fds=(r,))
            finally:
                writer.kill()
                writer.wait()
                os.close(r)

    # --- items 5, 7: deflate bombs, --loader jit ---

    def test_bombs(self):
        h.pt_bomb(self.path("bomb_pkl.pt"), "tiny_gpt/data.pkl")
        h.pt_bomb(self.path("bomb_code.pt"), h.MODELS_PY)
        h.pt2_bomb(self.path("bomb.pt2"))
        for name, fragment in (("bomb_pkl.pt", "record data.pkl claims to be 1073741824 bytes"),
                               ("bomb_code.pt", "record code/__torch__/models.py claims to be 1073741824 bytes"),
                               ("bomb.pt2", "record models/model.json claims to be 1073741824 bytes")):
            with self.subTest(name=name):
                self.refused([name], name, fragment, "a deflate bomb?")
        for name in ("bomb_pkl.pt", "bomb_code.pt"):
            with self.subTest(name=name + " --loader jit"):
                self.refused([name, "--loader", "jit"], name, "a deflate bomb?")
        h.deep_parens(self.path("deep_parens.pt"))
        for loader in ("archive", "jit"):
            with self.subTest(name="deep parentheses", loader=loader):
                self.refused(["deep_parens.pt", "--loader", loader], "deep_parens.pt",
                             "record code/__torch__/models.py nests brackets more than 100 deep")

    # --- item 6: damaged code/ records ---

    def test_damaged_code(self):
        edits = {
            "module1.pt": (b"class Block(Module):", b"class Block(Module1:", 'malformed class header "class Block(Module1:"'),
            "semicolon.pt": (b"  blocks : ", b"  blocks ; ", 'malformed class attribute "  blocks ; '),
            "renamed.pt": (b"  blocks : ", b"  blockz : ", "data.pkl lacks attribute blockz of __torch__.models.TinyGPT"),
            "constant.pt": (b"  blocks : ", b"  blocks = ", "data.pkl holds attribute blocks of __torch__.models.TinyGPT"),
            "buffer.pt": (b'__buffers__ = ["mask", ]', b'__buffers__ = ["masq", ]', "__buffers__ names masq"),
            "slot.pt": (b"  mlp : __torch__.models.MLP", b"  mlp : __torch__.models.MLQ",
                        "attribute mlp of __torch__.models.Block is declared as __torch__.models.MLQ"),
        }
        for name, (old, new, fragment) in edits.items():
            with self.subTest(name=name):
                h.edited_code(self.path(name), lambda d: d.replace(old, new, 1))
                self.refused([name], name, fragment)

    def test_random_code_edits(self):
        """The issue's experiment: 20 random one-byte edits of models.py (CRCs right). torch.jit.load refuses
        all 20; fsdp-plan must refuse every edit that changes the tree (6 of 20 changed it with exit 0)."""
        good = Run([h.GPT, "--dump-tree"], self.dir)
        self.assertEqual(good.code, 0, good.stderr)
        edits = h.one_byte_edits(seed=29, count=20)
        refused = same = 0
        for i, (at, byte) in enumerate(edits):
            name = f"edit{i}.pt"

            def edit(d, at=at, byte=byte):
                return d[:at] + bytes([byte]) + d[at + 1:]
            h.edited_code(self.path(name), edit)
            r = Run([name, "--dump-tree"], self.dir)
            self.assertIn(r.code, (0, 2), f"{name}: {r.stderr}")
            if r.code == 2:
                refused += 1
                self.assertTrue(r.stderr.startswith(f"fsdp-plan: error: {name}: "), r.stderr)
            else:
                same += 1
                self.assertEqual(r.stdout, good.stdout, f"{name}: offset {at} -> {byte:#x} changed the tree with exit 0")
        print(f"\n20 one-byte edits of models.py: {refused} refused, {same} planned the same tree", file=sys.stderr)
        try:
            import torch
        except ImportError:
            return
        jit_refused = 0
        for i in range(len(edits)):
            try:
                torch.jit.load(self.path(f"edit{i}.pt"))
            except Exception:
                jit_refused += 1
        print(f"torch.jit.load {torch.__version__}: {jit_refused} of 20 refused", file=sys.stderr)

    # --- item 9: plan files ---

    def test_plans(self):
        def twice(doc):
            doc["units"] = doc["units"] + doc["units"]

        def numel(v):
            def change(doc):
                doc["units"][0]["params"][0]["numel"] = v
            return change

        def escape(doc):
            doc["units"][1]["path"] = "\x1b[2J" + doc["units"][1]["path"]
        cases = {
            "twice.json": (twice, "units[%d].path \"\" is listed twice" % len(h.plan_doc()["units"])),
            "numel_list.json": (numel([]), "units[0].params[0].numel is not a whole number"),
            "numel_huge.json": (numel(2 ** 64 + 7), "units[0].params[0].numel is not a whole number"),
            "escape.json": (escape, "units[1].path holds a control character"),
        }
        for name, (change, fragment) in cases.items():
            h.plan_with(self.path(name), change)
            with self.subTest(name=name, how="diff"):
                self.refused(["diff", name, h.PLAN], name, fragment)
            with self.subTest(name=name, how="--expect"):
                self.refused([h.GPT, "--expect", name], name, fragment)
        h.write(self.path("dup.json"), '{"schema_version": 1,\n "schema_version": 1}')
        self.refused(["diff", "dup.json", h.PLAN], "dup.json", 'key "schema_version" given twice in one object (line 2)')

    # --- items 10-14 ---

    def test_numbers_and_names(self):
        for option in ("--max-root-share", "--warn-root-share"):
            for value in ("nan", "inf", "-inf", "NaN"):
                with self.subTest(option=option, value=value):
                    r = Run([h.GPT, option, value], self.dir)
                    self.assertEqual(r.code, 2, r.stderr)
                    self.assertIn(f"must be a share from 0 to 1, not {value}", r.stderr)
        h.write(self.path("esc.json"), json.dumps({"module_classes": ["\x1b[31mBlock"]}))
        self.refused([h.GPT, "--policy", "esc.json"], "esc.json", 'holds "\\x1b[31mBlock", which has a control character')
        h.write(self.path("dup_key.json"), '{"module_classes": ["Block"],\n "module_classes": ["MLP"]}')
        self.refused([h.GPT, "--policy", "dup_key.json"], "dup_key.json",
                     'key "module_classes" given twice in one object (line 2)')
        h.write(self.path("hsdp.yaml"), "distributed_type: FSDP\nnum_processes: 8\nnum_machines: 3\n"
                "fsdp_config:\n  fsdp_sharding_strategy: HYBRID_SHARD\n")
        self.refused([h.GPT, "--policy", "hsdp.yaml"], "hsdp.yaml", "num_processes 8 is not a multiple of num_machines 3")
        # A 50 MB class name: over the file limit; a 10 MB one: over the string limit, echoed in 200 bytes.
        h.write(self.path("name50.json"), json.dumps({"module_classes": ["B" * 50_000_000]}))
        self.refused([h.GPT, "--policy", "name50.json"], "name50.json", "more than a policy can be (16 MiB)")
        h.write(self.path("name10.json"), json.dumps({"module_classes": ["B" * 10_000_000]}))
        line = self.refused([h.GPT, "--policy", "name10.json"], "name10.json", "holds a string of 10000000 bytes")
        self.assertLess(len(line), 600)
        h.write(self.path("key10.json"), json.dumps({"x" * 10_000_000: 1}))
        line = self.refused([h.GPT, "--policy", "key10.json"], "key10.json", "unknown key")
        self.assertLess(len(line), 600)

    # --- the fuzzers' finds ---

    def test_fuzz_regressions(self):
        how = {"archive": lambda f: [f], "unpickler": None, "export": lambda f: [f],
               "policy": lambda f: [h.GPT, "--policy", f], "yaml": lambda f: [h.GPT, "--policy", f],
               "plan": lambda f: ["diff", f, h.PLAN]}
        for kind in sorted(os.listdir(REGRESSIONS)):
            make = how.get(kind)
            if make is None:
                continue  # data.pkl alone is no file the binary reads
            for name in sorted(os.listdir(os.path.join(REGRESSIONS, kind))):
                with self.subTest(kind=kind, name=name):
                    src = os.path.join(REGRESSIONS, kind, name)
                    r = Run(make(src), self.dir)
                    self.assertIn(r.code, (0, 1, 2), f"{kind}/{name}: {r.stderr[-500:]}")
                    if r.code == 2:
                        self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr[:500])
                    self.assertLessEqual(r.max_rss, MEMORY * (3 if ASAN else 1))


class Limits(Base):
    """docs/limits.md: each reader's limit, at the limit (not refused for it) and one past it (refused)."""

    def at_and_past(self, make, argv, file, fragment):
        """make(n) writes the input at size n; n = 0 is at the limit, 1 one past it."""
        make(0)
        r = Run(argv, self.dir)
        self.assertNotIn(fragment, r.stderr, "refused at the limit")
        self.assertIn(r.code, (0, 1, 2), r.stderr[-300:])
        self.assertLessEqual(r.max_rss, MEMORY * (3 if ASAN else 1))
        make(1)
        self.refused(argv, file, fragment)

    def test_policy_file_size(self):
        def make(extra):
            text = '{"module_classes": ["Block"]}'
            h.write(self.path("big.json"), text + " " * ((16 << 20) - len(text) + extra))
        self.at_and_past(make, [h.GPT, "--policy", "big.json"], "big.json", "more than a policy can be (16 MiB)")

    def test_plan_file_size(self):
        if ASAN:  # 45 s under ASan reading 128 MiB twice; the plain build checks the limit, the fuzzers the reader
            self.skipTest("the plain build's run checks this limit")

        def make(extra):
            with open(h.PLAN) as f:
                text = f.read()
            h.write(self.path("big_plan.json"), text + " " * ((128 << 20) - len(text) + extra))
        self.at_and_past(make, ["diff", "big_plan.json", h.PLAN], "big_plan.json", "more than a plan can be (128 MiB)")

    def test_json_depth(self):
        def make(extra):
            depth = 100 + extra - 1  # the policy object is one level
            h.write(self.path("deep.json"), '{"$schema": ' + "[" * depth + "]" * depth + "}")
        self.at_and_past(make, [h.GPT, "--policy", "deep.json"], "deep.json", "nested more than 100 deep")

    def test_json_values(self):
        if ASAN:  # 64 s under ASan for 4 M values twice; the plain build checks the limit, the json fuzzer the parser
            self.skipTest("the plain build's run checks this limit")

        def make(extra):
            n = (4 << 20) - 2 + extra  # the object, the list, n zeros
            h.write(self.path("many.json"), '{"$schema": [' + ",".join(["0"] * n) + "]}")
        self.at_and_past(make, [h.GPT, "--policy", "many.json"], "many.json", "more than 4194304 values")

    def test_policy_list_and_string(self):
        def many(extra):
            globs = ["nothing%d.*" % i for i in range(100000 + extra)]
            h.write(self.path("globs.json"), json.dumps({"ignored_params": globs}))
        self.at_and_past(many, [h.GPT, "--policy", "globs.json", "-o", "plan.json"], "globs.json",
                         '"ignored_params" lists 100001 items')
        os.remove(self.path("plan.json"))

        def long(extra):
            h.write(self.path("long.json"), json.dumps({"module_classes": ["B" * (4096 + extra)]}))
        self.at_and_past(long, [h.GPT, "--policy", "long.json", "-o", "plan.json"], "long.json",
                         "holds a string of 4097 bytes")
        os.remove(self.path("plan.json"))

    def yaml(self, body):
        return "distributed_type: FSDP\nnum_processes: 2\n" + body

    def test_yaml_depth(self):
        def make(extra):
            n = 63 + extra  # the top mapping is one level
            h.write(self.path("deep.yaml"), self.yaml("tpu_env: " + "[" * n + "]" * n + "\n"))
        self.at_and_past(make, [h.GPT, "--policy", "deep.yaml"], "deep.yaml", "nested more than 64 deep")

    def test_yaml_values(self):
        def make(extra):
            # The mapping, 3 keys, 2 values, the list: 7; then the list's items.
            n = 100000 - 7 + extra
            h.write(self.path("values.yaml"), self.yaml("tpu_env: [" + ", ".join(["1"] * n) + "]\n"))
        self.at_and_past(make, [h.GPT, "--policy", "values.yaml"], "values.yaml", "more than 100000 values")

    def test_yaml_alias_expansion(self):
        def make(extra):
            # Scalar bytes: the keys and values 16 + 4 + 13 + 1, tpu_env 7, tpu_zone 8 and its value, 256 copies.
            value = "z" * 65535
            pad = (16 << 20) - 256 * len(value) - (16 + 4 + 13 + 1 + 7 + 8) + extra
            h.write(self.path("alias.yaml"), self.yaml("tpu_zone: %s\ntpu_env: [&v %s%s]\n"
                                                       % ("p" * pad, value, ", *v" * 255)))
        self.at_and_past(make, [h.GPT, "--policy", "alias.yaml"], "alias.yaml",
                         "more than 16 MiB of text once its aliases are expanded")

    def test_yaml_scalar(self):
        def make(extra):
            h.write(self.path("scalar.yaml"), self.yaml("tpu_name: %s\n" % ("n" * (65536 + extra))))
        self.at_and_past(make, [h.GPT, "--policy", "scalar.yaml"], "scalar.yaml", "a value of 65537 bytes")

    def test_yaml_integer(self):
        def make(extra):
            h.write(self.path("int.yaml"), self.yaml("tpu_name: %#x\n" % ((1 << 63) - 1 + extra)))
        self.at_and_past(make, [h.GPT, "--policy", "int.yaml"], "int.yaml", "an integer past 2^63")

    def test_regex_nesting_and_repetition(self):
        def nested(extra):
            n = 100 + extra
            h.accelerate(self.path("re.yaml"), "fsdp_config:\n  fsdp_ignored_modules: '%s'\n"
                         % ("(" * n + "lm_head" + ")" * n))
        self.at_and_past(nested, [h.GPT, "--policy", "re.yaml"], "re.yaml", "nests groups more than 100 deep")

        def repeat(extra):
            h.accelerate(self.path("rep.yaml"), "fsdp_config:\n  fsdp_ignored_modules: 'x{%d}'\n" % (1000 + extra))
        self.at_and_past(repeat, [h.GPT, "--policy", "rep.yaml"], "rep.yaml", "a repetition count above 1000")

    def test_deflate_ratio(self):
        """A deflated structure record may claim 100 times its compressed bytes plus 4 KiB."""
        def make(extra):
            comp, crc = h.deflate_bomb(1 << 20)
            size = len(comp) * 100 + 4096 + extra
            h.write_zip(self.path("ratio.pt"), h.replaced(h.GPT, "tiny_gpt/data.pkl", (comp, crc, size)))
        self.at_and_past(make, ["ratio.pt"], "ratio.pt", "a deflate bomb?")

    def test_structure_records(self):
        """A structure record holds at most 64 MiB; data.pkl and code/ together 256 MiB."""
        def one(extra):
            recs = h.records_of(h.GPT) + [("tiny_gpt/code/__torch__/pad.py", b" " * ((64 << 20) + extra))]
            h.write_zip(self.path("pad.pt"), recs)
        self.at_and_past(one, ["pad.pt"], "pad.pt", "more than a record that describes structure can be (64 MiB)")

        def total(extra):
            recs = h.records_of(h.GPT)
            used = sum(len(d) for n, d in recs
                       if n.endswith(("/data.pkl", "/.data/version")) or ("/code/" in n and n.endswith(".py")))
            left = (256 << 20) - used + extra
            pads = []
            while left > 0:
                pads.append(min(left, 64 << 20))
                left -= pads[-1]
            recs += [("tiny_gpt/code/__torch__/pad%d.py" % i, b" " * n) for i, n in enumerate(pads)]
            h.write_zip(self.path("total.pt"), recs)
        self.at_and_past(total, ["total.pt"], "total.pt", "add up to more than 256 MiB")
        os.remove(self.path("total.pt"))

    def test_pickle_values(self):
        """data.pkl holds at most 2^24 values: a list of None, one value each."""
        def make(extra):
            n = (1 << 24) - 1 + extra  # the Nones and the list
            pkl = b"\x80\x02(" + b"N" * n + b"l."
            h.write_zip(self.path("values.pt"), h.replaced(h.GPT, "tiny_gpt/data.pkl", pkl))
        self.at_and_past(make, ["values.pt"], "values.pt", "more than 16777216 values")


class AgainstPyYAML(Base):
    """The YAML reader against the venv's PyYAML, as Accelerate calls it (yaml.safe_load on the decoded file):
    what PyYAML refuses, fsdp-plan refuses with PyYAML's exception and position; what PyYAML loads is not
    refused as YAML (only past docs/limits.md's bounds, or for a recursive alias)."""

    CASES = [
        'mixed_precision: "bf16\n', "mixed_precision: 'bf16\n", "x: [1, 2\n", "x: {a: 1\n", "x: 1\n  y: 2\n",
        "x: !!python/object/apply:os.system [ls]\n", "x: !foo 1\n", "---\nx: 1\n", "x: 1\n...\n---\ny: 2\n",
        "x: *y\n", "x: &a 1\ny: &a 2\n", "x\x1b: 1\n", "x: \x07\n", "x: a\tb\n", "\tx: 1\n", "x: 1 # \tc\n",
        "x: '\t'\n", "? [a, b]\n: 1\n", "x: |\n  a\t\n", "x: 1\n\t\n", "x: 'a''b'\n", "x: \"\\q\"\n",
        "fsdp_config:\n  <<: 1\n", "fsdp_config:\n  <<: [1]\n", "fsdp_config:\n  <<: {fsdp_version: 2}\n",
        "x: !!str 1\n", "x: !!int '2'\n", "%YAML 1.1\n---\nx: 1\n", "x: @\n", "x: `\n",
        "x: [a, b]]\n", "x: {a: [}\n", "- a\n- b\n", "x: >\n  folded\n", "x: ---\n",
    ]
    # libyaml and PyYAML differ here (docs/limits.md): an unknown directive, which PyYAML skips and libyaml
    # refuses, and a byte order mark past the start, which PyYAML reads into a key and libyaml refuses.
    # Accelerate stops on both all the same (another document; an unknown key).
    KNOWN_DIFFERENT = ["%FOO\n---\nx: 1\n", "\ufeffx: 1\n"]

    @staticmethod
    def pyyaml(text):
        """None if yaml.safe_load reads text, else (exception class, 'line L, column C' or 'position N')."""
        import yaml
        try:
            yaml.safe_load(text)
            return None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            if isinstance(e, yaml.reader.ReaderError):
                return type(e).__name__, "position %d" % e.position
            return type(e).__name__, "line %d, column %d" % (mark.line + 1, mark.column + 1) if mark else ""

    def check(self, text, counts):
        """text: a whole config file."""
        h.write(self.path("c.yaml"), text.encode("utf-8"))
        expect = self.pyyaml(text)
        r = Run([h.GPT, "--policy", "c.yaml", "-o", "plan.json"], self.dir)
        self.assertIn(r.code, (0, 1, 2), f"{text!r}: {r.stderr}")
        if os.path.exists(self.path("plan.json")):
            os.remove(self.path("plan.json"))
        if expect is None:
            self.assertNotIn("not valid YAML", r.stderr, f"{text!r}: PyYAML loads it")
            return
        self.assertEqual(r.code, 2, f"{text!r}: PyYAML refuses it ({expect}); fsdp-plan: {r.stderr}")
        self.assertIn("yaml." + {"ReaderError": "reader", "ScannerError": "scanner", "ParserError": "parser",
                                 "ComposerError": "composer", "ConstructorError": "constructor"}[expect[0]] +
                      "." + expect[0], r.stderr, f"{text!r}")
        counts["refused"] += 1
        if expect[1] in r.stderr:
            counts["same place"] += 1

    def test_cases(self):
        counts = {"refused": 0, "same place": 0}
        for text in self.CASES:
            with self.subTest(text=text):
                self.check("distributed_type: FSDP\nnum_processes: 2\n" + text, counts)
        self.assertEqual(counts["same place"], counts["refused"], counts)
        for text in self.KNOWN_DIFFERENT:
            with self.subTest(text=text):
                h.write(self.path("c.yaml"), "distributed_type: FSDP\nnum_processes: 2\n" + text)
                self.assertEqual(Run([h.GPT, "--policy", "c.yaml"], self.dir).code, 2)

    # Plain scalars PyYAML's resolver (yaml/resolver.py) reads as another type than a glance suggests.
    SCALARS = ["8", "+8", "010", "0o10", "0x10", "0b1000", "1_6", "0:8", "1:30", "0b_", "8.0", "8.", ".8", "-.5",
               ".", "._", ".INF", "-.inf", ".nan", "1:30.5", "1e3", "1.0e+3", "yes", "0x8000000000000000"]

    def test_scalars(self):
        """num_processes as each scalar: the world size Accelerate would plan (PyYAML's value, str() into the
        environment, int() back, as accelerate/commands/launch.py does), or a refusal where it would stop."""
        import yaml
        for text in self.SCALARS:
            with self.subTest(scalar=text):
                body = "distributed_type: FSDP\nnum_processes: %s\nfsdp_config:\n  fsdp_version: 1\n" % text
                h.write(self.path("s.yaml"), body)
                try:
                    expect = int(str(yaml.safe_load(body)["num_processes"]))
                except ValueError:
                    expect = None
                r = Run([h.GPT, "--policy", "s.yaml", "--format", "json"], self.dir)
                if expect is None or not 1 <= expect <= 1 << 24:
                    self.assertEqual(r.code, 2, f"{text}: {r.stdout[:200]}")
                    self.assertEqual(len(r.stderr.splitlines()), 1, r.stderr)
                else:
                    self.assertEqual(r.code, 0, f"{text}: {r.stderr}")
                    self.assertEqual(json.loads(r.stdout)["memory"]["world_size"], expect, text)

    def test_mutants(self):
        """300 seeded mutations of the Accelerate configs of tests/accelerate/configs (100 under ASan: 54 s
        for 300; the plain build runs all, the accelerate fuzzer mutates them under ASan)."""
        configs = sorted(os.path.join(d, f) for d in [os.path.join(ROOT, "tests", "accelerate", "configs")]
                         for f in os.listdir(d))
        rng = random.Random(29)
        alphabet = " \t\n:-[]{}'\"#&*!|>,?%@`~\\0aZ<"
        counts = {"refused": 0, "same place": 0}
        for i in range(100 if ASAN else 300):
            with open(rng.choice(configs)) as f:
                text = list(f.read())
            for _ in range(rng.randint(1, 3)):
                at = rng.randrange(len(text))
                op = rng.random()
                if op < 0.4:
                    text[at] = rng.choice(alphabet)
                elif op < 0.7:
                    text.insert(at, rng.choice(alphabet))
                else:
                    del text[at]
            text = "".join(text)
            if "distributed_type" not in text:
                continue  # not recognised as an Accelerate config: read as JSON, a different reader
            with self.subTest(i=i):
                self.check(text, counts)
        print(f"\nmutants PyYAML refuses: {counts['refused']}, fsdp-plan at PyYAML's place: {counts['same place']}",
              file=sys.stderr)
        self.assertGreaterEqual(counts["same place"], counts["refused"] * 0.95, counts)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = os.path.abspath(sys.argv.pop(1))
    ASAN = sanitized(BINARY)
    unittest.main(verbosity=2)
