#!/usr/bin/env python3
"""Compiled blocks (issue 42, item 2): fsdp-plan's model of AOTAutograd's min-cut partitioner against
a real compiled step.

For each corpus model at b2 s32 (fp32, CPU, SDPA; ViT at b2), every decoder layer is compiled on its
own (`layer.compile(backend=...)`, as torchtitan compiles each block) with the pieces of
`aot_eager_decomp_partition` (inductor's decompositions, min_cut_rematerialization_partition, no code
generation; torch/_dynamo/backends/debugging.py), the partition function wrapped to record each
graph's saved values. One real forward runs on CPU tensors (the branch eager training takes) under
saved-tensor hooks (saved_oracle.SavedRecorder), which see what each compiled graph saves for its
backward (CompiledFunction's save_for_backward): each storage once, attributed to the module running
when it is first saved, as the plan attributes it.

The plan: `fsdp-plan EXPORT --device cpu -f json --policy P`, P the layers as FSDP2 units and
`"compile": {"module_classes": [the layer]}` (and its `memory_budget` where the case sets
torch._functorch.config.activation_memory_budget), on the fp32 export of the act_exports fixture. Per
compiled layer, the plan's saved bytes (`memory.activations.modules[path].total_bytes`) must be within
TOLERANCE (issue 42: 2%) of the hooks', and so must the whole step's (`saved_bytes`, the rest eager).
The eager saves are printed beside them; COMPILE_DETAIL=1 prints each graph's saved values as the
partitioner lists them (at numel x itemsize, where two saved views of one storage count twice).

FSDPMemTracker cannot check the compiled step's peak here: under its dispatch mode dynamo does not
compile the layers (they run eagerly), so the tracker would measure the eager step.

    python tests/activations/test_compile.py BINARY EXPORTS_DIR [-k SUBSTRING]

Exits 1 on any failure.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from importlib import import_module
from typing import Any, Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from torch._dynamo.backends.common import aot_autograd  # noqa: E402
from torch._dynamo.backends.debugging import get_nop_func  # noqa: E402
from torch._functorch.partitioners import min_cut_rematerialization_partition  # noqa: E402

import actmodels  # noqa: E402
import peak_oracle  # noqa: E402
from saved_oracle import SavedRecorder  # noqa: E402

TOLERANCE = 0.02
MODELS = ["llama", "mistral", "mixtral", "qwen2_moe", "gpt2", "bert", "vit", "t5", "llama_lora"]
BATCH, SEQ = 2, 32
NO_SEQ = {"vit"}  # images: the export has no sequence
# bf16 compute: the model cast to bf16 against the fp32 export planned with param_dtype bf16.
MODELS_BF16 = ["llama", "mixtral", "gpt2"]
# activation_memory_budget below 1 (choose_saved_values_set's relaxed cuts and knapsack), fp32. Not
# here, being outside the 2% (docs/memory-model.md, Compiled blocks): bert, gpt2 and t5, whose
# attention with dropout runs the math SDPA, one composite node in the export where the traced graph
# recomputes its softmax from two small reductions (0.90 to 0.94 at 0.5); llama_lora at 0.5 (one
# layer 1.10: the knapsack's choice among the small reductions and LoRA's).
MODELS_BUDGET = [("llama", 0.5), ("llama", 0.2), ("llama", 0.8), ("llama", 0.0), ("mistral", 0.5),
                 ("qwen2_moe", 0.5), ("mixtral", 0.5), ("mixtral", 0.2), ("vit", 0.5)]


def recording_backend(graphs: List[Dict[str, Any]]):
    """aot_eager_decomp_partition's pieces, its partition function wrapped to record each graph's saves
    (the backward's inputs that are no tangent and no parameter, at numel x itemsize)."""

    def partition(joint, inputs, **kw):
        fw, bw = min_cut_rematerialization_partition(joint, inputs, compiler="inductor", **kw)
        params = {f"primals_{i + 1}" for i in kw.get("static_lifetime_input_indices") or []}
        saved = []
        for n in bw.graph.nodes:
            v = n.meta.get("val")
            if n.op == "placeholder" and not n.name.startswith("tangents") and n.name not in params \
                    and isinstance(v, torch.Tensor):
                saved.append((n.name, tuple(v.shape), str(v.dtype)[6:], v.numel() * v.element_size()))
        graphs.append({"saved_bytes": sum(s[3] for s in saved), "saved": saved})
        return fw, bw

    return aot_autograd(fw_compiler=get_nop_func(), bw_compiler=get_nop_func(),
                        decompositions=lambda: import_module("torch._inductor.compile_fx").select_decomp_table(),
                        partition_fn=partition)


def reference(name: str, bf16: bool, budget: float = 1.0) -> Dict[str, Any]:
    """What the compiled step saves, per compiled layer and in all, by storage (saved-tensor hooks)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = actmodels.build(name, "cpu", torch.bfloat16 if bf16 else torch.float32)
    classes = peak_oracle.layer_classes(model)
    graphs: List[Dict[str, Any]] = []
    backend = recording_backend(graphs)
    layers = [fqn for fqn, m in model.named_modules() if fqn and isinstance(m, classes)]
    for fqn in layers:
        model.get_submodule(fqn).compile(backend=backend, dynamic=False)
    kwargs = actmodels.inputs(name, model, BATCH, None if name in NO_SEQ else SEQ, device="cpu")
    params = list(model.parameters()) + list(model.buffers())
    rec = SavedRecorder(model, params, [v for v in kwargs.values() if isinstance(v, torch.Tensor)])
    with torch._functorch.config.patch(activation_memory_budget=budget), \
            torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
        model(**kwargs)
    rec.remove()
    if not graphs:
        raise RuntimeError(f"{name}: dynamo compiled no layer")
    first: Dict[int, Dict[str, Any]] = {}
    for r in rec.records:
        if r["kind"] == "activation":
            first.setdefault(r["storage"], r)
    per_layer = {fqn: sum(r["storage_bytes"] for r in first.values()
                          if r["module"] == fqn or r["module"].startswith(fqn + "."))
                 for fqn in layers}
    return {"classes": sorted(c.__name__ for c in classes), "layers": per_layer,
            "total": sum(r["storage_bytes"] for r in first.values()), "graphs": graphs}


def plan(binary: str, pt2: str, tmp: str, name: str, classes: List[str], bf16: bool,
         budget: float = 1.0) -> Dict[str, Any]:
    path = os.path.join(tmp, name + "_compile.json")
    pol: Dict[str, Any] = {"module_classes": classes, "compile": {"module_classes": classes},
                           "fsdp": {"version": 2, "world_size": 1}}
    if budget < 1:
        pol["compile"]["memory_budget"] = budget
    if bf16:
        pol["mixed_precision"] = {"param_dtype": "bfloat16", "reduce_dtype": "float32"}
    with open(path, "w") as f:
        json.dump(pol, f)
    cmd = [binary, pt2, "-f", "json", "--device", "cpu", "-q", "--policy", path]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)}: exit {res.returncode}: {res.stderr.strip()[:400]}")
    return json.loads(res.stdout)["memory"]["activations"]


def check(label: str, got: int, want: int, extra: str, failures: List[str]) -> None:
    ratio = got / want if want else float("inf")
    ok = abs(ratio - 1) <= TOLERANCE
    print(f"{'ok  ' if ok else 'FAIL'} {label}: plan {got} / compiled step {want} = {ratio:.4f}{extra}")
    if not ok:
        failures.append(f"{label}: {ratio:.4f}")


def run_model(binary: str, exports: str, tmp: str, name: str, bf16: bool, failures: List[str],
              budget: float = 1.0) -> None:
    pt2 = os.path.join(exports, f"{name}_b{BATCH}.pt2" if name in NO_SEQ else f"{name}_b{BATCH}s{SEQ}.pt2")
    if not os.path.exists(pt2):
        failures.append(f"{name}: no {pt2} (the act_exports fixture makes it)")
        return
    ref = reference(name, bf16, budget)
    acts = plan(binary, pt2, tmp, name, ref["classes"], bf16, budget)
    name += (" bf16" if bf16 else "") + (f" budget {budget}" if budget < 1 else "")
    modules = {m["path"]: m["total_bytes"] for m in acts["modules"]}
    compiled = {c["path"]: c for c in acts.get("compiled", [])}
    for fqn, want in ref["layers"].items():
        if fqn not in compiled:
            failures.append(f"{name} {fqn}: the plan has no compiled entry")
            continue
        check(f"{name} {fqn}", modules.get(fqn, 0), want, f" (eager {compiled[fqn]['eager_saved_bytes']})", failures)
    check(f"{name} whole step", acts["saved_bytes"], ref["total"], "", failures)
    if os.environ.get("COMPILE_DETAIL"):
        for g in ref["graphs"]:
            print(f"   a graph's saved values ({g['saved_bytes']} B at numel x itemsize):", g["saved"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("exports_dir")
    ap.add_argument("-k")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="plan_compile_")
    failures: List[str] = []
    t0 = time.perf_counter()
    for name, bf16, budget in ([(m, False, 1.0) for m in MODELS] + [(m, True, 1.0) for m in MODELS_BF16]
                               + [(m, False, b) for m, b in MODELS_BUDGET]):
        label = name + (" bf16" if bf16 else "") + (f" budget {budget}" if budget < 1 else "")
        if not args.k or args.k in label:
            run_model(args.binary, args.exports_dir, tmp, name, bf16, failures, budget)
    print(f"{time.perf_counter() - t0:.1f} s")
    for f in failures:
        print("FAIL", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
