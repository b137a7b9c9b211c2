#!/usr/bin/env python3
"""Two fsdp-plan binaries on the same plans, interleaved rep by rep: wall, user and system CPU, max RSS.

For changes that should move speed and not output (issue 27's JSON writer): per case the median wall,
user CPU, system CPU (os.wait4) and max RSS of each binary, the output's size and whether the two
binaries wrote the same bytes. Cases: the synthetic 5,000-module archive (JSON and text), the 70B
export (FSDP1 and FSDP2 JSON), and the 100,000-unit plan (--wide with --wide-policy) where given.
It measures; it asserts nothing. Run it niced on a quiet machine; say the load average it prints.

Usage: bench/compare_binaries.py [--reps N] [--only SUBSTRING] BEFORE AFTER"""
import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time



def cases(a):
    syn = [a.synthetic, "--module-classes", "Block", "--world-size", "8"]
    ex = [a.export, "--module-classes", "LlamaDecoderLayer", "--world-size", "8"]
    out = [("synthetic 5k json", syn + ["-f", "json"]), ("70B FSDP1 json", ex + ["-f", "json"]),
           ("70B FSDP2 json", ex + ["--fsdp-version", "2", "-f", "json"])]
    if a.wide:
        out.append(("wide json", [a.wide, "--policy", a.wide_policy, "-f", "json"]))
    out.append(("synthetic 5k text", syn))
    return [(n, args) for n, args in out if os.path.exists(args[0])]

def run(binary, args, out_path):
    with open(out_path, "wb") as out:
        t0 = time.perf_counter()
        p = subprocess.Popen([binary] + args, stdout=out, stderr=subprocess.DEVNULL)
        _, status, ru = os.wait4(p.pid, 0)
        wall = time.perf_counter() - t0
    rc = os.waitstatus_to_exitcode(status)
    if rc not in (0, 1):
        sys.exit(f"{binary} {' '.join(args)}: exit {rc}")
    return wall, ru.ru_utime, ru.ru_stime, ru.ru_maxrss / 1024.0

def sha(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()[:16], os.path.getsize(path)

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", help="substring of the case names to run")
    ap.add_argument("--synthetic", default="/work/scratch/lead/synthetic_5k.pt")
    ap.add_argument("--export", default="/work/scratch/h-export/new/llama3_70b.pt2")
    ap.add_argument("--wide", help="a very wide model (.pt), e.g. 100,000 leaves")
    ap.add_argument("--wide-policy", help="its policy file")
    ap.add_argument("--tmp", default=tempfile.gettempdir(), help="where the two outputs are written")
    ap.add_argument("before")
    ap.add_argument("after")
    a = ap.parse_args()
    tmp = a.tmp
    print(f"load average {os.getloadavg()[0]:.2f} at the start; {a.reps} reps each, interleaved, "
          "after one untimed run each")
    print(f"{'case':20} {'bin':6} {'wall':>8} {'user':>8} {'sys':>7} {'maxRSS MB':>10}  output")
    for name, args in cases(a):
        if a.only and a.only not in name:
            continue
        res = {"before": [], "after": []}
        outs = {k: os.path.join(tmp, f"compare_binaries_{k}.out") for k in res}
        for k, b in (("before", a.before), ("after", a.after)):
            run(b, args, outs[k])
        digests = {k: sha(outs[k]) for k in res}
        for _ in range(a.reps):
            for k, b in (("before", a.before), ("after", a.after)):
                res[k].append(run(b, args, outs[k]))
        for k in res:
            med = [statistics.median(r[i] for r in res[k]) for i in range(4)]
            print(f"{name:20} {k:6} {med[0]:7.3f}s {med[1]:7.3f}s {med[2]:6.3f}s {med[3]:9.1f}  "
                  f"{digests[k][1]} B sha {digests[k][0]}", flush=True)
        print(f"{'':20} same bytes: {digests['before'] == digests['after']}")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")

if __name__ == "__main__":
    main()
