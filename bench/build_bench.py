#!/usr/bin/env python3
"""How long a fresh machine takes to build fsdp-plan without LibTorch.

Clones the repository's HEAD (committed work only) into a temporary
directory, then configures and builds the binary as `scripts/dev demo` does
(no LibTorch, no tests, so no doctest-dev needed either; a quick build):

    cmake -S . -B build-demo -G Ninja -DFSDP_PLAN_LIBTORCH=OFF -DFSDP_PLAN_TESTS=OFF -DCMAKE_BUILD_TYPE=Release \
      -DFSDP_PLAN_QUICK_BUILD=ON
    cmake --build build-demo --target fsdp-plan

with ccache out of the way (CCACHE_DISABLE=1), so every file is compiled.
Each compiler and linker run goes through this script as CMake's launcher
(--launcher), which records its user+sys CPU (os.wait4) and its start and end.
It prints the wall time against the one-minute target, the CPU time of all
compiler runs, the longest one, the critical path (the longest compile, then
the archives and the link: every compile is independent of the others), and
a 2-core estimate: the compiles' CPU seconds scheduled on 2 idle cores in the
order Ninja started them, each on the first free core, then the link; with
the seconds the last compile ran with the other core idle. Timing on a loaded
machine is noise: the CPU seconds and the estimate are what to compare.

--base REV also builds REV as its own `scripts/dev demo` built it then
(Release, no quick build), in the same run, first: old against new.
--compare also builds HEAD each source file on its own (-DFSDP_PLAN_UNITY=OFF)
and at Release -O3 (no quick build), and prints the ratios.

Usage: python3 bench/build_bench.py [--base REV] [--compare] [--jobs N] [--top N]
Standard library only: runs with any python3.
"""
import argparse
import json
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


def launcher_main(argv):
    """CMake's compiler and linker launcher: runs argv, appends one JSON line
    (output, CPU seconds, start, end) to $BUILD_BENCH_LOG."""
    out = argv[argv.index("-o") + 1] if "-o" in argv else argv[-1]
    start = time.time()
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(argv[0], argv)
        finally:
            os._exit(127)
    _, status, usage = os.wait4(pid, 0)
    with open(os.environ["BUILD_BENCH_LOG"], "a") as f:
        f.write(json.dumps({"out": out, "cpu": usage.ru_utime + usage.ru_stime, "start": start,
                            "end": time.time()}) + "\n")
    return os.waitstatus_to_exitcode(status)


def fresh_build(src, build, extra, jobs):
    log = build + ".log"
    env = dict(os.environ, CCACHE_DISABLE="1", BUILD_BENCH_LOG=log)
    launcher = "%s;%s;--launcher" % (sys.executable, os.path.abspath(__file__))
    configure = ["cmake", "-S", src, "-B", build, "-G", "Ninja", "-DFSDP_PLAN_LIBTORCH=OFF", "-DFSDP_PLAN_TESTS=OFF",
                 "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_CXX_COMPILER_LAUNCHER=" + launcher,
                 "-DCMAKE_CXX_LINKER_LAUNCHER=" + launcher] + extra
    compile_ = ["cmake", "--build", build, "--target", "fsdp-plan", "-j", str(jobs)]
    load = os.getloadavg()[0]
    cpu0, t0 = children_cpu(), time.monotonic()
    for cmd in (configure, compile_):
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit("build_bench: %s failed:\n%s" % (" ".join(cmd), done.stderr[-3000:]))
    wall, cpu = time.monotonic() - t0, children_cpu() - cpu0
    with open(log) as f:
        runs = [json.loads(line) for line in f]
    return wall, cpu, load, os.getloadavg()[0], runs


def schedule(runs, cores):
    """(critical path s, estimated wall s on `cores` idle cores, s the last
    compile ran alone) from the recorded runs: compiles in the order Ninja
    started them, each on the first free core, then the rest (archives, link)
    one after another."""
    compiles = sorted((r for r in runs if r["out"].endswith(".o")), key=lambda r: r["start"])
    rest = sum(r["cpu"] for r in runs if not r["out"].endswith(".o"))
    free = [0.0] * cores
    for r in compiles:
        i = free.index(min(free))
        free[i] += r["cpu"]
    free.sort()
    longest = max((r["cpu"] for r in compiles), default=0.0)
    return longest + rest, free[-1] + rest, free[-1] - (free[-2] if cores > 1 else 0.0)


def short_name(out):
    return out.split("CMakeFiles/")[-1].replace(".dir/", ": ")
def linked_libraries(binary):
    out = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True).stdout
    names = []
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)", line)
        if m and not m.group(1).startswith(("linux-vdso", "/")):
            names.append(m.group(1))
    return names


QUICK = ["-DFSDP_PLAN_QUICK_BUILD=ON"]
DEFAULT = ("demo (quick: -Og, unity 16/8)", None, QUICK)
COMPARED = [("one file per compiler run", None, QUICK + ["-DFSDP_PLAN_UNITY=OFF"]),
            ("Release -O3, unity 8", None, [])]


def measure(variants, jobs, report=None):
    """Clones HEAD (and each variant's other revision) and builds each
    (name, revision or None for HEAD, extra cmake args) variant from scratch.
    Returns, per variant, (name, revision, wall s, CPU s, load before, load
    after, compiler runs, linked libraries)."""
    for tool in ("cmake", "ninja", "git", "ldd"):
        if not shutil.which(tool):
            sys.exit("build_bench: %s is not installed (scripts/dev build installs it)" % tool)
    results = []
    with tempfile.TemporaryDirectory(prefix="fsdp_plan_build_") as tmp:
        sources = {}
        for i, (name, rev, extra) in enumerate(variants):
            if rev not in sources:
                src = os.path.join(tmp, "src%d" % len(sources))
                subprocess.run(["git", "clone", "-q", "--no-hardlinks", ROOT, src], check=True)
                if rev:
                    subprocess.run(["git", "-C", src, "checkout", "-q", rev], check=True)
                head = subprocess.run(["git", "-C", src, "rev-parse", "--short", "HEAD"], capture_output=True,
                                      text=True, check=True).stdout.strip()
                sources[rev] = (src, head)
            src, head = sources[rev]
            build = os.path.join(tmp, "build%d" % i)
            wall, cpu, l0, l1, runs = fresh_build(src, build, extra, jobs)
            results.append((name, head, wall, cpu, l0, l1, runs,
                            linked_libraries(os.path.join(build, "app", "fsdp-plan"))))
            if report:
                report(results[-1])
    return results


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--launcher":
        sys.exit(launcher_main(sys.argv[2:]))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", metavar="REV", help="also build REV as Release (its scripts/dev demo), first")
    ap.add_argument("--compare", action="store_true", help="also build HEAD without unity and at Release -O3")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2, help="parallel compiles (default: all cores)")
    ap.add_argument("--top", type=int, default=5, help="the N longest compiles of each build (default 5)")
    args = ap.parse_args()
    print("fresh builds of fsdp-plan (committed work only) without LibTorch: %d cores, -j%d, ccache off"
          % (os.cpu_count() or 0, args.jobs))
    print("%-30s %-9s %8s %8s %8s %9s %9s %8s %s" % ("build", "revision", "wall", "CPU", "longest", "crit.path",
                                                    "2-core", "1 core", "load before/after"), flush=True)

    def row(r):
        name, head, wall, cpu, l0, l1, runs, _ = r
        compiler = sum(x["cpu"] for x in runs)
        crit, est, alone = schedule(runs, 2)
        longest = max(runs, key=lambda x: x["cpu"] if x["out"].endswith(".o") else -1)
        print("%-30s %-9s %7.1fs %7.1fs %7.1fs %8.1fs %8.1fs %7.1fs %.2f/%.2f" %
              (name, head, wall, compiler, longest["cpu"], crit, est, alone, l0, l1), flush=True)
        for x in sorted(runs, key=lambda x: -x["cpu"])[:args.top]:
            print("    %6.1fs  %s" % (x["cpu"], short_name(x["out"])), flush=True)
        del cpu  # cmake's and ninja's own time too; the compilers' is the figure

    variants = ([("before: Release -O3, unity 8", args.base, [])] if args.base else []) + [DEFAULT]
    variants += COMPARED if args.compare else []
    results = measure(variants, args.jobs, row)
    new = next(r for r in results if r[0] == DEFAULT[0])
    for r in results:
        if r is new:
            continue
        c_new, c_old = sum(x["cpu"] for x in new[6]), sum(x["cpu"] for x in r[6])
        print("%s / %s: compiler CPU %.2fx, 2-core estimate %.2fx" %
              (DEFAULT[0], r[0], c_new / c_old, schedule(new[6], 2)[1] / schedule(r[6], 2)[1]))
    est = schedule(new[6], 2)[1]
    print("target: under %.0f s on 2 idle cores (estimate %.1f s, not counting cmake's configure): %s" %
          (TARGET_S, est, "met" if est < TARGET_S else "MISSED"))
    print("linked (ldd): " + ", ".join(new[7]))
    if any("torch" in lib or "c10" in lib for lib in new[7]):
        sys.exit("build_bench: the binary built without LibTorch links LibTorch")


if __name__ == "__main__":
    main()
