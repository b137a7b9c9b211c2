#!/usr/bin/python3
"""LibTorch only for --loader jit: a default plan never maps LibTorch's
libraries (the dynamic loader's own trace, LD_DEBUG=files, lists every library
mapped, dlopen'ed ones included); --loader jit maps the plugin and LibTorch; a
build without the plugin says --loader jit is not available (exit 2, one line).

  test_loader_plugin.py FSDP_PLAN_BINARY with|without
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "sample_models", "tiny_gpt.pt")
FAILURES = []


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def mapped(binary, *args):
    env = dict(os.environ, LD_DEBUG="files")
    p = subprocess.run([binary, MODEL, "-f", "json", *args], capture_output=True, text=True, env=env)
    libs = sorted({line.split("file=", 1)[1].split()[0] for line in p.stderr.splitlines()
                   if "file=" in line and ("needed by" in line or "dynamically loaded by" in line)})
    messages = [line for line in p.stderr.splitlines() if not line.lstrip().startswith(tuple("0123456789"))
                and line.strip()]
    return p.returncode, libs, messages, p.stdout


def main():
    binary, mode = sys.argv[1], sys.argv[2]
    ldd = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    # Library names only: ldd's load addresses are random hex and may contain "c10".
    linked = [l.split()[0] for l in ldd.splitlines() if "=>" in l]
    check(not any("torch" in n or "c10" in n for n in linked), "fsdp-plan does not link LibTorch: " +
          ", ".join(linked))
    rc, libs, _, out = mapped(binary)
    check(rc in (0, 1) and out.startswith("{") and libs and not any("torch" in l or "c10" in l for l in libs),
          f"default loader: plan made, {len(libs)} libraries mapped, none of LibTorch's")
    rc, libs, messages, out = mapped(binary, "--loader", "jit")
    if mode == "with":
        check(rc in (0, 1) and out.startswith("{") and any("fsdp_plan_jit" in l for l in libs) and
              any("libtorch" in l for l in libs), f"--loader jit: plugin and LibTorch mapped (rc={rc})")
        # scripts/dev torch2 names another build's plugin: that one, not this build's, must be loaded.
        chosen = os.environ.get("FSDP_PLAN_JIT_PLUGIN")
        if chosen:
            check(os.path.realpath(chosen) in {os.path.realpath(l) for l in libs},
                  f"--loader jit: the plugin $FSDP_PLAN_JIT_PLUGIN names is the one mapped ({chosen})")
    else:
        check(rc == 2 and out == "" and len(messages) == 1 and
              "--loader jit is not available" in messages[0] and
              not any("torch" in l for l in libs),
              f"--loader jit without the plugin: rc={rc} {messages}")
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
