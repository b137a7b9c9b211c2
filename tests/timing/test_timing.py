#!/usr/bin/env python3
"""CI check of tests/timing: the comm oracle's and the FLOP oracle's CI subsets rerun against
PyTorch and compared with reference/, and every model check recomputed from reference/ and
compared with reference/model_check/. Exits 1 on any difference or failed check.

    python tests/timing/test_timing.py [--skip-comm] [--skip-flops]

Each part runs in its own process (the comm oracle patches FSDP methods and torch.Tensor).
"""
import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def run(script: str, *args: str) -> int:
    t0 = time.time()
    r = subprocess.run([sys.executable, os.path.join(HERE, script), *args])
    print(f"-- {script} {' '.join(args)}: exit {r.returncode}, {time.time() - t0:.0f} s", flush=True)
    return r.returncode


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-comm", action="store_true")
    ap.add_argument("--skip-flops", action="store_true")
    args = ap.parse_args(argv)
    rc = 0
    if not args.skip_comm:
        rc |= run("comm_oracle.py", "--ci", "--check")
    if not args.skip_flops:
        rc |= run("flop_oracle.py", "--ci", "--check")
    rc |= run("model_check.py", "--check")
    print("PASS" if rc == 0 else "FAIL")
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
