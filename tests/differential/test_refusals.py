#!/usr/bin/env python3
"""The plan's FSDP1 refusals against real FSDP1 (torch 2.13, `fake` backend, one process).

Models, made here and saved as TorchScript (traced):
  lora    the corpus's small Llama (tests/corpus/corpus.py), with peft LoRA on q_proj/v_proj: frozen base
          weights and trainable adapters in every decoder layer;
  dtypes  bfloat16 blocks, each with a float32 Router module inside.

For each, with the policy wrapping the block class:
  1. fsdp-plan marks some units as errors (mixed_requires_grad / mixed_dtype);
  2. real FSDP1, one unit at a time (bottom-up, a refused unit's parameters left
     out of its ancestors), raises for exactly those units, and nothing else;
  3. real FSDP1 auto-wrapping with the policy raises the error the plan quotes;
  4. the plan's `fix` merged into the policy: fsdp-plan reports no error, and
     real FSDP1 auto-wrapping with the fixed policy constructs.
And the memory of frozen parameters (lora, use_orig_params=True, world size 4,
rank 0): the plan's gradient and Adam state bytes equal those of real FSDP1
after a training step (flat parameter gradients, exp_avg + exp_avg_sq).
FSDP2 (`fsdp.version` 2, fully_shard calls as the plan lists them): the dtypes
model's groups whose lazy init (FSDPParamGroup.lazy_init, torch's own check)
raises are exactly the plan's fsdp2_mixed_dtype errors, and the advised fix
(the float32 module in a group of its own) runs; on the LoRA model
FSDPMemTracker's sharded parameters, sharded gradients and Adam state after a
step equal the plan's (frozen parameters: no gradient, no state).

    /work/venv/bin/python tests/differential/test_refusals.py BINARY
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: E402
from torch.distributed.fsdp.wrap import ModuleWrapPolicy  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "corpus"))  # corpus.py, imported when needed (transformers is slow)

BINARY = os.environ.get("FSDP_PLAN", "build/app/fsdp-plan")
WORLD = 4
CPU = torch.device("cpu")


# ---------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------
def lora_model() -> nn.Module:
    """The corpus's small Llama with peft LoRA on q_proj and v_proj."""
    import corpus
    from peft import LoraConfig, get_peft_model
    peft = get_peft_model(corpus.build("llama"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    return peft.base_model.model  # the HF model with LoRA layers injected, as FSDP would wrap it


def lora_inputs():
    torch.manual_seed(0)
    return (torch.randint(3, 64, (2, 8)),)


class Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(2, 16))  # float32: routers are often kept in full precision

    def forward(self, x):
        return x.float() @ self.weight.t()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16).to(torch.bfloat16)
        self.router = Router()

    def forward(self, x):
        return self.fc(x) + self.router(x).sum(-1, keepdim=True).to(x.dtype)


class MoeNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(16, 4).to(torch.bfloat16)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def dtype_model() -> nn.Module:
    torch.manual_seed(0)
    return MoeNet()


def dtype_inputs():
    return (torch.randn(2, 16, dtype=torch.bfloat16),)


def save_traced(model: nn.Module, inputs, path: str, hf: bool):
    """Traces the model itself, so the root keeps its class (HF models as the corpus traces them)."""
    with torch.no_grad():
        if hf:
            import corpus
            traced = corpus.trace(model, "llama", inputs)
        else:
            traced = torch.jit.trace(model, inputs)
    torch.jit.save(traced, path)


# ---------------------------------------------------------------------------
# Plans and policies
# ---------------------------------------------------------------------------
def plan(model_path: str, policy: dict, tmp: str) -> dict:
    pol = os.path.join(tmp, "policy.json")
    with open(pol, "w") as f:
        json.dump(policy, f)
    r = subprocess.run([BINARY, model_path, "--policy", pol, "-f", "json"], capture_output=True, text=True,
                       timeout=300)
    if r.returncode not in (0, 1):
        raise AssertionError(f"fsdp-plan failed ({r.returncode}): {r.stderr}")
    return json.loads(r.stdout)


def text_plan(model_path: str, policy: dict, tmp: str) -> str:
    pol = os.path.join(tmp, "policy.json")
    with open(pol, "w") as f:
        json.dump(policy, f)
    return subprocess.run([BINARY, model_path, "--policy", pol], capture_output=True, text=True, timeout=300).stdout


def with_fix(policy: dict, fix: dict) -> dict:
    out = json.loads(json.dumps(policy))
    for key, value in fix.items():
        if isinstance(value, list):
            out[key] = list(out.get(key) or []) + [v for v in value if v not in (out.get(key) or [])]
        else:
            out.setdefault(key, {}).update(value)
    return out


def class_matches(pattern: str, cls: type) -> bool:
    qualified = cls.__module__ + "." + cls.__qualname__
    return pattern == qualified or pattern == cls.__qualname__ or qualified.endswith("." + pattern)


def wrap_classes(model: nn.Module, policy: dict):
    names = policy.get("module_classes") or []
    return {type(m) for m in model.modules() if any(class_matches(n, type(m)) for n in names)}


def error_units(p: dict, kind: str):
    return sorted({u for w in p["warnings"] if w["kind"] == kind and w["severity"] == "error" for u in w["modules"]})


# ---------------------------------------------------------------------------
# Real FSDP1
# ---------------------------------------------------------------------------
def refused_units(model: nn.Module, p: dict, use_orig_params: bool):
    """FSDP1 on each of the plan's units, deepest first, as auto-wrapping does;
    a refused unit's parameters are left out of its ancestors (ignored_states)."""
    refused, left_out = [], []
    units = [u["path"] for u in p["units"]]
    for path in reversed(units):  # pre-order reversed: every unit after its descendants
        module = model.get_submodule(path) if path else model
        inside = {id(q) for q in module.parameters()}
        ignored = [q for q in left_out if id(q) in inside]
        try:
            wrapped = FSDP(module, device_id=CPU, use_orig_params=use_orig_params, ignored_states=ignored or None)
        except ValueError:
            refused.append(path)
            left_out.extend(q for q in module.parameters() if id(q) not in {id(x) for x in left_out})
            continue
        if path:
            parent, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, name, wrapped)
    return sorted(refused)


def auto_wrap(model: nn.Module, policy: dict):
    return FSDP(model, device_id=CPU, auto_wrap_policy=ModuleWrapPolicy(wrap_classes(model, policy)),
                use_orig_params=bool(policy.get("fsdp", {}).get("use_orig_params", False)))


class Refusals(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        dist.init_process_group("fake", rank=0, world_size=WORLD, store=FakeStore())
        cls.tmp = tempfile.mkdtemp(prefix="refusals-")
        cls._files = {}

    def file(self, name):
        """The model saved as TorchScript, made on first use."""
        if name not in self._files:
            make, inputs, hf = {"lora": (lora_model, lora_inputs, True),
                                "dtypes": (dtype_model, dtype_inputs, False)}[name]
            path = os.path.join(self.tmp, name + ".pt")
            save_traced(make(), inputs(), path, hf)
            self._files[name] = path
        return self._files[name]

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()

    def check(self, name, make, kind, policy, quote):
        p = plan(self.file(name), policy, self.tmp)
        marked = error_units(p, kind)
        self.assertTrue(marked, f"{name}: the plan marks no unit {kind}")
        # Every error of the plan is this kind: the per-unit run below covers all of them.
        self.assertEqual({w["kind"] for w in p["warnings"] if w["severity"] == "error"}, {kind})
        orig = bool(policy.get("fsdp", {}).get("use_orig_params", False))
        self.assertEqual(refused_units(make(), p, orig), marked, f"{name}: units FSDP1 refuses")
        with self.assertRaises(ValueError) as raised:
            auto_wrap(make(), policy)
        self.assertIn(quote(str(raised.exception)), next(w["message"] for w in p["warnings"] if w["kind"] == kind))

        fix = next(w for w in p["warnings"] if w["kind"] == kind).get("fix")
        self.assertIsNotNone(fix, f"{name}: no fix")
        fixed_policy = with_fix(policy, fix)
        fixed = plan(self.file(name), fixed_policy, self.tmp)
        self.assertEqual([w for w in fixed["warnings"] if w["severity"] == "error"], [])
        auto_wrap(make(), fixed_policy)  # constructs
        self.assertEqual(refused_units(make(), fixed, orig), [])
        return p, fixed_policy

    def test_lora_mixed_requires_grad(self):
        policy = {"module_classes": ["LlamaDecoderLayer"], "fsdp": {"world_size": WORLD}}
        # ModuleWrapPolicy checks frozen parameters before flattening and names the first unit (post-order).
        p, fixed = self.check("lora", lora_model, "mixed_requires_grad", policy,
                              lambda msg: msg.split(" has both")[0] and "has both parameters with requires_grad=True and False")
        self.assertEqual(error_units(p, "mixed_requires_grad"), ["model.layers.0", "model.layers.1"])
        print("\n--- LoRA, before the fix ---\n" + text_plan(self.file("lora"), policy, self.tmp))
        print("--- LoRA, after the fix " + json.dumps(fixed) + " ---\n" + text_plan(self.file("lora"), fixed, self.tmp))

    def test_float32_among_bfloat16(self):
        self.check("dtypes", dtype_model, "mixed_dtype", {"module_classes": ["Block"], "fsdp": {"world_size": WORLD}},
                   lambda msg: msg)

    def test_frozen_memory_matches_fsdp1(self):
        policy = {"module_classes": ["LlamaDecoderLayer"], "fsdp": {"world_size": WORLD, "use_orig_params": True}}
        p = plan(self.file("lora"), policy, self.tmp)
        w = [w for w in p["warnings"] if w["kind"] == "mixed_requires_grad"]
        self.assertEqual([x["severity"] for x in w], ["warning"])
        model = auto_wrap(lora_model(), policy)
        optim = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
        model(*lora_inputs())[0].float().sum().backward()
        optim.step()
        handles = [m._handle for m in FSDP.fsdp_modules(model) if m._handle is not None]
        self.assertEqual(len(handles), len(p["units"]))
        grads = sum(h.flat_param.grad.numel() * h.flat_param.grad.element_size()
                    for h in handles if h.flat_param.grad is not None)
        # Adam's state: exp_avg, exp_avg_sq and the 4-byte step tensor of each parameter.
        state = sum(t.numel() * t.element_size() for s in optim.state.values()
                    for k, t in s.items() if k in ("exp_avg", "exp_avg_sq", "step"))
        per_rank = p["memory"]["per_rank"]
        self.assertEqual(per_rank["grads_bytes"], grads)
        self.assertEqual(per_rank["optimizer_bytes"], state)
        # Frozen parameters cost no gradient: the root (embeddings, head, norm) is all frozen.
        self.assertIsNone(handles[0].flat_param.grad)
        self.assertEqual(p["units"][0]["trainable_numel"], 0)

    def fully_shard_plan(self, model: nn.Module, p: dict):
        """The plan's fully_shard calls on `model`, in the plan's call order; the groups, by unit path."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (WORLD,))
        groups = {}
        for u in sorted(p["units"], key=lambda u: u["call"]):
            mods = [model.get_submodule(m) if m else model for m in u["modules"]]
            fully_shard(mods if len(mods) > 1 else mods[0], mesh=mesh,
                        reshard_after_forward=u["reshard_after_forward"])
            groups[u["path"]] = mods[0]._get_fsdp_state()._fsdp_param_group
        return groups

    def test_fsdp2_float32_among_bfloat16(self):
        """FSDP2 refuses a group whose trainable parameters mix dtypes at its first forward
        (FSDPParamGroup.lazy_init): exactly the plan's fsdp2_mixed_dtype groups; wrapping the
        float32 module in a group of its own, as the plan's fix says, runs."""
        policy = {"module_classes": ["Block"], "fsdp": {"version": 2, "world_size": WORLD}}
        p = plan(self.file("dtypes"), policy, self.tmp)
        marked = error_units(p, "fsdp2_mixed_dtype")
        self.assertEqual(marked, ["blocks.0", "blocks.1"])
        refused, quote = [], next(w["message"] for w in p["warnings"] if w["kind"] == "fsdp2_mixed_dtype")
        for path, group in self.fully_shard_plan(dtype_model(), p).items():
            try:
                group.lazy_init()
            except AssertionError as e:
                refused.append(path)
                self.assertIn(str(e).split(" but got")[0], quote)
        self.assertEqual(sorted(refused), marked)
        # The exact code of the fix (issue 41, item 9): the router in a group of its own, first.
        self.assertIn("fix: fully_shard(model.blocks[0].router) before fully_shard(model.blocks[0])", quote)
        fixed_policy = with_fix(policy, {"module_classes": ["Router"]})
        fixed = plan(self.file("dtypes"), fixed_policy, self.tmp)
        self.assertEqual([w for w in fixed["warnings"] if w["severity"] == "error"], [])
        model = dtype_model()
        self.fully_shard_plan(model, fixed)
        model(*dtype_inputs())  # lazy init of every group passes, forward runs

    def test_frozen_memory_matches_fsdp2(self):
        """FSDP2 (fully_shard per LlamaDecoderLayer, then the root) on the LoRA model: frozen
        parameters get no gradient and no optimizer state, per parameter; FSDPMemTracker's
        sharded parameters, sharded gradients and Adam state equal the plan's."""
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
        policy = {"module_classes": ["LlamaDecoderLayer"], "fsdp": {"version": 2, "world_size": WORLD}}
        p = plan(self.file("lora"), policy, self.tmp)
        self.assertEqual([w["kind"] for w in p["warnings"] if w["severity"] == "error"], [])
        model = lora_model()
        self.fully_shard_plan(model, p)
        optim = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=False)
        tracker = FSDPMemTracker(model, optim)
        inputs = lora_inputs()
        tracker.track_inputs(inputs)
        with tracker:
            model(*inputs)[0].float().sum().backward()
            after_backward = tracker.get_tracker_snapshot()
            optim.step()
            after_step = tracker.get_tracker_snapshot()

        def category(snap, name):
            return sum(v for dev in snap.values() for k, v in dev.items() if getattr(k, "value", k) == name)

        per_rank = p["memory"]["per_rank"]
        got = {"params": category(after_step, "Sharded Param"), "grads": category(after_backward, "Sharded Grad"),
               "optimizer": category(after_step, "OptState")}
        want = {k: per_rank[k + "_bytes"] for k in got}
        print(f"\n    FSDP2 LoRA world {WORLD}: FSDPMemTracker {got}, plan {want}")
        self.assertEqual(got, want)
        # Only the adapters train: their gradients are a small part of the parameters.
        trainable = sum(q.numel() for q in model.parameters() if q.requires_grad)
        self.assertLess(trainable * 10, sum(q.numel() for q in model.parameters()))
        self.assertGreater(got["grads"], 0)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
