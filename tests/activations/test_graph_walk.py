#!/usr/bin/env python3
"""graph_walk.py (model.json + saved_ops.yaml, no torch) against the saved-bytes oracles.

For every small export of EXPORTS_DIR and both CPU SDPA paths (default: the CPU flash kernel;
math), the saved bytes computed from the graph alone are compared with
- the export replayed with autograd (saved_oracle.py --exports: the same graph, run): must be exact,
  in total and per module;
- the eager model (saved_oracle.py: HF's own forward, what training runs): per module and in total
  within TOLERANCE for the exports made as training runs; the `*_plain` exports (HF's export-time
  mask and repeat_kv) are reported, not checked; the dynamic ones are walked at their traced hint
  and at the first shape (--dim batch=1 --dim seq=16) and compared with those static cases.
Parameters and inputs saved for backward are compared too (param_saved_bytes, input_saved_bytes).

    python tests/activations/test_graph_walk.py EXPORTS_DIR [--eager saved_eager.json]
        [--replay saved_export.json] [--peak peak_small.json] [-k SUBSTRING] [-v] [--summary FILE]

With --peak (default refs/peak_small.json when present), every whole-step case is checked too: the
tracker's Activation right after the forward must be the walk's saved bytes plus the 4-byte fp32
loss without AC, and with AC on the decoder layers the walk's kept bytes (saved outside the layers,
plus the layers' inputs) plus the loss, within TOLERANCE (the walk cannot see a layer argument no
node uses: HF passes position_ids, [B, S] int64, which checkpoint_wrapper keeps). Under bf16
mixed precision the floating user inputs saved for backward are added (FSDP's cast of the inputs is
a copy made in the forward); under FSDP1 the parameters of units that mix frozen and trainable ones
count as trainable (graph_walk.fsdp1_flat_requires_grad).

Defaults read the committed references next to this file (refs/). Exits 1 on any failure.
"""
import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import graph_walk  # noqa: E402
import saved_ops  # noqa: E402

TOLERANCE = 0.02  # issue 30: per module within 2% of what autograd saves


def eager_key(entry: Dict[str, Any], sdpa: str) -> str:
    shape = f"b{entry['batch']}" + ("" if entry["seq"] is None else f"s{entry['seq']}")
    dt = "bf16" if entry["dtype"] == "bfloat16" else "fp32"
    return f"{entry['model']}_{shape}/{dt}{'_math' if sdpa == 'math' else ''}"


def compare(got: Dict[str, Any], ref: Dict[str, Any], tol: float) -> Tuple[List[str], float]:
    """Failures (modules or totals off by more than tol) and the largest relative difference."""
    fails, worst = [], 0.0
    for what in ("total_bytes", "param_saved_bytes", "input_saved_bytes"):
        a, b = got[what], ref[what]
        rel = abs(a - b) / b if b else (0.0 if a == 0 else 1.0)
        worst = max(worst, rel) if what == "total_bytes" else worst
        if rel > tol:
            fails.append(f"{what}: graph {a}, oracle {b} ({(a - b) / b if b else 0:+.2%})")
    for path in sorted(set(got["modules"]) | set(ref["modules"])):
        a = got["modules"].get(path, {}).get("total_bytes", 0)
        b = ref["modules"].get(path, {}).get("total_bytes", 0)
        rel = abs(a - b) / b if b else (0.0 if a == 0 else 1.0)
        worst = max(worst, rel)
        if rel > tol:
            fails.append(f"module {path!r}: graph {a}, oracle {b}")
    return fails, worst


LOSS_BYTES = 4  # HF's loss: a 0-dim float32 tensor, alive after the forward, not saved for backward


def check_peak(path: str, exports_dir: str, manifest: List[Dict[str, Any]], table: Dict[str, Any],
               k: Optional[str], summary: Dict[str, Any]) -> List[str]:
    with open(path) as f:
        cases = json.load(f)["cases"]
    by_stem = {e["file"][:-4]: e for e in manifest}
    walks: Dict[Tuple[str, bool], Dict[str, Any]] = {}
    failures = []
    for key, c in sorted(cases.items()):
        if k and k not in key:
            continue
        if "error" in c:
            failures.append(f"{key}: the tracker run failed: {c['error']}")
            continue
        shape = key.split("/")[0]
        stem = shape + ("_bf16" if c["dtype"] == "bfloat16" else "")
        if stem not in by_stem:
            continue  # no export at this shape and dtype (bf16 is exported at the first shape only)
        # FSDP1 units that mix frozen and trainable parameters make the frozen ones trainable for
        # autograd (graph_walk.fsdp1_flat_requires_grad): LoRA's layers.
        fsdp1 = c["fsdp"] == 1
        wkey = (stem, c["ac"], fsdp1)
        if wkey not in walks:
            walks[wkey] = graph_walk.walk(os.path.join(exports_dir, by_stem[stem]["file"]), "cpu", "default", {},
                                          table, ac_classes=c["layer_classes"] if c["ac"] else None,
                                          fsdp1_units=c["layer_classes"] if fsdp1 else None)
        w = walks[wkey]
        want = (w["ac"]["kept_bytes"] if c["ac"] else w["total_bytes"]) + LOSS_BYTES
        if c["dtype"] == "bfloat16":
            # Mixed precision: FSDP casts the floating inputs (ViT's pixel_values) to bf16 in the root's
            # pre-forward; the copy is made in the forward, so it is an activation where it is saved.
            want += w["input_saved_float_bytes"]
        got = c["after_forward"].get("Activation", 0)
        rel = (want - got) / got if got else 0.0
        summary[key] = {"tracker_activation_after_forward": got, "graph": want, "rel": rel}
        print(f"{key:44s} tracker {got:>9d}  graph {want:>9d}  ({rel:+.2%})")
        if abs(rel) > TOLERANCE:
            failures.append(f"{key}: tracker Activation after forward {got}, graph {want} ({rel:+.2%})")
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("exports_dir")
    ap.add_argument("--eager", default=os.path.join(HERE, "refs", "saved_eager.json"))
    ap.add_argument("--replay", default=os.path.join(HERE, "refs", "saved_export.json"))
    ap.add_argument("-k")
    ap.add_argument("-v", action="store_true")
    ap.add_argument("--summary", help="write the per-case comparison as JSON here")
    ap.add_argument("--peak", default=os.path.join(HERE, "refs", "peak_small.json"))
    args = ap.parse_args()
    with open(args.eager) as f:
        eager = json.load(f)["cases"]
    replay = {}
    if os.path.exists(args.replay):
        with open(args.replay) as f:
            replay = json.load(f)["cases"]
    with open(os.path.join(args.exports_dir, "manifest.json")) as f:
        manifest = [e for e in json.load(f)["exports"] if "error" not in e and not e.get("meta")]
    table = saved_ops.load()
    failures: List[str] = []
    summary: Dict[str, Any] = {}
    for e in manifest:
        stem = e["file"][:-4]
        for sdpa in ("default", "math"):
            key = f"{stem}/{sdpa}"
            if args.k and args.k not in key:
                continue
            path = os.path.join(args.exports_dir, e["file"])
            runs = [(key, {}, eager_key(e, sdpa))]
            if e.get("dynamic"):
                first = dict(e, batch=1, seq=16)
                runs.append((key + "@b1s16", {"batch": 1, "seq": 16}, eager_key(first, sdpa)))
            for case, dims, ekey in runs:
                got = graph_walk.walk(path, "cpu", sdpa, dims, table)
                rec: Dict[str, Any] = {"graph_bytes": got["total_bytes"], "missing_ops": got["missing_ops"]}
                if got["missing_ops"]:
                    failures.append(f"{case}: operators without a row: {got['missing_ops']}")
                if case in replay:
                    f_, worst = compare(got, replay[case], 0.0)
                    rec.update(replay_bytes=replay[case]["total_bytes"], replay_worst=worst)
                    failures += [f"{case} vs replay: {m}" for m in f_]
                if ekey in eager:
                    f_, worst = compare(got, eager[ekey], TOLERANCE)
                    rec.update(eager_key=ekey, eager_bytes=eager[ekey]["total_bytes"], eager_worst=worst)
                    if e.get("plain"):
                        rec["eager_checked"] = False
                    else:
                        failures += [f"{case} vs eager {ekey}: {m}" for m in f_]
                summary[case] = rec
                if args.v or True:
                    ref = rec.get("eager_bytes")
                    print(f"{case:34s} graph {got['total_bytes']:>9d}  replay {rec.get('replay_bytes', '-'):>9}  "
                          f"eager {ref if ref is not None else '-':>9}  "
                          f"({'plain, not checked, ' if e.get('plain') else ''}worst module "
                          f"{rec.get('eager_worst', 0):.2%})")
    if args.peak and os.path.exists(args.peak):
        failures += check_peak(args.peak, args.exports_dir, manifest, table, args.k, summary)
    for f_ in failures:
        print("FAIL " + f_)
    print(f"{len(summary)} cases, {len(failures)} failures")
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1, sort_keys=True)
            f.write("\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
