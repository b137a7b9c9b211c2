"""fsdp-plan from Python: the wheel's binary, fsdp-plan-export, and plan()
for a training script's pre-flight check.

    import fsdp_plan
    plan = fsdp_plan.plan(model, {"module_classes": ["LlamaDecoderLayer"]},
                          example_inputs={"input_ids": ids, "labels": ids}, world_size=8)
    print(plan["memory"]["peak_bytes"])

Nothing here imports torch until plan() or the exporter runs.
"""
import os
from typing import Any, Dict, Mapping, Optional, Sequence, Union

# Light on purpose: the `fsdp-plan` console script imports this package before
# it execs the binary, so every import here is paid on every fsdp-plan run.
from ._binary import FsdpPlanError, find_binary


def __getattr__(name: str) -> Any:
    if name == "__version__":  # importlib.metadata is slow to import: only when asked
        try:
            from importlib.metadata import PackageNotFoundError, version
            try:
                return version("fsdp-plan")
            except PackageNotFoundError:  # a source checkout on sys.path
                return "0+unknown"
        except ImportError:
            return "0+unknown"
    raise AttributeError(f"module 'fsdp_plan' has no attribute {name!r}")

__all__ = ["plan", "settings_to_args", "FsdpPlanError", "find_binary", "__version__"]

Policy = Union[None, str, "os.PathLike[str]", Mapping[str, Any], Sequence[Any]]


def plan(module: Any, policy: Policy = None, example_inputs: Any = None, *, binary: Optional[str] = None,
         keep: Optional[str] = None, timeout: Optional[float] = 600, **settings: Any) -> Dict[str, Any]:
    """The FSDP plan of a live `torch.nn.Module`, as the binary's `--format json` dict.

    - `policy`: None (no auto-wrap: one root unit), a policy dict (the JSON
      policy format; classes may be given as class objects), a list of
      classes or class names (`module_classes`), or the path of a policy JSON
      or an Accelerate config YAML.
    - `example_inputs`: a tuple of positional inputs, a dict of keyword inputs,
      or `(args, kwargs)`. With them the module (meta or real tensors) is
      exported with torch.export (strict=False; no weights are written) to a
      temporary .pt2 that the binary plans. Without them its structure is
      written as module-tree JSON (fsdp_plan.tree), classes with their bases,
      so that a policy naming a base class matches as isinstance does.
    - `settings`: command-line options, `world_size=8` -> `--world-size 8`
      (True -> the flag alone, a list -> the option repeated; README "Usage").
    - `binary`: the fsdp-plan to run (default: $FSDP_PLAN, else this package's).
    - `keep`: a directory to leave the model file and policy in.

    Exit 1 of the binary (FSDP would refuse, a budget is violated) still returns
    the plan: its `warnings` say why. Anything else raises FsdpPlanError.
    """
    import json
    import tempfile
    work = keep or tempfile.mkdtemp(prefix="fsdp-plan-")
    os.makedirs(work, exist_ok=True)
    try:
        if example_inputs is not None:
            from .export import ExportError, export_module
            args, kwargs = _split_inputs(example_inputs)
            model_path = os.path.join(work, "model.pt2")
            try:
                export_module(module, args, kwargs, model_path, metadata={"source": {"kind": "fsdp_plan.plan"}})
            except ExportError as e:
                raise FsdpPlanError(str(e)) from e
        else:
            import warnings
            warnings.warn("fsdp_plan.plan() without example_inputs plans the module's structure only: the "
                          "peak has no activations (memory.activations.source is \"unknown\"); pass "
                          "example_inputs to export it and count them", stacklevel=2)
            from .tree import module_tree
            model_path = os.path.join(work, "model.tree.json")
            with open(model_path, "w", encoding="utf-8") as f:
                json.dump(module_tree(module), f, indent=1)
                f.write("\n")
        cmd = [model_path]
        policy_path = _policy_file(policy, work)
        if policy_path:
            cmd += ["--policy", policy_path]
        cmd += ["--format", "json", *settings_to_args(settings)]
        from ._binary import run
        r = run(cmd, binary=binary, timeout=timeout)
        try:
            return json.loads(r.stdout)
        except json.JSONDecodeError as e:
            raise FsdpPlanError(f"fsdp-plan printed no JSON plan ({e})", r.returncode, r.args) from None
    finally:
        if not keep:
            import shutil
            shutil.rmtree(work, ignore_errors=True)


def settings_to_args(settings: Mapping[str, Any]) -> list:
    """`world_size=8, use_orig_params=True, fail_on=["a", "b"]` ->
    `--world-size 8 --use-orig-params --fail-on a --fail-on b` (False and None: left out)."""
    out = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                out += [flag, str(v)]
        else:
            out += [flag, str(value)]
    return out


def _split_inputs(example_inputs: Any):
    if isinstance(example_inputs, dict):
        return (), example_inputs
    if (isinstance(example_inputs, tuple) and len(example_inputs) == 2 and isinstance(example_inputs[0], tuple)
            and isinstance(example_inputs[1], dict)):
        return example_inputs
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    return (example_inputs,), {}


def _class_ref(c: Any) -> str:
    # A class object by its qualified name: the binary resolves dotted names as
    # PyTorch's class-name policies do (README "Policy format").
    return f"{c.__module__}.{c.__qualname__}" if isinstance(c, type) else str(c)


def _policy_file(policy: Policy, work: str) -> Optional[str]:
    if policy is None:
        return None
    if isinstance(policy, (str, os.PathLike)):
        return os.fspath(policy)
    if isinstance(policy, Mapping):
        data = dict(policy)
    else:
        data = {"module_classes": list(policy)}
    for key in ("module_classes", "force_leaf_modules", "exclude_wrap_modules"):
        if key in data:
            data[key] = [_class_ref(c) for c in data[key]]
    mp = data.get("mixed_precision")
    if isinstance(mp, Mapping):
        mp = dict(mp)
        for k, v in mp.items():
            if k.endswith("_dtype") and not isinstance(v, str) and v is not None:
                mp[k] = str(v).rsplit(".", 1)[-1]  # torch.bfloat16 -> "bfloat16"
        if "ignore_classes" in mp:
            mp["ignore_classes"] = [_class_ref(c) for c in mp["ignore_classes"]]
        data["mixed_precision"] = mp
    import json
    path = os.path.join(work, "policy.json")
    with open(path, "w", encoding="utf-8") as f:
        # Class objects anywhere else (activation_checkpointing.module_classes, ...) by their name too.
        json.dump(data, f, indent=1, sort_keys=True, default=_policy_value)
    return path


def _policy_value(value: Any) -> str:
    if isinstance(value, type):
        return _class_ref(value)
    if type(value).__name__ == "dtype" and str(value).startswith("torch."):
        return str(value).rsplit(".", 1)[-1]  # torch.bfloat16 -> "bfloat16"
    raise FsdpPlanError(f"the policy holds a {type(value).__name__} ({value!r}), which is not a class, a dtype or "
                        "JSON; give a class object or name, a dtype, or JSON values")
