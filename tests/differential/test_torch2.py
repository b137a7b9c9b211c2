#!/usr/bin/env python3
"""Differential test on torch 2.13: the corpus of real Hugging Face models
(tests/corpus/) planned by fsdp-plan against PyTorch itself, twice over:

1. torch 2.13's own wrap functions (ModuleWrapPolicy/transformer_auto_wrap_policy,
   size_based_auto_wrap_policy, _or_policy, _wrap_module_cls_individually,
   _recursive_wrap) and FSDP1's grouping (the seed's, with a tied weight split
   across units placed as FSDP1 builds it): reference_plan.py, the same
   oracle test_differential.py runs on Debian's torch 1.13;
2. real FSDP1, `FullyShardedDataParallel(model, auto_wrap_policy=...,
   device_id=cpu, use_orig_params=..., mixed_precision=..., ignored_...)` in
   this one process under the `fake` process-group backend (rank 0) at world
   sizes 1, 3 and 8, use_orig_params false and true. What FSDP built is read
   back: its FSDP instances (units, in order), each one's flat parameter
   (`_fqns`, `_shapes`, `_numels`, unpadded size including alignment padding,
   the rank's shard numel) and its mixed precision.

The plan (`--format json --world-size N [--use-orig-params]`) must match both:
unit paths in order, per unit the ordered parameter names with shape, dtype and
numel, buffers, class, `mixed_precision`, and `memory.flat_numel` /
`memory.sharded_numel` against FSDP's flat parameters. Each model is also
planned once with `--loader jit` (no_split, the last world size): where that
LibTorch can load the torch 2.13 file, the plan must equal the default
loader's at the same world size; where it cannot, the test says why and skips
that loader only.

    $FSDP_PLAN_VENV/bin/python tests/differential/test_torch2.py BINARY CORPUS_DIR [-k SUBSTR] [-v] [--keep DIR]
        [--world-sizes 1,3,8]

CORPUS_DIR is what tests/corpus/make_corpus.py wrote (ctest: build/corpus).
The last line is `N passed, M failed, S skipped, K known differences`; exit 1 on
any failure. KNOWN cases: tests/differential/README.md.
"""
import argparse
import concurrent.futures
import copy
import functools
import json
import os
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "corpus"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: E402
from torch.distributed.fsdp import MixedPrecision  # noqa: E402
from torch.distributed.fsdp import wrap  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import corpus  # noqa: E402
import reference_plan as rp  # noqa: E402
from plan_compare import MAX_MESSAGES, compare_plans, run_binary  # noqa: E402

WORLD_SIZES = (1, 3, 8)
MP = {"param_dtype": "bfloat16", "reduce_dtype": "float32", "buffer_dtype": "bfloat16"}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


# ---------------------------------------------------------------------------
# Policies per model
# ---------------------------------------------------------------------------
def norm_classes(model: nn.Module) -> List[str]:
    """The model's own normalisation classes (LayerNorm, LlamaRMSNorm, T5LayerNorm, ...)."""
    return sorted({type(m).__name__ for m in model.modules() if type(m).__name__.endswith("Norm")})


def first_instance(model: nn.Module, classes: List[str]) -> Optional[str]:
    return next((n for n, m in model.named_modules() if n and type(m).__name__ in classes), None)


def policies_for(model: nn.Module) -> Dict[str, Dict[str, Any]]:
    no_split = corpus.no_split_modules(model)
    total = sum(p.numel() for p in model.parameters())
    norms = norm_classes(model)
    out: Dict[str, Dict[str, Any]] = {
        # What Accelerate and HF's FSDP integration wrap.
        "no_split": {"module_classes": no_split},
        # A threshold that wraps parts of layers, embeddings and heads.
        "size": {"min_num_params": max(1, total // 12)},
        # Mixed precision with the model's norms kept in full precision: FSDP makes them units.
        "no_split_mp_norms": {"module_classes": no_split, "mixed_precision": dict(MP, ignore_classes=norms)},
        "size_mp": {"min_num_params": max(1, total // 6), "mixed_precision": MP},
    }
    first = first_instance(model, no_split)
    if first:
        out["no_split_ignored"] = {"module_classes": no_split, "ignored_modules": [first]}
    return out


# ---------------------------------------------------------------------------
# Real FSDP1 under the fake backend
# ---------------------------------------------------------------------------
def fsdp_kwargs(policy: Dict[str, Any], model: nn.Module) -> Dict[str, Any]:
    """FullyShardedDataParallel's arguments for `policy`, built from torch's own classes.
    module_classes alone goes through ModuleWrapPolicy (FSDP's _Policy path), anything
    else through callables and _recursive_wrap."""
    kw: Dict[str, Any] = {}
    parts = []
    if "module_classes" in policy:
        classes = set(rp.resolve_classes(policy["module_classes"], model))
        parts.append(wrap.ModuleWrapPolicy(classes))
    if "min_num_params" in policy:
        size = {"min_num_params": int(policy["min_num_params"])}
        if "force_leaf_modules" in policy:
            size["force_leaf_modules"] = set(rp.resolve_classes(policy["force_leaf_modules"], model))
        if "exclude_wrap_modules" in policy:
            size["exclude_wrap_modules"] = set(rp.resolve_classes(policy["exclude_wrap_modules"], model))
        parts.append(functools.partial(wrap.size_based_auto_wrap_policy, **size))
    if len(parts) == 1:
        kw["auto_wrap_policy"] = parts[0]
    elif parts:
        kw["auto_wrap_policy"] = functools.partial(wrap._or_policy, policies=parts)
    mp = policy.get("mixed_precision")
    if mp is not None:
        mkw = {k: DTYPES[mp[k]] for k in ("param_dtype", "reduce_dtype", "buffer_dtype") if k in mp}
        if "ignore_classes" in mp:
            mkw["_module_classes_to_ignore"] = rp.resolve_classes(mp["ignore_classes"], model)
        kw["mixed_precision"] = MixedPrecision(**mkw)
    ignored_modules, ignored_params = rp.ignored_sets(policy, model)
    if policy.get("ignored_params"):
        kw["ignored_states"] = list(ignored_params)
    elif ignored_modules:
        roots = [m for n, m in model.named_modules() if any(rp.glob_to_regex(p).match(n)
                                                              for p in policy["ignored_modules"])]
        kw["ignored_modules"] = roots
    return kw


def unit_path(fsdp_name: str) -> str:
    parts = [p for p in fsdp_name.split(".") if p != "_fsdp_wrapped_module"]
    return ".".join(parts)


def real_fsdp(eager: nn.Module, policy: Dict[str, Any], world_size: int, use_orig_params: bool
              ) -> List[Dict[str, Any]]:
    """FSDP1 on a copy of `eager` in the current fake process group: its units."""
    model = copy.deepcopy(eager)
    fsdp = FSDP(model, device_id=torch.device("cpu"), use_orig_params=use_orig_params,
                **fsdp_kwargs(policy, model))
    assert dist.get_world_size() == world_size
    return fsdp1_units(fsdp, policy)


def fsdp1_units(fsdp: FSDP, policy: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The units FSDP1 built, as compare_fsdp takes them (test_suggest_fsdp.py uses it too)."""
    has_mp = policy.get("mixed_precision") is not None
    units = []
    for name, mod in fsdp.named_modules():
        if not isinstance(mod, FSDP):
            continue
        path = unit_path(name)
        unit = {"path": path, "class": type(mod.module).__name__, "params": [], "flat_numel": 0,
                "sharded_numel": 0, "mixed_precision": (mod.mixed_precision.param_dtype is not None) if has_mp else None}
        handle = mod._handle
        if handle is not None:
            fp = handle.flat_param
            pre = path + "." if path else ""
            unit["params"] = [{"name": pre + fqn, "shape": list(shape), "numel": numel}
                              for fqn, shape, numel in zip(fp._fqns, fp._shapes, fp._numels)]
            unit["flat_numel"] = fp._unpadded_unsharded_size.numel()
            assert sum(fp._numels_with_padding) == unit["flat_numel"]
            unit["sharded_numel"] = fp.numel()  # this rank's shard (rank 0), padding included
            unit["trains"] = fp.requires_grad  # any of its parameters requires grad
        units.append(unit)
    return units


def compare_fsdp(real: List[Dict[str, Any]], plan: Dict[str, Any]) -> List[str]:
    """Differences between FSDP's units and the plan's."""
    msgs: List[str] = []
    punits = plan.get("units") or []
    rpaths, ppaths = [u["path"] for u in real], [u.get("path") for u in punits]
    if rpaths != ppaths:
        return [f"FSDP built units {rpaths[:12]}, the plan has {ppaths[:12]}"]
    for ru, pu in zip(real, punits):
        tag = f"unit {ru['path']!r}"
        pparams = [{"name": t["name"], "shape": t["shape"], "numel": t["numel"]} for t in pu.get("params") or []]
        rparams = ru["params"]
        if pparams != rparams:
            rn, pn = [t["name"] for t in rparams], [t["name"] for t in pparams]
            if rn != pn:
                msgs.append(f"{tag}: FSDP's flat parameter holds {rn[:8]}{' ...' if len(rn) > 8 else ''}, "
                            f"the plan lists {pn[:8]}{' ...' if len(pn) > 8 else ''}")
            else:
                msgs.append(f"{tag}: shapes/numels differ from FSDP's flat parameter")
        mem = pu.get("memory") or {}
        for key in ("flat_numel", "sharded_numel"):
            if mem.get(key) != ru[key]:
                msgs.append(f"{tag}: memory.{key} {mem.get(key)}, FSDP has {ru[key]}")
        if pu.get("mixed_precision") != ru["mixed_precision"]:
            msgs.append(f"{tag}: mixed_precision {pu.get('mixed_precision')}, FSDP has {ru['mixed_precision']}")
        if "trains" in ru and ((pu.get("trainable_numel") or 0) > 0) != ru["trains"]:
            msgs.append(f"{tag}: trainable_numel {pu.get('trainable_numel')}, FSDP's flat parameter has "
                        f"requires_grad={ru['trains']}")
        if (pu.get("class") or "").rsplit(".", 1)[-1] != ru["class"]:
            msgs.append(f"{tag}: class {pu.get('class')!r}, FSDP wraps a {ru['class']}")
    return msgs


# FSDP1's refusals (torch 2.13's messages) and the plan's error kinds for them.
# "uniform dtype" is also what an integer parameter after a floating one gets.
REFUSAL_WORDS = [
    ("uniform requires_grad", {"mixed_requires_grad"}),
    ("has both parameters with requires_grad=True and False", {"mixed_requires_grad"}),
    ("uniform dtype", {"mixed_dtype", "integer_param"}),
    ("integer dtype", {"integer_param"}),
    ("scalar parameters", {"scalar_param"}),
]


def check_real_fsdp(eager: nn.Module, policy: Dict[str, Any], ws: int, uop: bool,
                    plan: Dict[str, Any]) -> Tuple[List[str], List[str]]:
    """(differences, known differences) between real FSDP1 and the plan."""
    refusals = [w.get("kind") for w in plan.get("warnings") or [] if w.get("severity") == "error"]
    try:
        real = real_fsdp(eager, policy, ws, uop)
    except ValueError as e:  # FSDP refuses the model, e.g. mixed requires_grad in one flat parameter
        why = str(e).splitlines()[0]
        kinds = set().union(*[k for words, k in REFUSAL_WORDS if words in str(e)])
        if refusals and (not kinds or kinds & set(refusals)):
            return [], []
        if kinds:
            return [f"FSDP1 refuses ({why[:200]}): the plan's errors are {refusals}, not {sorted(kinds)}"], []
        return [], [f"known difference: FSDP1 refuses ({why}); the plan has no error for it"]
    except Exception:
        return ["real FSDP1 failed:\n" + traceback.format_exc()], []
    if refusals:
        return [f"the plan says FSDP would refuse ({refusals}), FSDP1 accepted the model"], []
    return [f"real FSDP1: {m}" for m in compare_fsdp(real, plan)], []


class _SplitTie(nn.Module):
    """A tied weight whose shard views differ by rank (docs/tied-weights.md): `a` flattens
    [tied 15, pad 1, other 15, pad 1] at world size 4; `b` shares `tied` and adds 13 of its own."""

    def __init__(self):
        super().__init__()
        self.a = nn.Sequential(nn.Linear(5, 3, bias=False), nn.Linear(5, 3, bias=False))
        self.b = nn.Linear(5, 3)
        self.b.weight = self.a[0].weight
        self.b.extra = nn.Parameter(torch.zeros(10))

    def forward(self, x):
        return self.a[0](x) + self.a[1](x) + self.b(x) + self.b.extra.sum()


def check_ranks(binary: str, work: str) -> Tuple[str, List[str]]:
    """With use_orig_params and a size policy, real FSDP1 on ranks 0..3 must build the plan's
    units on rank 0, and the plan must warn that ranks differ exactly when they do."""
    torch.manual_seed(0)
    eager = _SplitTie()
    path = os.path.join(work, "split_tie.pt")
    torch.jit.script(eager).save(path)
    msgs = []
    for min_num_params in (20, 22):  # b counts 21, 20, 13, 13 by rank: ranks differ at 20, none wraps b at 22
        policy = {"min_num_params": min_num_params}
        ppath = os.path.join(work, f"split_tie.{min_num_params}.policy.json")
        with open(ppath, "w") as f:
            json.dump(policy, f)
        plan, err = run_binary(binary, path, ppath, "--world-size", "4", "--use-orig-params")
        if plan is None:
            return "fail", [err]
        per_rank = []
        for rank in range(4):
            if dist.is_initialized():
                dist.destroy_process_group()
            dist.init_process_group("fake", rank=rank, world_size=4, store=FakeStore())
            fsdp = FSDP(copy.deepcopy(eager), device_id=torch.device("cpu"), use_orig_params=True,
                        **fsdp_kwargs(policy, eager))
            per_rank.append([unit_path(n) for n, m in fsdp.named_modules() if isinstance(m, FSDP)])
        dist.destroy_process_group()
        if [u["path"] for u in plan["units"]] != per_rank[0]:
            msgs.append(f"min_num_params {min_num_params}: FSDP1 on rank 0 built {per_rank[0]}, "
                        f"the plan has {[u['path'] for u in plan['units']]}")
        differ = any(r != per_rank[0] for r in per_rank)
        warned = any(w["message"].startswith("ranks would not build the same units") for w in plan["warnings"])
        if differ != warned:
            msgs.append(f"min_num_params {min_num_params}: FSDP1's units by rank {per_rank}, "
                        f"the plan {'warns' if warned else 'does not warn'} that ranks differ")
    return ("fail" if msgs else "pass"), msgs


def init_fake(world_size: int) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------
def first_difference(a: Any, b: Any, path: str = "") -> Optional[str]:
    """Where two JSON values first differ ('.memory.notes[0]: ...'), or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}: in one plan only"
            d = first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            d = first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None if len(a) == len(b) else f"{path}: {len(a)} against {len(b)} entries"
    return None if a == b else f"{path}: {str(a)[:80]!r} against {str(b)[:80]!r}"


def jit_loader_check(binary: str, model_path: str, policy_path: str, extra: List[str],
                     archive_plan: Dict[str, Any]) -> Tuple[str, str]:
    """('pass'|'fail'|'skip', detail): --loader jit against the default loader's plan,
    made with the same arguments (extra: its --world-size, ...)."""
    plan, err = run_binary(binary, model_path, policy_path, *extra, "--loader", "jit", ok_codes=(0, 1))
    if plan is None:
        reason = err.splitlines()[-1] if err else "no plan"
        return "skip", f"--loader jit cannot load this torch {torch.__version__} file: {reason}"
    strip = lambda p: {k: v for k, v in p.items() if k not in ("model",)}  # noqa: E731
    diff = first_difference(strip(archive_plan), strip(plan))
    if diff:
        return "fail", f"--loader jit plans differently from the default loader (default, jit): {diff}"
    return "pass", ""


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("corpus_dir")
    ap.add_argument("-k", dest="only", default=None, help="run cases whose label contains this")
    ap.add_argument("--keep", default=None, help="write policies and plans here")
    ap.add_argument("-j", dest="jobs", type=int, default=2, help="parallel binary runs (default 2)")
    ap.add_argument("-v", dest="verbose", action="store_true", help="print every difference")
    ap.add_argument("--world-sizes", default=",".join(map(str, WORLD_SIZES)),
                    help="comma-separated (default 1,3,8; the sanitizer build runs 3 only)")
    args = ap.parse_args(argv)
    world_sizes = [int(w) for w in args.world_sizes.split(",")]
    with open(os.path.join(args.corpus_dir, "index.json")) as f:
        index = json.load(f)
    t0 = time.time()
    counts = {"pass": 0, "fail": 0, "skip": 0, "known": 0}
    tmp = tempfile.TemporaryDirectory(prefix="fsdp-torch2-")
    work = args.keep or tmp.name
    os.makedirs(work, exist_ok=True)

    def report(status: str, label: str, msgs: List[str] = ()):
        counts[status] += 1
        print(f"{status.upper()} {label}" + (f": {msgs[0]}" if msgs else ""), flush=True)
        rest = list(msgs[1:])
        limit = None if args.verbose else MAX_MESSAGES
        for m in rest[:limit]:
            print(f"    {m}")
        if limit is not None and len(rest) > limit:
            print(f"    ... {len(rest) - limit} more (-v shows all)")

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs))
    names = [n for n, e in index["models"].items() if e["device"] == "cpu"]
    for name in names:
        if args.only and not any(args.only in f"{name} / {p}" for p in ("no_split", "size", "mp", "ignored", "jit")):
            continue
        model_path = os.path.join(args.corpus_dir, index["models"][name]["file"])
        eager = corpus.build(name)
        policies = {p: v for p, v in policies_for(eager).items() if not args.only or args.only in f"{name} / {p}"}
        # Every binary run first, in parallel; FSDP meanwhile in this thread.
        jobs = {}
        for pname, policy in policies.items():
            ppath = os.path.join(work, f"{name}.{pname}.policy.json")
            with open(ppath, "w") as f:
                json.dump(policy, f, indent=1)
            for ws in world_sizes:
                for uop in (False, True):
                    extra = ["--world-size", str(ws)] + (["--use-orig-params"] if uop else [])
                    jobs[pname, ws, uop] = (ppath, pool.submit(run_binary, args.binary, model_path, ppath, *extra,
                                                               ok_codes=(0, 1)))
        for ws in world_sizes:
            init_fake(ws)
            for pname, policy in policies.items():
                expected = rp.reference_plan(eager, policy) if ws == world_sizes[0] else None
                for uop in (False, True):
                    label = f"{name} / {pname} / world {ws}{' / use_orig_params' if uop else ''}"
                    ppath, fut = jobs[pname, ws, uop]
                    plan, err = fut.result()
                    if args.keep and plan is not None:
                        with open(os.path.join(work, f"{name}.{pname}.w{ws}.{int(uop)}.plan.json"), "w") as f:
                            json.dump(plan, f, indent=1)
                    if plan is None:
                        report("fail", label, [err])
                        continue
                    msgs, known = [], []
                    if expected is not None and not uop:
                        msgs += [f"torch {torch.__version__} wrap functions + FSDP1 grouping: {m}"
                                 for m in compare_plans(expected, plan)]
                    real_msgs, known = check_real_fsdp(eager, policy, ws, uop, plan)
                    msgs += real_msgs
                    n_units = len(plan.get("units") or [])
                    status = "fail" if msgs else "known" if known else "pass"
                    report(status, label + ("" if msgs else f" ({n_units} units)"), msgs or known)
                    # At the last world size (8; 3 under the sanitizers), not the default 1, so
                    # that the jit run is seen to get the same --world-size as the plan it meets.
                    if ws == world_sizes[-1] and not uop and pname == "no_split":
                        status, detail = jit_loader_check(args.binary, model_path, ppath,
                                                          ["--world-size", str(ws)], plan)
                        report(status, f"{name} / {pname} / --loader jit", [detail] if detail else [])
    pool.shutdown()
    if not args.only or args.only in "ranks":
        status, msgs = check_ranks(args.binary, work)
        report(status, "split_tie / size / world 4 / use_orig_params / ranks 0-3", msgs)
    if dist.is_initialized():
        dist.destroy_process_group()
    print(f"# {time.time() - t0:.1f}s, torch {torch.__version__}, binary {args.binary}", flush=True)
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped, "
          f"{counts['known']} known differences")
    return 0 if counts["fail"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
