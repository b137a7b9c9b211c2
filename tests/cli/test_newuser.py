#!/usr/bin/python3
"""What a new user tripped over, round two (issue 24), items 1, 2, 4, 9 and 10:
the command line's part (app/, README.md). Each test failed at 6bdb590; the docs' ones
(item 10) are guards since main's README rewrite (c7736d5) removed the false sentence.

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
        self.assertRegex(line, r"line 7, column \d+")  # PyYAML: line 7, column 1

    def test_a_bad_indent_is_a_yaml_error_with_its_line(self):
        path = self.write("indent.yaml", ACCELERATE_YAML.replace("  fsdp_version: 1", "  fsdp_version: 1\n   bad: 1"))
        line = self.error_line(run(GPT, "--policy", path))
        self.assertNotIn("JSON", line)
        self.assertIn("YAML", line)
        self.assertRegex(line, r"line 8, column \d+")  # PyYAML: line 8, column 7

    def test_empty_comment_only_list_and_scalar_say_what_they_are(self):
        for name, text, says in (("empty.yaml", "", "is empty"), ("blank.json", "  \n", "is empty"),
                                 ("comment.yaml", "# fsdp settings\n", "no YAML document"),
                                 ("list.yaml", "- a\n- b\n", "is a YAML list"),
                                 ("scalar.yaml", "FSDP\n", "is a YAML scalar ('FSDP')")):
            with self.subTest(file=name):
                line = self.error_line(run(GPT, "--policy", self.write(name, text)))
                self.assertNotIn("JSON:", line)
                self.assertIn(says, line)

    def test_a_yaml_mapping_of_policy_keys_is_no_accelerate_config(self):
        # A policy written in YAML: say that it is YAML and no Accelerate config, not "invalid JSON".
        line = self.error_line(run(GPT, "--policy", self.write("policy.yaml", "module_classes: [Block]\n")))
        self.assertNotIn("invalid JSON", line)
        self.assertIn("YAML mapping without any of Accelerate's keys", line)

    def test_json_still_reports_json_errors(self):
        # A guard (it passed before): what starts as JSON stays JSON to the error message.
        line = self.error_line(run(GPT, "--policy", self.write("bad.json", '{\n  "module_classes": [Block]\n}')))
        self.assertIn("invalid JSON", line)
        self.assertIn("line 2", line)

    def test_yaml_named_json_is_json_as_accelerate_reads_it(self):
        # load_config_from_file: a name ending in .json is json.load'ed, so a YAML config there is refused.
        line = self.error_line(run(GPT, "--policy", self.write("accelerate.json", ACCELERATE_YAML)))
        self.assertIn("invalid JSON", line)
        self.assertIn("needs a .yaml name", line)

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
        self.assertEqual([u["path"] for u in plans[0]["units"]], ["", "blocks.0", "blocks.1", "blocks.2"])
        self.assertEqual(plans[0]["memory"]["world_size"], 8)
        self.assertEqual(plans[0]["policy"], plans[1]["policy"])
        kinds = [w["kind"] for w in plans[0]["warnings"]]
        self.assertIn("accelerate_config", kinds)
        # With no name to go by (a pipe), the content decides.
        r = subprocess.run([BINARY, GPT, "--policy", "/dev/stdin", "-f", "json"], input=json.dumps(doc),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["policy"], plans[1]["policy"])
        # A typo gets Accelerate's own refusal, not the policy reader's "unknown key".
        doc["fsdp_confg"] = doc.pop("fsdp_config")
        line = self.error_line(run(GPT, "--policy", self.write("typo.json", json.dumps(doc))))
        self.assertIn("accelerate launch would stop", line)
        self.assertIn('Did you mean "fsdp_config"?', line)


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

    def test_expect_reads_a_reviewed_plan_of_schema_version_1(self):
        # Version 2 changed only comm and time, which diff does not compare: a plan reviewed
        # before it still matches (docs/plan-format.md, "Changes from version 1").
        old = os.path.join("tests", "cli", "tiny_gpt.schema1.json")
        with open(os.path.join(ROOT, old)) as f:
            self.assertEqual(json.load(f)["schema_version"], 1)
        r = run("sample_models/tiny_gpt.pt", "--policy", "policies/transformer.json", "--expect", old, "-q",
                cwd=ROOT, stdout=subprocess.DEVNULL)
        self.assertEqual((r.returncode, r.stderr), (0, ""))
        r = run("diff", old, "plans/tiny_gpt.json", cwd=ROOT)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("schema_version 1 -> 2: the versions differ only in comm and time", r.stdout)
        # A real change still fails.
        r = run("sample_models/tiny_gpt.pt", "--policy", "policies/transformer.json", "--world-size", "8",
                "--expect", old, "-q", cwd=ROOT, stdout=subprocess.DEVNULL)
        self.assertEqual(r.returncode, 1)

    def test_a_refusal_says_so_on_stderr(self):
        # FSDP2 refuses fully_shard on the ModuleList that this size policy selects.
        policy = self.write("size2.json", json.dumps({"min_num_params": 40000, "fsdp": {"version": 2}}))
        r = run(GPT, "--policy", policy, "-q", stdout=subprocess.DEVNULL)
        self.check_lines(r, ["fsdp2_container"])
        # --emit: the same lines, then that nothing was written.
        r = run(GPT, "--policy", policy, "--max-units", "2", "--emit", "torch", stdout=subprocess.DEVNULL)
        self.check_lines(r, ["fsdp2_container", "max_units", "--emit torch: nothing written"])

    def test_suggest_says_when_nothing_fits(self):
        r = run("suggest", GPT, "--budget", "1KiB", "-o", os.path.join(self.tmp, "best.json"),
                stdout=subprocess.DEVNULL)
        self.check_lines(r, ["no policy fits 1.0 KiB per rank; nearest: "])
        self.assertIn("nothing written to", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "best.json")))


class Item4WorldSize(Scratch):
    def test_a_plan_without_a_world_size_says_so(self):
        r = run(GPT, "--policy", TRANSFORMER)
        self.assertEqual(r.returncode, 0, r.stderr)
        memory = r.stdout[r.stdout.index("\nmemory  "):].splitlines()
        # The line under the memory header (the default 1 plans one rank: NO_SHARD, from FULL_SHARD).
        self.assertEqual(memory[2], "        world size not given, so 1: a single rank shards nothing; "
                                    "set it with --world-size N", r.stdout)
        for args in (("--world-size", "1"), ("--world-size", "8")):
            self.assertNotIn("not given", run(GPT, "--policy", TRANSFORMER, *args).stdout)
        policy = self.write("ws.json", json.dumps({"module_classes": ["Block"], "fsdp": {"world_size": 4}}))
        self.assertNotIn("not given", run(GPT, "--policy", policy).stdout)
        # FSDP2's memory line too.
        self.assertIn("not given", run(GPT, "--policy", TRANSFORMER, "--fsdp-version", "2").stdout)
        # An Accelerate config gives it as num_processes; without it, the launcher needs --num_processes.
        given = self.write("given.yaml", ACCELERATE_YAML)
        self.assertNotIn("not given", run(GPT, "--policy", given).stdout)
        missing = self.write("missing.yaml", ACCELERATE_YAML.replace("num_processes: 8\n", ""))
        self.assertIn("world size not given", run(GPT, "--policy", missing).stdout)
        # Only the text plan says it: JSON has the number (memory.world_size), as before.
        self.assertNotIn("not given", run(GPT, "--policy", TRANSFORMER, "-f", "json").stdout)


class Item9Output(Scratch):
    def test_o_through_a_symlink_writes_its_target(self):
        os.mkdir(os.path.join(self.tmp, "plans"))
        target = self.write(os.path.join("plans", "real_plan.txt"), "old\n")
        os.chmod(target, 0o640)
        link = os.path.join(self.tmp, "plan.txt")
        os.symlink(os.path.join("plans", "real_plan.txt"), link)  # relative to the link's directory
        dangling = os.path.join(self.tmp, "new.txt")
        os.symlink(os.path.join("plans", "new_plan.txt"), dangling)
        for out in (link, dangling):
            with self.subTest(out=out):
                r = run(GPT, "--policy", TRANSFORMER, "-o", out, cwd="/")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertTrue(os.path.islink(out))
                with open(out) as f:
                    self.assertTrue(f.read().startswith("model   "))
        self.assertEqual(sorted(os.listdir(self.tmp)), ["new.txt", "plan.txt", "plans"])  # no temporary left
        self.assertEqual(sorted(os.listdir(os.path.join(self.tmp, "plans"))), ["new_plan.txt", "real_plan.txt"])

    def test_o_naming_an_input_is_refused(self):
        model = os.path.join(self.tmp, "model.pt")
        alias = os.path.join(self.tmp, "alias.pt")
        hard = os.path.join(self.tmp, "hard.pt")
        os.symlink("model.pt", alias)
        with open(GPT, "rb") as f:
            data = f.read()
        policy = self.write("p.json", json.dumps({"module_classes": ["Block"]}))
        with open(EXPECTED) as f:
            expected = self.write("expected.json", f.read())
        cases = [((model, "--policy", TRANSFORMER, "-o", model), "is the model file"),
                 ((model, "--policy", TRANSFORMER, "-o", alias), "is the model file"),
                 ((model, "--policy", TRANSFORMER, "-o", os.path.join(self.tmp, ".", "model.pt")), "is the model file"),
                 ((model, "-o", hard), "is the model file"),  # a hard link: another name, the same inode
                 ((model, "--policy", TRANSFORMER, "--emit", "torch", "-o", model), "is the model file"),
                 ((model, "--policy", TRANSFORMER, "-f", "html", "-o", model), "is the model file"),
                 ((model, "--policy", policy, "-o", policy), "is the policy file"),
                 ((model, "--expect", expected, "-f", "json", "-o", expected), "is the reviewed plan"),
                 (("suggest", model, "--budget", "1GiB", "--policy", policy, "-o", policy), "is the policy file"),
                 (("diff", expected, EXPECTED, "-o", expected), "is the old plan")]
        for args, says in cases:
            with self.subTest(args=args):
                with open(model, "wb") as g:
                    g.write(data)
                if not os.path.exists(hard):
                    os.link(model, hard)
                before = {}
                for p in (model, policy, expected):
                    with open(p, "rb") as f:
                        before[p] = f.read()
                line = self.error_line(run(*args))
                self.assertIn(says, line)
                for p, content in before.items():
                    with open(p, "rb") as f:
                        self.assertEqual(f.read(), content, p)


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
def reads_module_tree_json(tmp):
    """Whether the binary plans a module-tree JSON (its own --dump-tree output) as a model."""
    tree = os.path.join(tmp, "tree.json")
    with open(tree, "w") as f:
        f.write(run(GPT, "--dump-tree").stdout)
    return run(tree).returncode == 0


GAPS = {
    "this binary does not read it yet": lambda tmp: not reads_module_tree_json(tmp),
}
# A gap the docs once claimed that the tests show closed: the sentence must not come back.
CLOSED = {
    "the plan does not report it yet": lambda tmp: reports_mixed_requires_grad(tmp),
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

    def test_closed_gaps_are_closed(self):
        for phrase, closed in CLOSED.items():
            with self.subTest(phrase=phrase):
                self.assertTrue(closed(self.tmp), f"{phrase!r}: no longer so? move it to GAPS")
                for doc, sentence in self.sentences(r"\s+".join(map(re.escape, phrase.split()))):
                    self.fail(f"{doc} says {sentence!r}, which the tests show is no longer so")

    def test_gaps_are_still_gaps(self):
        for phrase, gap in GAPS.items():
            with self.subTest(phrase=phrase):
                self.assertTrue(gap(self.tmp), f"{phrase!r} is no longer so: fix the docs, move it to CLOSED")

    def test_not_yet_and_not_reported_sentences_are_true(self):
        pattern = r"\bnot (yet|reported|supported)\b|\bnot report\b|\bunsupported\b|\byet\b(?= *[.;,)])"
        for doc, sentence in self.sentences(pattern):
            with self.subTest(doc=doc, sentence=sentence[:80]):
                known = [k for k in GAPS if k in sentence]
                self.assertTrue(known, f"{doc}: a 'not yet' sentence no test checks: {sentence!r}; add it to GAPS "
                                       "with a check, or remove it")
                self.assertTrue(GAPS[known[0]](self.tmp), f"{doc} says {sentence!r}, and it is no longer so")

    def test_the_usage_names_both_model_formats(self):
        for command in ((), ("suggest",)):
            head = run(*command, "--help").stdout.split("Options:")[0]
            self.assertRegex(head, r"torch\.export|\.pt2", "--help names TorchScript only: " + head)
        self.assertIn("TorchScript only", run("--help").stdout.split("--loader")[1].split("\n  -")[0])
        with open(os.path.join(ROOT, "README.md")) as f:
            intro = f.read().split("\n## ")[0]
        self.assertRegex(intro, r"torch\.export|\.pt2", "the README's opening names TorchScript only")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
