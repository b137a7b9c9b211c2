#!/usr/bin/python3
"""Render time of the HTML report of a big plan in headless chromium.

  /usr/bin/python3 bench/html_render.py [--binary PATH] [--units N] [--node-prefix DIR] [--workdir DIR]

Writes a synthetic archive (tests/cli/test_big_trees.py's `wide`: a root with
N-1 Leaf children, each a unit under {"module_classes": ["Leaf"]}, so N units),
plans it with --format html, then opens the page three times in Debian's
chromium (tests/browser/test_html_report.mjs --time) and prints, per run, the
time from navigation to the end of report.js and report.js's own time.
NODE_PREFIX holds node_modules/playwright-core: build/tests/browser after ctest
has run browser_deps. A measurement, not a test.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "cli"))
from test_big_trees import wide  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "app", "fsdp-plan"))
    ap.add_argument("--units", type=int, default=10_000)
    ap.add_argument("--node-prefix", default=os.path.join(ROOT, "build", "tests", "browser"))
    ap.add_argument("--workdir")
    a = ap.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="html-bench-")
    model, policy, page = (os.path.join(work, f) for f in ("wide.pt", "leaf.json", "wide.html"))
    wide(model, a.units - 1)
    with open(policy, "w") as f:
        json.dump({"module_classes": ["Leaf"]}, f)
    t0 = time.perf_counter()
    subprocess.run([a.binary, model, "--policy", policy, "--world-size", "8", "--format", "html", "-o", page],
                   check=True)
    print(f"fsdp-plan --format html: {a.units} units in {time.perf_counter() - t0:.2f} s, "
          f"page {os.path.getsize(page) / 2**20:.1f} MiB")
    subprocess.run(["node", os.path.join(ROOT, "tests", "browser", "test_html_report.mjs"), "--time", page,
                    a.node_prefix], check=True)


if __name__ == "__main__":
    main()
