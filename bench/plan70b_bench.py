#!/usr/bin/env python3
"""The whole plan of a Llama-3-70B export, activations included, for two
binaries side by side: issue 30's target (under 50 ms and 100 MB).

    python3 bench/plan70b_bench.py --old OLD_BINARY [--new build/app/fsdp-plan] [--file F.pt2]
        [--reps 15] [--format json] [--fsdp-version 1] [--world-size 8] [--policy P] [--old-policy Q]

The file is a torch.export archive of transformers' LlamaForCausalLM with
Llama-3-70B dimensions (80 layers), batch 1 x sequence 8192, bf16, made on
the meta device (tests/activations: export of the corpus config; 9.7 MB,
of which models/model.json is 9.4 MB). The command is

    fsdp-plan FILE --module-classes LlamaDecoderLayer --world-size 8 -f json -v

with its output thrown away. Each rep runs the old binary, then the new one,
then the other way round on the next rep (ABBA), so that the machine's load
hits both alike. For each binary it reports medians (min-max) of:

- wall: time.perf_counter() around the child, start to exit;
- cpu: user + system time of the child (os.wait4's rusage);
- max RSS: GNU /usr/bin/time -f %M around a second run of the same rep
  (os.wait4's ru_maxrss of a child of this Python starts at Python's own size);
- load / plan: the child's own stage times from -v ("loaded ... in X ms",
  "planned ... in Y ms"); the rest of the wall is process start, the JSON
  writer and exit.

Before timing, each binary runs once untimed and the two outputs are compared
byte for byte (a differing output is reported, not hidden). The load average
is printed at the start and the end: on a shared 2-core machine compare the
ratios, not the absolute times. The bench measures; it asserts nothing.
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# bench/export_bench.py --seq 8192 --keep build/bench writes it (the exporter, a minute or two).
DEFAULT_FILE = os.path.join(ROOT, "build", "bench", "llama3_70b.pt2")
STAGE = re.compile(r"(loaded|planned) .* in ([0-9.]+) ms")


def command(binary: str, args: argparse.Namespace, old: bool = False) -> list:
    policy = args.old_policy if old and args.old_policy else args.policy
    cmd = [binary, args.file, "--module-classes", args.module_classes, "--world-size", str(args.world_size),
           "-f", args.format, "-v"] + (["--policy", policy] if policy else [])
    if args.fsdp_version != 1:
        cmd += ["--fsdp-version", str(args.fsdp_version)]
    return cmd


def timed(cmd: list) -> dict:
    """Wall, CPU and the -v stage times of one run."""
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    err = p.stderr.read().decode(errors="replace")
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code not in (0, 1):
        sys.exit(f"{cmd[0]} exited {code}:\n{err}")
    stages = {m.group(1): float(m.group(2)) / 1000 for m in STAGE.finditer(err)}
    return {"wall": wall, "cpu": usage.ru_utime + usage.ru_stime, "load": stages.get("loaded"),
            "plan": stages.get("planned")}


def max_rss(cmd: list) -> int:
    """Peak RSS in bytes, from GNU time (kilobytes)."""
    with tempfile.NamedTemporaryFile("r") as out:
        subprocess.run(["/usr/bin/time", "-f", "%M", "-o", out.name] + cmd, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
        return int(out.read().split()[-1]) * 1024


def output_of(cmd: list) -> bytes:
    return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=False).stdout


def summary(values: list, scale: float, unit: str) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    return f"{statistics.median(vals) * scale:8.1f} {unit} ({min(vals) * scale:.1f}-{max(vals) * scale:.1f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", required=True, help="the binary to compare against (e.g. a build of main)")
    ap.add_argument("--new", default=os.path.join(ROOT, "build", "app", "fsdp-plan"))
    ap.add_argument("--file", default=DEFAULT_FILE, help="the .pt2 (default: %(default)s)")
    ap.add_argument("--module-classes", default="LlamaDecoderLayer")
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--fsdp-version", type=int, default=1, choices=(1, 2))
    ap.add_argument("--format", default="json", choices=("json", "text", "html"))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--policy", help="a policy file for both runs (issue 42: one with compile and selective AC)")
    ap.add_argument("--old-policy", help="the old binary's policy instead (the same binary with two policies: "
                                         "compile + SAC against eager)")
    args = ap.parse_args()
    if not os.path.exists(args.file):
        sys.exit(f"{args.file}: no such file (make it with bench/export_bench.py --seq 8192 --keep build/bench, "
                 "or pass --file)")

    # Copies, so that a rebuild during the run cannot mix two builds.
    work = tempfile.mkdtemp(prefix="plan70b_bench.")
    bins = {}
    for name in ("old", "new"):
        dst = os.path.join(work, f"fsdp-plan-{name}")
        shutil.copy2(getattr(args, name), dst)
        bins[name] = dst
    cmds = {name: command(b, args, old=name == "old") for name, b in bins.items()}

    with open(args.file, "rb") as f:  # into the page cache
        f.read()
    outs = {name: output_of(cmd) for name, cmd in cmds.items()}
    same = outs["old"] == outs["new"]

    load_start = os.getloadavg()
    runs = {name: [] for name in cmds}
    rss = {name: [] for name in cmds}
    for rep in range(args.reps):
        order = ["old", "new"] if rep % 2 == 0 else ["new", "old"]
        for name in order:
            runs[name].append(timed(cmds[name]))
        for name in order:
            rss[name].append(max_rss(cmds[name]))
    load_end = os.getloadavg()

    print(f"file {args.file} ({os.path.getsize(args.file) / 1e6:.1f} MB)")
    print("command: fsdp-plan FILE " + " ".join(cmds["new"][2:]))
    print(f"reps {args.reps} per binary, interleaved ABBA; medians (min-max); MB = 10^6 bytes")
    print(f"outputs byte-identical: {'yes' if same else 'NO'} ({len(outs['old'])} and {len(outs['new'])} bytes)")
    print(f"{'':6} {'wall':>26} {'cpu (user+sys)':>26} {'max RSS':>26} {'-v loaded':>26} {'-v planned':>26}")
    for name in ("old", "new"):
        r = runs[name]
        print(f"{name:6} {summary([x['wall'] for x in r], 1000, 'ms'):>26} "
              f"{summary([x['cpu'] for x in r], 1000, 'ms'):>26} {summary(rss[name], 1e-6, 'MB'):>26} "
              f"{summary([x['load'] for x in r], 1000, 'ms'):>26} {summary([x['plan'] for x in r], 1000, 'ms'):>26}")
    med = {n: statistics.median(x["wall"] for x in runs[n]) for n in runs}
    cpu = {n: statistics.median(x["cpu"] for x in runs[n]) for n in runs}
    print(f"new / old: wall {med['new'] / med['old']:.2f}, cpu {cpu['new'] / cpu['old']:.2f}, "
          f"max RSS {statistics.median(rss['new']) / statistics.median(rss['old']):.2f}")
    print(f"target (issue 30): under 50 ms and 100 MB; new: {med['new'] * 1000:.1f} ms wall, "
          f"{cpu['new'] * 1000:.1f} ms cpu, {max(rss['new']) / 1e6:.1f} MB (largest)")
    print(f"load average (1 min) at start {load_start[0]:.2f}, at end {load_end[0]:.2f} on {os.cpu_count()} CPUs")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
