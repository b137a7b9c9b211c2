"""FSDP2 differential test: fsdp-plan --fsdp-version 2 against torch 2.13's fully_shard and FSDPMemTracker.

For each model (small hand-built ones, plus corpus models when --corpus is given) and each mesh
(W = 1, 3, 8 and HSDP 2x4), with and without a bf16 MixedPrecisionPolicy:

1. save the model as TorchScript, plan it with `fsdp-plan MODEL --policy P --format json`;
2. in this process, under the fake process group (rank 0 of W) and FakeTensorMode, build the same
   model on the meta device and make the plan's fully_shard calls, in the plan's call order, with
   the plan's reshard_after_forward; compare each group's managed parameters (in order) and each
   parameter's local padded shard shape with the plan;
3. run two training steps (AdamW, foreach=False) under FSDPMemTracker and compare, on the second:
   sharded parameters, sharded gradients (after backward), optimizer state (after the step) and
   buffers exactly, and the peak of the non-activation categories within TOLERANCE.

Also (cases "inferred_class ..."): a module whose class a .pt2 only infers (never called during
torch.export: a Sequential iterated over, peft's LoraModel, a real ModuleList) may draw an
fsdp2_container warning, never the error; the TorchScript plan of a real ModuleList keeps the
error; each is checked against what fully_shard does on the live module. And (case "size_fix"):
a size policy's refused ModuleLists come with a fix that, merged into the policy, gives a plan
torch makes and tracks as planned.

    /work/venv/bin/python tests/differential/test_fsdp2.py BINARY [--corpus DIR] [-k SUBSTRING] [-v]

Exits 1 on any failure.
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.testing._internal.distributed.fake_pg import FakeStore

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

# The plan's non-activation peak may differ from the tracker's by this share. Why: the tracker
# files autograd's gradients under "Temp" until FSDP's post-backward takes them, and so the
# reduce-scatter output and the casts to and from the reduce dtype, which the plan counts and the
# compared sum leaves out (the plan is higher: up to +18% measured, on a small convnet whose
# gradients are large next to everything else); and the plan walks whole groups where autograd
# frees and allocates per operation (a few percent either way).
TOLERANCE = 0.20

NON_ACTIVATION = ["Sharded Param", "Unsharded Param", "Buffer", "Sharded Grad", "Unsharded Grad",
                  "All Gather", "Reduce Scatter", "OptState"]


# ---------------------------------------------------------------------------- models

class Block(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class TiedLM(nn.Module):
    """Embedding tied to the output head; odd sizes so that W = 3 and 8 pad."""

    def __init__(self, vocab=53, d=24, hidden=70, layers=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([Block(d, hidden) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        h = self.emb(ids)
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h))


class Expert(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w2 = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.w2(torch.relu(self.w1(x)))


class MoEBlock(nn.Module):
    """Dense soft routing (no data-dependent shapes, so FakeTensorMode runs it)."""

    def __init__(self, d, hidden, experts):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.router = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList([Expert(d, hidden) for _ in range(experts)])

    def forward(self, x):
        h = self.norm(x)
        weights = torch.softmax(self.router(h), dim=-1)
        out = torch.zeros_like(x)
        for i, expert in enumerate(self.experts):
            out = out + weights[..., i:i + 1] * expert(h)
        return x + out


class MoE(nn.Module):
    def __init__(self, vocab=61, d=20, hidden=36, experts=5, layers=2):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([MoEBlock(d, hidden, experts) for _ in range(layers)])
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        h = self.emb(ids)
        for b in self.blocks:
            h = b(h)
        return self.head(self.norm(h))


class ConvNet(nn.Module):
    """BatchNorm buffers (whole on every rank) and 4-D weights sharded on dim 0."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 13, 3), nn.BatchNorm2d(13), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(13, 22, 3), nn.BatchNorm2d(22), nn.ReLU())
        self.fc = nn.Linear(22, 10)

    def forward(self, x):
        return self.fc(self.body(self.stem(x)).mean(dim=(2, 3)))


def ids_input(vocab):
    return lambda: (torch.randint(0, vocab, (2, 16)),)


MODELS = {
    # name: (builder, input maker, policy without "fsdp")
    "tied_lm": (TiedLM, ids_input(53), {"module_classes": ["Block"]}),
    "tied_lm_groups": (TiedLM, ids_input(53), {
        "module_classes": ["Block"],
        "groups": [{"modules": ["emb", "norm", "head"], "reshard_after_forward": False}]}),
    "moe": (MoE, ids_input(61), {"module_classes": ["Expert", "MoEBlock"]}),
    "convnet": (ConvNet, lambda: (torch.randn(2, 3, 12, 12),), {"min_num_params": 1000}),
}

MESHES = [("W1", 1, 1), ("W3", 3, 1), ("W8", 8, 1), ("HSDP2x4", 8, 4)]  # name, world, shard group (1: all)


def meta_build(corpus, name):
    model = corpus.build(name, "meta")
    # HF's default grouped_mm experts have no float32 meta kernel; batched_mm runs under FakeTensorMode.
    if hasattr(model.config, "_experts_implementation"):
        model.config._experts_implementation = "batched_mm"
    return model


def add_corpus(corpus_dir):
    """The corpus's tied-head and mixture-of-experts models (tests/corpus, ctest fixture 'corpus')."""
    here = os.path.join(REPO, "tests", "corpus")
    if not os.path.exists(os.path.join(here, "corpus.py")) or not os.path.isdir(corpus_dir):
        print(f"note: no corpus ({corpus_dir}); hand-built models only")
        return
    sys.path.insert(0, here)
    import corpus  # noqa: E402  (HF models built from configs)

    for name in ("llama_tied", "mixtral"):
        path = os.path.join(corpus_dir, name + ".pt")
        if not os.path.exists(path):
            continue
        model = corpus.build(name, "cpu")
        inputs = corpus.example_inputs(name, model)
        MODELS["corpus_" + name] = (lambda name=name: meta_build(corpus, name), lambda inputs=inputs: inputs,
                                    {"module_classes": corpus.no_split_modules(model)}, path)


# ---------------------------------------------------------------------------- one case

def non_activation_tracker(base, categories):
    """A subclass of the memory tracker `base` that also keeps the largest sum of `categories`
    (the tracker's own "peak" is that of its Total, activations included)."""

    class Tracker(base):
        non_act_peak = 0
        non_act_snap = None

        def _update_snap(self, *args, **kwargs):
            super()._update_snap(*args, **kwargs)
            for snap in self._curr_mem_snap.values():
                total = sum(v for k, v in snap.items() if getattr(k, "value", k) in categories)
                if total > self.non_act_peak:
                    self.non_act_peak = total
                    self.non_act_snap = {getattr(k, "value", k): v for k, v in snap.items()}

    return Tracker


# FSDPMemTracker that also keeps the largest sum of the non-activation categories.
PeakTracker = non_activation_tracker(FSDPMemTracker, NON_ACTIVATION)


def two_tracked_steps(tracker, model, optim, inputs):
    """Two training steps under `tracker`, whose statistics (non_act_peak too)
    are then those of the second; the snapshots after its backward and after
    its optimizer step."""
    with tracker:
        for it in range(2):
            if it == 1:
                tracker.reset_mod_stats()
                tracker.non_act_peak = 0
            out = model(*inputs)
            out = out.logits if hasattr(out, "logits") else out
            out.float().sum().backward()
            after_backward = tracker.get_tracker_snapshot()
            optim.step()
            after_step = tracker.get_tracker_snapshot()
            optim.zero_grad()
    return after_backward, after_step


def category(snap, name):
    for dev_snap in snap.values():
        for k, v in dev_snap.items():
            if getattr(k, "value", k) == name:
                return v
    return 0


def plan_of(binary, model_file, policy, tmp):
    pfile = os.path.join(tmp, "policy.json")
    with open(pfile, "w") as f:
        json.dump(policy, f)
    out = subprocess.run([binary, model_file, "--policy", pfile, "--format", "json"], capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise RuntimeError(f"fsdp-plan exit {out.returncode}: {out.stderr.strip()}")
    return json.loads(out.stdout)


def run_case(binary, name, mesh_spec, bf16, model_file, tmp, verbose):
    builder, make_input, base_policy = MODELS[name][:3]
    mesh_name, world, group = mesh_spec
    fsdp = {"version": 2, "world_size": world, "optimizer": "adamw", "optimizer_impl": "for-loop"}
    if group > 1:
        fsdp.update({"sharding_strategy": "HYBRID_SHARD", "shard_group_size": group})
    policy = dict(base_policy, fsdp=fsdp)
    if bf16:
        policy["mixed_precision"] = {"param_dtype": "bfloat16", "reduce_dtype": "float32"}
    plan = plan_of(binary, model_file, policy, tmp)
    return check_against_torch(plan, builder, make_input, world, group, bf16, verbose)


def check_against_torch(plan, builder, make_input, world, group, bf16, verbose):
    """Makes `plan`'s fully_shard calls on builder()'s model (meta device, fake backend, rank 0 of
    `world`, shard groups of `group` ranks when > 1), compares groups and shard shapes, then two
    training steps under FSDPMemTracker. Returns a list of failures, or (None, peak offset).
    test_suggest_fsdp.py uses it on the plans `fsdp-plan suggest` picks."""
    errors = [w for w in plan["warnings"] if w["severity"] == "error"]
    if errors:
        return [f"plan has errors: {[w['kind'] for w in errors]}"]
    failures = []

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    if group > 1:
        mesh = init_device_mesh("cpu", (world // group, group), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()

    # allow_non_fake_inputs: BatchNorm's num_batches_tracked is made from a real constant at init.
    with FakeTensorMode(allow_non_fake_inputs=True):
        torch.manual_seed(0)
        with torch.device("meta"):
            model = builder()
        module_name = {id(m): n for n, m in model.named_modules()}
        aliases = {}
        for n, p in model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), set()).add(n)
        orig_names = {}  # FSDPParam -> names, read before sharding replaces the parameters
        for u in sorted(plan["units"], key=lambda u: u["call"]):
            mods = [model.get_submodule(p) if p else model for p in u["modules"]]
            raf = u["reshard_after_forward"]
            fully_shard(mods if len(mods) > 1 else mods[0], mesh=mesh, mp_policy=mp, reshard_after_forward=raf)
            group_ = mods[0]._get_fsdp_state()._fsdp_param_group
            got = []
            for fp in (group_.fsdp_params if group_ else []):
                info = fp._module_info
                prefix = module_name[id(info.module)]
                got.append((prefix + "." if prefix else "") + info.param_name)
            want = [p["name"] for p in u["params"]]
            if len(got) != len(want):
                failures.append(f"unit {u['path']!r}: torch manages {got}, plan {want}")
                continue
            for fp, g, p in zip(group_.fsdp_params if group_ else [], got, want):
                if g != p:
                    failures.append(f"unit {u['path']!r}: torch has {g} where the plan has {p}")
                shard = list(fp.padded_sharded_param_size)
                local = list(fp.sharded_param.to_local().shape)
                plan_shape = next(q["sharded_shape"] for q in u["params"] if q["name"] == p)
                if shard != plan_shape or local != plan_shape:
                    failures.append(f"{p}: torch padded {shard}, local {local}; plan {plan_shape}")
        if failures:
            return failures

        model.to_empty(device="cpu")
        optim = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        inputs = make_input()
        tracker = PeakTracker(model, optim)
        tracker.track_inputs(inputs)
        after_backward, after_step = two_tracked_steps(tracker, model, optim, inputs)

    mem = plan["memory"]["per_rank"]
    measured = {
        "sharded params": (category(after_step, "Sharded Param"), mem["params_bytes"]),
        "sharded grads": (category(after_backward, "Sharded Grad"), mem["grads_bytes"]),
        "optimizer state": (category(after_step, "OptState"), mem["optimizer_bytes"]),
        "buffers": (category(after_step, "Buffer"), mem["buffers_bytes"]),
    }
    for what, (torch_bytes, plan_bytes) in measured.items():
        if torch_bytes != plan_bytes:
            failures.append(f"{what}: FSDPMemTracker {torch_bytes}, plan {plan_bytes}")
    peak_t, peak_p = tracker.non_act_peak, mem["peak_bytes"]
    off = (peak_p - peak_t) / peak_t
    if abs(off) > TOLERANCE:
        failures.append(f"non-activation peak: FSDPMemTracker {peak_t}, plan {peak_p} ({off:+.1%})")
    if verbose:
        print(f"    peak FSDPMemTracker {peak_t} {tracker.non_act_snap}")
        print(f"    peak plan {peak_p} in {plan['memory']['peak']['phase']} at {plan['memory']['peak']['unit_path']!r}"
              f" {plan['memory']['peak']['categories']}")
    return failures if failures else None, off


# ---------------------------------------------------------------------------- classes a .pt2 infers

class IteratedSequential(nn.Module):
    """A Sequential the parent iterates over instead of calling: torch.export never sees its forward
    run, so the .pt2 records no class for it, and its children named 0..n-1 make it look like a
    ModuleList. fully_shard accepts it (a Sequential has a forward)."""

    def __init__(self, d=16, hidden=24):
        super().__init__()
        self.body = nn.Sequential(Block(d, hidden), Block(d, hidden))
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        for block in self.body:
            x = block(x)
        return self.head(x)


class RealList(nn.Module):
    """A real ModuleList: fully_shard refuses it, and the .pt2 cannot tell it from the above."""

    def __init__(self, d=16, hidden=24):
        super().__init__()
        self.layers = nn.ModuleList([Block(d, hidden), Block(d, hidden)])
        self.head = nn.Linear(d, 5)

    def forward(self, x):
        for block in self.layers:
            x = block(x)
        return self.head(x)


def lora_model():
    """peft's PeftModel -> LoraModel (base_model) -> the model: PeftModel.forward calls the model
    itself, so LoraModel's forward never runs and the .pt2 infers a ModuleDict for it."""
    from peft import LoraConfig, get_peft_model
    return get_peft_model(RealList(), LoraConfig(r=2, target_modules=["fc1"]))


# name: (builder, example input, policy without "fsdp", the container's path, file kind). The
# thresholds select the container and the blocks' parent but, for LoRA, not the real ModuleList.
INFERRED = {
    "sequential_pt2": (IteratedSequential, lambda: (torch.randn(2, 16),), {"min_num_params": 1000}, "body", "pt2"),
    "lora_pt2": (lora_model, lambda: (torch.randn(2, 16),), {"min_num_params": 1850}, "base_model", "pt2"),
    "modulelist_pt2": (RealList, lambda: (torch.randn(2, 16),), {"min_num_params": 1000}, "layers", "pt2"),
    "modulelist_torchscript": (RealList, lambda: (torch.randn(2, 16),), {"min_num_params": 1000}, "layers", "pt"),
}


def fake_mesh(world):
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    return init_device_mesh("cpu", (world,))


def fully_shard_raises(builder, path):
    """What real fully_shard says when called on the module at `path` (fake backend, meta device)."""
    mesh = fake_mesh(2)
    with torch.device("meta"):
        torch.manual_seed(0)
        model = builder()
    try:
        fully_shard(model.get_submodule(path), mesh=mesh)
    except ValueError as e:
        return str(e)
    return None


def first_forward_error(builder, plan, make_input):
    """The plan's calls made for real (CPU, fake backend, world 1), then one forward: its error or None."""
    mesh = fake_mesh(1)
    torch.manual_seed(0)
    model = builder()
    for u in sorted(plan["units"], key=lambda u: u["call"]):
        mods = [model.get_submodule(p) if p else model for p in u["modules"]]
        fully_shard(mods if len(mods) > 1 else mods[0], mesh=mesh, reshard_after_forward=u["reshard_after_forward"])
    try:
        model(*make_input())
    except RuntimeError as e:
        return str(e)
    return None


def check_inferred(binary, name, tmp):
    """A class the .pt2 infers may warn, never refuse (issue 24, item 3): the plan's fsdp2_container
    for `name` against what torch 2.13's fully_shard does on the live module."""
    builder, make_input, policy, path, kind = INFERRED[name]
    torch.manual_seed(0)
    model = builder().eval()
    model_file = os.path.join(tmp, name + "." + kind)
    if kind == "pt2":
        torch.export.save(torch.export.export(model, make_input(), strict=False), model_file)
    else:
        torch.jit.save(torch.jit.trace(model, make_input()), model_file)
    plan = plan_of(binary, model_file, dict(policy, fsdp={"version": 2}), tmp)
    said = [w for w in plan["warnings"] if w["kind"] == "fsdp2_container" and w["modules"] == [path]]
    if len(said) != 1:
        return [f"plan: {len(said)} fsdp2_container warnings on {path!r}, want 1: {plan['warnings']}"]
    w, raised = said[0], fully_shard_raises(builder, path)
    if raised is not None and "containers that do not implement forward" not in raised:
        return [f"fully_shard({path}) raised something else: {raised}"]
    if kind != "pt2":
        # A recorded class: the refusal is PyTorch's, and stays an error.
        ok = raised is not None and w["severity"] == "error"
        return [] if ok else [f"{path!r}: plan {w['severity']}, fully_shard {'raises' if raised else 'accepts it'}"]
    # The class is a guess: a warning that says so, whatever the module really is.
    if w["severity"] != "warning" or "inferred" not in w["message"]:
        return [f"{path!r}: {w['severity']} {w['message']!r}; want a warning saying the class is inferred"
                f" (fully_shard {'raises' if raised else 'accepts it'})"]
    if raised is not None:
        return []
    # fully_shard accepts it. Whether training runs depends on what the group manages: its module's
    # forward never runs, so FSDP2 never gathers it; the plan says which.
    owns = any(u["params"] for u in plan["units"] if u["modules"] == [path])
    error = first_forward_error(builder, plan, make_input)
    failures = []
    if owns != ("stay sharded" in w["message"]):
        failures.append(f"{path!r} manages parameters: {owns}; the warning says: {w['message']!r}")
    if owns:
        if error is None or "mixed torch.Tensor and DTensor" not in error:
            failures.append(f"{path!r} manages parameters and is never called, yet the first forward gives {error!r}")
        # The fix the warning gives: its elements in one group, which torch runs and the plan agrees with.
        elements = [path + "." + n for n, _ in builder().get_submodule(path).named_children()]
        fixed = dict(policy)
        fixed.pop("min_num_params")
        fixed.update(groups=[{"modules": elements}], fsdp={"version": 2})
        plan = plan_of(binary, model_file, fixed, tmp)
        bad = [x for x in plan["warnings"] if x["severity"] != "info"]
        if bad:
            return failures + [f"the fix {fixed} still warns: {bad}"]
    elif error is not None:
        failures.append(f"{path!r} manages nothing, yet the first forward fails: {error}")
    result = check_against_torch(plan, builder, make_input, 1, 1, False, False)
    result = result[0] if isinstance(result, tuple) else result
    return failures + (result or [])


def check_size_fix(binary, tmp):
    """Issue 24, item 11: a size policy selects the MoE's ModuleLists (Accelerate's rule), which
    fully_shard refuses; the refusal's fix, merged into the policy as Warning.fix says (arrays add),
    gives a plan torch 2.13 makes and tracks as planned (W = 8)."""
    torch.manual_seed(0)
    model_file = os.path.join(tmp, "moe_size.pt")
    torch.jit.save(torch.jit.script(MoE()), model_file)
    policy = {"min_num_params": 1000, "fsdp": {"version": 2, "world_size": 8, "optimizer": "adamw",
                                                   "optimizer_impl": "for-loop"}}
    plan = plan_of(binary, model_file, policy, tmp)
    refused = [w for w in plan["warnings"] if w["kind"] == "fsdp2_container"]
    want = ["blocks", "blocks.0.experts", "blocks.1.experts"]
    if sorted(m for w in refused for m in w["modules"]) != want or any(w["severity"] != "error" for w in refused):
        return [f"want fsdp2_container errors on {want}: {refused}"]
    for w in refused:
        try:
            fully_shard(MoE().get_submodule(w["modules"][0]), mesh=fake_mesh(8))
            return [f"fully_shard accepts {w['modules'][0]}, the plan refuses it"]
        except ValueError:
            pass
    fixes = [w.get("fix") for w in refused]
    if not fixes[0] or any(f != fixes[0] for f in fixes) or "Fix: add" not in refused[0]["message"]:
        return [f"want one fix on every refusal: {refused}"]
    fixed = dict(policy)
    for key, value in fixes[0].items():
        fixed[key] = fixed.get(key, []) + value if isinstance(value, list) else value
    plan = plan_of(binary, model_file, fixed, tmp)
    errors = [w for w in plan["warnings"] if w["severity"] == "error"]
    if errors:
        return [f"the fix {fixes[0]} leaves errors: {errors}"]
    if not any(u["modules"] == ["blocks.0.experts.0"] for u in plan["units"]):
        return [f"the fixed plan lost the experts: {[u['modules'] for u in plan['units']]}"]
    result = check_against_torch(plan, MoE, ids_input(61), 8, 1, False, False)
    return (result[0] if isinstance(result, tuple) else result) or []

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--corpus")
    ap.add_argument("-k")
    ap.add_argument("-v", action="store_true")
    args = ap.parse_args()
    if args.corpus:
        add_corpus(args.corpus)
    passed = failed = 0
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        extra = {f"inferred_class {name}": (lambda name=name: check_inferred(args.binary, name, tmp))
                 for name in INFERRED}
        extra["size_fix moe"] = lambda: check_size_fix(args.binary, tmp)
        for case, check_case in extra.items():
            if args.k and args.k not in case:
                continue
            try:
                failures = check_case()
            except Exception:
                failures = [traceback.format_exc()]
            if failures:
                failed += 1
                print(f"FAIL {case}")
                for f in failures:
                    print("     " + f)
            else:
                passed += 1
                print(f"ok   {case}")
        for name, spec in MODELS.items():
            if len(spec) > 3:
                model_file = spec[3]
            else:
                torch.manual_seed(0)
                model_file = os.path.join(tmp, name + ".pt")
                torch.jit.save(torch.jit.script(spec[0]()), model_file)
            for mesh_spec in MESHES:
                for bf16 in (False, True):
                    case = f"{name} {mesh_spec[0]} {'bf16' if bf16 else 'fp32'}"
                    if args.k and args.k not in case:
                        continue
                    try:
                        result = run_case(args.binary, name, mesh_spec, bf16, model_file, tmp, args.v)
                        failures, off = result if isinstance(result, tuple) else (result, 0.0)
                    except Exception:
                        failures, off = [traceback.format_exc()], 0.0
                    if failures:
                        failed += 1
                        print(f"FAIL {case}")
                        for f in failures:
                            print("     " + f)
                    else:
                        passed += 1
                        worst = max(worst, abs(off))
                        print(f"ok   {case}  (non-activation peak {off:+.1%})")
    print(f"{passed} passed, {failed} failed; largest peak difference among passes {worst:.1%}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
