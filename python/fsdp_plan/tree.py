"""A live module's structure as fsdp-plan's module-tree JSON: the format of
`fsdp-plan MODEL --dump-tree` (lib/model/tree_json.cpp), plus what a live module
knows and a file does not:

- `bases` per module: the class's MRO after the class itself, `object` left
  out, as `module.qualname` names (`transformers.models.llama.modeling_llama.
  LlamaPreTrainedModel`, ..., `torch.nn.modules.module.Module`). FSDP's
  ModuleWrapPolicy matches with isinstance (torch/distributed/fsdp/wrap.py:
  _module_wrap_policy), so a policy naming a base class wraps its subclasses;
  a TorchScript or .pt2 file records the class alone.
- `persistent` per buffer: whether it is in the state_dict
  (`_non_persistent_buffers_set`); both kinds are planned as FSDP holds them.
- a header: `tree_format` (1), `producer`, and `no_split_modules` (the
  module's `_no_split_modules`, sorted, or null: what Accelerate wraps for
  TRANSFORMER_BASED_WRAP without a class list, as in a .pt2's record).

Everything else is the --dump-tree format exactly: modules in pre-order
(`named_modules(remove_duplicate=False)`, so a module registered under two
names is listed twice), each with its own parameters and buffers in
registration order, tensors numbered in order of first use so that a tensor
reached by two names (a tied weight) has one number. The binary reads it
(lib/model/loaders/tree_loader.cpp, recognised by `tree_format`), with
isinstance over the recorded bases; docs/export-metadata.md describes it.
"""
from typing import Any, Dict, List

TREE_FORMAT = 1


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def dtype_name(dtype: Any) -> str:
    return str(dtype).rsplit(".", 1)[-1]  # torch.bfloat16 -> bfloat16, as the loaders name dtypes


def module_tree(module: Any) -> Dict[str, Any]:
    """The tree of a live `torch.nn.Module` (meta, fake or real tensors: only
    shapes, dtypes and identities are read)."""
    import torch

    from . import __version__

    ids: Dict[int, int] = {}

    def slots(tensors, persistent_names=None) -> List[Dict[str, Any]]:
        out = []
        for name, t in tensors:
            if t is None:
                continue
            number = ids.setdefault(id(t), len(ids))
            slot = {"name": name, "tensor": number, "shape": list(t.shape), "dtype": dtype_name(t.dtype),
                    "itemsize": t.element_size(), "requires_grad": bool(t.requires_grad)}
            if persistent_names is not None:
                slot["persistent"] = name not in persistent_names
            out.append(slot)
        return out

    modules = []
    for path, m in module.named_modules(remove_duplicate=False):
        cls = type(m)
        modules.append({
            "path": path,
            "type": class_name(cls),
            "bases": [class_name(b) for b in cls.__mro__[1:] if b is not object],
            "params": slots(m._parameters.items()),
            "buffers": slots(m._buffers.items(), getattr(m, "_non_persistent_buffers_set", set())),
        })
    no_split = getattr(module, "_no_split_modules", None)
    return {"tree_format": TREE_FORMAT, "producer": f"fsdp_plan {__version__} (torch {torch.__version__})",
            "no_split_modules": sorted(no_split) if no_split is not None else None,
            "modules": modules, "num_tensors": len(ids)}
