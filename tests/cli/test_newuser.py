#!/usr/bin/python3
"""What a new user tripped over, round two (issue 24), items 1, 2, 4, 9 and 10:
the command line's part (app/, README.md). Each test failed at 6bdb590.

1. a broken Accelerate YAML is reported as YAML, with its line and column; an
   empty or comment-only file and a top-level list say what they are; an
   Accelerate config written as JSON is read as one;
2. exit 1 always comes with one line per failed check on stderr, also with -o,
   stdout redirected, or -q;
4. a text plan without a world size says that it was not given, and how to;
9. -o through a symlink writes the link's target (the link stays); -o naming
   the model file is refused;
10. a "not yet" / "not reported" sentence in the docs is one the tests know to
   be true (GAPS below), or it goes.

Usage: test_newuser.py FSDP_PLAN_BINARY   (Debian's python3: no torch needed)
"""
import io
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import unittest
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "app", "fsdp-plan")
GPT = os.path.join(ROOT, "sample_models", "tiny_gpt.pt")
GPT_PT2 = os.path.join(ROOT, "sample_models", "tiny_gpt.pt2")
TRANSFORMER = os.path.join(ROOT, "policies", "transformer.json")
EXPECTED = os.path.join(ROOT, "plans", "tiny_gpt.json")


def run(*args, cwd=None, stdout=subprocess.PIPE):
    env = dict(os.environ)
    env.pop("COLUMNS", None)
    return subprocess.run([BINARY, *args], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120, cwd=cwd,
                          env=env)


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

    def error_line(self, r):
        """The one 'fsdp-plan: error:' line of a refused run (exit 2)."""
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.startswith("fsdp-plan: error: ")]
        self.assertEqual(len(lines), 1, r.stderr)
        return lines[0]


ACCELERATE_YAML = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: Block
  fsdp_sharding_strategy: FULL_SHARD
  fsdp_version: 1
mixed_precision: 'no'
num_machines: 1
num_processes: 8
"""


class Item1PolicyFiles(Scratch):
    """A policy file that is YAML is read as YAML, whatever is wrong with it."""

    def test_a_tab_is_a_yaml_error_with_its_line(self):
        path = self.write("tab.yaml", ACCELERATE_YAML.replace("  fsdp_version: 1", "\tfsdp_version: 1"))
        line = self.error_line(run(GPT, "--policy", path))
        self.assertNotIn("JSON", line)
        self.assertIn("YAML", line)
        self.assertRegex(line, r"line 7\b")
        self.assertRegex(line, r"column \d+")

    def test_a_bad_indent_is_a_yaml_error_with_its_line(self):
        path = self.write("indent.yaml", ACCELERATE_YAML.replace("  fsdp_version: 1", "  fsdp_version: 1\n   bad: 1"))
        line = self.error_line(run(GPT, "--policy", path))
        self.assertNotIn("JSON", line)
        self.assertIn("YAML", line)
        self.assertRegex(line, r"line 8\b")

    def test_empty_comment_only_and_list_say_what_they_are(self):
        for name, text, says in (("empty.yaml", "", "empty"), ("blank.json", "  \n", "empty"),
                                 ("comment.yaml", "# fsdp settings\n", "no YAML document"),
                                 ("list.yaml", "- a\n- b\n", "a YAML list")):
            with self.subTest(file=name):
                line = self.error_line(run(GPT, "--policy", self.write(name, text)))
                self.assertNotIn("invalid JSON", line)
                self.assertIn(says, line)

    def test_json_still_reports_json_errors(self):
        line = self.error_line(run(GPT, "--policy", self.write("bad.json", '{\n  "module_classes": [Block]\n}')))
        self.assertIn("invalid JSON", line)
        self.assertIn("line 2", line)

    def test_an_accelerate_config_in_json_is_an_accelerate_config(self):
        # Accelerate reads config files ending in .json as JSON (commands/config/config_args.py).
        import yaml  # python3-yaml: the test suite has it (scripts/dev)

        doc = yaml.safe_load(ACCELERATE_YAML)
        as_json = self.write("accelerate.json", json.dumps(doc, indent=2))
        as_yaml = self.write("accelerate.yaml", ACCELERATE_YAML)
        plans = []
        for path in (as_json, as_yaml):
            r = run(GPT, "--policy", path, "-f", "json")
            self.assertEqual(r.returncode, 0, r.stderr)
            plans.append(json.loads(r.stdout))
        self.assertEqual([u["path"] for u in plans[0]["units"]], [u["path"] for u in plans[1]["units"]])
        self.assertEqual(plans[0]["memory"]["world_size"], 8)
        self.assertEqual(plans[0]["policy"], plans[1]["policy"])


class Item2SilentFailures(Scratch):
    """Exit 1 says why on stderr, one line per failed check, however stdout goes."""

    def check_lines(self, r, needles):
        self.assertEqual(r.returncode, 1, r.stderr)
        lines = [line for line in r.stderr.splitlines() if line.startswith("fsdp-plan: error: ")]
        self.assertEqual(len(lines), len(needles), r.stderr)
        for line, needle in zip(lines, needles):
            self.assertIn(needle, line)

    def test_budgets_with_o_redirected_and_quiet(self):
        args = (GPT, "--policy", TRANSFORMER, "--max-units", "2", "--max-root-share", "0.1")
        needles = ["max_units", "max_root_share"]
        self.check_lines(run(*args, "-o", os.path.join(self.tmp, "plan.txt")), needles)
        self.check_lines(run(*args, stdout=subprocess.DEVNULL), needles)
        self.check_lines(run(*args, "-q", stdout=subprocess.DEVNULL), needles)
        self.check_lines(run(*args, "-q", "-f", "json", "-o", os.path.join(self.tmp, "plan.json")), needles)

    def test_expect_with_quiet_and_redirected(self):
        # The README's own CI line, with a plan that differs from the reviewed one.
        r = run("sample_models/tiny_gpt.pt", "--policy", "policies/transformer.json", "--world-size", "8",
                "--expect", "plans/tiny_gpt.json", "-q", cwd=ROOT, stdout=subprocess.DEVNULL)
        self.check_lines(r, ["plans/tiny_gpt.json"])
        # Unchanged: exit 0, nothing on stderr.
        r = run("sample_models/tiny_gpt.pt", "--policy", "policies/transformer.json", "--expect",
                "plans/tiny_gpt.json", "-q", cwd=ROOT, stdout=subprocess.DEVNULL)
        self.assertEqual((r.returncode, r.stderr), (0, ""))

    def test_a_refusal_says_so_on_stderr(self):
        # FSDP2 refuses fully_shard on the ModuleList that this size policy selects.
        policy = self.write("size2.json", json.dumps({"min_num_params": 40000, "fsdp": {"version": 2}}))
        r = run(GPT, "--policy", policy, "-q", stdout=subprocess.DEVNULL)
        self.check_lines(r, ["fsdp2_container"])


class Item4WorldSize(Scratch):
    def test_a_plan_without_a_world_size_says_so(self):
        r = run(GPT, "--policy", TRANSFORMER)
        self.assertEqual(r.returncode, 0, r.stderr)
        memory = r.stdout[r.stdout.index("\nmemory  "):]
        self.assertIn("not given", memory)
        self.assertIn("--world-size", memory)
        for args in (("--world-size", "1"), ("--world-size", "8")):
            self.assertNotIn("not given", run(GPT, "--policy", TRANSFORMER, *args).stdout)
        policy = self.write("ws.json", json.dumps({"module_classes": ["Block"], "fsdp": {"world_size": 4}}))
        self.assertNotIn("not given", run(GPT, "--policy", policy).stdout)
        # FSDP2's memory line too.
        self.assertIn("not given", run(GPT, "--policy", TRANSFORMER, "--fsdp-version", "2").stdout)


class Item9Output(Scratch):
    def test_o_through_a_symlink_writes_its_target(self):
        target = self.write("real_plan.txt", "old\n")
        link = os.path.join(self.tmp, "plan.txt")
        os.symlink("real_plan.txt", link)
        r = run(GPT, "--policy", TRANSFORMER, "-o", link)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(os.path.islink(link))
        with open(target) as f:
            self.assertTrue(f.read().startswith("model   "))
        self.assertEqual(sorted(os.listdir(self.tmp)), ["plan.txt", "real_plan.txt"])  # no temporary left

    def test_o_naming_the_model_is_refused(self):
        model = os.path.join(self.tmp, "model.pt")
        alias = os.path.join(self.tmp, "alias.pt")
        os.symlink("model.pt", alias)
        with open(GPT, "rb") as f:
            data = f.read()
        for out, extra in ((model, ()), (alias, ()), (os.path.join(self.tmp, ".", "model.pt"), ()),
                           (model, ("--emit", "torch")), (model, ("-f", "html"))):
            with self.subTest(out=out, extra=extra):
                with open(model, "wb") as g:
                    g.write(data)
                line = self.error_line(run(model, "--policy", TRANSFORMER, *extra, "-o", out))
                self.assertIn("model", line)
                with open(model, "rb") as f:
                    self.assertEqual(f.read(), data)


# A frozen and a trainable parameter in one module (the root): FSDP1 without use_orig_params
# refuses the unit (FlatParamHandle: "Must flatten tensors with uniform requires_grad").
def mixed_requires_grad_archive(path):
    pkl = io.BytesIO()
    pkl.write(b"\x80\x02c__torch__\nNet\n)\x81}(")

    def string(text):
        b = text.encode()
        pkl.write(b"X" + struct.pack("<I", len(b)) + b)

    string("training")
    pkl.write(b"\x88")
    for key, (name, grad) in enumerate((("weight", True), ("frozen", False))):
        string(name)
        pkl.write(b"ctorch._utils\n_rebuild_tensor_v2\n((")
        string("storage")
        pkl.write(b"ctorch\nFloatStorage\n")
        string(str(key))
        string("cpu")
        pkl.write(b"K\x04tQK\x00K\x04\x85K\x01\x85" + (b"\x88" if grad else b"\x89"))
        pkl.write(b"ccollections\nOrderedDict\n)RtR")
    pkl.write(b"ub.")
    code = ("class Net(Module):\n  __parameters__ = [\"weight\", \"frozen\", ]\n  __buffers__ = []\n"
            "  weight : Tensor\n  frozen : Tensor\n  training : bool\n")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("net/data.pkl", pkl.getvalue())
        z.writestr("net/code/__torch__.py", code)
        z.writestr("net/constants.pkl", b"\x80\x02).")
        z.writestr("net/version", b"3\n")


def reports_mixed_requires_grad(tmp):
    model = os.path.join(tmp, "mixed.pt")
    mixed_requires_grad_archive(model)
    r = run(model, "-f", "json")
    return any(w["kind"] == "mixed_requires_grad" for w in json.loads(r.stdout)["warnings"])


# Sentences of the docs that say something is not done yet or not reported, each with a check
# that it is still so (true: the sentence may stay). A sentence the list lacks fails the test;
# so does one whose check says it is no longer so.
GAPS = {
    "the plan does not report it yet": lambda tmp: not reports_mixed_requires_grad(tmp),
}
DOCS = ["README.md"] + [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                        if f.endswith(".md")]


class Item10Docs(Scratch):
    def sentences(self, pattern):
        out = []
        for doc in DOCS:
            with open(os.path.join(ROOT, doc)) as f:
                text = f.read()
            for m in re.finditer(pattern, text, re.I):
                start = max(text.rfind(". ", 0, m.start()), text.rfind("\n\n", 0, m.start()), text.rfind("\n- ", 0, m.start()))
                ends = [e for e in (text.find(". ", m.end()), text.find(".\n", m.end()), text.find("\n\n", m.end()))
                        if e >= 0]
                end = min(ends) if ends else len(text)
                out.append((doc, " ".join(text[start + 1:end].split())))
        return out

    def test_not_yet_and_not_reported_sentences_are_true(self):
        for doc, sentence in self.sentences(r"\bnot (yet|reported)\b|\bnot report\b|\byet\b(?= *[.;,)])"):
            with self.subTest(doc=doc, sentence=sentence[:80]):
                known = [k for k in GAPS if k in sentence]
                self.assertTrue(known, f"{doc}: a 'not yet' sentence no test checks: {sentence!r}; add it to GAPS "
                                       "with a check, or remove it")
                self.assertTrue(GAPS[known[0]](self.tmp), f"{doc} says {sentence!r}, and it is no longer so")

    def test_the_usage_names_both_model_formats(self):
        head = run("--help").stdout.split("Options:")[0]
        self.assertRegex(head, r"torch\.export|\.pt2", "--help names TorchScript only: " + head)
        with open(os.path.join(ROOT, "README.md")) as f:
            intro = f.read().split("\n## ")[0]
        self.assertRegex(intro, r"torch\.export|\.pt2", "the README's opening names TorchScript only")

if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
