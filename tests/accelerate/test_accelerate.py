#!/usr/bin/env python3
"""Accelerate configs in and out, checked against Accelerate 1.15.0 and torch 2.13 themselves.

For each config in configs/ (and the model it is written for):
  1. fsdp-plan reads it (--policy CONFIG --format json);
  2. Accelerate's own code reads it as `accelerate launch` does (load_config_from_file,
     launch_command_parser + _validate_launch_command, prepare_multi_gpu_env), builds
     FullyShardedDataParallelPlugin from that environment, sets its wrap policy on the
     model built on the meta device, and wraps the model with real FSDP1 (fake process
     group, CPU) with the arguments Accelerator.prepare_model passes: the units FSDP
     built, their mixed precision, the strategy, world size and use_orig_params must be
     the plan's; a missing class must be Accelerate's own error, word for word;
  3. --emit accelerate: the YAML goes through the same chain and gives the same units,
     and fsdp-plan reads it back into the same plan (round trip);
  4. --emit torch: the Python runs on the model under the fake backend and builds
     exactly the plan's units (apply_fsdp checks, and so does this test).
FSDP2 (fsdp_version 2 configs, and FSDP2 policies in FSDP2_POLICIES): Accelerate's own
fsdp2_prepare_model around torch's fully_shard makes the plan's calls; --emit torch runs
on the meta-device model under the fake backend and torch's groups (modules, parameter
names in order, mesh, reshard_after_forward, mixed precision, offload) are the plan's.

Usage: test_accelerate.py FSDP_PLAN_BINARY   (the venv's python: torch 2.13, accelerate)
"""
import contextlib
import importlib.util
import inspect
import io
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import unittest
import warnings

import torch
import torch.distributed as dist
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = os.path.join(HERE, "configs")
BINARY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "build", "app", "fsdp-plan")
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)

# config -> (model, what Accelerate does with it)
CASES = {
    "fsdp1_llama_layers.yaml": ("llama", "units"),
    "fsdp1_gpt2_size.yaml": ("gpt2", "units"),
    "fsdp1_min_num_params_zero.yaml": ("gpt2", "units"),
    "fsdp1_size_launcher_default.yaml": ("llama", "units"),
    "fsdp1_stale_keys.yaml": ("gpt2", "units"),
    "fsdp1_missing_class.yaml": ("llama", "missing_class"),
    "fsdp1_hybrid.yaml": ("llama", "units"),
    "fsdp1_two_classes_ignored.yaml": ("llama", "units"),
    "fsdp1_batchnorm_bf16.yaml": ("convnet", "units"),
    "fsdp1_no_wrap.yaml": ("convnet", "units"),
    "fsdp2_llama.yaml": ("llama", "fsdp2"),
    "fsdp2_hsdp.yaml": ("llama", "fsdp2"),
    "fsdp2_gpt2_size.yaml": ("gpt2", "fsdp2_refused"),
}
# The warnings fsdp-plan must give (kind, text in the message).
EXPECTED_WARNINGS = {
    "fsdp1_min_num_params_zero.yaml": [("accelerate_config_key", "fsdp_min_num_params: 0")],
    "fsdp1_stale_keys.yaml": [
        ("accelerate_config_key", "fsdp_backward_prefetch_policy: renamed fsdp_backward_prefetch"),
        ("accelerate_config_key", "fsdp_ofload_params: not an Accelerate key"),
        ("accelerate_config_key", "fsdp_reshard_after_forward: \"SHARD_GRAD_OP\" does nothing under FSDP1"),
    ],
    "fsdp1_missing_class.yaml": [("accelerate_class_missing", "Closest class names in the model: LlamaDecoderLayer")],
    "fsdp2_hsdp.yaml": [("accelerate_config_key", "fsdp_sharding_strategy: does nothing under fsdp_version 2"),
                        ("accelerate_config_key", "fsdp_use_orig_params: does nothing under fsdp_version 2")],
}


class ConvBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.bn = nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.stem_bn = nn.BatchNorm2d(8)
        self.blocks = nn.Sequential(ConvBlock(8), ConvBlock(8))
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = self.blocks(self.stem_bn(self.stem(x)))
        return self.head(x.mean((2, 3)))


def build(name, device="cpu"):
    """The model, on `device`; the same structure every time."""
    import transformers

    transformers.logging.set_verbosity_error()
    with torch.device(device):
        if name == "gpt2":
            cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=64,
                                          bos_token_id=0, eos_token_id=0)
            model = transformers.GPT2LMHeadModel(cfg)
        elif name == "llama":
            cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                           num_attention_heads=2, num_key_value_heads=2, vocab_size=100,
                                           tie_word_embeddings=False)
            model = transformers.LlamaForCausalLM(cfg)
        else:
            model = ConvNet()
    return model.eval()


def save_torchscript(name, path):
    torch.manual_seed(0)
    model = build(name)
    if name == "convnet":
        torch.jit.script(model).save(path)
        return
    model.config.use_cache = False
    forward = model.forward
    model.forward = lambda ids: forward(input_ids=ids).logits  # trace the logits only
    torch.jit.trace(model, (torch.randint(0, 100, (1, 8)),), strict=False, check_trace=False).save(path)


def run_plan(*args):
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=120)


def plan_json(model_file, policy):
    r = run_plan(model_file, "--policy", policy, "--format", "json")
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def plan_units(plan):
    return sorted(u["path"] for u in plan["units"] if u["path"])


def accelerate_launch_env(config_path, launch_flags=()):
    """(launch args, environment) as `accelerate launch --config_file CONFIG [FLAGS]` makes them."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    load_config_from_file(config_path)  # the loader's own checks (top-level keys)
    args = launch_command_parser().parse_args(["--config_file", config_path, *launch_flags, "train.py"])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        args, _, _ = _validate_launch_command(args)
        env = prepare_multi_gpu_env(args)
    env = {k: v for k, v in env.items() if k.startswith(("FSDP_", "ACCELERATE_", "PARALLELISM_CONFIG"))}
    # A CPU-only box cannot sync module states (FullyShardedDataParallelPlugin broadcasts from a CUDA
    # device); nothing else changes.
    env.update(FSDP_SYNC_MODULE_STATES="false", FSDP_CPU_RAM_EFFICIENT_LOADING="false")
    return args, env


def accelerate_plugin(config_path, launch_flags=()):
    """(plugin, launch args) as `accelerate launch --config_file CONFIG [FLAGS]` makes them."""
    from accelerate import FullyShardedDataParallelPlugin
    from accelerate.utils import patch_environment

    args, env = accelerate_launch_env(config_path, launch_flags)
    with patch_environment(**env):
        plugin = FullyShardedDataParallelPlugin()
        if env["ACCELERATE_MIXED_PRECISION"] != "no":  # AcceleratorState does this
            plugin.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])
    return plugin, args


@contextlib.contextmanager
def fake_world(size):
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=size, store=FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()


def accelerator_parallelism(config_path):
    """What Accelerate's own Accelerator() makes of the config's parallelism_config, on rank 0 of
    num_processes ranks (fake backend) in the environment the launcher sets: ("raised", "Type: message"),
    or ("built", fsdp_version, (mesh dim names, mesh shape)) of the ParallelismConfig's device mesh
    (() when it builds none). Accelerator.__init__ builds ParallelismConfig from the environment, then
    its device mesh (torch's init_device_mesh), then runs _validate_accelerator: all three run here."""
    from unittest import mock

    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, patch_environment

    args, env = accelerate_launch_env(config_path)
    world = int(args.num_processes)
    env.update(WORLD_SIZE=str(world), RANK="0", LOCAL_RANK="0", ACCELERATE_TORCH_DEVICE="cpu")
    # PartialState as on a CUDA box (nccl: MULTI_GPU, which AcceleratorState makes FSDP), on the fake
    # process group already up and the CPU device.
    backend = mock.patch.object(PartialState, "_prepare_backend",
                                lambda *a, **k: ("fake", DistributedType.MULTI_GPU))
    with fake_world(world), backend, patch_environment(**env):
        try:
            accelerator = Accelerator()
            config = accelerator.parallelism_config
            mesh = config._get_mesh() if config is not None else ()
            if accelerator.state.device_mesh is not None:
                assert tuple(accelerator.state.device_mesh.shape) == tuple(mesh[1]), mesh
            return "built", 2 if accelerator.is_fsdp2 else 1, tuple(tuple(m) for m in mesh)
        except (ValueError, RuntimeError) as e:
            return "raised", f"{type(e).__name__}: {e}"
        finally:
            AcceleratorState._reset_state(True)
            PartialState._reset_state()


def fsdp_units(wrapped):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    out = {}
    for name, m in wrapped.named_modules():
        if isinstance(m, FSDP):
            path = name.replace("_fsdp_wrapped_module.", "").rstrip(".")
            out[path] = m.mixed_precision.param_dtype is not None
    return out


def accelerate_fsdp_units(config_path, model_name, launch_flags=()):
    """The units FSDP builds from Accelerate's plugin, as Accelerator.prepare_model calls it."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy

    plugin, args = accelerate_plugin(config_path, launch_flags)
    meta = build(model_name, "meta")
    plugin.set_auto_wrap_policy(meta)  # Accelerate's class lookup, on the meta-device model
    model = build(model_name)
    ignored = plugin.ignored_modules
    if isinstance(ignored, str):
        reg = re.compile(ignored)
        ignored = [m for n, m in model.named_modules() if reg.fullmatch(n)]
    with fake_world(1):
        wrapped = FSDP(model, sharding_strategy=ShardingStrategy.FULL_SHARD,  # units do not depend on it
                       auto_wrap_policy=plugin.auto_wrap_policy, mixed_precision=plugin.mixed_precision_policy,
                       use_orig_params=plugin.use_orig_params, ignored_modules=ignored,
                       device_id=torch.device("cpu"))
        units = fsdp_units(wrapped)
    return plugin, args, units


def mesh_device(module):
    """device_type="cpu" for an emitted apply_fsdp that takes one (FSDP2, FSDP1's HYBRID_SHARD mesh)."""
    return {"device_type": "cpu"} if "device_type" in inspect.signature(module.apply_fsdp).parameters else {}


class SavedModels(unittest.TestCase):
    """Saves the models of MODEL_NAMES as TorchScript once per class, in a
    temporary directory: self.models maps a name to its file."""

    MODEL_NAMES = ()

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.models = {}
        for name in sorted(cls.MODEL_NAMES):
            path = os.path.join(cls.tmp.name, name + ".pt")
            save_torchscript(name, path)
            cls.models[name] = path

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()


class AccelerateConfigs(SavedModels):
    MODEL_NAMES = {m for m, _ in CASES.values()}

    def test_at_least_eight_configs(self):
        self.assertEqual(sorted(CASES), sorted(os.listdir(CONFIGS)))
        self.assertGreaterEqual(len(CASES), 8)

    def check_same(self, plan, plugin, args, units, what):
        self.assertEqual(plan_units(plan), sorted(p for p in units if p), what)
        mp = {u["path"]: u["mixed_precision"] for u in plan["units"]}
        for path, on in units.items():
            if mp[path] is not None:
                self.assertEqual(mp[path], on, f"{what}: mixed precision of unit {path!r}")
            else:
                self.assertFalse(on, f"{what}: mixed precision of unit {path!r}")
        memory = plan["memory"]
        strategy = plugin.sharding_strategy.name.lstrip("_").replace("HYBRID_SHARD_ZERO2", "HYBRID_SHARD")
        self.assertEqual(memory["sharding_strategy"], strategy, what)
        self.assertEqual(memory["world_size"], int(args.num_processes), what)
        self.assertEqual(memory["use_orig_params"], bool(plugin.use_orig_params), what)
        if strategy == "HYBRID_SHARD":
            self.assertEqual(memory["shard_group_size"], int(args.nproc_per_node), what)

    def test_configs(self):
        for config, (model_name, kind) in sorted(CASES.items()):
            with self.subTest(config=config):
                self.check_config(config, model_name, kind)

    def check_config(self, config, model_name, kind):
        path = os.path.join(CONFIGS, config)
        model_file = self.models[model_name]
        code, plan = plan_json(model_file, path)
        if kind == "fsdp2":
            self.check_fsdp2(config, model_name, path, code, plan)
            return
        if kind == "fsdp2_refused":
            # Accelerate's FSDP2 size rule also picks the ModuleList of blocks: torch refuses it.
            self.assertEqual(code, 1)
            self.assertIn("fsdp2_container", [w["kind"] for w in plan["warnings"]])
            with self.assertRaisesRegex(ValueError, "containers that do not implement forward"):
                accelerate_fsdp2_calls(path, model_name)
            return
        kinds = [(w["kind"], w["message"]) for w in plan["warnings"]]
        for kind_, text in EXPECTED_WARNINGS.get(config, []):
            self.assertTrue(any(k == kind_ and text in m for k, m in kinds), f"{config}: no {kind_} with {text!r}: {kinds}")
        if kind == "missing_class":
            with self.assertRaises(ValueError) as raised:
                plugin, _ = accelerate_plugin(path)
                plugin.set_auto_wrap_policy(build(model_name, "meta"))
            self.assertEqual(code, 1)
            missing = [m for k, m in kinds if k == "accelerate_class_missing"]
            self.assertTrue(missing and str(raised.exception) in missing[0], (str(raised.exception), missing))
            r = run_plan(model_file, "--policy", path, "--emit", "accelerate")
            self.assertEqual((r.returncode, r.stdout), (1, ""), r.stderr)
            return
        self.assertEqual(code, 0, kinds)
        plugin, args, units = accelerate_fsdp_units(path, model_name)
        self.check_same(plan, plugin, args, units, f"{config}: Accelerate")
        self.check_emit_accelerate(config, model_name, model_file, plan)
        self.check_emit_torch(config, model_name, model_file, plan, path)

    def check_emit_accelerate(self, config, model_name, model_file, plan):
        out = os.path.join(self.tmp.name, "emitted_" + config)
        r = run_plan(model_file, "--policy", os.path.join(CONFIGS, config), "--emit", "accelerate", "-o", out)
        self.assertEqual(r.returncode, 0, f"{config}: {r.stderr}")
        plugin, args, units = accelerate_fsdp_units(out, model_name)
        self.check_same(plan, plugin, args, units, f"{config}: emitted YAML through Accelerate")
        code, again = plan_json(model_file, out)
        self.assertEqual(code, 0)
        self.assertEqual(plan_units(again), plan_units(plan), f"{config}: round trip")
        for key in ("world_size", "sharding_strategy", "shard_group_size", "use_orig_params"):
            self.assertEqual(again["memory"][key], plan["memory"][key], f"{config}: round trip {key}")
        self.assertEqual([u["mixed_precision"] for u in again["units"]], [u["mixed_precision"] for u in plan["units"]])

    def check_emit_torch(self, config, model_name, model_file, plan, path):
        out = os.path.join(self.tmp.name, "emitted_" + config.replace(".yaml", ".py"))
        r = run_plan(model_file, "--policy", path, "--emit", "torch", "-o", out)
        self.assertEqual(r.returncode, 0, f"{config}: {r.stderr}")
        spec = importlib.util.spec_from_file_location("emitted", out)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        world = plan["memory"]["world_size"]
        with fake_world(world):
            wrapped = module.apply_fsdp(build(model_name), **mesh_device(module), device_id=torch.device("cpu"))
            units = fsdp_units(wrapped)
        self.assertEqual(sorted(p for p in units if p), plan_units(plan), f"{config}: emitted torch")
        mp = {u["path"]: u["mixed_precision"] for u in plan["units"]}
        for p, on in units.items():
            self.assertEqual(bool(mp[p]), on, f"{config}: emitted torch, mixed precision of {p!r}")


def accelerate_fsdp2_calls(config_path, model_name, launch_flags=()):
    """[(module paths, reshard_after_forward)] of the fully_shard calls Accelerate's own
    fsdp2_prepare_model makes, recorded around torch's real fully_shard (fake backend)."""
    import types

    import torch.distributed.fsdp as torch_fsdp
    from accelerate.utils import fsdp_utils

    plugin, args = accelerate_plugin(config_path, launch_flags)
    plugin.cpu_ram_efficient_loading = False  # no meta round trip or state-dict broadcast
    model = build(model_name)
    names = {id(m): n for n, m in model.named_modules()}
    calls, real = [], torch_fsdp.fully_shard

    def recording(module, **kwargs):
        modules = module if isinstance(module, (list, tuple)) else [module]
        calls.append((tuple(names[id(m)] for m in modules), kwargs.get("reshard_after_forward", None)))
        # No mesh (world size 1 here) and no pinned host memory (no accelerator); the units are the same.
        return real(module, **{k: v for k, v in kwargs.items() if k not in ("mesh", "offload_policy")})

    accelerator = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=None,
                                        mixed_precision=os.environ.get("ACCELERATE_MIXED_PRECISION", "no"),
                                        device=torch.device("cpu"), is_main_process=True)
    torch_fsdp.fully_shard = recording
    try:
        with fake_world(1):
            fsdp_utils.fsdp2_prepare_model(accelerator, model)
    finally:
        torch_fsdp.fully_shard = real
    return plugin, args, calls


def check_fsdp2(self, config, model_name, path, code, plan):
    self.assertEqual(code, 0, plan["warnings"])
    self.assertEqual(plan["fsdp_version"], 2)
    plugin, args, calls = accelerate_fsdp2_calls(path, model_name)
    want = sorted((tuple(c[0]), c[1] if c[0] != ("",) else False) for c in calls)
    got = sorted((tuple(u["modules"]), u["reshard_after_forward"]) for u in plan["units"])
    self.assertEqual(got, want, f"{config}: fully_shard calls")
    self.assertEqual(plan["memory"]["world_size"], int(args.num_processes))
    if args.use_parallelism_config:
        self.assertEqual(plan["memory"]["sharding_strategy"], "HYBRID_SHARD")
        self.assertEqual(plan["memory"]["shard_group_size"], int(args.parallelism_config_dp_shard_size))
    check_torch_fsdp2(self, config, model_name, self.models[model_name], path, plan)
    check_accelerate_fsdp2(self, config, model_name, self.models[model_name], path, plan)


def plan_calls(plan):
    return sorted((tuple(u["modules"]), u["reshard_after_forward"]) for u in plan["units"])


def check_accelerate_fsdp2(self, what, model_name, model_file, policy_path, plan):
    """--emit accelerate of an FSDP2 plan: Accelerate's own loader, launcher, plugin and
    fsdp2_prepare_model (around torch's fully_shard) make the plan's calls from the YAML, and
    fsdp-plan reads the YAML back into the same plan."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    out = os.path.join(self.tmp.name, "emitted_" + re.sub(r"\W", "_", what) + ".yaml")
    r = run_plan(model_file, "--policy", policy_path, "--emit", "accelerate", "-o", out)
    self.assertEqual(r.returncode, 0, f"{what}: {r.stderr}")
    with open(out) as f:
        self.assertIn("fsdp_version: 2\n", f.read())
    plugin, args, calls = accelerate_fsdp2_calls(out, model_name)
    want = sorted((tuple(c[0]), c[1] if c[0] != ("",) else False) for c in calls)
    self.assertEqual(plan_calls(plan), want, f"{what}: emitted YAML through Accelerate's fsdp2_prepare_model")
    memory = plan["memory"]
    self.assertEqual(int(args.num_processes), memory["world_size"], what)
    if memory["sharding_strategy"] == "HYBRID_SHARD":
        self.assertTrue(args.use_parallelism_config, what)
        self.assertEqual((int(args.parallelism_config_dp_replicate_size), int(args.parallelism_config_dp_shard_size)),
                         (memory["replicate_size"], memory["shard_group_size"]), what)
    self.assertEqual(isinstance(plugin.cpu_offload, CPUOffloadPolicy), memory["cpu_offload"], what)
    mp = plan["policy"]["mixed_precision"]
    got_mp = plugin.mixed_precision_policy
    if mp:
        self.assertEqual((got_mp.param_dtype, got_mp.reduce_dtype),
                         (getattr(torch, mp["param_dtype"]), getattr(torch, mp["reduce_dtype"])), what)
    else:
        self.assertTrue(got_mp is None or got_mp.param_dtype is None, what)
    code, again = plan_json(model_file, out)  # the round trip
    self.assertEqual(code, 0, again["warnings"])
    self.assertEqual(plan_calls(again), plan_calls(plan), f"{what}: round trip")
    self.assertEqual([(u["call"], [q["name"] for q in u["params"]]) for u in again["units"]],
                     [(u["call"], [q["name"] for q in u["params"]]) for u in plan["units"]], f"{what}: round trip")
    for key in ("world_size", "sharding_strategy", "shard_group_size", "replicate_size", "cpu_offload"):
        self.assertEqual(again["memory"][key], memory[key], f"{what}: round trip {key}")
    for key in ("param_dtype", "reduce_dtype"):
        self.assertEqual((again["policy"]["mixed_precision"] or {}).get(key), (mp or {}).get(key), what)
    if mp:  # set_mixed_precision's output_dtype, as read back from the YAML
        self.assertEqual(getattr(torch, again["policy"]["mixed_precision"]["output_dtype"]), got_mp.output_dtype, what)


def check_torch_fsdp2(self, what, model_name, model_file, policy_path, plan):
    """--emit torch of an FSDP2 plan, run on the meta-device model under the fake backend:
    fully_shard applied to exactly the plan's modules, one FSDP state (group) per plan group
    managing the plan's parameters in the plan's order, on the plan's mesh, with its
    reshard_after_forward, mixed precision dtypes and offload policy."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule

    out = os.path.join(self.tmp.name, "emitted_" + re.sub(r"\W", "_", what) + ".py")
    r = run_plan(model_file, "--policy", policy_path, "--emit", "torch", "-o", out)
    self.assertEqual(r.returncode, 0, f"{what}: {r.stderr}")
    spec = importlib.util.spec_from_file_location("emitted_fsdp2", out)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    memory, policy = plan["memory"], plan["policy"]
    hsdp = memory["sharding_strategy"] == "HYBRID_SHARD"
    shard = memory["shard_group_size"] if hsdp else memory["world_size"]
    mesh_shape = (memory["replicate_size"], shard) if hsdp else (memory["world_size"],)
    mp = policy["mixed_precision"] or {}
    dtype = lambda name: getattr(torch, name) if name else None  # noqa: E731
    with fake_world(memory["world_size"]):
        model = build(model_name, "meta")
        module_name = {id(m): n for n, m in model.named_modules()}
        module.apply_fsdp(model, device_type="cpu")
        built = sorted(n for n, m in model.named_modules() if isinstance(m, FSDPModule))
        self.assertEqual(built, sorted(p for u in plan["units"] for p in u["modules"]), f"{what}: FSDPModules")
        states = set()
        for u in plan["units"]:
            state = model.get_submodule(u["modules"][0])._get_fsdp_state()
            for path in u["modules"][1:]:
                self.assertIs(model.get_submodule(path)._get_fsdp_state(), state, f"{what}: one call for {u['modules']}")
            states.add(id(state))
            group = state._fsdp_param_group
            got = []
            for fp in (group.fsdp_params if group else []):
                prefix = module_name[id(fp._module_info.module)]
                got.append((prefix + "." if prefix else "") + fp._module_info.param_name)
            self.assertEqual(got, [q["name"] for q in u["params"]], f"{what}: parameters of group {u['modules']}")
            if group is None:
                continue
            self.assertEqual(tuple(group.mesh_info.mesh.shape), mesh_shape, f"{what}: mesh")
            self.assertEqual(group.mesh_info.shard_mesh_size, shard, f"{what}: shard size")
            raf = u["reshard_after_forward"]
            if u["modules"] == [""]:
                # PyTorch's None: False for the root (resolved at lazy init), as planned.
                self.assertTrue(state._auto_reshard_after_forward, what)
                self.assertIs(raf, False, what)
            elif raf is True:
                self.assertEqual(group.post_forward_mesh_info.shard_mesh_size, shard, f"{what}: {u['modules']}")
            elif raf is False:
                self.assertIsNone(group.post_forward_mesh_info, f"{what}: {u['modules']}")
            else:
                self.assertEqual(group.post_forward_mesh_info.shard_mesh_size, raf, f"{what}: {u['modules']}")
            self.assertEqual((group.mp_policy.param_dtype, group.mp_policy.reduce_dtype),
                             (dtype(mp.get("param_dtype")), dtype(mp.get("reduce_dtype"))), f"{what}: mixed precision")
            self.assertEqual((group.mp_policy.output_dtype, group.mp_policy.cast_forward_inputs),
                             (dtype(mp.get("output_dtype")), mp.get("cast_forward_inputs", True)), f"{what}: mixed precision")
            self.assertEqual(isinstance(group.offload_policy, CPUOffloadPolicy), policy["fsdp"]["cpu_offload"], what)
        self.assertEqual(len(states), len(plan["units"]), f"{what}: one FSDP state per group")
        # Issue 42: each compiled module (its checkpoint wrapper where it has one) compiled in place.
        compiled = {c["path"] for c in plan["memory"]["activations"].get("compiled", [])}
        got = {n.replace("._checkpoint_wrapped_module", "") for n, m in model.named_modules()
               if getattr(m, "_compiled_call_impl", None) is not None}
        self.assertEqual(got, compiled, f"{what}: compiled modules")
        self.assertEqual(bool(compiled), "compile" in policy, what)
        # The partitioner's memory budget the plan was made with, set for the compiles to come.
        budget = (policy.get("compile") or {}).get("memory_budget", 1.0)
        self.assertEqual(torch._functorch.config.activation_memory_budget, budget, what)
        torch._functorch.config.activation_memory_budget = 1.0


AccelerateConfigs.check_fsdp2 = check_fsdp2

# FSDP2 plans from fsdp-plan policies: (model, policy, None if Accelerate can say it, else
# the reason --emit accelerate gives).
LLAMA_ACCELERATE_GROUPS = [{"modules": ["model.embed_tokens"]},
                           {"modules": ["model.norm", "lm_head"], "reshard_after_forward": False}]
FSDP2_POLICIES = {
    "layers_bf16_fp32": ("llama", {"module_classes": ["LlamaDecoderLayer"],
                                   "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
                                   "fsdp": {"version": 2, "world_size": 8}}, "param and reduce dtypes"),
    "accelerate_shape": ("llama", {"module_classes": ["LlamaDecoderLayer"], "groups": LLAMA_ACCELERATE_GROUPS,
                                   "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16"},
                                   "fsdp": {"version": 2, "world_size": 8, "reshard_after_forward": False,
                                            "cpu_offload": True}}, None),
    "size": ("convnet", {"min_num_params": 100, "groups": [{"modules": ["stem_bn"], "reshard_after_forward": False}],
                         "fsdp": {"version": 2, "world_size": 4}}, None),
    "layers_only": ("llama", {"module_classes": ["LlamaDecoderLayer"], "fsdp": {"version": 2, "world_size": 4}},
                    "Accelerate would make the groups"),
    "hsdp_groups_ranks": ("llama", {
        "module_classes": ["LlamaDecoderLayer"],
        "groups": [{"modules": ["model.embed_tokens"]},
                   {"modules": ["model.norm", "lm_head"], "reshard_after_forward": 2}],
        "mixed_precision": {"param_dtype": "float16", "reduce_dtype": "float16"},
        "fsdp": {"version": 2, "world_size": 8, "sharding_strategy": "HYBRID_SHARD", "shard_group_size": 4,
                 "reshard_after_forward": False}}, "a number of ranks"),
    "multi_module": ("llama", {"groups": [{"modules": ["model.layers.0", "model.layers.1"]}] + LLAMA_ACCELERATE_GROUPS,
                               "fsdp": {"version": 2, "world_size": 2}}, "several modules in one fully_shard call"),
    "output_dtype": ("llama", {"module_classes": ["LlamaDecoderLayer"], "groups": LLAMA_ACCELERATE_GROUPS,
                               "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16",
                                                   "output_dtype": "float32"},
                               "fsdp": {"version": 2, "world_size": 2}}, "output_dtype float32 differs"),
    "no_input_cast": ("llama", {"module_classes": ["LlamaDecoderLayer"], "groups": LLAMA_ACCELERATE_GROUPS,
                                "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16",
                                                    "cast_forward_inputs": False},
                                "fsdp": {"version": 2, "world_size": 2}}, "cast_forward_inputs is false"),
    "compiled": ("llama", {"module_classes": ["LlamaDecoderLayer"],
                           "compile": {"module_classes": ["LlamaDecoderLayer"], "memory_budget": 0.5},
                           "fsdp": {"version": 2, "world_size": 2}}, "not only the plan's \"compile\" modules"),
    "compiled_checkpointed": ("llama", {"module_classes": ["LlamaDecoderLayer"],
                                        "activation_checkpointing": {"module_classes": ["LlamaDecoderLayer"]},
                                        "compile": {"module_classes": ["LlamaDecoderLayer"]},
                                        "fsdp": {"version": 2, "world_size": 2}}, "not only the plan's \"compile\""),
    "ignored_offload": ("llama", {"module_classes": ["LlamaDecoderLayer"], "ignored_params": ["lm_head.*"],
                                  "fsdp": {"version": 2, "world_size": 2, "cpu_offload": True}},
                        "ignored parameters by glob"),
}


class EmitFsdp2(SavedModels):
    """--emit torch|accelerate of FSDP2 plans made from fsdp-plan policies."""

    MODEL_NAMES = {m for m, _, _ in FSDP2_POLICIES.values()}

    def plan(self, label):
        model_name, policy, _ = FSDP2_POLICIES[label]
        path = os.path.join(self.tmp.name, label + ".json")
        with open(path, "w") as f:
            json.dump(policy, f)
        code, plan = plan_json(self.models[model_name], path)
        self.assertEqual(code, 0, plan["warnings"])
        self.assertEqual(plan["fsdp_version"], 2)
        return model_name, path, plan

    def test_emit_torch(self):
        for label in FSDP2_POLICIES:
            with self.subTest(policy=label):
                model_name, path, plan = self.plan(label)
                check_torch_fsdp2(self, label, model_name, self.models[model_name], path, plan)

    def test_emit_accelerate(self):
        for label, (model_name, _, refused) in FSDP2_POLICIES.items():
            with self.subTest(policy=label):
                _, path, plan = self.plan(label)
                if refused is None:
                    check_accelerate_fsdp2(self, label, model_name, self.models[model_name], path, plan)
                    continue
                r = run_plan(self.models[model_name], "--policy", path, "--emit", "accelerate")
                self.assertEqual((r.returncode, r.stdout), (2, ""), r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertIn(refused, r.stderr)
                self.assertIn("--emit torch", r.stderr)

    def test_plans_cover_the_cases(self):
        plans = {label: self.plan(label)[2] for label in FSDP2_POLICIES}
        units = [u for p in plans.values() for u in p["units"]]
        self.assertTrue(any(len(u["modules"]) > 1 for u in units))  # a fully_shard([a, b]) call
        self.assertEqual({u["reshard_after_forward"] for u in units} - {True, False}, {2})
        self.assertEqual(plans["hsdp_groups_ranks"]["memory"]["replicate_size"], 2)
        self.assertTrue(plans["ignored_offload"]["memory"]["cpu_offload"])
        ignored = [q["name"] for u in plans["ignored_offload"]["units"] for q in u["params"]]
        self.assertNotIn("lm_head.weight", ignored)


class EmitFsdp1MixedPrecision(SavedModels):
    """--emit torch of an FSDP1 plan whose MixedPrecision sets keep_low_precision_grads,
    cast_forward_inputs and cast_root_forward_inputs away from PyTorch's defaults: the
    generated code builds them into every mixed-precision unit (BatchNorm units have none),
    and trains a step under the fake backend; defaults are not written. --emit accelerate
    refuses, as Accelerate's MixedPrecision keeps the defaults."""

    MODEL_NAMES = {"convnet"}
    MP = {"param_dtype": "bfloat16", "reduce_dtype": "bfloat16", "buffer_dtype": "bfloat16"}
    FLAGS = {"keep_low_precision_grads": True, "cast_forward_inputs": True, "cast_root_forward_inputs": False}

    def emit(self, mp):
        path = os.path.join(self.tmp.name, "mp.json")
        with open(path, "w") as f:
            json.dump({"module_classes": ["ConvBlock"], "mixed_precision": mp, "fsdp": {"world_size": 2}}, f)
        out = os.path.join(self.tmp.name, "mp.py")
        r = run_plan(self.models["convnet"], "--policy", path, "--emit", "torch", "-o", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            return path, out, f.read()

    def test_emit_torch_writes_the_flags_torch_builds_them(self):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        _, _, code = self.emit(self.MP)
        for flag in self.FLAGS:
            self.assertNotIn(flag, code)  # PyTorch's defaults go unsaid
        path, out, code = self.emit(dict(self.MP, **self.FLAGS))
        self.assertIn("keep_low_precision_grads=True, cast_forward_inputs=True, cast_root_forward_inputs=False", code)
        code, plan = plan_json(self.models["convnet"], path)
        self.assertEqual(plan["policy"]["mixed_precision"], dict(self.MP, ignore_classes=[
            "torch.nn.modules.batchnorm._BatchNorm"], **self.FLAGS))
        spec = importlib.util.spec_from_file_location("emitted_mp", out)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with fake_world(2):
            wrapped = module.apply_fsdp(build("convnet"), **mesh_device(module), device_id=torch.device("cpu"))
            seen = 0
            for m in wrapped.modules():
                if isinstance(m, FSDP) and m.mixed_precision.param_dtype is not None:
                    seen += 1
                    self.assertEqual({k: getattr(m.mixed_precision, k) for k in self.FLAGS}, self.FLAGS)
            self.assertEqual(seen, sum(1 for u in plan["units"] if u["mixed_precision"]))
            wrapped(torch.ones(2, 3, 8, 8)).float().sum().backward()
            grads = {p.grad.dtype for p in wrapped.parameters() if p.grad is not None}
        self.assertIn(torch.bfloat16, grads)  # kept low on the mixed-precision units

    def test_emit_accelerate_refuses(self):
        path, _, _ = self.emit(dict(self.MP, keep_low_precision_grads=True))
        r = run_plan(self.models["convnet"], "--policy", path, "--emit", "accelerate")
        self.assertEqual((r.returncode, r.stdout), (2, ""), r.stderr)
        self.assertIn("keep_low_precision_grads is true", r.stderr)


# FSDP1 policies for the linted code: each way apply_fsdp is written.
FSDP1_POLICIES = {
    "classes": ("llama", {"module_classes": ["LlamaDecoderLayer"]}),
    "size": ("gpt2", {"min_num_params": 2000}),
    "no_wrap": ("convnet", {}),
    "bf16_batchnorm": ("convnet", {"module_classes": ["ConvBlock"], "mixed_precision": {
        "param_dtype": "bfloat16", "reduce_dtype": "float32", "ignore_classes": ["_BatchNorm"]}}),
    "hybrid_ignored": ("llama", {"module_classes": ["LlamaDecoderLayer"], "ignored_params": ["lm_head.*"],
                                 "fsdp": {"world_size": 8, "sharding_strategy": "HYBRID_SHARD",
                                          "shard_group_size": 4}}),
    "size_excluded": ("gpt2", {"min_num_params": 2000, "exclude_wrap_modules": ["torch.nn.ModuleList"]}),
}


class EmittedCodeLints(SavedModels):
    """Issue 24, item 8: the Python --emit torch writes, FSDP1 and FSDP2 under several policies,
    passes ruff check (the venv's ruff, pinned in requirements/dev.txt; its default rules:
    pyflakes and pycodestyle's errors: unused imports and variables, undefined names, ...)."""

    MODEL_NAMES = {m for m, _ in FSDP1_POLICIES.values()} | {m for m, _, _ in FSDP2_POLICIES.values()}

    def test_ruff_check(self):
        ruff = [sys.executable, "-m", "ruff"]
        version = subprocess.run(ruff + ["--version"], capture_output=True, text=True)
        self.assertEqual(version.returncode, 0, "ruff is not installed in this Python (" + sys.executable +
                         "): requirements/dev.txt pins it; " + version.stderr.strip()[-200:])
        policies = {"fsdp1_" + k: v for k, v in FSDP1_POLICIES.items()}
        policies.update({"fsdp2_" + k: (m, p) for k, (m, p, _) in FSDP2_POLICIES.items()})
        files = []
        for label, (model_name, policy) in sorted(policies.items()):
            path = os.path.join(self.tmp.name, label + ".json")
            with open(path, "w") as f:
                json.dump(policy, f)
            out = os.path.join(self.tmp.name, "apply_" + label + ".py")
            r = run_plan(self.models[model_name], "--policy", path, "--emit", "torch", "-o", out)
            self.assertEqual(r.returncode, 0, f"{label}: {r.stderr}")
            files.append(out)
            spec = importlib.util.spec_from_file_location("emitted_" + label, out)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            # device_type only where a device mesh is made from it.
            hybrid = policy.get("fsdp", {}).get("sharding_strategy") == "HYBRID_SHARD"
            self.assertEqual(bool(mesh_device(module)), hybrid or label.startswith("fsdp2_"), label)
        r = subprocess.run(ruff + ["check", "--isolated", "--no-cache", "--output-format", "concise", *files],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)


NO_CLASS_LIST = {
    "fsdp1": "fsdp_config:\n  fsdp_version: 1\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n",
    "fsdp2": "fsdp_config:\n  fsdp_version: 2\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n",
}


class RecordedNoSplitModules(unittest.TestCase):
    """Issue 25: an Accelerate config with TRANSFORMER_BASED_WRAP and no
    fsdp_transformer_layer_cls_to_wrap plans with model._no_split_modules, as Accelerate does,
    where the file records it: a .pt2 that fsdp-plan-export wrote (its extra/fsdp_plan.json), or
    a live module's tree JSON (fsdp_plan.tree). Checked against Accelerate's own plugin
    (FSDP1: set_auto_wrap_policy and FullyShardedDataParallel under the fake backend; FSDP2:
    fsdp2_prepare_model around fully_shard) on the live model. A TorchScript file records no
    _no_split_modules: the warning says so and the plan has the root unit only. --module-classes
    with such a config is accelerate launch's --fsdp_transformer_layer_cls_to_wrap."""

    MODELS = ("llama", "gpt2")

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
        from fsdp_plan.export import export_module
        from fsdp_plan.tree import module_tree

        cls.tmp = tempfile.TemporaryDirectory()
        cls.files = {}
        for name in cls.MODELS:
            meta = build(name, "meta").train()
            meta.config.use_cache = False  # as fsdp-plan-export builds it: no KV cache in the outputs
            ids, labels = (torch.zeros(1, 8, dtype=torch.long, device="meta") for _ in range(2))
            pt2 = os.path.join(cls.tmp.name, name + ".pt2")
            export_module(meta, (), {"input_ids": ids, "labels": labels}, pt2)
            tree = os.path.join(cls.tmp.name, name + ".tree.json")
            with open(tree, "w") as f:
                json.dump(module_tree(build(name, "meta")), f)
            ts = os.path.join(cls.tmp.name, name + ".pt")
            save_torchscript(name, ts)
            cls.files[name] = {"pt2": pt2, "tree": tree, "pt": ts}
        cls.configs = {}
        for version, body in NO_CLASS_LIST.items():
            path = os.path.join(cls.tmp.name, version + "_no_class_list.yaml")
            with open(path, "w") as f:
                f.write("distributed_type: FSDP\nnum_processes: 2\n" + body)
            cls.configs[version] = path

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def accelerate_units(self, version, name, flags=()):
        if version == "fsdp1":
            _, _, units = accelerate_fsdp_units(self.configs[version], name, flags)
            return sorted(p for p in units if p)
        _, _, calls = accelerate_fsdp2_calls(self.configs[version], name, flags)
        return sorted(m for c in calls for m in c[0] if m)

    def plan_units(self, plan, version):
        if version == "fsdp1":
            return plan_units(plan)
        return sorted(m for u in plan["units"] for m in u["modules"] if m)

    def test_recorded_no_split_modules_plan_as_accelerate(self):
        for version in NO_CLASS_LIST:
            for name in self.MODELS:
                want = self.accelerate_units(version, name)
                self.assertTrue(want, f"{version} {name}: Accelerate wrapped no layer")
                for kind in ("pt2", "tree"):
                    with self.subTest(version=version, model=name, file=kind):
                        code, plan = plan_json(self.files[name][kind], self.configs[version])
                        self.assertEqual(code, 0, plan["warnings"])
                        self.assertEqual(self.plan_units(plan, version), want)
                        notes = [w["message"] for w in plan["warnings"] if w["kind"] == "accelerate_config"]
                        self.assertTrue(any("model._no_split_modules, which the" in m for m in notes), notes)

    def test_torchscript_records_none(self):
        code, plan = plan_json(self.files["llama"]["pt"], self.configs["fsdp1"])
        self.assertEqual(code, 0)
        self.assertEqual(plan_units(plan), [])
        msgs = [w["message"] for w in plan["warnings"] if w["kind"] == "accelerate_config_key"]
        self.assertTrue(any("which this file does not record" in m for m in msgs), msgs)

    def test_module_classes_is_the_launcher_flag(self):
        flags = ("--fsdp_transformer_layer_cls_to_wrap", "LlamaRMSNorm,LlamaDecoderLayer")
        for version in NO_CLASS_LIST:
            with self.subTest(version=version):
                want = self.accelerate_units(version, "llama", flags)
                r = run_plan(self.files["llama"]["pt"], "--policy", self.configs[version], "--format", "json",
                             "--module-classes", flags[1])
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertEqual(self.plan_units(json.loads(r.stdout), version), want)
        size = os.path.join(self.tmp.name, "size.yaml")
        with open(size, "w") as f:
            f.write("distributed_type: FSDP\nfsdp_config:\n  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n")
        r = run_plan(self.files["llama"]["pt"], "--policy", size, "--module-classes", "LlamaDecoderLayer")
        self.assertEqual((r.returncode, r.stdout), (2, ""))
        self.assertIn("fsdp_auto_wrap_policy is SIZE_BASED_WRAP, which wraps no class", r.stderr)


# parallelism_config as Accelerator() takes it: name -> (fsdp_version, num_processes, {parallelism_config_KEY:
# value}, what fsdp-plan's refusal says besides Accelerate's error: the fix). A size the file leaves out is the
# launcher's default, 1 (commands/launch.py), dp_shard_size included.
PARALLELISM = {
    "fsdp2_hsdp": (2, 8, {"dp_replicate_size": 2, "dp_shard_size": 4}, None),
    "fsdp2_shard_only": (2, 8, {"dp_shard_size": 8}, None),
    "fsdp2_all_ones": (2, 8, {"cp_size": 1, "tp_size": 1}, None),
    "fsdp1_all_ones": (1, 8, {"dp_replicate_size": 1, "tp_size": 1}, None),
    "fsdp1_hsdp": (1, 8, {"dp_replicate_size": 2, "dp_shard_size": 4}, "fsdp_sharding_strategy: HYBRID_SHARD"),
    "fsdp1_shard_only": (1, 8, {"dp_shard_size": 8}, "set fsdp_version: 2"),
    "fsdp1_replicate_only": (1, 8, {"dp_replicate_size": 2}, "dp_shard_size is 1, the launcher's default"),
    "fsdp2_replicate_only": (2, 8, {"dp_replicate_size": 2}, "dp_shard_size is 1, the launcher's default"),
    "fsdp2_replicate_whole_world": (2, 8, {"dp_replicate_size": 8}, "dp_shard_size is 1, the launcher's default"),
    "fsdp2_shard_short": (2, 8, {"dp_shard_size": 4}, None),
    "fsdp2_mesh_too_big": (2, 8, {"dp_replicate_size": 4, "dp_shard_size": 4}, "16 ranks"),
    "fsdp2_tp_mesh_too_big": (2, 8, {"dp_shard_size": 4, "tp_size": 4}, "16 ranks"),
    "fsdp2_replicate0": (2, 8, {"dp_replicate_size": 0, "dp_shard_size": 8}, None),
}


class ParallelismConfigs(SavedModels):
    """parallelism_config read as Accelerate's own Accelerator() takes it from the launcher
    (accelerator_parallelism): where it raises, fsdp-plan refuses (exit 2) with its error word
    for word and the fix; where it builds a mesh, the plan is on that mesh (HSDP for a
    dp_replicate dimension), FSDP1 or FSDP2 as Accelerate runs it."""

    MODEL_NAMES = {"llama"}

    def write(self, name):
        version, world, sizes, _ = PARALLELISM[name]
        path = os.path.join(self.tmp.name, name + ".yaml")
        with open(path, "w") as f:
            f.write("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n"
                    "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                    "  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer\n"
                    f"  fsdp_version: {version}\nmixed_precision: 'no'\nnum_processes: {world}\n"
                    "parallelism_config:\n" + "".join(f"  parallelism_config_{k}: {v}\n" for k, v in sizes.items()))
        return path

    def test_as_accelerator(self):
        outcomes = {}
        for name, (version, world, _, fix) in PARALLELISM.items():
            with self.subTest(config=name):
                path = self.write(name)
                want = accelerator_parallelism(path)
                outcomes[name] = want
                r = run_plan(self.models["llama"], "--policy", path, "--format", "json")
                if want[0] == "raised":
                    self.assertEqual((r.returncode, r.stdout), (2, ""), f"{name}: Accelerate: {want[1]}; {r.stderr}")
                    self.assertIn("accelerate launch would stop: " + want[1], r.stderr, name)
                    if fix:
                        self.assertIn(fix, r.stderr, name)
                    continue
                self.assertEqual(r.returncode, 0, f"{name}: {r.stderr}")
                plan = json.loads(r.stdout)
                _, accelerate_version, mesh = want
                self.assertEqual((plan["fsdp_version"], accelerate_version), (version, version), name)
                memory = plan["memory"]
                self.assertEqual(memory["world_size"], world, name)
                dims = dict(zip(*mesh)) if mesh else {}
                if "dp_replicate" in dims:
                    self.assertEqual(memory["sharding_strategy"], "HYBRID_SHARD", name)
                    self.assertEqual((memory["replicate_size"], memory["shard_group_size"]),
                                     (dims["dp_replicate"], dims["dp_shard"]), name)
                else:
                    self.assertEqual(memory["sharding_strategy"], "FULL_SHARD", name)
                    self.assertEqual(dims.get("dp_shard", world), world, name)
                if version == 1:  # sizes of 1: Accelerate builds no mesh and says nothing; fsdp-plan says so
                    keys = [w["message"] for w in plan["warnings"] if w["kind"] == "accelerate_config_key"]
                    self.assertTrue(any(m.startswith("parallelism_config: ") for m in keys), keys)
        # The oracle itself: FSDP1 with a size above 1 is Accelerate's error, after the size check.
        fsdp1 = ("raised", "ValueError: ParallelismConfig is only compatible DistributedType.FSDP (version 2) or "
                 "DistributedType.Multi{Device} or DistributedType.DEEPSPEED, but got DistributedType.FSDP.")
        self.assertEqual(outcomes["fsdp1_hsdp"], fsdp1)
        self.assertEqual(outcomes["fsdp1_shard_only"], fsdp1)
        self.assertIn("total_size (2) does not match num_processes (8)", outcomes["fsdp1_replicate_only"][1])
        self.assertIn("no dimension for FSDP to shard across", outcomes["fsdp2_replicate_whole_world"][1])
        self.assertEqual(outcomes["fsdp2_mesh_too_big"][1],
                         "RuntimeError: Mesh should not be bigger than default world size 8, but found 16 ranks!")
        self.assertEqual(outcomes["fsdp2_hsdp"], ("built", 2, (("dp_replicate", "dp_shard"), (2, 4))))
        self.assertEqual(outcomes["fsdp1_all_ones"], ("built", 1, ()))


class EmitRules(unittest.TestCase):
    def test_emit_refuses_format_and_explains_what_accelerate_cannot_say(self):
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "gpt2.pt")
            save_torchscript("gpt2", model)
            r = run_plan(model, "--emit", "accelerate", "--format", "json")
            self.assertEqual(r.returncode, 2)
            self.assertEqual(r.stdout, "")
            policy = os.path.join(tmp, "p.json")
            with open(policy, "w") as f:
                json.dump({"module_classes": ["GPT2Block"], "ignored_params": ["lm_head.*"]}, f)
            r = run_plan(model, "--policy", policy, "--emit", "accelerate")
            self.assertEqual(r.returncode, 2)
            self.assertEqual(r.stdout, "")
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
            self.assertIn("ignored parameters by glob", r.stderr)
            self.assertIn("--emit torch", r.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
