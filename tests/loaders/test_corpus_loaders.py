#!/usr/bin/env python3
"""Both loaders on the corpus (tests/corpus/, archives written by torch 2.13):
identical trees (--dump-tree, requires_grad included) and identical JSON
plans under each model's _no_split_modules policy. Where this build's LibTorch
cannot load an archive (Debian's 1.13 lacks ops that torch 2.13 writes), the
test says so and checks the default loader alone; the build against the torch
2.13 wheel's LibTorch (scripts/dev torch2) compares every model.

  test_corpus_loaders.py FSDP_PLAN_BINARY CORPUS_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

FAILURES = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def run(binary, *args):
    p = subprocess.run([binary, *args], capture_output=True, text=True, timeout=600)
    return p.returncode, p.stdout, p.stderr.strip()


def main():
    binary, corpus = sys.argv[1], sys.argv[2]
    with open(os.path.join(corpus, "index.json")) as f:
        models = json.load(f)["models"]
    compared = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, entry in sorted(models.items()):
            path = os.path.join(corpus, entry["file"])
            rc_a, tree_a, err_a = run(binary, path, "--dump-tree")
            check(rc_a == 0 and tree_a.startswith("{"), f"{name}: default loader reads it {err_a[:200]}")
            rc_j, tree_j, err_j = run(binary, path, "--dump-tree", "--loader", "jit")
            if rc_j == 2 and "torch::jit::load failed" in err_j:
                print(f"      {name}: this LibTorch cannot load it ({err_j.split(': ', 2)[-1][:160]}); "
                      f"default loader alone")
                continue
            check(rc_j == 0 and tree_a == tree_j, f"{name}: same tree from both loaders {err_j[:200]}")
            args = [path, "-f", "json", "--world-size", "8"]
            classes = entry.get("no_split_modules") or []
            if classes:
                policy = os.path.join(tmp, name + ".json")
                with open(policy, "w") as f:
                    json.dump({"module_classes": classes}, f)
                args += ["--policy", policy]
            plan_a = run(binary, *args)
            plan_j = run(binary, *args, "--loader", "jit")
            check(plan_a[0] in (0, 1) and plan_a[:2] == plan_j[:2],
                  f"{name}: same plan from both loaders (policy {classes or 'none'})")
            compared += 1
    print(f"      {compared} of {len(models)} models compared with --loader jit")
    check(compared > 0, "at least one corpus model compared")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
