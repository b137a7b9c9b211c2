#!/usr/bin/env python3
"""Accelerate's parallelism_config_tp_size read as a 2-D plan, checked against Accelerate 1.15.0 itself.

For each config below (written to a temporary directory):
  1. Accelerate's own chain reads it as `accelerate launch` and Accelerator do (load_config_from_file,
     launch_command_parser + _validate_launch_command, prepare_multi_gpu_env, then ParallelismConfig
     built from that environment and its _validate_accelerator with the launch's num_processes and
     fsdp_version): either the device mesh it would build (_get_mesh: dimension names and sizes) or
     the ValueError it raises;
  2. fsdp-plan reads the same config (--policy CONFIG): where Accelerate raises, fsdp-plan refuses
     with Accelerate's message, word for word; where it builds a mesh, the plan's tensor_parallel
     mesh is that mesh, its plan is the model's own ("plan": "model", what transformers'
     from_pretrained(tp_plan="auto") applies), and the plan carries the accelerate_tp_refused error
     quoting the ImportError that Accelerate's own Accelerator._prepare_tp raises here (run on a
     model with DTensor parameters under the fake backend: FSDP2 with tp_size > 1 imports
     transformers' ReplicateParallel, which the installed transformers does not have).

Usage: test_accelerate_tp.py FSDP_PLAN_BINARY   (the venv's python: torch 2.13, accelerate, transformers)
About a minute (one export of the corpus Llama).
"""
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import types
import unittest
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tensor_parallel"))
BINARY = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "..", "build", "app", "fsdp-plan")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

HEAD = """compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_version: {version}
mixed_precision: 'no'
num_processes: {world}
parallelism_config:
"""
# name -> (fsdp_version, num_processes, {parallelism_config_KEY: value}); keys left out take the launcher's default.
CONFIGS = {
    "fsdp2_tp2": (2, 8, {"dp_shard_size": 4, "tp_size": 2}),
    "fsdp2_hsdp_tp2": (2, 8, {"dp_replicate_size": 2, "dp_shard_size": 2, "tp_size": 2}),
    "fsdp2_tp2_replicate_only": (2, 4, {"dp_replicate_size": 2, "tp_size": 2}),
    "fsdp2_tp2_size_mismatch": (2, 8, {"dp_shard_size": 2, "tp_size": 2}),
    "fsdp2_tp_whole_world": (2, 8, {"tp_size": 8}),
    "fsdp2_tp0": (2, 8, {"dp_shard_size": 8, "tp_size": 0}),
    "fsdp1_tp2": (1, 8, {"dp_shard_size": 4, "tp_size": 2}),
}


def write_config(tmp: str, name: str) -> str:
    version, world, sizes = CONFIGS[name]
    path = os.path.join(tmp, name + ".yaml")
    with open(path, "w") as f:
        f.write(HEAD.format(version=version, world=world))
        for k, v in sizes.items():
            f.write(f"  parallelism_config_{k}: {v}\n")
    return path


def accelerate_mesh(path: str):
    """(dim names, shape) of the mesh Accelerate builds from the config, or the ValueError's text."""
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DistributedType, patch_environment
    from accelerate.utils.launch import prepare_multi_gpu_env

    load_config_from_file(path)
    args = launch_command_parser().parse_args(["--config_file", path, "train.py"])
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        args, _, _ = _validate_launch_command(args)
        env = prepare_multi_gpu_env(args)
    env = {k: v for k, v in env.items() if k.startswith("PARALLELISM_CONFIG")}
    accelerator = types.SimpleNamespace(multi_device=False, num_processes=int(args.num_processes),
                                        is_fsdp2=int(args.fsdp_version) == 2, is_main_process=True,
                                        distributed_type=DistributedType.FSDP)
    try:
        with patch_environment(**env):
            config = ParallelismConfig()  # Accelerator(): from the environment the launcher set
        config._validate_accelerator(accelerator)
    except ValueError as e:
        return str(e)
    names, shape = config._get_mesh()
    return list(names), list(shape)


def accelerate_prepare_tp_error() -> str:
    """What Accelerate 1.15's Accelerator._prepare_tp raises under FSDP2 on a model with DTensor
    parameters (as from_pretrained(tp_plan="auto") leaves it), on a 2-rank fake mesh."""
    from accelerate import Accelerator
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", rank=0, world_size=2, store=FakeStore())
    try:
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
        model = parallelize_module(torch.nn.Sequential(torch.nn.Linear(4, 4)), mesh, {"0": ColwiseParallel()})
        fake = types.SimpleNamespace(_prepare_one=lambda obj, first_pass=False: obj, is_fsdp2=True,
                                     torch_device_mesh={"tp": mesh}, _get_named_parameters=lambda *a, **k: {})
        try:
            Accelerator._prepare_tp(fake, model)
        except ImportError as e:
            return f"ImportError: {e}".split(" (/")[0]  # without the module's install path
        return ""
    finally:
        dist.destroy_process_group()


def run_plan(model_file: str, policy: str):
    r = subprocess.run([BINARY, model_file, "--policy", policy, "--format", "json"], capture_output=True, text=True,
                       timeout=300)
    return r.returncode, r.stdout, r.stderr


class AccelerateTensorParallel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import test_tp_plan  # the corpus Llama exported with its tp record (fsdp-plan-export)

        cls.tmp = tempfile.TemporaryDirectory()
        cls.pt2 = test_tp_plan.export_pt2("llama", cls.tmp.name)
        cls.import_error = accelerate_prepare_tp_error()

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_prepare_tp_fails_here(self):
        """The oracle itself: Accelerate's _prepare_tp does stop, so accelerate_tp_refused is an error."""
        self.assertTrue(self.import_error.startswith("ImportError: cannot import name 'ReplicateParallel'"),
                        self.import_error)

    def test_configs(self):
        planned = refused = 0
        for name in CONFIGS:
            with self.subTest(config=name):
                path = write_config(self.tmp.name, name)
                want = accelerate_mesh(path)
                code, out, err = run_plan(self.pt2, path)
                if isinstance(want, str):  # Accelerate raises: fsdp-plan refuses with its words
                    refused += 1
                    self.assertEqual(code, 2, f"{name}: exit {code}, {err}")
                    self.assertIn("accelerate launch would stop: ValueError: " + want, err)
                    continue
                planned += 1
                self.assertEqual(code, 1, err)  # the plan, with Accelerate's ImportError as an error
                plan = json.loads(out)
                tp = plan["tensor_parallel"]
                self.assertEqual([tp["mesh"]["dim_names"], tp["mesh"]["shape"]], list(want), name)
                section = plan["policy"]["tensor_parallel"]
                self.assertEqual(section["degree"], want[1][-1], name)
                self.assertTrue(tp["modules"], f"{name}: the model's plan applied to no module")
                errors = [w for w in plan["warnings"] if w["severity"] == "error"]
                self.assertEqual([w["kind"] for w in errors], ["accelerate_tp_refused"], name)
                self.assertIn(self.import_error, errors[0]["message"], name)
        self.assertEqual((planned, refused), (2, 5))

    def test_plan_is_the_models_own(self):
        """The config's plan is the one "plan": "model" reads from the file's record."""
        path = write_config(self.tmp.name, "fsdp2_tp2")
        policy = os.path.join(self.tmp.name, "model_plan.json")
        with open(policy, "w") as f:
            json.dump({"module_classes": ["LlamaDecoderLayer"], "fsdp": {"version": 2, "world_size": 8},
                       "tensor_parallel": {"degree": 2, "plan": "model", "mesh": {"dp_shard": 4}}}, f)
        _, from_config, _ = run_plan(self.pt2, path)
        _, from_policy, _ = run_plan(self.pt2, policy)
        a, b = json.loads(from_config)["tensor_parallel"], json.loads(from_policy)["tensor_parallel"]
        self.assertEqual(a, b)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)
