#!/usr/bin/env python3
"""FLOP oracle: torch.utils.flop_counter.FlopCounterMode on one training step of each model,
per module and per op, forward and backward apart; and the same FLOPs computed from the model's
torch.export graph with the per-op formulas of FLOPS.md, which is what the C++ side will do.

For each case (model x attention x activation checkpointing x batch shape) this builds the model on
fake CPU tensors (FakeTensorMode), runs forward with labels (so the loss is in the step) and
backward under one FlopCounterMode, and records:

- per module (the mode's module hierarchy: a module's count includes its submodules) and per op:
  forward (counted up to the end of forward) and backward (the rest: gradients, and the recompute
  when activation checkpointing is on);
- the ordered forward op trace: consecutive counted ops merged per innermost module, which gives
  the order in which FSDP units compute (model_check.py uses it);
- the graph side: torch.export.export(model, kwargs={input_ids, labels}, strict=False) on the meta
  device (training IR: ops not decomposed), the op names in the graph, and the forward and
  backward FLOPs from FLOPS.md's formulas per node, totalled per module; they must equal the
  FlopCounterMode figures (a check; the export runs without activation checkpointing, so the AC
  cases compare recompute = the checkpointed layers' forward instead).

One addition to FlopCounterMode: on the CPU, scaled_dot_product_attention runs
`aten._scaled_dot_product_flash_attention_for_cpu` (and `..._backward`), which torch 2.13's
flop registry does not list (it lists the CUDA flash / efficient / cuDNN kernels,
torch/utils/flop_counter.py `sdpa_flop`, `sdpa_backward_flop`), so stock FlopCounterMode counts
0 for attention on this machine. We map the two CPU ops to torch's own `sdpa_flop` and
`sdpa_backward_flop` (custom_mapping), so that the counts are those FlopCounterMode gives on a GPU.

    python tests/timing/flop_oracle.py                  # every case, writes reference/flops/
    python tests/timing/flop_oracle.py -k llama         # cases whose name contains the string
    python tests/timing/flop_oracle.py --ci --check     # the CI subset against reference/
    python tests/timing/flop_oracle.py --export-dir DIR # also save each case's .pt2 in DIR
"""
import argparse
import functools
import os
import sys
import time
import traceback
from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import timing_common as tc  # noqa: E402

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # noqa: E402
    CheckpointImpl, checkpoint_wrapper)
from torch.utils import flop_counter  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import graph_flops  # noqa: E402

OUT_DIR = os.path.join(tc.REFERENCE, "flops")
aten = torch.ops.aten

# The CPU SDPA kernels, counted with torch's own formulas for the GPU kernels (see the docstring).
def _raw(fn):
    """flop_counter's module-level formulas are already shape-wrapped (register_flop_formula
    returns the wrapped function): mark them raw so that custom_mapping does not wrap again."""
    def f(*args, **kwargs):
        return fn(*args, **kwargs)
    f._get_raw = True
    return f


CPU_SDPA = {
    aten._scaled_dot_product_flash_attention_for_cpu: _raw(flop_counter.sdpa_flop),
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _raw(flop_counter.sdpa_backward_flop),
}


def _grouped_mm_flop(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """torch 2.13 has no formula for aten._grouped_mm (it counts 0): the matmuls it runs
    (graph_flops.grouped_mm_flops), forward and, through autograd's _grouped_mm calls, backward."""
    return graph_flops.grouped_mm_flops(tuple(a_shape), tuple(b_shape))


# What the oracle's FlopCounterMode counts beyond torch's registry.
CUSTOM_MAPPING = {**CPU_SDPA, aten._grouped_mm: _grouped_mm_flop}


def case_table() -> Dict[str, Dict[str, Any]]:
    cases: Dict[str, Dict[str, Any]] = {}

    def add(model, attn, ac, batch, seq):
        name = f"{model}.{attn}.{'ac' if ac else 'noac'}.b{batch}s{seq}"
        cases[name] = dict(model=model, attn=attn, ac=ac, batch=batch, seq=seq)

    for model in ("llama", "mixtral", "gpt2"):
        for attn in ("sdpa", "eager"):
            for ac in (False, True):
                add(model, attn, ac, 2, 16)
    # Mixtral's experts through aten._grouped_mm (transformers' default kernel; bf16, which its
    # meta kernel requires).
    add("mixtral_gmm", "sdpa", False, 2, 16)
    add("mixtral_gmm", "sdpa", True, 2, 16)
    add("tiny_gpt", "own", False, 2, 16)
    add("tiny_gpt", "own", True, 2, 16)
    # Full-size layer shapes at a training sequence length (the worked check, model_check.py).
    add("llama3_8b", "sdpa", False, 1, 4096)
    add("llama3_8b", "sdpa", True, 1, 4096)
    return cases


CI_CASES = ["llama.sdpa.noac.b2s16", "llama.sdpa.ac.b2s16", "llama.eager.noac.b2s16", "mixtral.sdpa.noac.b2s16",
            "mixtral_gmm.sdpa.noac.b2s16",
            "gpt2.sdpa.noac.b2s16", "tiny_gpt.own.noac.b2s16", "tiny_gpt.own.ac.b2s16"]


class TracingFlopCounter(FlopCounterMode):
    """FlopCounterMode that also keeps the order of the counted ops: (innermost module, op, FLOPs)."""

    def __init__(self, **kw):
        super().__init__(display=False, custom_mapping=CUSTOM_MAPPING, **kw)
        self.trace: List[Tuple[str, str, int, str]] = []
        self.phase = "forward"

    def _count_flops(self, func_packet, out, args, kwargs):
        if func_packet in self.flop_registry:
            n = self.flop_registry[func_packet](*args, **kwargs, out_val=out)
            inner = max(self.mod_tracker.parents, key=lambda p: (p != "Global", p.count(".")))
            self.trace.append((inner, str(func_packet).replace("aten.", ""), int(n), self.phase))
        return super()._count_flops(func_packet, out, args, kwargs)


def _fqn(tracker_name: str, root: str) -> str:
    """ModuleTracker names a module by the root's class then the attribute path."""
    if tracker_name == "Global":
        return "Global"
    name = tracker_name[len(root):].lstrip(".") if tracker_name.startswith(root) else tracker_name
    return tc.clean_fqn(name)


def _apply_ac(model: nn.Module, cfg: Dict[str, Any]) -> None:
    """HF models: their own activation checkpointing (checkpoints each decoder layer's forward,
    non-reentrant, transformers/modeling_layers.py GradientCheckpointingLayer); tiny_gpt: the
    torch checkpoint_wrapper on each Block (as comm_oracle's FSDP2 'ac_torch' case)."""
    if hasattr(model, "config"):
        model.gradient_checkpointing_enable()
        return
    cls = tc.decoder_layer_class(model)
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, cls):
                setattr(parent, name, checkpoint_wrapper(child, checkpoint_impl=CheckpointImpl.NO_REENTRANT))


def _merge_trace(trace, root) -> List[List[Any]]:
    """Consecutive forward ops of the same innermost module, merged: [module, phase, flops, ops].
    Forward only: in backward, ModuleTracker keeps several sibling modules open at the same depth,
    so "the innermost module" of a backward op is not defined (and not stable between runs)."""
    out: List[List[Any]] = []
    for mod, op, n, phase in trace:
        if phase != "forward":
            continue
        m = _fqn(mod, root)
        if out and out[-1][0] == m and out[-1][1] == phase:
            out[-1][2] += n
            out[-1][3] += 1
        else:
            out.append([m, phase, n, 1])
    return out


def count_step(cfg: Dict[str, Any]) -> Dict[str, Any]:
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = tc.build(cfg["model"], attn=cfg["attn"] if cfg["attn"] != "own" else "eager")
        if cfg["ac"]:
            _apply_ac(model, cfg)
        ids = tc.make_batch(model, cfg["batch"], cfg["seq"])
        counter = TracingFlopCounter()
        with counter:
            loss = tc.loss_of(model, ids)
            fwd = {k: dict(v) for k, v in counter.flop_counts.items()}
            counter.phase = "backward"
            loss.backward()
        total = counter.get_flop_counts()
    root = type(model).__name__
    modules: Dict[str, Any] = {}
    for name in sorted(set(total) | set(fwd)):
        f = {str(k).replace("aten.", ""): v for k, v in fwd.get(name, {}).items()}
        t = {str(k).replace("aten.", ""): v for k, v in total.get(name, {}).items()}
        b = {k: t.get(k, 0) - f.get(k, 0) for k in t if t.get(k, 0) - f.get(k, 0)}
        modules[_fqn(name, root)] = {"forward": sum(f.values()), "backward": sum(b.values()),
                                     "forward_by_op": f, "backward_by_op": b}
    return {"modules": modules, "trace": _merge_trace(counter.trace, root),
            "params": sum(p.numel() for p in model.parameters()),
            "trainable_params": sum(p.numel() for p in model.parameters() if p.requires_grad)}


def export_graph(cfg: Dict[str, Any], export_dir: Optional[str], name: str):
    """torch.export of the model (meta device, no AC) with labels: the training IR graph."""
    with torch.device("meta"):
        model = tc.build(cfg["model"], attn=cfg["attn"] if cfg["attn"] != "own" else "eager")
    ids = tc.make_batch(model, cfg["batch"], cfg["seq"]).to("meta")
    if hasattr(model, "config"):
        ep = torch.export.export(model, (), kwargs={"input_ids": ids, "labels": ids}, strict=False)
    else:
        ep = torch.export.export(_TinyGPTWithLoss(model), (ids,), strict=False)
    if export_dir:
        os.makedirs(export_dir, exist_ok=True)
        torch.export.save(ep, os.path.join(export_dir, name + ".pt2"))
    return ep


class _TinyGPTWithLoss(nn.Module):
    """tiny_gpt with timing_common.loss_of's loss inside forward, so that the export has it."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return tc.loss_of(self.model, ids)


def run_case(name: str, cfg: Dict[str, Any], export_dir: Optional[str]) -> Dict[str, Any]:
    counted = count_step(cfg)
    ep = export_graph(cfg, export_dir, name)
    prefix = "model." if cfg["model"] == "tiny_gpt" else ""  # the loss wrapper's attribute
    graph = graph_flops.graph_flops(ep, strip_prefix=prefix)
    checks, recompute = compare(cfg, counted, graph, ep, prefix)
    g_tot = graph["modules"].get("", {"forward": 0, "backward": 0})
    mods = counted["modules"]
    return {
        "case": name,
        "config": cfg,
        "versions": tc.versions(),
        "counted_with": "torch.utils.flop_counter.FlopCounterMode under FakeTensorMode (CPU), with the CPU "
                        "flash-attention kernels mapped to torch's sdpa_flop / sdpa_backward_flop and aten._grouped_mm "
                        "to the matmuls it runs (graph_flops.grouped_mm_flops)",
        "totals": {"forward": mods["Global"]["forward"], "backward": mods["Global"]["backward"]},
        "modules": {k: v for k, v in mods.items() if k != "Global"},
        "global_by_op": {"forward": mods["Global"]["forward_by_op"], "backward": mods["Global"]["backward_by_op"]},
        "trace": counted["trace"],
        "params": counted["params"],
        "trainable_params": counted["trainable_params"],
        "graph": {"ops": graph["ops"], "totals": {"forward": g_tot["forward"], "backward": g_tot["backward"]},
                  "modules": graph["modules"], "unknown_ops": graph["unknown_ops"],
                  "recompute": recompute},
        "checks": checks,
    }


def compare(cfg, counted, graph, ep, prefix) -> Tuple[List[str], Dict[str, Any]]:
    """The graph's FLOPs against FlopCounterMode's, per FSDP-unit-sized module: the root ("") and
    each decoder layer, forward and backward. With AC the counted backward must be the graph's
    backward plus graph_flops.recompute_flops of each checkpointed layer. Modules inside a layer
    are not compared: FlopCounterMode's ModuleTracker attributes backward ops to the modules whose
    backward hooks are open, and sibling modules that share an input (q/k/v_proj) overlap."""
    fails = []
    cm, gm = counted["modules"], graph["modules"]
    layers = sorted((k for k in gm if _is_layer(k)), key=_layer_key)
    recompute = {k: graph_flops.recompute_flops(ep, k, prefix) for k in layers} if cfg["ac"] else {}
    for fqn in [""] + layers:
        c, g = cm.get(fqn), gm.get(fqn)
        if c is None or g is None:
            fails.append(f"{fqn!r}: counted {c is not None}, in the graph {g is not None}")
            continue
        if g["forward"] != c["forward"]:
            fails.append(f"{fqn!r} forward: graph {g['forward']}, counted {c['forward']}")
        want = g["backward"] + (sum(recompute.values()) if fqn == "" else recompute.get(fqn, 0))
        if want != c["backward"]:
            fails.append(f"{fqn!r} backward: graph {want}{' (with recompute)' if cfg['ac'] else ''}, "
                         f"counted {c['backward']}")
    if graph["unknown_ops"]:
        fails.append(f"ops with FLOPs the graph formulas do not know: {graph['unknown_ops']}")
    return fails, recompute


def _layer_key(fqn: str):
    return [int(p) if p.isdigit() else p for p in fqn.split(".")]


def _is_layer(fqn: str) -> bool:
    parts = fqn.split(".")
    return len(parts) >= 2 and parts[-1].isdigit() and parts[-2] in ("layers", "h", "blocks")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", action="append", default=[], help="run the cases whose name contains this (repeatable)")
    ap.add_argument("--ci", action="store_true", help="only the CI subset")
    ap.add_argument("--check", action="store_true", help="compare with reference/flops/*.json instead of writing")
    ap.add_argument("--out", default=OUT_DIR)
    ap.add_argument("--export-dir", help="also save each case's torch.export archive (.pt2) here")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args(argv)
    table = case_table()
    names = tc.select(CI_CASES if args.ci else list(table), args.k)
    if args.list:
        print("\n".join(names))
        return 0
    failed = 0
    t_all = time.time()
    for name in names:
        t0 = time.time()
        try:
            doc = run_case(name, table[name], args.export_dir)
        except Exception:
            failed += 1
            print(f"FAIL {name}: exception\n{traceback.format_exc()}", flush=True)
            continue
        path = os.path.join(args.out, name + ".json")
        problems = list(doc["checks"])
        if args.check:
            if not os.path.exists(path):
                problems.append(f"no reference {path}")
            else:
                ref = tc.read_json(path)
                ref.pop("versions", None)
                d = tc.first_difference(ref, tc.json_round_trip({k: v for k, v in doc.items() if k != "versions"}))
                if d:
                    problems.append(f"differs from the reference: {d}")
        else:
            tc.write_json(path, doc)
        failed += bool(problems)
        t = doc["totals"]
        print(f"{'FAIL' if problems else 'ok  '} {name} ({time.time() - t0:.1f} s): forward {t['forward']}, "
              f"backward {t['backward']} FLOPs", flush=True)
        for p in problems:
            print("     " + p, flush=True)
    print(f"{len(names) - failed} passed, {failed} failed, {time.time() - t_all:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
