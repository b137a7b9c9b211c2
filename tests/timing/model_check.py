#!/usr/bin/env python3
"""Worked check of the step-time model (docs/time-model.md): reads the comm oracle's and the FLOP
oracle's JSON for one model and prints, per FSDP unit, the all-gather / reduce-scatter bytes and
times, compute time, exposed communication, and the step time. An ESTIMATE from peak figures and
stated efficiencies; no GPU was used.

    python tests/timing/model_check.py                        # the default checks (below), written
    python tests/timing/model_check.py --check                # compared with reference/model_check/
    python tests/timing/model_check.py --comm llama3_8b.fsdp2.w8.mp_bf16_fp32 \\
        --flops llama3_8b.sdpa.noac.b1s4096 --hardware h100 [--gpus-per-node 8] \\
        [--intra-node-bandwidth GBps] [--inter-node-bandwidth GBps] [--efficiency 0.5] [--json OUT]

The C++ implementation (issue 27, phase 2) must reproduce reference/model_check/*.json.
"""
import argparse
import json
import os
import sys
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import timing_common as tc  # noqa: E402
import time_model as tm  # noqa: E402

OUT_DIR = os.path.join(tc.REFERENCE, "model_check")
# name -> (comm case, FLOP case, hardware, overrides)
CHECKS = {
    "llama.fsdp2.w8.h100": ("llama.fsdp2.w8.mp_bf16_fp32", "llama.sdpa.noac.b2s16", "h100", {}),
    "llama.fsdp1.w8.h100": ("llama.fsdp1.w8.mp_bf16_fp32", "llama.sdpa.noac.b2s16", "h100", {}),
    "llama3_8b.fsdp2.w8.h100": ("llama3_8b.fsdp2.w8.mp_bf16_fp32", "llama3_8b.sdpa.noac.b1s4096", "h100", {}),
    "llama3_8b.fsdp1.w8.h100": ("llama3_8b.fsdp1.w8.mp_bf16_fp32", "llama3_8b.sdpa.noac.b1s4096", "h100", {}),
    "llama3_8b.fsdp2.w8.h100.ac": ("llama3_8b.fsdp2.w8.mp_bf16_fp32", "llama3_8b.sdpa.ac.b1s4096", "h100", {}),
    # The same 8 GPUs spread over two nodes (4 per node): every collective crosses the network.
    "llama3_8b.fsdp2.w8.h100.2nodes": ("llama3_8b.fsdp2.w8.mp_bf16_fp32", "llama3_8b.sdpa.noac.b1s4096", "h100",
                                       {"gpus_per_node": 4}),
    "llama3_8b.fsdp2.w16.h100": ("llama3_8b.fsdp2.w16.mp_bf16_fp32", "llama3_8b.sdpa.noac.b1s4096", "h100", {}),
    "llama3_8b.fsdp2.w16.hsdp2x8.h100": ("llama3_8b.fsdp2.w16.hsdp2x8_mp_bf16_fp32", "llama3_8b.sdpa.noac.b1s4096",
                                         "h100", {}),
    "llama3_8b.fsdp2.w8.a100": ("llama3_8b.fsdp2.w8.mp_bf16_fp32", "llama3_8b.sdpa.noac.b1s4096", "a100", {}),
    "llama3_8b.fsdp2.w8.h200": ("llama3_8b.fsdp2.w8.mp_bf16_fp32", "llama3_8b.sdpa.noac.b1s4096", "h200", {}),
}


def load(kind: str, case: str) -> Dict[str, Any]:
    path = os.path.join(tc.REFERENCE, kind, case + ".json")
    if not os.path.exists(path):
        known = sorted(f[:-5] for f in os.listdir(os.path.dirname(path)))
        raise SystemExit(f"model_check: no {kind} case {case!r}; known: {', '.join(known)}")
    return tc.read_json(path)


def run(comm_case: str, flop_case: str, hardware: str, overrides: Dict[str, Any]) -> Dict[str, Any]:
    hw = tm.PRESETS[hardware]
    a = tm.Assumptions()
    for k in ("compute_efficiency", "comm_efficiency", "memory_efficiency", "gpus_per_node"):
        if overrides.get(k) is not None:
            setattr(a, k, overrides[k])
    if overrides.get("intra_node_bandwidth") is not None or overrides.get("inter_node_bandwidth") is not None:
        hw = tm.Hardware(**{**tm.asdict(hw),
                            "intra_node_bytes_per_s": overrides.get("intra_node_bandwidth") or hw.intra_node_bytes_per_s,
                            "inter_node_bytes_per_s": overrides.get("inter_node_bandwidth") or hw.inter_node_bytes_per_s})
    comm, flops = load("comm", comm_case), load("flops", flop_case)
    doc = tm.step_time(comm, flops, hw, a)
    doc.update({"comm_case": comm_case, "flop_case": flop_case, "hardware_preset": hardware,
                "world_size": comm["config"]["world"], "fsdp_version": comm["config"]["version"],
                "batch_seq": [flops["config"]["batch"], flops["config"]["seq"]]})
    return doc


def print_report(name: str, doc: Dict[str, Any]) -> None:
    hw, a = doc["hardware"], doc["assumptions"]
    print(f"== {name}: ESTIMATE (no GPU measurement) of one training step, rank 0 of {doc['world_size']}, "
          f"FSDP{doc['fsdp_version']}, batch x seq {doc['batch_seq'][0]} x {doc['batch_seq'][1]}")
    print(f"   {hw['name']}: {doc['compute_peak_flops'] / 1e12:.1f} TFLOP/s peak x {a['compute_efficiency']} compute "
          f"efficiency; NVLink {hw['intra_node_bytes_per_s'] / 1e9:.0f} GB/s, network "
          f"{hw['inter_node_bytes_per_s'] / 1e9:.0f} GB/s per GPU per direction x {a['comm_efficiency']}; "
          f"{a['gpus_per_node']} GPUs per node; ring latency {a['base_latency_s'] * 1e6:.1f} us + "
          f"{a['intra_step_latency_s'] * 1e6:.1f} us/NVLink step, {a['inter_step_latency_s'] * 1e6:.1f} us/network step")
    hdr = (f"   {'unit':<24} {'all-gather':>11} {'AG time':>10} {'red.-scat.':>11} {'RS time':>10} {'all-red.':>10} "
           f"{'compute':>10} {'exposed':>10}")
    print(hdr)
    for u in doc["units"]:
        print(f"   {(u['unit'] or '(root)')[:24]:<24} {tm.fmt_b(u['all_gather_bytes']):>11} {tm.fmt_s(u['all_gather_s']):>10} "
              f"{tm.fmt_b(u['reduce_scatter_bytes']):>11} {tm.fmt_s(u['reduce_scatter_s']):>10} "
              f"{tm.fmt_b(u['all_reduce_bytes']):>10} "
              f"{tm.fmt_s(u['forward_compute_s'] + u['backward_compute_s']):>10} {tm.fmt_s(u['exposed_s']):>10}")
    print(f"   compute {tm.fmt_s(doc['compute_s'])} + exposed communication {tm.fmt_s(doc['exposed_comm_s'])} + "
          f"optimizer {tm.fmt_s(doc['optimizer_s'])} = step {tm.fmt_s(doc['step_s'])} (estimate)")


def compare(ref: Any, got: Any, path: str = "") -> List[str]:
    """Equal JSON, floats to a relative 1e-9."""
    if isinstance(ref, float) or isinstance(got, float):
        if not isinstance(ref, (int, float)) or not isinstance(got, (int, float)) or \
                abs(ref - got) > 1e-9 * max(abs(ref), abs(got), 1e-30):
            return [f"{path}: {ref!r} vs {got!r}"]
        return []
    if isinstance(ref, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(ref) | set(got)):
            if k not in ref or k not in got:
                out.append(f"{path}.{k}: missing on one side")
            else:
                out += compare(ref[k], got[k], f"{path}.{k}")
        return out
    if isinstance(ref, list) and isinstance(got, list):
        if len(ref) != len(got):
            return [f"{path}: length {len(ref)} vs {len(got)}"]
        return [m for i, (x, y) in enumerate(zip(ref, got)) for m in compare(x, y, f"{path}[{i}]")]
    return [] if ref == got else [f"{path}: {ref!r} vs {got!r}"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--comm", help="comm oracle case (reference/comm/CASE.json)")
    ap.add_argument("--flops", help="FLOP oracle case (reference/flops/CASE.json)")
    ap.add_argument("--hardware", default="h100", choices=sorted(tm.PRESETS))
    ap.add_argument("--gpus-per-node", type=int)
    ap.add_argument("--intra-node-bandwidth", type=float, help="GB/s per GPU per direction (peak)")
    ap.add_argument("--inter-node-bandwidth", type=float, help="GB/s per GPU per direction (peak)")
    ap.add_argument("--efficiency", type=float, help="compute efficiency (achieved / peak FLOP/s)")
    ap.add_argument("--comm-efficiency", type=float)
    ap.add_argument("--json", help="write the result here")
    ap.add_argument("--check", action="store_true", help="compare the default checks with reference/model_check/")
    ap.add_argument("-k", action="append", default=[])
    args = ap.parse_args(argv)
    if args.comm or args.flops:
        if not (args.comm and args.flops):
            ap.error("--comm and --flops go together")
        ov = {"gpus_per_node": args.gpus_per_node, "compute_efficiency": args.efficiency,
              "comm_efficiency": args.comm_efficiency,
              "intra_node_bandwidth": args.intra_node_bandwidth * 1e9 if args.intra_node_bandwidth else None,
              "inter_node_bandwidth": args.inter_node_bandwidth * 1e9 if args.inter_node_bandwidth else None}
        doc = run(args.comm, args.flops, args.hardware, ov)
        print_report(f"{args.comm} + {args.flops}", doc)
        if args.json:
            tc.write_json(args.json, doc)
        return 0
    failed = 0
    for name in tc.select(list(CHECKS), args.k):
        comm_case, flop_case, hw, ov = CHECKS[name]
        doc = tc.json_round_trip(run(comm_case, flop_case, hw, ov))
        print_report(name, doc)
        path = os.path.join(OUT_DIR, name + ".json")
        if doc["check_step_equals_compute_plus_exposed_plus_optimizer"] > 1e-12:
            print("   FAIL: step != compute + exposed + optimizer")
            failed += 1
        if args.check:
            diffs = compare(tc.read_json(path), doc) if os.path.exists(path) else [f"no reference {path}"]
            if diffs:
                failed += 1
                print("   FAIL: " + "; ".join(diffs[:5]))
        else:
            tc.write_json(path, doc)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
