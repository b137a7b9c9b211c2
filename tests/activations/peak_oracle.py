#!/usr/bin/env python3
"""Whole-step oracle: the per-rank peak of a real FSDP training step, under the `fake` backend.

For each model of actmodels.MODELS (train mode, SDPA, labels so the loss is in the forward) at each
shape, world sizes 1 and 8 (rank 0), fp32 and bf16 mixed precision (bf16 parameters for compute,
fp32 reduce; the model's own parameters stay fp32), with and without activation checkpointing (AC)
on the decoder layers (actmodels.decoder_layer_classes: the repeated `_no_split_modules`), AdamW
(foreach=False; with --foreach, foreach=True, PyTorch's default on CUDA), two steps; the second is
recorded:

- FSDP2: `checkpoint_wrapper(layer, preserve_rng_state=False)` put in place of every layer first
  when AC is on (accelerate/utils/fsdp_utils.py: fsdp2_apply_ac; torchtitan's full AC wraps each
  block the same way), then `fully_shard` on every layer (or its wrapper), bottom-up, and on the
  root; FSDPMemTracker (torch/distributed/_tools/fsdp2_mem_tracker.py);
- FSDP1: `FullyShardedDataParallel(model, auto_wrap_policy=ModuleWrapPolicy(layers),
  use_orig_params=...)`, then, when AC is on, `apply_activation_checkpointing(model,
  checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=NO_REENTRANT), check_fn=is a
  layer)` inside the FSDP units (accelerate/accelerator.py: prepare_model, FSDP1 branch);
  MemTracker (torch/distributed/_tools/mem_tracker.py, which knows nothing of FSDP: it files flat
  parameters as Parameter, their gradients as Gradient; the inputs given to track_external, as
  "Other").

Real tiny CPU tensors (FakeTensorMode cannot run HF's grouped_mm experts: aten._grouped_mm's meta
kernel rejects float32 and its backward's strides), except --headline, which reproduces issue 30's
figure with FakeTensorMode on Llama-3-8B dimensions (32 layers, hidden 4096): FSDP2 per layer,
8 ranks, bf16, batch 1 x seq 4096. It is long; its JSON is committed (headline_8b.json).

    python tests/activations/peak_oracle.py [-k SUBSTRING] [--out FILE] [--shapes first|all]
    python tests/activations/peak_oracle.py --headline [--layers N] [--seq S] --out FILE

Output (stable JSON, sorted keys, ints for bytes): {"cases": {"MODEL_bBsS/fsdpV/wW/DTYPE/ac|noac": {
"peak_bytes", "peak": {category: bytes} (the snapshot when Total peaked in step 2), "after_forward",
"after_backward", "after_step" (snapshots), "modules": {fqn: {"local_peak", "Peak Forward" / "Peak Backward"
(FSDPMemTracker) or "Peak-Forward" / "Peak-Backward" (MemTracker): {category: bytes}}}
(the root and the layers: the FSDP units), "seconds"}}}.
"""
import argparse
import contextlib
import functools
import json
import os
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # noqa: E402
    CheckpointImpl, apply_activation_checkpointing, checkpoint_wrapper)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: E402
from torch.distributed.fsdp import MixedPrecision, MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

import actmodels  # noqa: E402

WORLDS = [1, 8]
GiB = 1 << 30


class _NoHook:
    def remove(self) -> None:
        pass


class FrozenSafeMemTracker(MemTracker):
    """MemTracker (torch 2.13, mem_tracker.py: _track_module_params_and_buffers) registers a gradient
    hook on every parameter of every module it enters, which raises for a frozen one (LoRA's base;
    FSDP1's all-frozen flat parameters) and, for the post-accumulate hook, for a non-leaf one (FSDP1's
    use_orig_params parameters are views of the flat parameter during forward, new objects each
    time). Those are marked as already hooked, per call: a frozen one never gets a gradient, and the
    views' gradients are views of the flat parameter's, which is hooked."""

    def _track_module_params_and_buffers(self, module, install_grad_hooks=True):
        for p in module.parameters():
            if (not p.requires_grad or not p.is_leaf) and self._param_to_grad_hook_handles.get(p, None) is None:
                self._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())
        return super()._track_module_params_and_buffers(module, install_grad_hooks)


def init_fake(world: int) -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())


def layer_classes(model: nn.Module) -> tuple:
    names = set(actmodels.decoder_layer_classes(model))
    return tuple({type(m) for m in model.modules() if type(m).__name__ in names})


def apply_fsdp2_ac(model: nn.Module, classes: tuple) -> None:
    """Each layer replaced by checkpoint_wrapper(layer, preserve_rng_state=False), deepest first
    (accelerate 1.15 fsdp2_apply_ac walks get_module_children_bottom_up the same way)."""
    for name, mod in reversed(list(model.named_modules())):
        if name and isinstance(mod, classes):
            model.set_submodule(name, checkpoint_wrapper(mod, preserve_rng_state=False))


def apply_fully_shard(model: nn.Module, classes: tuple, mesh, mp: MixedPrecisionPolicy) -> None:
    """fully_shard on every layer, bottom-up, then the root. A checkpointed layer is sharded through
    its CheckpointWrapper (accelerate's FSDP2 policy looks through the wrapper the same way)."""
    wrapped = {id(m._checkpoint_wrapped_module) for m in model.modules() if hasattr(m, "_checkpoint_wrapped_module")}
    for name, mod in reversed(list(model.named_modules())):
        inner = getattr(mod, "_checkpoint_wrapped_module", mod)
        if name and isinstance(inner, classes) and id(mod) not in wrapped:
            fully_shard(mod, mesh=mesh, mp_policy=mp, reshard_after_forward=True)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=True)


def clean_fqn(fqn: str) -> str:
    """The module path as the model names it: FSDP1's and AC's wrapper segments dropped."""
    parts = [p for p in fqn.split(".") if p not in ("_fsdp_wrapped_module", "_checkpoint_wrapped_module")]
    return ".".join(parts)


def snap(d: Dict[Any, Dict[Any, int]]) -> Dict[str, int]:
    """A tracker snapshot ({device: {reftype: bytes}}) for the one device, keys as strings."""
    out: Dict[str, int] = {}
    for dev_snap in d.values():
        for k, v in dev_snap.items():
            key = getattr(k, "value", k)
            out[key] = out.get(key, 0) + int(v)
    return out


KEEP_STATES = ("Peak Forward", "Peak Backward", "Peak-Forward", "Peak-Backward")
MODULE_CATEGORIES = ("Total", "Activation", "Temp")  # per module; the whole-step snapshots keep all


def prune(res: Dict[str, Any]) -> Dict[str, Any]:
    """What the committed references keep: zero categories dropped; per module its local peak and the
    Total, Activation and Temp of its snapshots at its forward and backward peaks (FSDPMemTracker
    names them "Peak Forward" / "Peak Backward", MemTracker "Peak-Forward" / "Peak-Backward")."""
    out = dict(res)
    for k in ("peak", "after_forward", "after_backward", "after_step"):
        if k in out:
            out[k] = {c: v for c, v in out[k].items() if v}
    mods = {}
    for fqn, rec in res.get("modules", {}).items():
        mods[fqn] = {k: ({c: v for c, v in rec[k].items() if v and c in MODULE_CATEGORIES}
                         if isinstance(rec[k], dict) else rec[k])
                     for k in rec if k == "local_peak" or k in KEEP_STATES}
    out["modules"] = mods
    return out


def module_stats(tracker, keep) -> Dict[str, Any]:
    out = {}
    for stats in tracker.memory_tracking.values():
        fqn = clean_fqn(stats.mod_fqn)
        fqn = fqn.split(".", 1)[1] if "." in fqn else ""  # drop the root's class name
        if not keep(fqn):
            continue
        rec: Dict[str, Any] = {"local_peak": int(sum(stats.local_peak.values()))}
        for state, lst in stats.snapshots.items():
            if lst and lst[-1]:
                rec[getattr(state, "value", str(state))] = snap(lst[-1])
        out[fqn] = rec
    return out


def two_steps(tracker, model: nn.Module, optim, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """Two training steps under `tracker`; the statistics are the second's (its peak is reset at the
    start of step 2: MemTracker keeps its peak from __enter__ on, and step 1 has no optimizer state)."""
    res: Dict[str, Any] = {}
    with tracker:
        for it in range(2):
            if it == 1:
                tracker.reset_mod_stats()
                # Private state of torch/distributed/_tools/mem_tracker.py: MemTracker._update_peak_stats.
                tracker._peak_mem = {}
                tracker._peak_mem_snap = {}
            # Only the loss is kept, as a training loop does (HF Trainer's compute_loss drops the
            # outputs): holding the ModelOutput would keep the logits alive through backward.
            loss = model(**kwargs).loss
            if it == 1:
                res["after_forward"] = snap(tracker.get_tracker_snapshot())
            loss.backward()
            if it == 1:
                res["after_backward"] = snap(tracker.get_tracker_snapshot())
            optim.step()
            optim.zero_grad()
            if it == 1:
                res["after_step"] = snap(tracker.get_tracker_snapshot())
    res["peak"] = snap(tracker.get_tracker_snapshot("peak"))
    res["peak_bytes"] = res["peak"].get("Total", 0)
    return res


def keep_module(classes_names: List[str], model: nn.Module):
    """The root and the layers (the FSDP units of these policies)."""
    def cls_name(m: nn.Module) -> str:
        # fully_shard swaps a module's class for a subclass named "FSDP" + the class name.
        name = type(getattr(m, "_checkpoint_wrapped_module", m)).__name__
        return name[4:] if name.startswith("FSDP") and name[4:] in classes_names else name
    layer_paths = {clean_fqn(n) for n, m in model.named_modules() if cls_name(m) in classes_names}

    def keep(fqn: str) -> bool:
        return fqn == "" or fqn in layer_paths
    return keep


def run_case(name: str, batch: int, seq: Optional[int], version: int, world: int, bf16: bool, ac: bool,
             fake: bool = False, full: Optional[str] = None, layers: Optional[int] = None,
             foreach: bool = False) -> Dict[str, Any]:
    t0 = time.perf_counter()
    init_fake(world)
    mesh = init_device_mesh("cpu", (world,))
    ctx = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    with ctx:
        torch.manual_seed(0)
        if full:
            import corpus
            model = corpus.build(full, "meta")
            if layers is not None:
                model.model.layers = model.model.layers[:layers]
                model.config.num_hidden_layers = layers
            model.set_attn_implementation("sdpa")
            model.train()
        else:
            model = actmodels.build(name, "meta" if fake else "cpu", torch.float32)
        classes = layer_classes(model)
        names = sorted(c.__name__ for c in classes)
        if version == 2:
            if ac:
                apply_fsdp2_ac(model, classes)
            mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16
                  else MixedPrecisionPolicy())
            apply_fully_shard(model, classes, mesh, mp)
            if fake:
                model.to_empty(device="cpu")
            wrapped = model
        else:
            mp1 = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else None
            # FSDP1 flattens each unit's parameters into one FlatParameter, which must be all trainable
            # or all frozen unless use_orig_params (LoRA's units mix both).
            wrapped = FSDP(model, auto_wrap_policy=ModuleWrapPolicy(set(classes)), device_id=torch.device("cpu"),
                           mixed_precision=mp1, use_orig_params=name == "llama_lora")
            if ac:
                apply_activation_checkpointing(
                    wrapped, checkpoint_wrapper_fn=functools.partial(checkpoint_wrapper,
                                                                     checkpoint_impl=CheckpointImpl.NO_REENTRANT),
                    check_fn=lambda m: isinstance(m, classes))
        params = [p for p in wrapped.parameters() if p.requires_grad]
        optim = torch.optim.AdamW(params, lr=1e-3, foreach=foreach)
        if full:
            g = torch.Generator().manual_seed(0)
            kwargs = {"input_ids": torch.randint(3, 1000, (batch, seq), generator=g),
                      "labels": torch.randint(3, 1000, (batch, seq), generator=g)}
        else:
            kwargs = actmodels.inputs(name, model, batch, seq, device="cpu")
        if version == 2:
            tracker = FSDPMemTracker(wrapped, optim)
            tracker.track_inputs(tuple(v for v in kwargs.values() if isinstance(v, torch.Tensor)))
        else:
            tracker = FrozenSafeMemTracker()
            # The batch is device memory for the whole step, as FSDPMemTracker.track_inputs counts it
            # above; MemTracker sees tensors made outside it only when given (filed as "Other").
            tracker.track_external(wrapped, optim, *(v for v in kwargs.values() if isinstance(v, torch.Tensor)))
        res = two_steps(tracker, wrapped, optim, kwargs)
        res["modules"] = module_stats(tracker, keep_module(names, wrapped))
        res = prune(res)
    res.update(model=full or name, batch=batch, seq=seq, fsdp=version, world=world,
               dtype="bfloat16" if bf16 else "float32", ac=ac, layer_classes=names,
               fake_tensors=fake, seconds=round(time.perf_counter() - t0, 2))
    if foreach:
        res["optimizer_impl"] = "foreach"

    return res


def case_keys(shapes: str) -> List[tuple]:
    out = []
    for name in actmodels.MODELS:
        for b, s in (actmodels.SHAPES if shapes == "all" else actmodels.SHAPES[:1]):
            s = None if name == "vit" else s
            shape = f"b{b}" + ("" if s is None else f"s{s}")
            for version in (2, 1):
                for world in WORLDS:
                    for bf16 in (False, True):
                        for ac in (False, True):
                            key = (f"{name}_{shape}/fsdp{version}/w{world}/{'bf16' if bf16 else 'fp32'}/"
                                   f"{'ac' if ac else 'noac'}")
                            out.append((key, name, b, s, version, world, bf16, ac))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", help="only cases whose key contains this")
    ap.add_argument("--out", help="write the JSON here (default: stdout)")
    ap.add_argument("--shapes", choices=["first", "all"], default="all")
    ap.add_argument("--models", help="comma-separated subset of actmodels.MODELS")
    ap.add_argument("--fsdp", type=int, choices=[1, 2], help="only this FSDP version")
    ap.add_argument("--no-ac", dest="ac_only", action="store_const", const=False, default=None,
                    help="only the cases without activation checkpointing")
    ap.add_argument("--headline", action="store_true",
                    help="issue 30's figure: Llama-3-8B dims, FSDP2 per layer, 8 ranks, bf16, FakeTensorMode")
    ap.add_argument("--layers", type=int, help="--headline: keep only the first N decoder layers")
    ap.add_argument("--seq", type=int, default=4096, help="--headline: sequence length (batch 1)")
    ap.add_argument("--ac", action="store_true", help="--headline: with activation checkpointing")
    ap.add_argument("--foreach", action="store_true",
                    help="AdamW(foreach=True), PyTorch's default on CUDA, in place of the for-loop; keys end in /foreach")
    args = ap.parse_args()
    cases: Dict[str, Any] = {}
    if args.headline:
        c0 = time.process_time()
        res = run_case("llama3_8b", 1, args.seq, 2, 8, True, args.ac, fake=True, full="llama3_8b",
                       layers=args.layers)
        res["cpu_seconds"] = round(time.process_time() - c0, 1)
        key = f"llama3_8b{'' if args.layers is None else f'_{args.layers}l'}_b1s{args.seq}/fsdp2/w8/bf16/" \
              f"{'ac' if args.ac else 'noac'}"
        cases[key] = res
        p = res["peak"]
        print(f"{key}: peak {p['Total'] / GiB:.2f} GiB, Activation+Temp "
              f"{(p.get('Activation', 0) + p.get('Temp', 0)) / GiB:.2f} GiB, {res['seconds']} s wall, "
              f"{res['cpu_seconds']} s CPU", file=sys.stderr)
    else:
        models = set(args.models.split(",")) if args.models else None
        for key, name, b, s, version, world, bf16, ac in case_keys(args.shapes):
            if (args.k and args.k not in key) or (models and name not in models):
                continue
            if (args.fsdp and version != args.fsdp) or (args.ac_only is not None and ac != args.ac_only):
                continue
            try:
                res = run_case(name, b, s, version, world, bf16, ac, foreach=args.foreach)
            except Exception as e:  # recorded, so that one refusal does not lose the others
                res = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            key = key + "/foreach" if args.foreach else key
            cases[key] = res
            print(f"{key}: peak {res.get('peak_bytes')} {json.dumps(res.get('peak', res), sort_keys=True)} "
                  f"{res.get('seconds')} s", file=sys.stderr)
            if args.out:  # written as it goes: a long run that stops keeps what it measured
                with open(args.out, "w") as f:
                    f.write(actmodels.dump_cases({"torch": torch.__version__, "cases": cases}))
    doc = {"torch": torch.__version__, "cases": cases}
    text = actmodels.dump_cases(doc)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
