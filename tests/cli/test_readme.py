#!/usr/bin/python3
"""Runs the examples of the README and of every page in docs/, so they cannot rot.

Conventions (docs/ci.md states them too), each block run in a fresh copy of
sample_models/, policies/ and plans/, with fsdp-plan first on the PATH:
  ```sh       the block runs under bash -e -o pipefail and must succeed
  ```console  each `$ ` line runs; its output must be exactly the lines after it
  ```yaml     GitHub Actions `run:` steps run in their `shell` and must succeed;
              pre-commit `entry:` hooks run as argv and must succeed
Other tags (```shell, ```json, untagged) are not run.

Usage: test_readme.py FSDP_PLAN_BINARY   (run by ctest)
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
# The README and the manual: every page's examples run.
PAGES = [README] + sorted(os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                          if f.endswith(".md"))
BINARY = os.environ.get("FSDP_PLAN", os.path.join(ROOT, "build", "app", "fsdp-plan"))


def blocks(text):
    """(tag, body, line number) of each fenced block."""
    out = []
    for m in re.finditer(r"^```([^\n`]*)\n(.*?)^```$", text, re.M | re.S):
        out.append((m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1))
    return out


def console_steps(body):
    """[(command, expected output)] from `$ command` lines and what follows them."""
    steps = []
    for line in body.splitlines():
        if line.startswith("$ "):
            steps.append([line[2:], []])
        elif steps:
            steps[-1][1].append(line)
    return [(cmd, "\n".join(lines)) for cmd, lines in steps]


def yaml_commands(body):
    """[(argv or shell script, shell)] of Actions steps and pre-commit hooks."""
    doc = yaml.safe_load(body)
    steps = doc if isinstance(doc, list) else []
    out = [(s["run"], s.get("shell", "bash")) for s in steps if isinstance(s, dict) and "run" in s]
    if isinstance(doc, dict):
        for repo in doc.get("repos", []):
            for hook in repo.get("hooks", []):
                if "entry" in hook:
                    out.append((shlex.split(hook["entry"]), None))
    return out


class Readme(unittest.TestCase):
    def setUp(self):
        self._dir = tempfile.TemporaryDirectory()
        self.cwd = self._dir.name
        for d in ("sample_models", "policies", "plans"):
            shutil.copytree(os.path.join(ROOT, d), os.path.join(self.cwd, d))
        self.env = dict(os.environ, PATH=os.path.dirname(BINARY) + os.pathsep + os.environ["PATH"],
                        GITHUB_STEP_SUMMARY=os.path.join(self.cwd, "summary.md"))

    def tearDown(self):
        self._dir.cleanup()

    def sh(self, script, shell="bash"):
        # GitHub's `shell: bash` is `bash --noprofile --norc -eo pipefail {0}`.
        argv = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script] if shell == "bash" else \
            [shell, "-e", "-c", script]
        return subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=300)

    def test_the_pages_have_runnable_examples(self):
        tags = []
        for page in PAGES:
            with open(page) as f:
                tags += [t for t, _, _ in blocks(f.read())]
        for tag in ("sh", "console", "yaml"):
            self.assertIn(tag, tags)

    def test_examples(self):
        ran = 0
        for page in PAGES:
            name = os.path.relpath(page, ROOT)
            with open(page) as f:
                text = f.read()
            for tag, body, line in blocks(text):
                where = f"{name}:{line}"
                if tag == "sh":
                    with self.subTest(block=f"{where} sh"):
                        r = self.sh(body)
                        self.assertEqual(r.returncode, 0, f"{where}\n{body}\n{r.stdout}{r.stderr}")
                        ran += 1
                elif tag == "console":
                    for cmd, expected in console_steps(body):
                        with self.subTest(block=f"{where} $ {cmd}"):
                            r = self.sh(cmd)
                            self.assertEqual(r.stderr, "", f"{where}: {cmd}")
                            self.assertEqual(r.stdout.rstrip("\n"), expected.rstrip("\n"), f"{where}: {cmd}")
                            ran += 1
                elif tag == "yaml":
                    for command, shell in yaml_commands(body):
                        with self.subTest(block=f"{where} yaml"):
                            if shell is None:  # a pre-commit entry: argv, no shell
                                r = subprocess.run(command, cwd=self.cwd, env=self.env, capture_output=True,
                                                   text=True, timeout=300)
                            else:
                                r = self.sh(command, shell)
                            self.assertEqual(r.returncode, 0, f"{where}\n{command}\n{r.stdout}{r.stderr}")
                            ran += 1
        self.assertGreater(ran, 15)

    def test_links_between_pages_resolve(self):
        # A relative link from one page to a file of the repository names a file that exists.
        for page in PAGES:
            with open(page) as f:
                text = f.read()
            for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", text):
                with self.subTest(page=os.path.relpath(page, ROOT), link=target):
                    self.assertTrue(os.path.exists(os.path.join(os.path.dirname(page), target)))

    def test_the_actions_step_fails_on_a_changed_plan(self):
        # The gate must bite: the same step against a plan of another policy fails.
        with open(os.path.join(ROOT, "docs", "ci.md")) as f:
            steps = [c for t, b, _ in blocks(f.read()) if t == "yaml" for c in yaml_commands(b) if c[1]]
        self.assertTrue(steps)
        r = subprocess.run([BINARY, "sample_models/tiny_gpt.pt", "--policy", "policies/size_based.json",
                            "-f", "json", "-o", "plans/tiny_gpt.json"], cwd=self.cwd, capture_output=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        script, shell = steps[0]
        self.assertEqual(self.sh(script, shell).returncode, 1)
        with open(self.env["GITHUB_STEP_SUMMARY"]) as f:
            self.assertIn("the plan differs from plans/tiny_gpt.json", f.read())


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
