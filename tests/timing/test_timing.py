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


def selftest() -> int:
    """The overlap rules of docs/time-model.md on a three-unit step worked out by hand: every
    collective takes 1 ms (2 MB over 2 ranks at 1 GB/s, no latency), a layer computes 5 ms
    forward and 10 ms backward, the root's head likewise. Expected (ms): forward waits 1 for
    the root's all-gather and 1 for layer 0's behind it; backward hides everything until layer
    0's and the root's reduce-scatters, 1 ms each after the last compute (47): backward ends at 49."""
    sys.path.insert(0, HERE)
    import time_model as tm
    hw = tm.Hardware("test", 1e12, 1e12, 28e9, 1e9, 1e9, 1e9)
    a = tm.Assumptions(compute_efficiency=1.0, comm_efficiency=1.0, memory_efficiency=1.0,
                       base_latency_s=0.0, intra_step_latency_s=0.0, inter_step_latency_s=0.0)
    unit = lambda name: {"unit": name, "params": [{"param_dtype": "bfloat16", "requires_grad": True,
                                                   "padded_sharded_numel": 1000}]}
    coll = lambda phase, kind, u: {"phase": phase, "kind": kind, "unit": u, "cause": "", "bytes": 2_000_000,
                                   "group_ranks": [0, 1]}
    comm = {"config": {"version": 2}, "units": [unit(""), unit("l0"), unit("l1")],
            "collectives": [coll("forward", "all_gather", ""), coll("forward", "all_gather", "l0"),
                            coll("forward", "all_gather", "l1"), coll("backward", "all_gather", "l1"),
                            coll("backward", "all_gather", "l0"), coll("backward", "reduce_scatter", "l1"),
                            coll("backward", "reduce_scatter", "l0"), coll("backward", "reduce_scatter", "")]}
    flops = {"trace": [["l0", "forward", 5 * 10**9, 1], ["l1", "forward", 5 * 10**9, 1],
                       ["head", "forward", 5 * 10**9, 1]],
             "modules": {"": {"forward": 15 * 10**9, "backward": 30 * 10**9},
                         "l0": {"forward": 5 * 10**9, "backward": 10 * 10**9},
                         "l1": {"forward": 5 * 10**9, "backward": 10 * 10**9}}}
    doc = tm.step_time(comm, flops, hw, a)
    got = {u["unit"]: round(u["exposed_s"] * 1e3, 9) for u in doc["units"]}
    fails = []
    if got != {"": 2.0, "l0": 2.0, "l1": 0.0}:
        fails.append(f"exposed per unit {got}")
    for key, want in (("forward_end_s", 17e-3), ("backward_compute_end_s", 47e-3), ("backward_end_s", 49e-3),
                      ("compute_s", 45e-3), ("exposed_comm_s", 4e-3), ("optimizer_s", 3000 * 84 / 28e9)):
        if abs(doc[key] - want) > 1e-12:
            fails.append(f"{key} {doc[key]} != {want}")
    for f in fails:
        print("FAIL selftest: " + f)
    print("-- time_model selftest: " + ("ok" if not fails else "FAIL"), flush=True)
    return 1 if fails else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-comm", action="store_true")
    ap.add_argument("--skip-flops", action="store_true")
    args = ap.parse_args(argv)
    rc = selftest()
    if not args.skip_comm:
        rc |= run("comm_oracle.py", "--ci", "--check")
    if not args.skip_flops:
        rc |= run("flop_oracle.py", "--ci", "--check")
    rc |= run("model_check.py", "--check")
    print("PASS" if rc == 0 else "FAIL")
    return 1 if rc else 0


if __name__ == "__main__":
    sys.exit(main())
