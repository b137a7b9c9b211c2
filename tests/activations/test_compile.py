#!/usr/bin/env python3
"""Compiled blocks (issue 42, item 2): fsdp-plan's model of AOTAutograd's min-cut partitioner against
the partitioner itself.

For each model at b2 s32 (fp32, CPU, SDPA), every decoder layer is compiled on its own
(`layer.compile(backend=...)`, as torchtitan compiles each block) with the backend
`aot_eager_decomp_partition` uses (inductor's decompositions, min_cut_rematerialization_partition,
no code generation; torch/_dynamo/backends/debugging.py), its partition function wrapped to record
what each compiled graph saves: the backward graph's inputs that are no tangent and no parameter
(static_lifetime_input_indices), each at numel x itemsize. One real forward and backward runs on CPU
tensors (the branch eager training takes).

The plan: `fsdp-plan EXPORT --device cpu -f json --policy P`, P the layers as FSDP2 units and
`"compile": {"module_classes": [the layer]}`, on the fp32 export of the act_exports fixture. Per
layer, the plan's `memory.activations.compiled[].saved_bytes` must be within TOLERANCE (issue 42: 2%)
of what the partitioner saved for it. The eager saves are printed beside them.

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

TOLERANCE = 0.02
MODELS = ["llama", "mistral", "qwen2_moe", "gpt2"]
BATCH, SEQ = 2, 32


def recording_backend(graphs: List[Dict[str, Any]]):
    """aot_eager_decomp_partition with its partition function wrapped to record each graph's saves."""

    def partition(joint, inputs, **kw):
        fw, bw = min_cut_rematerialization_partition(joint, inputs, compiler="inductor", **kw)
        static = set(kw.get("static_lifetime_input_indices") or [])
        params = {f"primals_{i + 1}" for i in static}
        saved, names = 0, []
        for n in bw.graph.nodes:
            if n.op != "placeholder" or n.name.startswith("tangents") or n.name in params:
                continue
            v = n.meta.get("val")
            if isinstance(v, torch.Tensor):
                saved += v.numel() * v.element_size()
                names.append((n.name, tuple(v.shape), str(v.dtype)[6:], v.numel() * v.element_size()))
        graphs.append({"saved_bytes": saved, "saved": names})
        return fw, bw

    return aot_autograd(fw_compiler=get_nop_func(), bw_compiler=get_nop_func(),
                        decompositions=lambda: import_module("torch._inductor.compile_fx").select_decomp_table(),
                        partition_fn=partition)


def reference(name: str) -> Dict[str, Any]:
    """Per compiled layer (in call order), what the partitioner saves."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = actmodels.build(name, "cpu", torch.float32)
    classes = peak_oracle.layer_classes(model)
    graphs: List[Dict[str, Any]] = []
    backend = recording_backend(graphs)
    layers = [(fqn, m) for fqn, m in model.named_modules() if fqn and isinstance(m, classes)]
    order: List[str] = []
    for fqn, m in layers:
        m.register_forward_pre_hook(lambda mod, a, fqn=fqn: order.append(fqn))
        m.compile(backend=backend, dynamic=False)
    kwargs = actmodels.inputs(name, model, BATCH, SEQ, device="cpu")
    out = model(**kwargs)
    out.loss.backward()
    # Identical layers share one compiled graph (their parameters are its inputs); a graph break
    # or a recompile would make more, which this comparison does not map to layers.
    if len(graphs) == 1:
        graphs = graphs * len(order)
    if len(graphs) != len(order):
        raise RuntimeError(f"{name}: {len(graphs)} compiled graphs for {len(order)} layer calls")
    return {"classes": sorted(c.__name__ for c in classes),
            "layers": {fqn: g["saved_bytes"] for fqn, g in zip(order, graphs)}, "detail": graphs[0]["saved"]}


def plan(binary: str, pt2: str, tmp: str, name: str, classes: List[str]) -> Dict[str, Any]:
    path = os.path.join(tmp, name + "_compile.json")
    with open(path, "w") as f:
        json.dump({"module_classes": classes, "compile": {"module_classes": classes},
                   "fsdp": {"version": 2, "world_size": 1}}, f)
    cmd = [binary, pt2, "-f", "json", "--device", "cpu", "-q", "--policy", path]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode not in (0, 1):
        raise RuntimeError(f"{' '.join(cmd)}: exit {res.returncode}: {res.stderr.strip()[:400]}")
    return json.loads(res.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("exports_dir")
    ap.add_argument("-k")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="plan_compile_")
    failures: List[str] = []
    t0 = time.perf_counter()
    for name in MODELS:
        if args.k and args.k not in name:
            continue
        pt2 = os.path.join(args.exports_dir, f"{name}_b{BATCH}s{SEQ}.pt2")
        if not os.path.exists(pt2):
            failures.append(f"{name}: no {pt2} (the act_exports fixture makes it)")
            continue
        ref = reference(name)
        got = plan(args.binary, pt2, tmp, name, ref["classes"])
        compiled = {c["path"]: c for c in got["memory"]["activations"].get("compiled", [])}
        for fqn, want in ref["layers"].items():
            c = compiled.get(fqn)
            if c is None:
                failures.append(f"{name} {fqn}: the plan has no compiled entry")
                continue
            ratio = c["saved_bytes"] / want if want else float("inf")
            ok = abs(ratio - 1) <= TOLERANCE
            print(f"{'ok  ' if ok else 'FAIL'} {name} {fqn}: plan {c['saved_bytes']} / partitioner {want} = "
                  f"{ratio:.4f} (eager {c['eager_saved_bytes']})")
            if not ok and os.environ.get("COMPILE_DETAIL"):
                print("   partitioner saves:", ref["detail"])
            if not ok:
                failures.append(f"{name} {fqn}: {ratio:.4f}")
    print(f"{time.perf_counter() - t0:.1f} s")
    for f in failures:
        print("FAIL", f, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
