#!/usr/bin/python3
"""PyTorch's own FSDP auto-wrap plan for an eager nn.Module and a policy dict.

This is the oracle for the differential tests. Everything that decides the plan
is PyTorch's code, of whichever torch runs it (Debian's python3-torch 1.13 for
test_differential.py, the venv's torch 2.13 for test_torch2.py):

- the policy is assembled from torch.distributed.fsdp.wrap's own functions
  (size_based_auto_wrap_policy, transformer_auto_wrap_policy, _or_policy);
  `_wrap_module_cls_individually` does not exist in 1.13, so it is restated
  here exactly as later releases define it;
- the wrapped modules come from wrap._recursive_wrap with the seed's recording
  wrapper (only_wrap_children=False; the root is always a unit);
- the grouping pass is the seed's `_get_fully_sharded_module_to_states`
  (torch/distributed/fsdp/_wrap_utils.py of torch 2.x), copied below, extended only to remember
  each tensor's name (unit path + DFS prefix + local name);
- except for a tensor reached from several units (a tied weight split across
  units), whose place the seed does not model: FSDP1's wrapper class builds
  its units bottom-up, and each unit flattens what `_get_orig_params` still
  yields. `fsdp1_flat_params` restates that (torch 1.13: fully_sharded_data_parallel.py
  `_get_orig_params`, no use_orig_params; 2.13: _init_utils.py
  `_get_orig_params`, _flat_param.py `_set_fsdp_flattened` only with
  use_orig_params): each unit flattens its own copy, or with use_orig_params
  the first unit built holds it;
- ignored modules / params follow FSDP 1.13's _get_ignored_modules /
  _get_ignored_params.

The only code of ours is the translation of the policy JSON (class names,
globs) into Python objects. Usage as a script:

    /usr/bin/python3 reference_plan.py MODEL.pt POLICY.json  # needs the eager class: see --help
"""
import collections
import functools
import inspect
import re
from typing import Any, Callable, Deque, Dict, Iterable, List, Optional, Set, Tuple, Type

import torch
import torch.nn as nn


def _load_torch_wrap_module():
    """torch/distributed/fsdp/wrap.py of the installed torch.

    torch 2.x imports it normally. `import torch.distributed.fsdp` fails on
    Debian's torch 1.13 under Python 3.11 (a dataclass in
    torch.distributed._shard has a mutable default, which 3.11 rejects), but
    wrap.py itself imports only torch.nn, so there we load that one file,
    unmodified, straight from the installed package."""
    try:
        import torch.distributed.fsdp.wrap as wrap
        return wrap
    except Exception:  # torch 1.13 under Python 3.11
        pass
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(torch.__file__), "distributed", "fsdp", "wrap.py")
    spec = importlib.util.spec_from_file_location("_torch_fsdp_wrap", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_wrap = _load_torch_wrap_module()
_or_policy = _wrap._or_policy
_recursive_wrap = _wrap._recursive_wrap
size_based_auto_wrap_policy = _wrap.size_based_auto_wrap_policy
transformer_auto_wrap_policy = _wrap.transformer_auto_wrap_policy
WRAP_PY = _wrap.__file__

DEFAULT_FORCE_LEAF = ["MultiheadAttention"]
DEFAULT_EXCLUDE_WRAP = ["ModuleList", "ModuleDict"]
DEFAULT_MP_IGNORE = ["_BatchNorm"]

# How `ignored_params` globs see tied parameters (the policy JSON is ours, not
# PyTorch's, so this is a project decision): "any": a parameter is ignored if
# any of its names (every module path that reaches it) matches -- what
# fsdp-plan does ("a tied tensor is one parameter"); "canonical": only its
# first name in named_parameters() order counts.
IGNORED_PARAMS_NAMES = "any"


class PolicyError(ValueError):
    pass


# ---------------------------------------------------------------------------
# Policy translation (ours)
# ---------------------------------------------------------------------------
def _torch_nn_module_classes() -> Set[type]:
    """Every nn.Module subclass defined under torch.nn (imported ones)."""
    import torch.nn.modules  # noqa: F401
    out: Set[type] = set()
    stack = [nn.Module]
    while stack:
        cls = stack.pop()
        if cls in out:
            continue
        out.add(cls)
        stack.extend(cls.__subclasses__())
    return {c for c in out if c.__module__.startswith("torch.nn")}


def candidate_classes(model: nn.Module) -> Set[type]:
    """Classes a policy name may refer to: the MRO of every module in the
    model plus all nn.Module subclasses in torch.nn."""
    cands = set(_torch_nn_module_classes())
    for m in model.modules():
        for cls in type(m).__mro__:
            if cls is object:
                continue
            cands.add(cls)
    return cands


def class_matches_name(cls: type, name: str) -> bool:
    """Short name: cls.__name__ == name. Dotted name "a.b.C": __name__ == "C"
    and the class's module path is "a.b" or starts with "a.b." (so
    "torch.nn.Linear" matches torch.nn.modules.linear.Linear)."""
    if "." not in name:
        return cls.__name__ == name
    prefix, short = name.rsplit(".", 1)
    mod = cls.__module__ or ""
    return cls.__name__ == short and (mod == prefix or mod.startswith(prefix + "."))


def resolve_classes(names: Iterable[str], model: nn.Module) -> Tuple[type, ...]:
    cands = candidate_classes(model)
    out = []
    for name in names:
        hits = [c for c in cands if class_matches_name(c, name)]
        out.extend(hits)  # an unknown name matches nothing, as PyTorch would
    # Deterministic order (isinstance with a tuple does not care).
    return tuple(sorted(set(out), key=lambda c: (c.__module__, c.__qualname__)))


def glob_to_regex(pattern: str) -> "re.Pattern[str]":
    """`*` matches any characters, dots included; everything else is literal."""
    return re.compile("".join(".*" if ch == "*" else re.escape(ch) for ch in pattern) + r"\Z", re.S)


def _restated_wrap_module_cls_individually(module: nn.Module, recurse: bool, *args,
                                           module_classes=(), **kwargs) -> bool:
    # Restated from torch >= 2.0 torch/distributed/fsdp/wrap.py (absent in 1.13).
    # Same body; `module_classes` moved to a keyword because 1.13's _or_policy
    # calls its policies positionally as policy(module, recurse, unwrapped_params).
    if recurse:
        return True
    else:
        return isinstance(module, tuple(module_classes))


# torch 2.x's own; 1.13 lacks it. Both are called with module_classes as a keyword.
_wrap_module_cls_individually = getattr(_wrap, "_wrap_module_cls_individually",
                                        _restated_wrap_module_cls_individually)


def build_policy(policy: Dict[str, Any], model: nn.Module) -> Optional[Callable]:
    """The `_recursive_wrap` predicate for `policy`, or None (no auto wrap)."""
    parts: List[Callable] = []
    if "module_classes" in policy:
        classes = set(resolve_classes(policy["module_classes"], model))
        parts.append(functools.partial(transformer_auto_wrap_policy,
                                       transformer_layer_cls=classes))
    if "min_num_params" in policy:
        force_leaf = set(resolve_classes(policy.get("force_leaf_modules", DEFAULT_FORCE_LEAF), model))
        exclude = set(resolve_classes(policy.get("exclude_wrap_modules", DEFAULT_EXCLUDE_WRAP), model))
        parts.append(functools.partial(size_based_auto_wrap_policy,
                                       min_num_params=int(policy["min_num_params"]),
                                       force_leaf_modules=force_leaf,
                                       exclude_wrap_modules=exclude))
    if not parts:
        return None  # mixed precision alone does not make an auto-wrap policy
    base = parts[0] if len(parts) == 1 else functools.partial(_or_policy, policies=parts)
    if policy.get("mixed_precision") is not None:
        ignore = mp_ignore_classes(policy, model)
        # As in the seed's _auto_wrap: OR the user policy with the MP override.
        return functools.partial(_or_policy, policies=[
            base,
            functools.partial(_wrap_module_cls_individually, module_classes=ignore),
        ])
    return base


def mp_ignore_classes(policy: Dict[str, Any], model: nn.Module) -> Tuple[type, ...]:
    mp = policy.get("mixed_precision")
    if mp is None:
        return ()
    return resolve_classes(mp.get("ignore_classes", DEFAULT_MP_IGNORE), model)


def ignored_sets(policy: Dict[str, Any], model: nn.Module) -> Tuple[Set[nn.Module], Set[nn.Parameter]]:
    """FSDP 1.13 _get_ignored_modules / _get_ignored_params, with the roots
    chosen by glob on module paths, plus parameters chosen by glob."""
    roots: Set[nn.Module] = set()
    pats = [glob_to_regex(p) for p in policy.get("ignored_modules", [])]
    if pats:
        for name, m in model.named_modules():
            if any(p.match(name) for p in pats):
                roots.add(m)
    ignored_modules = set(child for m in roots for child in m.modules())
    ignored_params: Set[nn.Parameter] = set(p for m in ignored_modules for p in m.parameters())
    ppats = [glob_to_regex(p) for p in policy.get("ignored_params", [])]
    if ppats:
        for name, p in all_param_names(model, IGNORED_PARAMS_NAMES == "any"):
            if any(pt.match(name) for pt in ppats):
                ignored_params.add(p)
    return ignored_modules, ignored_params


def all_param_names(model: nn.Module, with_duplicates: bool) -> List[Tuple[str, nn.Parameter]]:
    if not with_duplicates:
        return list(model.named_parameters())
    out = []
    for mname, m in model.named_modules(remove_duplicate=False):
        for pname, p in m._parameters.items():
            if p is not None:
                out.append(((mname + "." if mname else "") + pname, p))
    return out


# ---------------------------------------------------------------------------
# Seed logic (PyTorch's)
# ---------------------------------------------------------------------------
def _record_module_wrapper_cls(wrapped_modules_set: Set[nn.Module], module: nn.Module, **kwargs) -> nn.Module:
    wrapped_modules_set.add(module)
    return module


def _is_fsdp_flattened(t) -> bool:
    return getattr(t, "_is_flat_param", False) or getattr(t, "_fsdp_flattened", False)


def get_fully_sharded_module_to_states(root_module, auto_wrap_policy, ignored_modules, ignored_params):
    """The seed's _get_fully_sharded_module_to_states, with `auto_wrap_policy`
    the bare predicate (the seed passes `_FSDPPolicy` and uses `.policy`), and
    names recorded alongside the tensors."""
    wrapped_modules_set: Set[nn.Module] = set()
    wrapper_cls = functools.partial(_record_module_wrapper_cls, wrapped_modules_set)
    if auto_wrap_policy is not None:
        _recursive_wrap(
            root_module,
            auto_wrap_policy=auto_wrap_policy,
            wrapper_cls=wrapper_cls,
            ignored_modules=ignored_modules,
            ignored_params=ignored_params,
            only_wrap_children=False,
        )
    wrapped_modules_set.add(root_module)

    fully_sharded_module_to_states = collections.OrderedDict()
    visited_params = set()
    for ignored_param in ignored_params:
        visited_params.add(ignored_param)
    visited_buffers = set()
    wrapped_modules: List[nn.Module] = []
    for module in root_module.modules():
        if module in wrapped_modules_set:
            wrapped_modules.append(module)
    for submodule in wrapped_modules:
        deque: Deque[Tuple[nn.Module, str]] = collections.deque()
        deque.append((submodule, ""))
        params: List[Tuple[str, nn.Parameter]] = []
        buffers: List[Tuple[str, torch.Tensor]] = []
        while len(deque) > 0:
            module, prefix = deque.popleft()
            for child_module_name, child_module in reversed(list(module.named_children())):
                if child_module not in wrapped_modules_set:
                    deque.appendleft((child_module, prefix + child_module_name + "."))
            # named_parameters(recurse=False) yields exactly parameters(recurse=False)
            for pname, param in module.named_parameters(recurse=False):
                if param not in visited_params and not _is_fsdp_flattened(param):
                    params.append((prefix + pname, param))
                    visited_params.add(param)
            for bname, buffer in module.named_buffers(recurse=False):
                if buffer not in visited_buffers:
                    buffers.append((prefix + bname, buffer))
                    visited_buffers.add(buffer)
        fully_sharded_module_to_states[submodule] = (params, buffers)
    return fully_sharded_module_to_states


def fsdp1_flat_params(root_module: nn.Module, units: List[nn.Module], ignored_params: Set[nn.Parameter],
                      use_orig_params: bool) -> Dict[nn.Module, List[Tuple[str, nn.Parameter]]]:
    """Each unit's flat parameter as FSDP1's wrapper builds them: units in
    post-order (`_recursive_wrap` / `_post_order_apply`, the root last); a unit
    takes the parameters its subtree still holds as originals, wrapped
    descendants excluded (they replaced theirs with views), ignored ones and
    (use_orig_params only) ones an earlier unit marked flattened left out; in
    `named_modules(remove_duplicate=False)` order, each tensor once."""
    unit_set = set(units)
    order: List[nn.Module] = []
    stack = [(root_module, False)]
    while stack:  # post-order without recursion
        m, done = stack.pop()
        if done:
            if m in unit_set:
                order.append(m)
            continue
        stack.append((m, True))
        for child in reversed(list(m.children())):
            stack.append((child, False))
    flattened: Set[nn.Parameter] = set()
    out: Dict[nn.Module, List[Tuple[str, nn.Parameter]]] = {}
    for unit in order:
        params: List[Tuple[str, nn.Parameter]] = []
        seen: Set[nn.Parameter] = set()
        walk: Deque[Tuple[nn.Module, str]] = collections.deque([(unit, "")])
        while walk:
            module, prefix = walk.popleft()
            for name, child in reversed(list(module.named_children())):
                if child not in unit_set:
                    walk.appendleft((child, prefix + name + "."))
            for pname, param in module._parameters.items():
                if param is None or param in ignored_params or param in flattened or param in seen:
                    continue
                seen.add(param)
                params.append((prefix + pname, param))
        if use_orig_params:
            flattened |= seen
        out[unit] = params
    return out


# ---------------------------------------------------------------------------
# Plan in the tool's JSON shape
# ---------------------------------------------------------------------------
def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


def tensor_entry(name: str, t: torch.Tensor, param: bool = False) -> Dict[str, Any]:
    out = {"name": name, "shape": list(t.shape), "dtype": dtype_name(t.dtype), "numel": t.numel()}
    if param:  # the plan gives requires_grad for parameters only
        out["requires_grad"] = bool(t.requires_grad)
    return out


def reference_plan(model: nn.Module, policy: Dict[str, Any], use_orig_params: bool = False) -> Dict[str, Any]:
    """The plan FSDP1 builds. Sizes decide as on the untouched model: with
    use_orig_params a size policy may see a tied weight an earlier unit
    flattened at its sharded size (tests/differential/README.md); compare
    use_orig_params plans of size policies with real FSDP1 instead."""
    auto = build_policy(policy, model)
    ignored_modules, ignored_params = ignored_sets(policy, model)
    states = get_fully_sharded_module_to_states(model, auto, ignored_modules, ignored_params)
    flat = fsdp1_flat_params(model, list(states), ignored_params, use_orig_params)
    states = collections.OrderedDict((m, (flat[m], buffers)) for m, (_, buffers) in states.items())
    mp_ignore = mp_ignore_classes(policy, model)
    has_mp = policy.get("mixed_precision") is not None
    module_to_path = {}
    for name, m in model.named_modules():
        module_to_path.setdefault(m, name)
    units = []
    for m, (params, buffers) in states.items():
        path = module_to_path[m]
        pre = path + "." if path else ""
        units.append({
            "path": path,
            "class": type(m).__name__,
            "params": [tensor_entry(pre + n, p, param=True) for n, p in params],
            "buffers": [tensor_entry(pre + n, b) for n, b in buffers],
            "mixed_precision": (not isinstance(m, mp_ignore)) if has_mp else None,
        })
    uniq = {id(p): p for p in model.parameters()}
    ubuf = {id(b): b for b in model.buffers()}
    return {
        "units": units,
        "model": {
            "param_numel": sum(p.numel() for p in uniq.values()),
            "buffer_numel": sum(b.numel() for b in ubuf.values()),
            "num_modules": len(list(model.modules())),
        },
        "ignored_param_names": sorted(n for n, p in model.named_parameters() if p in ignored_params),
    }


def main(argv: List[str]) -> int:
    import argparse
    import json
    import os
    import sys
    ap = argparse.ArgumentParser(description="PyTorch's FSDP plan for a sample or torchvision model")
    ap.add_argument("model", help="sample model name (tiny_gpt, ...) or torchvision:NAME")
    ap.add_argument("policy", help="policy JSON file, or inline JSON")
    args = ap.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "sample_models"))
    if args.model.startswith("torchvision:"):
        import torchvision
        torch.manual_seed(0)
        model = getattr(torchvision.models, args.model.split(":", 1)[1])(weights=None).eval()
    else:
        import models
        model = models.build(args.model)
    pol = json.loads(args.policy) if args.policy.lstrip().startswith("{") else json.load(open(args.policy))
    json.dump(reference_plan(model, pol), sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    import sys
    sys.exit(main(sys.argv[1:]))
