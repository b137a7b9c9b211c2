#!/usr/bin/env python3
"""Saved-bytes oracle: what autograd really saves for backward, per module, in one training forward.

For each model of actmodels.MODELS at each export shape and each setting, one forward (train mode,
labels given, so the loss is included) and one backward of the *eager* model on real tiny CPU
tensors, with `torch.autograd.graph.saved_tensors_hooks`:

- every packed tensor is keyed by its storage (`untyped_storage()._cdata`, the StorageImpl: two views
  of one tensor share it) and counted once, at its storage's full size (a saved view keeps its
  whole base alive);
- a storage is attributed to the innermost module whose forward is running when it is first packed
  (module forward pre/post hooks keep the stack); `total_bytes` of a module is its subtree's;
- storages of parameters (and buffers) and of the model's inputs are not activations: counted apart
  as `param_saved_bytes` / `input_saved_bytes` (they are held anyway; the planner must not count
  them twice);
- after the forward the autograd graph is walked from the loss and every `_saved_*` attribute is
  read, which calls the unpack hook: that names the backward node (`MmBackward0`,
  `ScaledDotProductFlashAttentionForCpuBackward0`, ...) and the slot (`self`, `mat2`, `result1`, ...)
  of each saved tensor: `by_op` and, with --detail, one record per saved tensor.

Settings: dtype fp32 / bf16 (`model.to(torch.bfloat16)`), and the SDPA backend: "default" (what the
CPU picks: `_scaled_dot_product_flash_attention_for_cpu`) or "math" (`sdpa_kernel(SDPBackend.MATH)`).
The CPU differs from CUDA in two places the op table records: dropout (CPU: a float noise tensor of
the input's dtype, CUDA: native_dropout's bool mask) and the attention kernel.

    python tests/activations/saved_oracle.py [-k SUBSTRING] [--out FILE] [--detail] [--self-test]
    python tests/activations/saved_oracle.py --exports EXPORTS_DIR [-k SUBSTRING] [--out FILE]
    python tests/activations/saved_oracle.py --full llama3_8b [--seq 4096] [--layers N] [--out FILE]

With --exports, the exported graphs themselves are replayed (ep.module(), node by node, with
autograd; each node attributed to its nn_module_stack): what a reader of the graph must find.
Keys are then "FILE_STEM/default" and "FILE_STEM/math".

Output (stable JSON, sorted keys, ints for bytes): {"cases": {"MODEL_bBsS/SETTING": {"modules":
{path: {"self_bytes", "total_bytes"}}, "total_bytes", "param_saved_bytes", "input_saved_bytes",
"by_dtype", "by_op", "storages", ...}}}. The root module's path is "".
"""
import argparse
import contextlib
import json
import os
import sys
import time
from collections import defaultdict
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import actmodels  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SETTINGS = ["fp32", "fp32_math", "bf16", "bf16_math"]


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).replace("torch.", "")


class SavedRecorder:
    """saved_tensors_hooks that record each packed tensor's storage, the module running, and (after
    `name_nodes`) the backward node and slot that saved it."""

    def __init__(self, model: nn.Module, params: List[torch.Tensor], inputs: List[torch.Tensor]):
        self.stack: List[str] = []
        self.records: List[Dict[str, Any]] = []
        self.param_storages = {t.untyped_storage()._cdata for t in params}
        self.input_storages = {t.untyped_storage()._cdata for t in inputs}
        self.keep: List[torch.Tensor] = []  # keeps every packed tensor (so no storage is reused)
        self.handles = []
        for name, mod in model.named_modules():
            self.handles.append(mod.register_forward_pre_hook(lambda m, a, n=name: self.stack.append(n)))
            self.handles.append(mod.register_forward_hook(lambda m, a, o, n=name: self._pop(n)))
        self.current_node: Optional[Tuple[str, str]] = None

    def _pop(self, name: str) -> None:
        assert self.stack and self.stack[-1] == name, (self.stack[-3:], name)
        self.stack.pop()

    def remove(self) -> None:
        for h in self.handles:
            h.remove()

    def pack(self, t: torch.Tensor) -> int:
        st = t.untyped_storage()
        rec = {"module": self.stack[-1] if self.stack else "", "storage": st._cdata, "storage_bytes": st.nbytes(),
               "shape": list(t.shape), "dtype": dtype_name(t.dtype), "nodes": []}
        if st._cdata in self.param_storages:
            rec["kind"] = "param"
        elif st._cdata in self.input_storages:
            rec["kind"] = "input"
        else:
            rec["kind"] = "activation"
        self.records.append(rec)
        self.keep.append(t)
        return len(self.records) - 1

    def unpack(self, handle: int) -> torch.Tensor:
        if self.current_node is not None:
            self.records[handle]["nodes"].append(self.current_node)
        return self.keep[handle]

    def name_nodes(self, roots: List[torch.Tensor]) -> None:
        """Reads every `_saved_*` attribute of every backward node reachable from `roots`."""
        seen = set()
        todo = [r.grad_fn for r in roots if r.grad_fn is not None]
        while todo:
            fn = todo.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            node = type(fn).__name__
            for attr in dir(fn):
                if not attr.startswith("_saved_"):
                    continue
                self.current_node = (node, attr[len("_saved_"):])
                try:
                    getattr(fn, attr)
                except Exception:
                    pass
            if hasattr(fn, "saved_tensors"):  # custom autograd.Function nodes (ctx.save_for_backward)
                self.current_node = (node, "saved_tensors")
                try:
                    fn.saved_tensors
                except Exception:
                    pass
            self.current_node = None
            todo.extend(nxt for nxt, _ in fn.next_functions if nxt is not None)


def summarise(rec: SavedRecorder, model: nn.Module, detail: bool) -> Dict[str, Any]:
    first: Dict[int, Dict[str, Any]] = {}
    for r in rec.records:
        first.setdefault(r["storage"], r)
        if r is not first[r["storage"]]:
            first[r["storage"]]["nodes"].extend(r["nodes"])
    modules: Dict[str, Dict[str, int]] = {n: {"self_bytes": 0, "total_bytes": 0} for n, _ in model.named_modules()}
    by_dtype: Dict[str, int] = defaultdict(int)
    by_op: Dict[str, int] = defaultdict(int)
    totals = {"activation": 0, "param": 0, "input": 0}
    unnamed = 0
    for r in first.values():
        totals[r["kind"]] += r["storage_bytes"]
        if r["kind"] != "activation":
            continue
        modules[r["module"]]["self_bytes"] += r["storage_bytes"]
        by_dtype[r["dtype"]] += r["storage_bytes"]
        nodes = sorted({n for n, _ in r["nodes"]})
        if not nodes:
            unnamed += 1
        by_op["+".join(nodes) if nodes else "(unnamed)"] += r["storage_bytes"]
    for path, m in modules.items():
        m["total_bytes"] = sum(v["self_bytes"] for p, v in modules.items()
                               if p == path or path == "" or p.startswith(path + "."))
    out = {"modules": {p: m for p, m in modules.items() if m["total_bytes"]},
           "total_bytes": totals["activation"], "param_saved_bytes": totals["param"],
           "input_saved_bytes": totals["input"], "by_dtype": dict(by_dtype), "by_op": dict(by_op),
           "storages": sum(1 for r in first.values() if r["kind"] == "activation"),
           "saves": len(rec.records), "unnamed_storages": unnamed}
    assert out["modules"].get("", {}).get("total_bytes", 0) == out["total_bytes"]
    if detail:
        out["saved"] = [{"module": r["module"], "kind": r["kind"], "shape": r["shape"], "dtype": r["dtype"],
                         "storage_bytes": r["storage_bytes"],
                         "nodes": sorted({f"{n}.{s}" for n, s in r["nodes"]})}
                        for r in first.values()]
    return out


def run_case(name: str, batch: int, seq: Optional[int], setting: str, detail: bool) -> Dict[str, Any]:
    dtype = DTYPES[setting.split("_")[0]]
    math = setting.endswith("_math")
    model = actmodels.build(name, "cpu", dtype)
    kwargs = actmodels.inputs(name, model, batch, seq)
    tensors = [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
    params = list(model.parameters()) + list(model.buffers())
    rec = SavedRecorder(model, params, tensors)
    ctx = sdpa_kernel([SDPBackend.MATH]) if math else contextlib.nullcontext()
    torch.manual_seed(0)  # dropout masks
    t0 = time.perf_counter()
    with ctx, torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
        out = model(**kwargs)
        loss = out.loss
        rec.name_nodes([loss])
        loss.backward()
    rec.remove()
    res = summarise(rec, model, detail)
    res.update(model=name, batch=batch, seq=seq, dtype=dtype_name(dtype), sdpa="math" if math else "default",
               seconds=round(time.perf_counter() - t0, 3),
               trainable_params=sum(p.numel() for p in model.parameters() if p.requires_grad))
    return res


def run_full(name: str, batch: int, seq: int, math: bool, layers: Optional[int] = None) -> Dict[str, Any]:
    """A full-size corpus model (llama3_8b, llama3_70b) in bf16 under FakeTensorMode: no memory for
    weights or activations; storages are fake, told apart by their StorageImpl like real ones.
    Under FakeTensorMode HF takes its tracing attention path (a materialised causal mask, repeat_kv:
    GRAPH.md item 8), so this measures what a plain export describes, as issue 30's tracker run did."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    model = actmodels.full_size(name, "meta", torch.bfloat16)  # structure only, outside the fake mode
    if layers is not None:
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
    with FakeTensorMode(allow_non_fake_inputs=True):
        model.to_empty(device="cpu")
        g = torch.Generator().manual_seed(0)
        kwargs = {"input_ids": torch.randint(3, 1000, (batch, seq), generator=g),
                  "labels": torch.randint(3, 1000, (batch, seq), generator=g)}
        rec = SavedRecorder(model, list(model.parameters()) + list(model.buffers()), list(kwargs.values()))
        ctx = sdpa_kernel([SDPBackend.MATH]) if math else contextlib.nullcontext()
        t0 = time.perf_counter()
        with ctx, torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
            loss = model(**kwargs).loss
            rec.name_nodes([loss])
            loss.backward()
        rec.remove()
        res = summarise(rec, model, False)
    res.update(model=name, batch=batch, seq=seq, dtype="bfloat16", sdpa="math" if math else "default",
               layers=layers or model.config.num_hidden_layers, fake_tensors=True,
               seconds=round(time.perf_counter() - t0, 1))
    return res


class _Replay(torch.fx.Interpreter):
    """Runs an exported program's graph (ep.module()) node by node with autograd on; the module stack
    of the recorder is the node's innermost nn_module_stack entry, as the C++ reader will see it."""

    def __init__(self, gm: torch.fx.GraphModule, rec: SavedRecorder):
        super().__init__(gm)
        self.rec = rec

    def run_node(self, n: torch.fx.Node) -> Any:
        stack = n.meta.get("nn_module_stack") or {}
        self.rec.stack = [list(stack.values())[-1][0] if stack else ""]
        return super().run_node(n)


def run_export(path: str, entry: Dict[str, Any], math: bool, detail: bool) -> Dict[str, Any]:
    """The saved bytes of the exported graph itself, replayed eagerly with autograd: what a reader of
    the graph must compute. Inputs are the eager case's (same seeds), parameters the archive's."""
    ep = torch.export.load(path)
    gm = ep.module()
    name = entry["model"]
    ref = actmodels.build(name, "cpu", DTYPES["bf16" if entry["dtype"] == "bfloat16" else "fp32"])
    kwargs = actmodels.inputs(name, ref, entry["batch"], entry["seq"])
    tensors = [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
    rec = SavedRecorder(nn.Module(), list(gm.parameters()) + list(gm.buffers()), tensors)
    ctx = sdpa_kernel([SDPBackend.MATH]) if math else contextlib.nullcontext()
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with ctx, torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
        # ep.module()'s placeholders are the user inputs, named as the call's keywords.
        args = [kwargs[n.name] for n in gm.graph.nodes if n.op == "placeholder"]
        loss = _Replay(gm, rec).run(*args)[0]
        rec.name_nodes([loss])
        loss.backward()
    # Every module path the graph names, so that `modules` has the same keys as the eager case's.
    # ... and their ancestors (a ModuleList such as model.layers is never called, so never named).
    paths = {""}
    for n in gm.graph.nodes:
        for p_, _ in (n.meta.get("nn_module_stack") or {}).values():
            while p_:
                paths.add(p_)
                p_ = p_.rsplit(".", 1)[0] if "." in p_ else ""
    holder = _PathModel(sorted(paths))
    res = summarise(rec, holder, detail)
    res.update(model=name, batch=entry["batch"], seq=entry["seq"], dtype=entry["dtype"],
               sdpa="math" if math else "default", seconds=round(time.perf_counter() - t0, 3), file=entry["file"])
    return res


class _PathModel:
    """Stands in for a model in `summarise`: only named_modules() is used."""

    def __init__(self, paths: List[str]):
        self.paths = paths

    def named_modules(self):
        return [(p, None) for p in self.paths]


class TwoViews(nn.Module):
    """Saves two views of one tensor: `a = x @ w` (saves x), then `a[:, :2] * a[:, 2:]` saves both
    halves of `a` (one storage). Expected: x's storage and a's storage, once each."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(3, 4))

    def forward(self, x):
        a = (x * 2) @ self.w
        return (a[:, :2] * a[:, 2:]).sum()


def self_test() -> int:
    model = TwoViews()
    x = torch.randn(5, 3)
    rec = SavedRecorder(model, list(model.parameters()), [x])
    with torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack):
        loss = model(x)
        rec.name_nodes([loss])
        loss.backward()
    res = summarise(rec, model, True)
    # x does not require grad, so mm(x*2, w) saves only x*2 (for w's gradient: 5x3 fp32, 60 bytes)
    # and not w; the mul of the two halves of `a` (5x4, 80 bytes) packs two views of one storage.
    ok = (res["total_bytes"] == 60 + 80 and res["storages"] == 2 and len(rec.records) == 3
          and res["param_saved_bytes"] == 0)
    print(("ok  " if ok else "FAIL") + f" self-test (two views of one storage counted once): {res['total_bytes']} "
          f"bytes in {res['storages']} storages from {len(rec.records)} saves, param {res['param_saved_bytes']}")
    return 0 if ok else 1


def case_list(k: Optional[str]) -> List[Tuple[str, int, Optional[int], str]]:
    out = []
    for name in actmodels.MODELS:
        for b, s in actmodels.SHAPES:
            s = None if name == "vit" else s
            for setting in SETTINGS:
                key = f"{name}_b{b}" + ("" if s is None else f"s{s}") + f"/{setting}"
                if k and k not in key:
                    continue
                out.append((key, name, b, s, setting))
    return out


def eager_cases(k: Optional[str], detail: bool) -> Dict[str, Any]:
    cases = {}
    for key, name, b, s, setting in case_list(k):
        res = run_case(name, b, s, setting, detail)
        cases[key] = res
        print(f"{key}: {res['total_bytes']} bytes in {res['storages']} storages (params {res['param_saved_bytes']},"
              f" inputs {res['input_saved_bytes']}), {res['seconds']} s", file=sys.stderr)
    return cases


def export_cases(exports: str, k: Optional[str], detail: bool) -> Dict[str, Any]:
    """Every export of the directory (small ones: not the meta-device full-size files), SDPA default and math."""
    with open(os.path.join(exports, "manifest.json")) as f:
        manifest = [e for e in json.load(f)["exports"] if "error" not in e and not e.get("meta")]
    cases = {}
    for e in manifest:
        for math in (False, True):
            key = f"{e['file'][:-4]}/{'math' if math else 'default'}"
            if k and k not in key:
                continue
            res = run_export(os.path.join(exports, e["file"]), e, math, detail)
            cases[key] = res
            print(f"{key}: {res['total_bytes']} bytes in {res['storages']} storages "
                  f"(params {res['param_saved_bytes']}, inputs {res['input_saved_bytes']}), {res['seconds']} s",
                  file=sys.stderr)
    return cases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", help="only cases whose key (MODEL_bBsS/SETTING) contains this")
    ap.add_argument("--out", help="write the JSON here (default: stdout)")
    ap.add_argument("--detail", action="store_true", help="one record per saved storage")
    ap.add_argument("--self-test", action="store_true", help="check the storage dedup on a two-view model and exit")
    ap.add_argument("--full", help="a full-size model (llama3_8b, llama3_70b) in bf16 under FakeTensorMode")
    ap.add_argument("--seq", type=int, default=4096, help="--full: sequence length (batch 1)")
    ap.add_argument("--layers", type=int, help="--full: keep only the first N decoder layers")
    ap.add_argument("--exports", help="instead of the eager models: replay every export of this directory "
                                      "(make_exports.py) with autograd, SDPA default and math")
    args = ap.parse_args()
    if args.self_test:
        return self_test()
    if args.full:
        res = run_full(args.full, 1, args.seq, False, args.layers)
        cases = {f"{args.full}{'' if args.layers is None else f'_{args.layers}l'}_b1s{args.seq}/bf16": res}
        print(f"{args.full}: {res['total_bytes']} bytes saved ({res['total_bytes'] / 2**30:.2f} GiB), params "
              f"{res['param_saved_bytes']}, {res['seconds']} s", file=sys.stderr)
    elif args.exports:
        cases = export_cases(args.exports, args.k, args.detail)
    else:
        cases = eager_cases(args.k, args.detail)
    doc = {"torch": torch.__version__, "cases": cases}
    text = actmodels.dump_cases(doc)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
