#!/usr/bin/env python3
"""Why the plan's peak and the tracker's differ, for one case of refs/peak_small.json.

Runs the case as peak_oracle.py does (real FSDP1 / FSDP2 under the fake backend, MemTracker /
FSDPMemTracker, second step recorded), with the tracker instrumented: every storage it tracks is
labelled with the operator that made it (or "param"/"grad"/... when a hook filed it), the phase and
the innermost module running then; at each new peak the live storages are listed. It prints the
tracker's peak as those storages, grouped, beside the plan's peak (`fsdp-plan -f json`:
memory.per_rank, memory.peak, the peak step of memory.timeline and its categories), and the
plan's timeline.

    python tests/activations/peak_probe.py KEY [--binary build/app/fsdp-plan] [--exports build/act_exports]
        [--json FILE]

KEY as in refs/peak_small.json, e.g. llama_b1s16/fsdp1/w8/fp32/noac.
"""
import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from torch.distributed._tools.common_utils import get_untyped_storages  # noqa: E402
from torch.utils.weak import WeakIdKeyDictionary  # noqa: E402

import peak_oracle  # noqa: E402
import test_plan_activations  # noqa: E402


class ProbeMixin:
    """Labels storages as the tracker first files them; lists the live ones at each new peak.

    The tracker's peak is updated only after a dispatched op (mem_tracker.py:
    MemTracker.__torch_dispatch__ -> _update_peak_stats); the list is taken then, from the same
    _WINFO table the snapshot sums."""

    def _probe_init(self) -> None:
        self._probe_labels = WeakIdKeyDictionary()
        self._probe_func = "-"
        self._probe_peak: List[Tuple[str, int, str]] = []
        self._probe_at = ""

    def _probe_where(self) -> str:
        mt = self._mod_tracker
        mods = sorted(mt.parents, key=len)
        phase = "opt" if self._in_opt else ("bw" if mt.is_bw else "fw")
        inner = peak_oracle.clean_fqn(mods[-1]) if mods else "-"
        return f"{phase} {inner}"

    def _probe_label(self, t: torch.Tensor, what: str) -> None:
        for st in get_untyped_storages(t):
            if st not in self._probe_labels:
                self._probe_labels[st] = f"{what} {tuple(t.shape)} {str(t.dtype)[6:]} @ {self._probe_where()}"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self._probe_func = str(func.overloadpacket.__name__)
        return super().__torch_dispatch__(func, types, args, kwargs)

    def _track(self, reftype, t):
        self._probe_label(t, self._probe_func)
        return super()._track(reftype, t)

    def _update_and_maybe_create_winfos(self, t, reftype, update_existing=False):
        self._probe_label(t, f"<{getattr(reftype, 'value', reftype)}>")
        return super()._update_and_maybe_create_winfos(t, reftype, update_existing)

    def _update_peak_stats(self, peak_state) -> None:
        before = dict(self._peak_mem)
        super()._update_peak_stats(peak_state)
        if self._peak_mem != before:
            self._probe_at = f"{self._probe_where()} after {self._probe_func}"
            self._probe_peak = [(str(getattr(w.reftype, "value", w.reftype)), int(w.mem_consumed),
                                 self._probe_labels.get(st, "?"))
                                for st, (w, _) in self._WINFO.items() if w.mem_consumed > 0]


class ProbeFSDPMemTracker(ProbeMixin, peak_oracle.FSDPMemTracker):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._probe_init()


class ProbeMemTracker(ProbeMixin, peak_oracle.FrozenSafeMemTracker):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self._probe_init()


def run_probe(key: str) -> Tuple[Dict[str, Any], Any]:
    for k, name, b, s, version, world, bf16, ac in peak_oracle.case_keys("all"):
        if k == key:
            break
    else:
        raise SystemExit(f"no case {key!r}")
    made: List[Any] = []

    def fsdp2(*a, **kw):
        made.append(ProbeFSDPMemTracker(*a, **kw))
        return made[-1]

    def fsdp1(*a, **kw):
        made.append(ProbeMemTracker(*a, **kw))
        return made[-1]

    peak_oracle.FSDPMemTracker, peak_oracle.FrozenSafeMemTracker = fsdp2, fsdp1
    res = peak_oracle.run_case(name, b, s, version, world, bf16, ac)
    return res, made[-1]


def plan_for(binary: str, exports: str, case: Dict[str, Any], key: str) -> Dict[str, Any]:
    with open(os.path.join(exports, "manifest.json")) as f:
        manifest = {e["file"][:-4]: e for e in json.load(f)["exports"] if "error" not in e}
    stem = key.split("/")[0]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(test_plan_activations.policy_for(case), f)
    return test_plan_activations.plan_json(binary, os.path.join(exports, manifest[stem]["file"]), ["--policy", f.name])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("key")
    ap.add_argument("--binary", default="build/app/fsdp-plan")
    ap.add_argument("--exports", default="build/act_exports")
    ap.add_argument("--json", help="write the tracker's peak storages and the plan's peak here")
    args = ap.parse_args()
    res, tracker = run_probe(args.key)
    rows = sorted(tracker._probe_peak, key=lambda r: (r[0], -r[1]))
    print(f"tracker peak {res['peak_bytes']} at {tracker._probe_at}")
    by_cat: Dict[str, int] = collections.defaultdict(int)
    for cat, b, label in rows:
        by_cat[cat] += b
    for cat in sorted(by_cat):
        print(f"  {cat:16s} {by_cat[cat]:>10d}")
        grouped: Dict[str, List[int]] = collections.defaultdict(list)
        for c, b, label in rows:
            if c == cat:
                grouped[label].append(b)
        for label, bs in sorted(grouped.items(), key=lambda x: -sum(x[1])):
            print(f"      {sum(bs):>10d} {'x' + str(len(bs)) if len(bs) > 1 else '  '} {label}")
    plan = plan_for(args.binary, args.exports, res, args.key)
    m = plan["memory"]
    pr = m["per_rank"]
    print(f"plan peak {pr['peak_bytes']} ({(pr['peak_bytes'] - res['peak_bytes']) / res['peak_bytes']:+.2%}) "
          f"at {m.get('peak')}")
    print("  per_rank " + json.dumps(pr, sort_keys=True))
    for s in m.get("timeline", []):
        s = dict(s)
        mark = "*" if s["total_bytes"] == pr["peak_bytes"] else " "
        cats = s.pop("categories", None)
        print(f" {mark} {s.pop('phase'):15s} {str(s.pop('unit')):>4s} total {s.pop('total_bytes'):>9d} "
              + " ".join(f"{k.replace('_bytes', '')}={v}" for k, v in sorted(s.items()) if v)
              + (f"  [{' '.join(f'{k}={v}' for k, v in cats.items() if v)}]" if cats else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tracker_peak": rows, "tracker_at": tracker._probe_at, "plan": m}, f, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
