#!/usr/bin/env python3
"""fsdp-plan-export and fsdp_plan.plan() against PyTorch itself (torch 2.13,
transformers, peft: the project's venv).

For every small corpus model (tests/corpus/corpus.py SMALL) its config is
written to a temp dir as config.json (`architectures` set as save_pretrained
of the model sets it) and exported with the fsdp-plan-export command line
(--seq 16). Then, against the live model (corpus.build: eager, real tensors):

- tree: the binary's `--dump-tree` of the .pt2 equals fsdp_plan.tree's tree
  of the live model (named_modules(remove_duplicate=False), each module's own
  parameters and buffers with shape, dtype, requires_grad, and which names are
  one tensor), classes compared where the archive records them;
- metadata: extra/fsdp_plan.json is there, its no_split_modules are the live
  model's `_no_split_modules`, its tied_parameters the live model's ties, the
  loss is in the graph, hf_attention is "eager";
- plan: the recorded no_split_modules as a policy plans as reference_plan.py
  computes on the live model (torch 2.13's wrap functions and FSDP1's
  grouping), and as real FSDP1 builds it under the fake backend (world size 2,
  use_orig_params false and true: test_torch2.check_real_fsdp, refusals
  included);
- tree JSON: fsdp_plan.tree's tree of the live module, given to the binary as
  fsdp_plan.plan() gives it without example inputs, plans exactly as the .pt2
  (FSDP1 with and without use_orig_params, FSDP2).

Also: a peft LoRA adapter config (--lora) on Llama, the same checks against
get_peft_model of the live model; --dynamic batch,seq (symbolic input sizes
in the file, the same plan as the static export, and the loaded program run
at two sizes); torch.export.load of an archive with the record; the graph
against tests/activations (walk:NAME: graph_walk.py's saved bytes on the
exporter's file equal those of the as-trained corpus export, for every model
of actmodels.MODELS); --factory; the error exits (exit 2, one line naming the
file); fsdp_plan.plan() through the .pt2 path (example_inputs) against the
reference and real FSDP1, and without inputs (the tree path) against the
.pt2 path and, for a user's own base class, reference_plan.py.

    $FSDP_PLAN_VENV/bin/python tests/python/test_export_cli.py BINARY [-k A,B,...] [--keep DIR] [-v]
        [--exporter COMMAND] [-j JOBS]

-k runs the cases whose label contains one of the comma-separated substrings
(the labels are printed: corpus:NAME, lora:llama, dynamic:llama,
torch.export.load, walk:NAME, factory, errors, plan()). ctest's `export_cli`
runs the subset tests/CMakeLists.txt names in FSDP_PLAN_EXPORT_CLI_SUBSET
(Llama, tied Llama, GPT-2, the LoRA, the dynamic export, two graph walks, the
factory, the errors, plan()); the full run is the command without -k.

BINARY is the fsdp-plan to plan with (a build's, or the one a wheel
installed). The exporter runs as `python -m fsdp_plan.export` from this
checkout's python/ unless --exporter names an installed `fsdp-plan-export`.
The last line is `N passed, M failed`; exit 1 on any failure.
"""
import argparse
import concurrent.futures
import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
for sub in ("python", "tests/differential", "tests/corpus", "tests/activations"):
    sys.path.insert(0, os.path.join(REPO, sub))
warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

import corpus  # noqa: E402
import fsdp_plan  # noqa: E402
import reference_plan as rp  # noqa: E402
import test_torch2 as t2  # noqa: E402
from fsdp_plan import export as fexport  # noqa: E402
from fsdp_plan.tree import class_name, module_tree  # noqa: E402
from plan_compare import compare_plans, run_binary  # noqa: E402

UNRECORDED = "(unrecorded)"
SEQ = 16
WORLD = 2


class Runner:
    def __init__(self, args):
        self.args = args
        self.passed = self.failed = 0
        self.exporter = shlex.split(args.exporter) if args.exporter else [sys.executable, "-m", "fsdp_plan.export"]
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs))
        self.env = dict(os.environ, FSDP_PLAN=args.binary,
                        PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"), os.environ.get("PYTHONPATH", "")]))

    def selected(self, label: str) -> bool:
        """-k A,B: the cases whose label contains A or B (all without -k)."""
        return not self.args.only or any(k in label for k in self.args.only.split(","))

    def report(self, ok: bool, label: str, msgs: List[str] = ()) -> None:
        self.passed += ok
        self.failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {label}" + ("" if ok or not msgs else f": {msgs[0]}"), flush=True)
        if not ok:
            for m in list(msgs[1:])[: None if self.args.verbose else 12]:
                print(f"    {m}")

    def export(self, *argv: str, cwd: Optional[str] = None) -> subprocess.CompletedProcess:
        return subprocess.run([*self.exporter, *argv], capture_output=True, text=True, env=self.env, cwd=cwd,
                              timeout=900)

    def export_later(self, *argv: str):
        """The export in the background (-j at a time): the next models export while
        this process compares the last one with FSDP."""
        return self.pool.submit(self.export, *argv)


# ---------------------------------------------------------------------------
# Comparisons
# ---------------------------------------------------------------------------
def dump_tree(binary: str, path: str) -> Tuple[Optional[Dict[str, Any]], str]:
    r = subprocess.run([binary, path, "--dump-tree"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return None, f"--dump-tree exit {r.returncode}: {r.stderr.strip()[-500:]}"
    return json.loads(r.stdout), ""


def compare_trees(live: Dict[str, Any], dumped: Dict[str, Any]) -> List[str]:
    """fsdp_plan.tree of the live module against --dump-tree of its export."""
    msgs = []
    lpaths = [m["path"] for m in live["modules"]]
    dpaths = [m["path"] for m in dumped["modules"]]
    if lpaths != dpaths:
        missing = [p for p in lpaths if p not in dpaths]
        extra = [p for p in dpaths if p not in lpaths]
        return [f"modules differ: live has {len(lpaths)}, the file {len(dpaths)}; "
                f"missing {missing[:5]}, extra {extra[:5]}"]
    for lm, dm in zip(live["modules"], dumped["modules"]):
        for kind in ("params", "buffers"):
            strip = [{k: v for k, v in s.items() if k != "persistent"} for s in lm[kind]]
            if strip != dm[kind]:
                msgs.append(f"{lm['path'] or '(root)'}: {kind} live {strip}, file {dm[kind]}")
        if dm["type"] != UNRECORDED and dm["type"] != lm["type"] and not _inferred(dm["type"], lm):
            msgs.append(f"{lm['path'] or '(root)'}: class live {lm['type']}, file {dm['type']}")
    if live["num_tensors"] != dumped["num_tensors"]:
        msgs.append(f"num_tensors live {live['num_tensors']}, file {dumped['num_tensors']}")
    return msgs


def _inferred(file_type: str, live_module: Dict[str, Any]) -> bool:
    # A never-called container the loader names by its contents (README: inferred_class).
    short = file_type.rsplit(".", 1)[-1]
    return short in ("ModuleList", "ModuleDict") and any(short in b for b in [live_module["type"], *live_module["bases"]])


def known_plan_diffs(msgs: List[str]) -> Tuple[List[str], List[str]]:
    known = [m for m in msgs if m.endswith(f"plan has {UNRECORDED!r}")]
    return [m for m in msgs if m not in known], known


def check_plan(binary: str, path: str, live: torch.nn.Module, policy: Dict[str, Any], work: str,
               tag: str) -> List[str]:
    """The plan of `path` under `policy` against reference_plan.py and real FSDP1 on `live`."""
    ppath = os.path.join(work, f"{tag}.policy.json")
    with open(ppath, "w") as f:
        json.dump(policy, f)
    msgs: List[str] = []
    expected = rp.reference_plan(live, policy)
    for uop in (False, True):
        extra = ["--world-size", str(WORLD)] + (["--use-orig-params"] if uop else [])
        plan, err = run_binary(binary, path, ppath, *extra, ok_codes=(0, 1))
        if plan is None:
            return [err]
        if not uop:
            diffs, _ = known_plan_diffs(compare_plans(expected, plan))
            msgs += [f"reference_plan: {m}" for m in diffs]
        t2.init_fake(WORLD)
        real, _known = t2.check_real_fsdp(live, policy, WORLD, uop, plan)
        msgs += [f"use_orig_params={uop}: {m}" for m in real]
    return msgs


def archive_record(path: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.endswith("/extra/" + fexport.METADATA_NAME)]
        if len(names) != 1:
            return None, None
        return json.loads(z.read(names[0])), names[0]


def live_ties(model: torch.nn.Module) -> List[List[str]]:
    groups: Dict[int, List[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(n)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def register_outputs() -> None:
    """transformers registers a ModelOutput class with torch's pytree when one is
    first made (transformers/utils/generic.py: _register_model_output_pytree_node),
    and torch.export.load needs the class of the archive's outputs registered."""
    from transformers.modeling_outputs import CausalLMOutputWithPast
    CausalLMOutputWithPast()


def write_config(name: str, model: torch.nn.Module, out: str) -> str:
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    cfg = model.config
    cfg.architectures = [type(model).__name__]  # as model.save_pretrained writes it
    cfg.save_pretrained(d)
    return d


# ---------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------
def out_path(work: str, label: str) -> str:
    return os.path.join(work, label.replace(" ", "_").replace("/", "_").replace(":", "_") + ".pt2")


def model_case(run: Runner, name: str, work: str, live: torch.nn.Module, export_args: List[str],
               label: str, pending=None) -> Optional[str]:
    """Export with the CLI (or take `pending`, an export_later of the same), then tree,
    metadata and plan checks. Returns the .pt2 path."""
    out = out_path(work, label)
    r = pending.result() if pending is not None else run.export(*export_args, "-o", out)
    if r.returncode != 0:
        run.report(False, f"{label} / export", [f"exit {r.returncode}: {r.stderr.strip()[-800:]}"])
        return None
    lines = r.stderr.strip().splitlines()
    ok = any(ln.startswith("fsdp-plan-export: wrote") for ln in lines) and any(ln.startswith("next: ") for ln in lines)
    run.report(ok, f"{label} / export", [f"stderr does not say what it wrote: {lines}"])

    dumped, err = dump_tree(run.args.binary, out)
    if dumped is None:
        run.report(False, f"{label} / tree", [err])
    else:
        run.report(not (m := compare_trees(module_tree(live), dumped)), f"{label} / tree", m)

    rec, where = archive_record(out)
    msgs = []
    if rec is None:
        msgs.append(f"no extra/{fexport.METADATA_NAME} in the archive")
    else:
        if rec.get("no_split_modules") != corpus.no_split_modules(live):
            msgs.append(f"no_split_modules {rec.get('no_split_modules')}, live {corpus.no_split_modules(live)}")
        if sorted(sorted(g) for g in rec.get("tied_parameters", [])) != live_ties(live):
            msgs.append(f"tied_parameters {rec.get('tied_parameters')}, live {live_ties(live)}")
        if not rec.get("loss_in_graph"):
            msgs.append("the loss is not in the graph")
        if rec.get("root_class") != class_name(type(live)):
            msgs.append(f"root_class {rec.get('root_class')}, live {class_name(type(live))}")
        if rec.get("training") is not True:
            msgs.append("not exported in train mode")
        want_tp = None
        base = live.get_base_model() if hasattr(live, "get_base_model") else live  # PEFT: the model under it
        if getattr(base.config, "base_model_tp_plan", None):
            cfg = base.config
            want_tp = {"base_model_prefix": base.base_model_prefix, "head_tp_plan": dict(type(base)._tp_plan or {}),
                       "num_attention_heads": cfg.num_attention_heads,
                       "num_key_value_heads": getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
                       "head_dim": getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads}
        if "source" in rec and rec["source"].get("kind") == "config" and rec.get("tp_model") != want_tp:
            msgs.append(f"tp_model {rec.get('tp_model')}, live {want_tp}")
        if rec.get("hf_attention") != "eager":
            msgs.append(f"hf_attention {rec.get('hf_attention')!r}, not 'eager' (traced as eager training runs)")
    run.report(not msgs, f"{label} / metadata", msgs)

    classes = (rec or {}).get("no_split_modules") or []
    if classes:
        m = check_plan(run.args.binary, out, live, {"module_classes": classes}, work, label.replace(" ", "_"))
        run.report(not m, f"{label} / no_split_modules plan vs reference_plan and FSDP1 (world {WORLD})", m)
        m = compare_tree_plan(run.args.binary, out, live, {"module_classes": classes}, work, label)
        run.report(not m, f"{label} / the live module's tree JSON plans as the .pt2", m)
    return out


# What only a .pt2 says: a module whose forward never ran has no recorded class there.
PT2_ONLY_KINDS = {"inferred_class", "unrecorded_class", "fsdp2_not_called"}


def tree_vs_pt2(tree_plan: Dict[str, Any], pt2_plan: Dict[str, Any]) -> List[str]:
    """Differences between the plan of a live module's tree JSON and the plan of its .pt2:
    everything but the model's path and loader, and the warnings only a .pt2 gives."""
    def strip(p):
        p = without_time({k: v for k, v in p.items() if k != "model"})
        p["warnings"] = [w for w in p.get("warnings", []) if w["kind"] not in PT2_ONLY_KINDS]
        return p
    a, b = strip(tree_plan), strip(pt2_plan)
    return [] if a == b else [f"tree JSON vs .pt2: {t2.first_difference(a, b)}"]


def without_time(plan: Dict[str, Any]) -> Dict[str, Any]:
    """The plan without its step-time estimate: a .pt2's comes with FLOPs from the graph, at the
    graph's sizes; a tree JSON has no graph. Communication stays: it depends on the units only."""
    out = {k: v for k, v in plan.items() if k != "time"}
    out["units"] = [{k: v for k, v in u.items() if k != "time"} for u in plan.get("units", [])]
    return out


def compare_tree_plan(binary: str, pt2: str, live: torch.nn.Module, policy: Dict[str, Any], work: str,
                      label: str) -> List[str]:
    """fsdp_plan.plan(module) without example inputs (the tree JSON) against the .pt2 of the same
    module, both for FSDP1 (use_orig_params off and on) and FSDP2."""
    tag = label.replace(" ", "_").replace("/", "_").replace(":", "_")
    tree = os.path.join(work, f"{tag}.tree.json")
    with open(tree, "w") as f:
        json.dump(module_tree(live), f)
    ppath = os.path.join(work, f"{tag}.tree_policy.json")
    with open(ppath, "w") as f:
        json.dump(policy, f)
    msgs = []
    # A tree JSON has no graph, so no activations: both plans take the same allowance (0) and
    # must then agree on everything else.
    for extra in ([], ["--use-orig-params"], ["--fsdp-version", "2"]):
        extra = [*extra, "--activation-bytes", "0"]
        a, ea = run_binary(binary, tree, ppath, "--world-size", str(WORLD), *extra, ok_codes=(0, 1))
        b, eb = run_binary(binary, pt2, ppath, "--world-size", str(WORLD), *extra, ok_codes=(0, 1))
        if a is None or b is None:
            return [ea or eb]
        msgs += [f"{' '.join(extra) or 'FSDP1'}: {m}" for m in tree_vs_pt2(a, b)]
    return msgs


def corpus_cases(run: Runner, work: str, cfg_dir: str) -> None:
    cases = []
    for name in corpus.SMALL:
        if not run.selected(f"corpus:{name}"):
            continue
        live = corpus.build(name)
        live.train()
        src = write_config(name, live, cfg_dir)
        label = f"corpus:{name}"
        argv = [src, "--seq", str(SEQ)]
        cases.append((name, live, argv, label, run.export_later(*argv, "-o", out_path(work, label))))
    for name, live, argv, label, pending in cases:
        model_case(run, name, work, live, argv, label, pending)


def lora_case(run: Runner, work: str, cfg_dir: str) -> None:
    import peft
    label = "lora:llama"
    if not run.selected(label):
        return
    lcfg = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    data = {k: (sorted(v) if isinstance(v, set) else v) for k, v in lcfg.to_dict().items()}
    adapter = os.path.join(cfg_dir, "adapter_config.json")
    with open(adapter, "w") as f:
        json.dump(data, f, indent=1)
    base = corpus.build("llama")
    src = write_config("llama_for_lora", base, cfg_dir)
    live = peft.get_peft_model(base, peft.LoraConfig(**{k: v for k, v in data.items() if k in (
        "r", "lora_alpha", "target_modules", "task_type")}))
    live.train()
    model_case(run, "llama", work, live, [src, "--seq", str(SEQ), "--lora", adapter], label)


def dynamic_case(run: Runner, work: str, cfg_dir: str) -> None:
    label = "dynamic:llama"
    if not run.selected(label):
        return
    live = corpus.build("llama")
    src = write_config("llama_dynamic", live, cfg_dir)
    static = os.path.join(work, "llama_static.pt2")
    r = run.export(src, "--seq", str(SEQ), "-o", static)
    out = model_case(run, "llama", work, live, [src, "--seq", str(SEQ), "--dynamic", "batch,seq"], label)
    if out is None or r.returncode != 0:
        run.report(False, f"{label} / symbolic", [r.stderr.strip()[-500:]])
        return
    with zipfile.ZipFile(out) as z:
        model = json.loads(z.read(next(n for n in z.namelist() if n.endswith("/models/model.json"))))
    tv = model["graph_module"]["graph"]["tensor_values"]
    sizes = tv["input_ids"]["sizes"]
    symbolic = [("as_expr" in s) for s in sizes]
    run.report(symbolic == [True, True] and len(model["range_constraints"]) == 2,
               f"{label} / input_ids batch and seq are symbolic",
               [f"input_ids sizes {sizes}, range_constraints {model['range_constraints']}"])
    # Same plan as the static export (the parameters do not depend on the inputs).
    policy = os.path.join(work, "dyn.policy.json")
    with open(policy, "w") as f:
        json.dump({"module_classes": corpus.no_split_modules(live)}, f)
    # Activations do: the dynamic export plans at its traced sizes (batch 2), the static one at
    # batch 1; both take the same allowance here (plan_activations_saved checks dynamic exports).
    a, ea = run_binary(run.args.binary, out, policy, "--world-size", "8", "--activation-bytes", "0")
    b, eb = run_binary(run.args.binary, static, policy, "--world-size", "8", "--activation-bytes", "0")
    # Nor FLOPs, and so the step-time estimate: compared without it.
    strip = lambda p: without_time({k: v for k, v in p.items() if k != "model"})  # noqa: E731
    ok = a is not None and b is not None and strip(a) == strip(b)
    run.report(ok, f"{label} / plans as the static export", [ea or eb or t2.first_difference(strip(a), strip(b))])
    # The loaded program runs at two sizes. The graph was traced on the meta
    # device (its arange/zeros carry device=meta), so it runs there: weights too.
    msgs = []
    try:
        register_outputs()
        prog = torch.export.load(out).module().to("meta")
        for bsz, seq in ((2, 8), (3, 12)):
            ids = torch.zeros(bsz, seq, dtype=torch.long, device="meta")
            loss = prog(input_ids=ids, labels=ids)[0]
            if loss.dim() != 0:
                msgs.append(f"at {bsz}x{seq} the first output has shape {list(loss.shape)}, not a scalar loss")
        # The recorded range holds: past max_position_embeddings the program's guard refuses.
        too_long = torch.zeros(2, live.config.max_position_embeddings + 1, dtype=torch.long, device="meta")
        with contextlib.suppress(Exception):
            prog(input_ids=too_long, labels=too_long)
            msgs.append("a sequence past max_position_embeddings passed the program's guards")
    except Exception as e:
        msgs.append(f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    run.report(not msgs, f"{label} / runs at batch x seq 2x8 and 3x12", msgs)


def walk_cases(run: Runner, work: str, cfg_dir: str) -> None:
    """The exporter traces what eager training runs (GRAPH.md item 8): for each model of the
    activation references (tests/activations/actmodels.MODELS), the saved bytes graph_walk.py
    computes from the exporter's .pt2 (built on the meta device from the config) equal, in total,
    for parameters, for inputs and per module, those of the as-trained corpus export
    (make_exports.export_one: the eager CPU model traced inside actmodels.hf_training_export), at
    batch 1 x seq 16 in float32."""
    import actmodels
    import graph_walk
    import make_exports
    import peft
    act_dir = os.path.join(work, "act_exports")
    os.makedirs(act_dir, exist_ok=True)
    for name in actmodels.MODELS:
        label = f"walk:{name}"
        if not run.selected(label):
            continue
        seq = None if name == "vit" else SEQ
        c = dict(model=name, batch=1, seq=seq, dtype="float32")
        c["file"] = make_exports.file_stem(c) + ".pt2"
        msgs: List[str] = []
        try:
            make_exports.export_one(c, act_dir)
            want = graph_walk.walk(os.path.join(act_dir, c["file"]))
        except Exception as e:
            run.report(False, f"{label} / the as-trained corpus export", [f"{type(e).__name__}: {e}"])
            continue
        base = corpus.build(actmodels.corpus_name(name))
        src = write_config(f"walk_{actmodels.corpus_name(name)}", base, cfg_dir)
        argv = [src, "--batch", "1"] + ([] if seq is None else ["--seq", str(seq)])
        if name == "llama_lora":
            adapter = os.path.join(cfg_dir, "walk_lora_adapter.json")
            cfg = peft.LoraConfig(**actmodels.LORA).to_dict()
            with open(adapter, "w") as f:
                json.dump({k: sorted(v) if isinstance(v, set) else v for k, v in cfg.items()}, f)
            argv += ["--lora", adapter]
        out = os.path.join(work, f"walk_{name}.pt2")
        r = run.export(*argv, "-o", out)
        if r.returncode != 0:
            run.report(False, f"{label} / export", [r.stderr.strip()[-500:]])
            continue
        got = graph_walk.walk(out)
        for key in ("total_bytes", "param_saved_bytes", "input_saved_bytes"):
            if got[key] != want[key]:
                msgs.append(f"{key}: exporter {got[key]}, as-trained export {want[key]}")
        for path in sorted(set(got["modules"]) | set(want["modules"])):
            a = got["modules"].get(path, {}).get("total_bytes", 0)
            b = want["modules"].get(path, {}).get("total_bytes", 0)
            if a != b:
                msgs.append(f"module {path!r}: exporter {a}, as-trained export {b}")
        run.report(not msgs, f"{label} / saved bytes of the exporter's graph equal the as-trained export's "
                             f"({want['total_bytes']})", msgs)


def load_case(run: Runner, work: str) -> None:
    """torch.export.load reads an archive with the record, and gives it back by name."""
    label = "torch.export.load"
    path = os.path.join(work, "corpus_llama_tied.pt2")
    if not run.selected(label):
        return
    if not os.path.exists(path):
        run.report(False, f"{label}: {path} was not written")
        return
    extra = {fexport.METADATA_NAME: ""}
    msgs = []
    try:
        register_outputs()
        ep = torch.export.load(path, extra_files=extra)
        rec = json.loads(extra[fexport.METADATA_NAME])
        if rec != archive_record(path)[0]:
            msgs.append("the record torch.export.load returns differs from the zip's")
        sd = ep.state_dict
        if sd["lm_head.weight"].untyped_storage().data_ptr() != sd["model.embed_tokens.weight"].untyped_storage().data_ptr():
            msgs.append("the tied head and embedding load as two storages")
    except Exception as e:
        msgs.append(f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
    run.report(not msgs, f"{label} / the record and the tie survive (llama_tied)", msgs)


FACTORY = '''
import torch, torch.nn as nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
    def forward(self, x):
        return self.norm(torch.relu(self.fc(x)) + x)

class Net(nn.Module):
    _no_split_modules = ["Block"]
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.head = nn.Linear(16, 4)
        # 0-dim tensors (Gemma 3's embed_scale buffer; a learned scalar)
        self.register_buffer("embed_scale", torch.tensor(4.0), persistent=False)
        self.gain = nn.Parameter(torch.tensor(0.5))
    def forward(self, x):
        x = x * self.embed_scale
        for b in self.blocks:
            x = b(x)
        return (self.head(x) * self.gain).sum()

def make():
    torch.manual_seed(0)
    return Net(), (torch.randn(2, 16),)

def broken():
    class Bad(nn.Module):
        def forward(self, x):
            raise RuntimeError("this forward always fails")
    return Bad(), (torch.randn(2),)
'''


# A user's own hierarchy: A and B subclass Base (not a torch class), C does not.
BASES = '''
import torch.nn as nn

class Base(nn.Module):
    pass

class A(Base):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

class B(A):
    pass

class C(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = A(), B(), C()

def make():
    return Net()
'''


def factory_case(run: Runner, work: str) -> None:
    label = "factory"
    if not run.selected(label):
        return
    fdir = os.path.join(work, "factory")
    os.makedirs(fdir, exist_ok=True)
    with open(os.path.join(fdir, "my_models.py"), "w") as f:
        f.write(FACTORY)
    out = os.path.join(work, "factory.pt2")
    r = run.export("--factory", "my_models:make", "-o", out, cwd=fdir)
    if r.returncode != 0:
        run.report(False, f"{label} / export", [r.stderr.strip()[-500:]])
        return
    run.report(True, f"{label} / export")
    sys.path.insert(0, fdir)
    try:
        import my_models  # noqa: F401
        live, _ = my_models.make()
    finally:
        sys.path.remove(fdir)
    dumped, err = dump_tree(run.args.binary, out)
    m = [err] if dumped is None else compare_trees(module_tree(live), dumped)
    run.report(not m, f"{label} / tree", m)
    rec, _ = archive_record(out)
    run.report(bool(rec) and rec["no_split_modules"] == ["Block"] and rec["source"]["kind"] == "factory",
               f"{label} / metadata", [f"record {rec}"])
    want = {n: f"{type(m).__module__}.{type(m).__qualname__}" for n, m in live.named_modules(remove_duplicate=False)}
    container = "torch.nn.modules.container.ModuleList"
    run.report(bool(rec) and rec.get("module_classes") == want and want["blocks"] == container,
               f"{label} / module_classes (the ModuleList the graph never enters too)",
               [f"recorded {rec.get('module_classes') if rec else None}, live {want}"])
    m = check_plan(run.args.binary, out, live, {"module_classes": ["Block"]}, work, "factory")
    run.report(not m, f"{label} / plan vs reference_plan and FSDP1", m)


def error_cases(run: Runner, work: str, cfg_dir: str) -> None:
    if not run.selected("errors"):
        return
    bad_dir = os.path.join(cfg_dir, "bad")
    os.makedirs(bad_dir, exist_ok=True)
    unknown = os.path.join(bad_dir, "unknown_type.json")
    with open(unknown, "w") as f:
        json.dump({"model_type": "no_such_model_type"}, f)
    not_json = os.path.join(bad_dir, "not_json.json")
    with open(not_json, "w") as f:
        f.write("{ this is not json")
    unbuildable = os.path.join(bad_dir, "unbuildable")
    os.makedirs(unbuildable, exist_ok=True)
    with open(os.path.join(unbuildable, "config.json"), "w") as f:  # reads, but names no activation there is
        json.dump({"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 32,
                   "num_attention_heads": 4, "num_hidden_layers": 1, "intermediate_size": 8, "vocab_size": 64,
                   "hidden_act": "no_such_activation"}, f)
    invalid = os.path.join(bad_dir, "invalid.json")
    with open(invalid, "w") as f:  # transformers 5 validates the config: 30 is not a multiple of 4 heads
        json.dump({"model_type": "llama", "hidden_size": 30, "num_attention_heads": 4}, f)
    fdir = os.path.join(work, "factory")
    cases = [
        ("missing file", [os.path.join(bad_dir, "nope.json")], {}, "nope.json: no such file"),
        ("directory without config.json", [work], {}, "no config.json"),
        ("not JSON", [not_json], {}, "not JSON"),
        ("unknown model_type", [unknown], {}, "transformers cannot read this config"),
        ("config transformers refuses", [invalid], {}, "transformers cannot read this config"),
        ("config that does not build", [unbuildable], {}, "does not build from this config"),
        ("export failure", ["--factory", "my_models:broken"], {"cwd": fdir}, "torch.export.export failed"),
        ("bad --dynamic", [os.path.join(cfg_dir, "llama"), "--dynamic", "heads"], {}, "unknown dimension"),
        ("missing adapter", [os.path.join(cfg_dir, "llama"), "--lora", os.path.join(bad_dir, "nope")], {},
         "no such file"),
    ]
    for label, argv, kw, words in cases:
        out = os.path.join(work, "error.pt2")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out)
        if kw.get("cwd") and not os.path.isdir(kw["cwd"]):
            continue  # the factory case did not run (-k)
        r = run.export(*argv, "-o", out, **kw)
        lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
        ok = (r.returncode == 2 and len(lines) == 1 and words in lines[0] and lines[0].startswith("fsdp-plan-export: ")
              and not os.path.exists(out) and r.stdout == "")
        run.report(ok, f"errors / {label}: exit 2, one line", [f"exit {r.returncode}, stderr {lines[-3:]}"])


def plan_api_cases(run: Runner, work: str) -> None:
    """fsdp_plan.plan() in this process: the .pt2 path, and the tree path's refusal."""
    if not run.selected("plan()"):
        return
    live = corpus.build("llama")
    live.train()
    layer = type(live.model.layers[0])
    ids = torch.randint(3, 200, (1, SEQ))
    msgs = []
    try:
        got = fsdp_plan.plan(live, [layer], example_inputs={"input_ids": ids, "labels": ids}, world_size=WORLD,
                             binary=run.args.binary)
        expected = rp.reference_plan(live, {"module_classes": corpus.no_split_modules(live)})
        msgs += [f"reference_plan: {m}" for m in known_plan_diffs(compare_plans(expected, got))[0]]
        t2.init_fake(WORLD)
        msgs += t2.check_real_fsdp(live, {"module_classes": corpus.no_split_modules(live)}, WORLD, False, got)[0]
        if got["memory"]["world_size"] != WORLD:
            msgs.append(f"memory.world_size {got['memory']['world_size']}, asked {WORLD}")
    except Exception as e:
        msgs.append(f"{type(e).__name__}: {e}")
    run.report(not msgs, "plan() / example_inputs: the export plans as reference_plan and FSDP1", msgs)
    # A meta-device module, the recorded dtype and settings mapping.
    with torch.device("meta"):
        meta = type(live)(live.config)
    meta.train()
    mids = torch.zeros(2, SEQ, dtype=torch.long, device="meta")
    try:
        got_meta = fsdp_plan.plan(meta, {"module_classes": [layer]}, example_inputs=((), {"input_ids": mids,
                                  "labels": mids}), world_size=WORLD, use_orig_params=True, binary=run.args.binary)
        same = [u["path"] for u in got_meta["units"]] == [u["path"] for u in got["units"]]
        run.report(same, "plan() / a meta module plans the same units", [f"{[u['path'] for u in got_meta['units']]}"])
    except Exception as e:
        run.report(False, "plan() / a meta module plans the same units", [f"{type(e).__name__}: {e}"])
    args = fsdp_plan.settings_to_args({"world_size": 8, "use_orig_params": True, "aliases": False,
                                       "fail_on": ["nested_wrap", "mixed_dtype"], "optimizer": None})
    run.report(args == ["--world-size", "8", "--use-orig-params", "--fail-on", "nested_wrap", "--fail-on",
                        "mixed_dtype"], "plan() / settings map to options", [f"{args}"])
    # Without inputs: the module tree JSON, which plans as the .pt2 does.
    try:
        # The tree has no graph, so no activations: both take the same allowance (0).
        tree_plan = fsdp_plan.plan(live, [layer], binary=run.args.binary, world_size=WORLD, activation_bytes=0)
        got0 = fsdp_plan.plan(live, [layer], example_inputs={"input_ids": ids, "labels": ids}, world_size=WORLD,
                              binary=run.args.binary, activation_bytes=0)
        m = tree_vs_pt2(tree_plan, got0)
    except fsdp_plan.FsdpPlanError as e:
        m = [f"FsdpPlanError: {e}"]
    run.report(not m, "plan() / no example_inputs: the live module's tree plans as its export", m)
    # A user's own class hierarchy: a policy naming a base class wraps its subclasses (isinstance),
    # which only the tree can say (a .pt2 records each module's own class alone).
    m = []
    bdir = os.path.join(work, "bases")
    os.makedirs(bdir, exist_ok=True)
    with open(os.path.join(bdir, "my_models_bases.py"), "w") as f:
        f.write(BASES)
    sys.path.insert(0, bdir)
    try:
        import my_models_bases
        net = my_models_bases.make()
        got_base = fsdp_plan.plan(net, [my_models_bases.Base], binary=run.args.binary)
        expected = rp.reference_plan(net, {"module_classes": ["Base"]})
        m = [f"reference_plan: {d}" for d in known_plan_diffs(compare_plans(expected, got_base))[0]]
        if sorted(u["path"] for u in got_base["units"]) != ["", "a", "b"]:
            m.append(f"units {[u['path'] for u in got_base['units']]}, not a, b (subclasses of Base) and the root")
    except Exception as e:
        m.append(f"{type(e).__name__}: {e}")
    finally:
        sys.path.remove(bdir)
    run.report(not m, "plan() / no example_inputs: a base class of the user's own matches its subclasses", m)


def identical_case(run: Runner, work: str) -> None:
    """The exporter's two skips (no stack traces while tracing, no canonical-form self-check
    in save) leave the archive as torch alone writes it: every member, byte for byte."""
    label = "skips: the archive is torch's own"
    if not run.selected("skips"):
        return
    live = corpus.build("llama")
    live.train()
    ids = torch.randint(3, 200, (1, SEQ))
    paths = {}
    for fast in (True, False):
        paths[fast] = os.path.join(work, f"identical_{'fast' if fast else 'plain'}.pt2")
        fexport.export_module(live, (), {"input_ids": ids, "labels": ids}, paths[fast], fast=fast)
    members = []
    for fast in (True, False):
        with zipfile.ZipFile(paths[fast]) as z:
            # The archive's root folder is named after the file: compare what lies below it.
            members.append({n.split("/", 1)[1]: z.read(n) for n in z.namelist()})
    fast_m, plain_m = members
    msgs = [f"member {n}: only in the {'fast' if n in fast_m else 'plain'} archive"
            for n in sorted(set(fast_m) ^ set(plain_m))]
    msgs += [f"member {n}: {len(fast_m[n])} bytes fast, {len(plain_m[n])} plain, not the same bytes"
             for n in sorted(set(fast_m) & set(plain_m)) if fast_m[n] != plain_m[n]]
    run.report(not msgs and len(fast_m) > 3, f"{label} ({len(fast_m)} members)", msgs)


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--exporter", default=None, help="the fsdp-plan-export command (default: python -m "
                                                     "fsdp_plan.export from this checkout)")
    ap.add_argument("-k", dest="only", default=None,
                    help="only the cases whose label contains one of these comma-separated substrings "
                         "(corpus:NAME, lora:, dynamic:, torch.export.load, skips, walk:NAME, factory, errors, plan())")
    ap.add_argument("--keep", default=None)
    ap.add_argument("-v", dest="verbose", action="store_true")
    ap.add_argument("-j", dest="jobs", type=int, default=2, help="exports running at once (default 2)")
    args = ap.parse_args(argv)
    args.binary = os.path.abspath(args.binary)
    tmp = tempfile.TemporaryDirectory(prefix="fsdp-export-cli-")
    work = args.keep or tmp.name
    os.makedirs(work, exist_ok=True)
    cfg_dir = os.path.join(work, "configs")
    run = Runner(args)
    t0 = time.time()
    corpus_cases(run, work, cfg_dir)
    lora_case(run, work, cfg_dir)
    dynamic_case(run, work, cfg_dir)
    load_case(run, work)
    identical_case(run, work)
    walk_cases(run, work, cfg_dir)
    factory_case(run, work)
    error_cases(run, work, cfg_dir)
    plan_api_cases(run, work)
    run.pool.shutdown()
    print(f"# {time.time() - t0:.0f} s, torch {torch.__version__}, binary {args.binary}")
    print(f"{run.passed} passed, {run.failed} failed")
    return 1 if run.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
