#!/usr/bin/env python3
"""fsdp-plan-export of a Llama 3 70B config, and the wheel's install time:
the figures issue 25 sets targets for (this machine: under 30 s and 1 GB for
the export, a file under 20 MB; the wheel installs in under 10 s). Prints the
figures; asserts nothing about time.

    $FSDP_PLAN_VENV/bin/python bench/export_bench.py [--seq 8192] [--dtype bfloat16] [--dynamic]
        [--binary build/app/fsdp-plan] [--wheel build-wheel/wheelhouse/fsdp_plan-*.whl] [--keep DIR]

The config is tests/corpus/corpus.py's FULL["llama3_70b"] (built on the meta
device here, its config written with save_pretrained). The export runs as
its own process (`python -m fsdp_plan.export` from this checkout's python/),
timed from start to exit, import of torch and transformers included; its
peak RSS is that child's own (GNU time's %M; see timed_child). With --binary,
the file is then planned with the recorded no_split_modules at world size 64.
With --wheel, the wheel is installed with --no-index into a fresh venv, timed.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, ".."))


def timed_child(cmd, env=None):
    """(exit code, wall seconds, peak RSS bytes, CPU seconds, stderr) of one child process.

    The peak RSS comes from GNU time (/usr/bin/time -f %M), the child's parent: a
    child forked straight from this process would report this process's own RSS
    (torch and transformers imported, ~360 MB) as its peak, because Linux keeps the
    pre-exec memory's high-water mark in ru_maxrss (fs/exec.c: exec_mmap,
    setmax_mm_hiwater_rss). The times are still os.wait4's."""
    with tempfile.NamedTemporaryFile(prefix="rss-", suffix=".txt") as rss_file:
        gnu_time = os.path.exists("/usr/bin/time")
        argv = ["/usr/bin/time", "-q", "-f", "%M", "-o", rss_file.name, *cmd] if gnu_time else list(cmd)
        t0 = time.perf_counter()
        p = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        stderr = p.stderr.read()
        _, status, usage = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        rss = usage.ru_maxrss * 1024
        if gnu_time:
            lines = open(rss_file.name).read().split()
            rss = int(lines[-1]) * 1024 if lines and lines[-1].isdigit() else rss
    return p.returncode, wall, rss, usage.ru_utime + usage.ru_stime, stderr


def write_config(out_dir: str) -> str:
    sys.path.insert(0, os.path.join(REPO, "tests", "corpus"))
    import corpus
    model = corpus.build("llama3_70b", device="meta")
    cfg = model.config
    cfg.architectures = [type(model).__name__]
    d = os.path.join(out_dir, "llama3_70b")
    os.makedirs(d, exist_ok=True)
    cfg.save_pretrained(d)
    return d


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--dynamic", action="store_true", help="also --dynamic batch,seq")
    ap.add_argument("--binary", default=None, help="plan the file with this fsdp-plan")
    ap.add_argument("--wheel", default=None, help="time pip install --no-index of this wheel into a fresh venv")
    ap.add_argument("--keep", default=None)
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory(prefix="fsdp-export-bench-")
    work = args.keep or tmp.name
    os.makedirs(work, exist_ok=True)
    src = write_config(work)
    out = os.path.join(work, "llama3_70b.pt2")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"),
                                                        os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "fsdp_plan.export", src, "-o", out, "--seq", str(args.seq), "--dtype", args.dtype]
    if args.dynamic:
        cmd += ["--dynamic", "batch,seq", "--batch", "2"]
    code, wall, rss, cpu, stderr = timed_child(cmd, env)
    if code != 0:
        print(f"export failed (exit {code}):\n{stderr}")
        return 1
    size = os.path.getsize(out)
    print(stderr.rstrip())
    print(f"FIGURES export llama3_70b seq {args.seq} {args.dtype}{' dynamic' if args.dynamic else ''}: "
          f"wall {wall:.1f} s (target < 30), CPU {cpu:.1f} s, peak RSS {rss / 1e6:.0f} MB (target < 1000), "
          f"file {size / 1e6:.2f} MB (target < 20)")
    if args.binary:
        sys.path.insert(0, os.path.join(REPO, "python"))
        from fsdp_plan.export import read_metadata
        policy = os.path.join(work, "llama.json")
        with open(policy, "w") as f:
            json.dump({"module_classes": read_metadata(out)["no_split_modules"],
                       "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}}, f)
        code, pwall, prss, pcpu, perr = timed_child([args.binary, out, "--policy", policy, "--world-size", "64",
                                                     "--format", "json"])
        print(f"FIGURES plan (world 64, no_split_modules): exit {code}, wall {pwall:.2f} s, CPU {pcpu:.2f} s, "
              f"peak RSS {prss / 1e6:.1f} MB" + (f": {perr.strip()[-300:]}" if code not in (0, 1) else ""))
    if args.wheel:
        venv = os.path.join(work, "venv")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        code, iwall, _, icpu, ierr = timed_child([os.path.join(venv, "bin", "pip"), "install", "-q",
                                                  "--disable-pip-version-check", "--no-index", "--no-deps",
                                                  args.wheel])
        print(f"FIGURES pip install --no-index {os.path.basename(args.wheel)} "
              f"({os.path.getsize(args.wheel) / 1e6:.2f} MB) into a fresh venv: exit {code}, "
              f"wall {iwall:.2f} s (target < 10), CPU {icpu:.2f} s" + (f": {ierr[-300:]}" if code else ""))
    print(f"# load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
