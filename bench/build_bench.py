#!/usr/bin/env python3
"""How long a fresh machine takes to build fsdp-plan without LibTorch.

Clones the repository's HEAD (committed work only) into a temporary
directory, then configures and builds the binary as `scripts/dev demo` does
(no LibTorch, no tests, so no doctest-dev needed either):

    cmake -S . -B build-demo -G Ninja -DFSDP_PLAN_LIBTORCH=OFF -DFSDP_PLAN_TESTS=OFF -DCMAKE_BUILD_TYPE=Release
    cmake --build build-demo --target fsdp-plan

with ccache out of the way (CCACHE_DISABLE=1, no compiler launcher), so every
file is compiled. It prints the wall time against the one-minute target, the
CPU time of the compilers, the machine's load average before and after, and
the shared libraries the binary links (ldd). With --compare it also builds
each source file on its own (-DFSDP_PLAN_UNITY=OFF) and with -O2 instead of
CMake's Release -O3, side by side, and prints the ratios.

Usage: python3 bench/build_bench.py [--compare] [--jobs N]
Standard library only: runs with any python3.
"""
import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET_S = 60.0


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def fresh_build(src, build, extra, jobs):
    env = dict(os.environ, CCACHE_DISABLE="1")
    configure = ["cmake", "-S", src, "-B", build, "-G", "Ninja", "-DFSDP_PLAN_LIBTORCH=OFF", "-DFSDP_PLAN_TESTS=OFF",
                 "-DCMAKE_BUILD_TYPE=Release", "-UCMAKE_CXX_COMPILER_LAUNCHER"] + extra
    compile_ = ["cmake", "--build", build, "--target", "fsdp-plan", "-j", str(jobs)]
    load = os.getloadavg()[0]
    cpu0, t0 = children_cpu(), time.monotonic()
    for cmd in (configure, compile_):
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit("build_bench: %s failed:\n%s" % (" ".join(cmd), done.stderr[-3000:]))
    wall, cpu = time.monotonic() - t0, children_cpu() - cpu0
    return wall, cpu, load, os.getloadavg()[0]


def linked_libraries(binary):
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    names = []
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)", line)
        if m and not m.group(1).startswith(("linux-vdso", "/")):
            names.append(m.group(1))
    return names


DEFAULT = ("default (unity, Release -O3)", [])
COMPARED = [("one file per compiler run", ["-DFSDP_PLAN_UNITY=OFF"]),
            ("-O2 (as Debian builds)", ["-DCMAKE_CXX_FLAGS_RELEASE=-O2 -DNDEBUG"])]


def measure(variants, jobs, report=None):
    """Clones HEAD once and builds each (name, extra cmake args) variant from
    scratch. Returns the short revision and, per variant, (name, wall s,
    compiler CPU s, load before, load after, linked libraries)."""
    for tool in ("cmake", "ninja", "git", "ldd"):
        if not shutil.which(tool):
            sys.exit("build_bench: %s is not installed (scripts/dev build installs it)" % tool)
    results = []
    with tempfile.TemporaryDirectory(prefix="fsdp_plan_build_") as tmp:
        src = os.path.join(tmp, "src")
        subprocess.run(["git", "clone", "-q", "--no-hardlinks", ROOT, src], check=True)
        head = subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        for i, (name, extra) in enumerate(variants):
            build = os.path.join(tmp, "build%d" % i)
            wall, cpu, l0, l1 = fresh_build(src, build, extra, jobs)
            results.append((name, wall, cpu, l0, l1, linked_libraries(os.path.join(build, "app", "fsdp-plan"))))
            if report:
                report(results[-1])
    return head, results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--compare", action="store_true", help="also build without unity and with -O2")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel compiles (default: all cores)")
    args = ap.parse_args()
    print("fresh build of fsdp-plan (HEAD, committed work only) without LibTorch: %d cores, -j%d, ccache off"
          % (os.cpu_count() or 0, args.jobs))
    print("%-30s %9s %9s %8s %12s" % ("build", "wall", "CPU", "vs 60 s", "load before/after"), flush=True)

    def row(r):
        name, wall, cpu, l0, l1, _ = r
        print("%-30s %8.1fs %8.1fs %7.2fx %7.2f/%.2f" % (name, wall, cpu, wall / TARGET_S, l0, l1), flush=True)

    head, results = measure([DEFAULT] + (COMPARED if args.compare else []), args.jobs, row)
    base = results[0]
    for name, wall, cpu, *_ in results[1:]:
        print("%s / default: wall %.2fx, CPU %.2fx" % (name, wall / base[1], cpu / base[2]))
    print("revision %s; target: under %.0f s on this machine: %s" %
          (head, TARGET_S, "met" if base[1] < TARGET_S else "MISSED"))
    print("linked (ldd): " + ", ".join(base[5]))
    if any("torch" in lib or "c10" in lib for lib in base[5]):
        sys.exit("build_bench: the binary built without LibTorch links LibTorch")


if __name__ == "__main__":
    main()
