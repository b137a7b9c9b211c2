"""What the differential tests share: running fsdp-plan, and comparing its
plan with a reference plan (reference_plan.py's shape) difference by difference.
Imports no torch, so any interpreter can use it."""
import json
import os
import subprocess
from typing import Any, Dict, List, Optional, Tuple

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
MAX_MESSAGES = 12  # per case


def _short_class(name: Optional[str]) -> str:
    return (name or "").rsplit(".", 1)[-1]


def _tensor_desc(t: Dict[str, Any]) -> str:
    return f"{t.get('name')!r} {t.get('shape')} {t.get('dtype')}"


def compare_plans(expected: Dict[str, Any], actual: Dict[str, Any]) -> List[str]:
    """Human-readable differences, most informative first; [] when equal."""
    msgs: List[str] = []
    eunits, aunits = expected["units"], actual.get("units")
    if not isinstance(aunits, list):
        return ["plan JSON has no `units` list"]

    def where(units, kind):
        loc = {}
        for i, u in enumerate(units):
            for t in u.get(kind) or []:
                loc.setdefault(t.get("name"), (i, u.get("path")))
        return loc

    epaths = [u["path"] for u in eunits]
    apaths = [u.get("path") for u in aunits]
    if epaths != apaths:
        missing = [p for p in epaths if p not in apaths]
        extra = [p for p in apaths if p not in epaths]
        if missing:
            msgs.append(f"units missing from the plan: {missing[:10]}" + (" ..." if len(missing) > 10 else ""))
        if extra:
            msgs.append(f"units in the plan that PyTorch does not make: {extra[:10]}" + (" ..." if len(extra) > 10 else ""))
        if not missing and not extra:
            for i, (e, a) in enumerate(zip(epaths, apaths)):
                if e != a:
                    msgs.append(f"unit order differs at unit {i}: expected {e!r}, plan has {a!r}")
                    break
        if len(epaths) != len(apaths):
            msgs.append(f"expected {len(epaths)} units, plan has {len(apaths)}")

    aby_path = {}
    for i, u in enumerate(aunits):
        aby_path.setdefault(u.get("path"), (i, u))
    for kind, label in (("params", "param"), ("buffers", "buffer")):
        aloc = where(aunits, kind)
        eloc = where(eunits, kind)
        later: List[str] = []
        for ei, eu in enumerate(eunits):
            if eu["path"] not in aby_path:
                continue
            ai, au = aby_path[eu["path"]]
            tag = f"unit {ei} {eu['path']!r}"
            elist = eu[kind]
            alist = au.get(kind) or []
            enames = [t["name"] for t in elist]
            anames = [t.get("name") for t in alist]
            for t in elist:
                if t["name"] not in anames:
                    if t["name"] in aloc:
                        j, p = aloc[t["name"]]
                        msgs.append(f"{tag}: {label} {t['name']!r} expected in this unit, plan has it in unit {j} {p!r}")
                    else:
                        msgs.append(f"{tag}: {label} {t['name']!r} expected in this unit, plan has it in no unit")
            for t in alist:
                n = t.get("name")
                if n not in enames:
                    if n in eloc:
                        j, p = eloc[n]
                        later.append(f"{tag}: plan puts {label} {n!r} here, PyTorch puts it in unit {j} {p!r}")
                    else:
                        msgs.append(f"{tag}: plan has {label} {n!r}, which PyTorch assigns to no unit")
            common_e = [n for n in enames if n in anames]
            common_a = [n for n in anames if n in enames]
            if common_e != common_a:
                k = next(i for i, (x, y) in enumerate(zip(common_e, common_a)) if x != y)
                msgs.append(f"{tag}: {label} order differs at position {k}: expected {common_e[k]!r}, plan has {common_a[k]!r}")
            amap = {t.get("name"): t for t in alist}
            for t in elist:
                a = amap.get(t["name"])
                if a is None:
                    continue
                if list(a.get("shape") or []) != t["shape"] or a.get("dtype") != t["dtype"]:
                    msgs.append(f"{tag}: {label} expected {_tensor_desc(t)}, plan has {_tensor_desc(a)}")
                elif "numel" in a and a["numel"] != t["numel"]:
                    msgs.append(f"{tag}: {label} {t['name']!r} numel expected {t['numel']}, plan has {a['numel']}")
                elif "requires_grad" in t and a.get("requires_grad") != t["requires_grad"]:
                    msgs.append(f"{tag}: {label} {t['name']!r} requires_grad expected {t['requires_grad']}, "
                                f"plan has {a.get('requires_grad')}")
        msgs.extend(later)
    for ei, eu in enumerate(eunits):
        if eu["path"] not in aby_path:
            continue
        _, au = aby_path[eu["path"]]
        tag = f"unit {ei} {eu['path']!r}"
        if au.get("mixed_precision", "<absent>") != eu["mixed_precision"]:
            msgs.append(f"{tag}: mixed_precision expected {json.dumps(eu['mixed_precision'])}, "
                        f"plan has {json.dumps(au.get('mixed_precision', '<absent>'))}")
        if _short_class(au.get("class")) != eu["class"]:
            msgs.append(f"{tag}: class expected {eu['class']!r}, plan has {au.get('class')!r}")
    return msgs


def run_binary(binary: str, model_path: str, policy_path: str, *extra: str,
               ok_codes: Tuple[int, ...] = (0,)) -> Tuple[Optional[Dict[str, Any]], str]:
    """The plan as JSON, or None and why not. Exit 1 still prints a plan:
    `ok_codes=(0, 1)` accepts it (the plan's warnings then say why)."""
    cmd = [binary, model_path, "--policy", policy_path, "--format", "json", *extra]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return None, f"timed out: {' '.join(cmd)}"
    if r.returncode not in ok_codes:
        return None, f"exit {r.returncode}: {' '.join(cmd)}\n{r.stderr.strip()[-2000:]}"
    try:
        return json.loads(r.stdout), ""
    except json.JSONDecodeError as e:
        return None, f"output is not JSON ({e}): {r.stdout[:300]!r}"


def default_binary() -> str:
    return os.environ.get("FSDP_PLAN") or os.path.join(REPO, "build", "app", "fsdp-plan")
