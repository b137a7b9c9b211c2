#!/usr/bin/env python3
"""Context parallelism (issue 43) against real PyTorch 2.13: torch's context_parallel around the step of a
small Llama-style decoder (tests/differential/cp_models.py), FSDP2 over the flattened dp_shard x cp mesh as
torchtitan builds it, one process, the fake backend, CPU (tests/differential/cp_reference.py).

On the CPU torch's ring handlers do not cover SDPA's CPU kernel; the reference registers the CPU flash
kernel with torch's own ring (_templated_ring_attention and its backward, the rotaters, the merger), so
the collectives and the memory are torch's code (cp_reference.py says what is its own, and checks the
ring's numerics against full attention on a real 2-process gloo group: --verify).

For world 8 with cp 2 and 4 and world 4 with cp 4, fp32 and bf16 mixed precision, activation
checkpointing off and on, allgather and alltoall rotation, head-tail balancing on and off, the plan
must equal the real step in:
- each rank's parameter, gradient and AdamW state bytes (over dp_shard x cp);
- the ring's collectives: count and bytes by op and phase (CommDebugMode around the second step);
- FSDP's all-gathers and reduce-scatters, by group size;
and its activations after forward and whole-step peak must lie within 5% of FSDPMemTracker's. With expert
parallelism beside it (test_expert_parallel: a decoder of 4-expert MoE layers, ep 2 and 4), the all-to-alls'
count and bytes too.

Usage: test_context_parallel.py FSDP_PLAN_BINARY   (the venv's python: torch 2.13)
"""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, ROOT)

import jsonschema  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from tests.differential import cp_models, cp_reference  # noqa: E402

BINARY = None
with open(os.path.join(ROOT, "docs", "schemas", "plan.schema.json")) as _f:
    PLAN_SCHEMA = jsonschema.Draft202012Validator(json.load(_f))
# (world, cp, param_dtype, ac, rotate, head_tail)
CASES = [(8, 2, None, False, "allgather", True), (8, 2, None, True, "allgather", True),
         (8, 4, None, False, "allgather", True), (8, 4, "bfloat16", False, "allgather", True),
         (8, 4, "bfloat16", True, "allgather", True), (4, 4, None, False, "allgather", True),
         (8, 2, "bfloat16", False, "allgather", True),
         (8, 4, None, False, "alltoall", True), (8, 4, None, False, "allgather", False),
         (8, 4, "bfloat16", True, "alltoall", True)]
TOLERANCE = 0.05
# Expert parallelism beside CP, (world, cp, ep, param_dtype), on the decoder with a mixture of 4 experts, top 4,
# per layer (cp_models experts / top_k).
EP_CASES = [(8, 2, 2, None), (8, 2, 4, None), (8, 4, 4, "bfloat16"), (4, 2, 4, None)]
MOE = {"experts": 4, "top_k": 4}


def plan_ring(plan):
    """{(kind, phase): [calls, bytes]} of the plan's context-parallel collectives."""
    out = {}
    for c in plan["comm"]["context_parallel"]["collectives"]:
        k = out.setdefault((c["kind"], c["phase"]), [0, 0])
        k[0] += 1
        k[1] += c["bytes"]
    return out


def real_ring(real):
    out = {}
    for c in real["collectives"]:
        if c["source"] != "cp" or c["group_size"] <= 1:
            continue
        k = out.setdefault((c["kind"], c["phase"]), [0, 0])
        k[0] += 1
        k[1] += c["bytes"]
    return out


def fsdp_bytes_by_group(plan):
    groups = plan["comm"]["groups"]
    out = {}
    for c in plan["comm"]["collectives"]:
        key = (c["kind"], groups[c["group"]]["size"])
        out[key] = out.get(key, 0) + c["bytes"]
    return out


def real_fsdp_bytes_by_group(real):
    out = {}
    for c in real["collectives"]:
        if c["source"] != "fsdp" or c["phase"] == "optimizer":
            continue
        key = (c["kind"], c["group_size"])
        out[key] = out.get(key, 0) + c["bytes"]
    return out


def accelerate_builds(config):
    """Accelerate's own Accelerator() on an Accelerate config (tests/accelerate: on a fake process group of
    its own, so the reference's is put down first)."""
    from tests.accelerate.test_accelerate import accelerator_parallelism
    if dist.is_initialized():
        dist.destroy_process_group()
    return accelerator_parallelism(config)


class ContextParallel(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.model = os.path.join(cls.tmp.name, "cp_decoder.pt2")
        cp_models.export(cls.model)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()
        if dist.is_initialized():
            dist.destroy_process_group()

    def plan(self, world, cp, param_dtype, ac, rotate, head_tail, extra=()):
        policy = os.path.join(self.tmp.name, "policy.json")
        with open(policy, "w") as f:
            json.dump({"module_classes": ["DecoderLayer"],
                       "fsdp": {"version": 2, "world_size": world, "optimizer": "adamw"},
                       "context_parallel": {"degree": cp, "rotate_method": rotate,
                                            "load_balancer": "headtail" if head_tail else None},
                       **({"activation_checkpointing": {"module_classes": ["DecoderLayer"]}} if ac else {}),
                       **({"mixed_precision": {"param_dtype": param_dtype, "reduce_dtype": "float32"}}
                          if param_dtype else {})}, f)
        r = subprocess.run([BINARY, self.model, "--policy", policy, "-f", "json", "--collectives", "--device", "cpu",
                            *extra], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def test_each_case(self):
        for world, cp, param_dtype, ac, rotate, head_tail in CASES:
            with self.subTest(world=world, cp=cp, param_dtype=param_dtype, ac=ac, rotate=rotate, head_tail=head_tail):
                plan = self.plan(world, cp, param_dtype, ac, rotate, head_tail)
                real = cp_reference.cp_step(world=world, cp=cp, ac=ac, rotate=rotate, load_balance=head_tail,
                                            param_dtype=getattr(torch, param_dtype) if param_dtype else None)
                self.assert_matches(plan, real, f"w{world} cp{cp} {param_dtype or 'float32'} ac={ac} {rotate} "
                                                f"head_tail={head_tail}")

    def assert_matches(self, plan, real, label):
        """The plan equals the real step's bytes per rank and collectives; its peak within TOLERANCE."""
        PLAN_SCHEMA.validate(plan)  # the shipped docs/schemas/plan.schema.json: its ep / cp sections too
        per_rank = plan["memory"]["per_rank"]
        self.assertEqual(per_rank["params_bytes"], real["params_bytes"])
        self.assertEqual(per_rank["grads_bytes"], real["grads_bytes"])
        self.assertEqual(per_rank["optimizer_bytes"], real["optimizer_bytes"])
        self.assertEqual(plan_ring(plan), real_ring(real))
        self.assertEqual(fsdp_bytes_by_group(plan), real_fsdp_bytes_by_group(real))
        self.assertEqual(plan["context_parallel"]["local_seq"], real["seq_local"])
        ratio = per_rank["peak_bytes"] / real["tracker_peak_bytes"]
        print(f"{label}: peak {per_rank['peak_bytes']} / {real['tracker_peak_bytes']} = {ratio:.4f}",
              file=sys.stderr)
        self.assertLess(abs(ratio - 1), TOLERANCE,
                        f"peak {per_rank['peak_bytes']} vs {real['tracker_peak_bytes']} ({ratio:.4f})")

    def test_expert_parallel(self):
        """EP beside CP, as torchtitan builds it: ep borrows the dp_shard x cp ranks (the sparse mesh (efsdp, ep));
        the all-to-alls carry one cp rank's tokens (batch x seq / cp x top_k rows), besides the ring and FSDP's
        collectives on the flattened dp_shard_cp group and the experts' on efsdp."""
        model = os.path.join(self.tmp.name, "cp_moe.pt2")
        cp_models.export(model, MOE)
        policy = os.path.join(self.tmp.name, "ep_cp.json")
        for world, cp, ep, param_dtype in EP_CASES:
            label = f"w{world} cp{cp} ep{ep} {param_dtype or 'float32'}"
            with self.subTest(label):
                with open(policy, "w") as f:
                    json.dump({"module_classes": ["DecoderLayer"],
                               "fsdp": {"version": 2, "world_size": world, "optimizer": "adamw"},
                               "context_parallel": {"degree": cp}, "expert_parallel": {"degree": ep},
                               **({"mixed_precision": {"param_dtype": param_dtype, "reduce_dtype": "float32"}}
                                  if param_dtype else {})}, f)
                r = subprocess.run([BINARY, model, "--policy", policy, "-f", "json", "--collectives",
                                    "--device", "cpu"], capture_output=True, text=True)
                self.assertEqual(r.returncode, 0, r.stderr)
                plan = json.loads(r.stdout)
                real = cp_reference.cp_step(cfg=MOE, world=world, cp=cp, ep=ep,
                                            param_dtype=getattr(torch, param_dtype) if param_dtype else None)
                self.assert_matches(plan, real, label)
                a2a = [c for c in real["collectives"] if c["kind"] == "all_to_all" and c["source"] != "cp"]
                planned = plan["comm"]["expert_parallel"]
                self.assertEqual((planned["calls"], planned["bytes"]), (len(a2a), sum(c["bytes"] for c in a2a)))
                self.assertEqual({c["group_size"] for c in a2a}, {ep})
                self.assertEqual(plan["expert_parallel"]["modules"][0]["tokens"],
                                 cp_models.DEFAULTS["batch"] * real["seq_local"])

    def emitted(self, policy, name):
        """The module `--emit torch` writes for `policy`, imported."""
        path = os.path.join(self.tmp.name, name + ".py")
        r = subprocess.run([BINARY, self.model, "--policy", policy, "--emit", "torch", "-o", path],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    def test_emit_torch(self):
        """The emitted build_mesh, apply_fsdp and cp_context run the real step the plan describes."""
        for world, cp, param_dtype, ac, rotate, head_tail in [(8, 2, None, False, "allgather", True),
                                                              (8, 4, "bfloat16", True, "alltoall", True),
                                                              (8, 4, None, False, "allgather", False)]:
            label = f"emitted w{world} cp{cp} {param_dtype or 'float32'} ac={ac} {rotate} head_tail={head_tail}"
            with self.subTest(label):
                plan = self.plan(world, cp, param_dtype, ac, rotate, head_tail)
                module = self.emitted(os.path.join(self.tmp.name, "policy.json"), f"emitted_cp{cp}_{rotate}")
                self.assertEqual(module.MESH_DIM_NAMES, ("dp_shard", "cp"))
                self.assertEqual(module.MESH_SHAPE, (world // cp, cp))
                real = cp_reference.cp_step(world=world, cp=cp, ac=ac, rotate=rotate, load_balance=head_tail,
                                            applier=module)
                self.assertEqual(real["load_balancer"] is not None, head_tail)
                self.assert_matches(plan, real, label)
        # HSDP with CP: fully_shard on mesh["dp_replicate", "dp_shard_cp"], a 2-D mesh (2, 4).
        policy = os.path.join(self.tmp.name, "hsdp.json")
        with open(policy, "w") as f:
            json.dump({"module_classes": ["DecoderLayer"], "context_parallel": {"degree": 2},
                       "fsdp": {"version": 2, "world_size": 16, "sharding_strategy": "HYBRID_SHARD",
                                "shard_group_size": 8}}, f)
        module = self.emitted(policy, "emitted_hsdp")
        emitted = [os.path.join(self.tmp.name, f) for f in os.listdir(self.tmp.name) if f.startswith("emitted_")]
        r = subprocess.run([sys.executable, "-m", "ruff", "check", "--isolated", "--no-cache", "--extend-select", "I",
                            "--output-format", "concise", *emitted], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual((module.MESH_DIM_NAMES, module.MESH_SHAPE), (("dp_replicate", "dp_shard", "cp"), (2, 4, 2)))
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group("fake", rank=0, world_size=16, store=FakeStore())
        model = module.apply_fsdp(cp_models.build(cp_models.DEFAULTS), device_type="cpu")
        mesh = next(model.parameters()).device_mesh
        self.assertEqual((mesh.mesh_dim_names, tuple(mesh.shape)), (("dp_replicate", "dp_shard_cp"), (2, 8)))
        dist.destroy_process_group()

    def test_refusals(self):
        policy = os.path.join(self.tmp.name, "bad.json")
        cases = [({"context_parallel": {"degree": 3}, "fsdp": {"version": 2, "world_size": 8}}, [],
                  "context_parallel.degree (3) must divide the world size (8)"),
                 ({"context_parallel": {"degree": 2}, "fsdp": {"version": 2, "world_size": 8}}, ["--dim", "seq=255"],
                  "must be divisible by cp (2)"),
                 ({"context_parallel": {"degree": 2}, "fsdp": {"world_size": 8}}, [], "it needs FSDP2"),
                 ({"context_parallel": {"degree": 2, "load_balancer": "ptrr"}, "fsdp": {"version": 2}}, [],
                  "FlexAttention"),
                 ({"context_parallel": {"degree": 2, "rotate_method": "ring"}, "fsdp": {"version": 2}}, [],
                  "\"allgather\" or \"alltoall\""),
                 ({"context_parallel": {"degree": 2}, "expert_parallel": {"degree": 2},
                   "fsdp": {"version": 2, "world_size": 8}}, [], "no routed experts in this model")]
        for doc, extra, words in cases:
            with self.subTest(words=words):
                with open(policy, "w") as f:
                    json.dump(doc, f)
                r = subprocess.run([BINARY, self.model, "--policy", policy, *extra], capture_output=True, text=True)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(words, r.stderr)
                self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)
                self.assertEqual(r.stdout, "")

    def test_balancer_dropped(self):
        # 2 x cp does not divide 260: torch runs contiguous shards without a word; the plan says so.
        plan = self.plan(8, 4, None, False, "allgather", True, extra=["--dim", "seq=260"])
        self.assertIsNone(plan["context_parallel"]["load_balancer"])
        self.assertIn("cp_load_balance_dropped", [w["kind"] for w in plan["warnings"]])
        real = cp_reference.cp_step(world=8, cp=4, cfg={"seq": 260})
        self.assertIsNone(real["load_balancer"])
        self.assertEqual(plan["context_parallel"]["local_seq"], real["seq_local"])

    def test_static_export_refused(self):
        from fsdp_plan.export import export_module
        static = os.path.join(self.tmp.name, "static.pt2")
        cfg = dict(cp_models.DEFAULTS)
        export_module(cp_models.build(cfg), (), cp_models.example_inputs(cfg), static, None, {},
                      what="cp_models.CPDecoder")
        policy = os.path.join(self.tmp.name, "static.json")
        with open(policy, "w") as f:
            json.dump({"context_parallel": {"degree": 2}, "fsdp": {"version": 2, "world_size": 8}}, f)
        r = subprocess.run([BINARY, static, "--policy", policy], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("no dynamic seq dimension", r.stderr)

    def accelerate_config(self, sizes, comm=None):
        path = os.path.join(self.tmp.name, "accelerate.yaml")
        with open(path, "w") as f:
            f.write("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n"
                    "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                    "  fsdp_transformer_layer_cls_to_wrap: DecoderLayer\n"
                    "  fsdp_version: 2\nmixed_precision: 'no'\nnum_processes: 8\nparallelism_config:\n" +
                    "".join(f"  parallelism_config_{k}: {v}\n" for k, v in sizes.items()) +
                    (f"  parallelism_config_cp_comm_strategy: {comm}\n" if comm else ""))
        return path

    def test_accelerate_cp_size(self):
        # Accelerate's own Accelerator() on the config (tests/accelerate): its mesh is the plan's, and the
        # ring is the one the JSON policy plans.
        path = self.accelerate_config({"dp_shard_size": 4, "cp_size": 2}, comm="alltoall")
        want = accelerate_builds(path)
        self.assertEqual(want[0], "built", want)
        r = subprocess.run([BINARY, self.model, "--policy", path, "-f", "json", "--collectives", "--device", "cpu"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        plan = json.loads(r.stdout)
        mesh = plan["context_parallel"]["mesh"]
        self.assertEqual((tuple(mesh["dim_names"]), tuple(mesh["shape"])), want[2])
        self.assertEqual(plan["context_parallel"]["rotate_method"], "alltoall")
        self.assertEqual(plan_ring(plan), plan_ring(self.plan(8, 2, None, False, "alltoall", True)))
        # A cp_size that leaves no integer dp_shard: Accelerate's error, word for word, and nothing planned.
        path = self.accelerate_config({"dp_shard_size": 4, "cp_size": 3})
        want = accelerate_builds(path)
        self.assertEqual(want[0], "raised", want)
        r = subprocess.run([BINARY, self.model, "--policy", path], capture_output=True, text=True)
        self.assertEqual((r.returncode, r.stdout), (2, ""), r.stderr)
        self.assertIn(want[1], r.stderr)

    def test_suggest_searches_cp(self):
        # suggest varies cp over the powers of two the world and the sequence allow, and ranks per sample
        # (step x cp); the best policy it prints plans again.
        policy = os.path.join(self.tmp.name, "suggest.json")
        with open(policy, "w") as f:
            json.dump({"module_classes": ["DecoderLayer"], "context_parallel": {"degree": 2},
                       "fsdp": {"version": 2, "world_size": 8}}, f)
        suggest = [BINARY, "suggest", self.model, "--policy", policy, "--budget", "64MiB", "-f", "json", "--top", "500",
                   "--device", "cpu"]
        r = subprocess.run(suggest, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        out = json.loads(r.stdout)
        labels = [c["label"] for c in out["candidates"]]
        for d in (1, 4, 8):  # around the best wrappings; the policy's own cp (2) is the unprefixed candidate
            self.assertTrue(any(x.startswith(f"cp {d}, ") for x in labels), labels[:10])
        self.assertTrue(any(not x.startswith("cp ") for x in labels), labels[:10])
        # seq 250: 4 and 8 do not divide it, so no such candidate.
        r = subprocess.run(suggest + ["--dim", "seq=250"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        labels = [c["label"] for c in json.loads(r.stdout)["candidates"]]
        self.assertTrue(any(x.startswith("cp 1, ") for x in labels))
        self.assertFalse(any(x.startswith(("cp 4, ", "cp 8, ")) for x in labels))

    def test_emit(self):
        policy = os.path.join(self.tmp.name, "emit.json")
        # Accelerate carries it: parallelism_config_cp_size; its own Accelerator() builds the plan's mesh, and
        # the config plans the same ring. (Accelerate's FSDP2 wrap also makes the final norm a group, kept
        # after forward: the policy says so, or the emitter refuses.)
        with open(policy, "w") as f:
            json.dump({"module_classes": ["DecoderLayer"], "groups": [{"modules": ["norm"],
                                                                      "reshard_after_forward": False}],
                       "context_parallel": {"degree": 2}, "fsdp": {"version": 2, "world_size": 8}}, f)
        config = os.path.join(self.tmp.name, "emitted.yaml")
        r = subprocess.run([BINARY, self.model, "--policy", policy, "--emit", "accelerate", "-o", config],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(config) as f:
            self.assertIn("parallelism_config_cp_size: 2", f.read())
        want = accelerate_builds(config)
        self.assertEqual(want, ("built", 2, (("dp_shard", "cp"), (4, 2))))
        plans = []
        for p in (policy, config):
            r = subprocess.run([BINARY, self.model, "--policy", p, "-f", "json", "--collectives"], capture_output=True,
                               text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            plans.append(json.loads(r.stdout))
        self.assertEqual(plan_ring(plans[0]), plan_ring(plans[1]))
        self.assertEqual(plans[0]["memory"]["per_rank"]["peak_bytes"], plans[1]["memory"]["per_rank"]["peak_bytes"])
        with open(policy, "w") as f:
            json.dump({"module_classes": ["DecoderLayer"], "context_parallel": {"degree": 2, "load_balancer": None},
                       "fsdp": {"version": 2, "world_size": 8}}, f)
        r = subprocess.run([BINARY, self.model, "--policy", policy, "--emit", "accelerate"], capture_output=True,
                           text=True)
        self.assertEqual((r.returncode, r.stdout), (2, ""), r.stderr)
        self.assertIn("head-tail load balancer", r.stderr)

if __name__ == "__main__":
    BINARY = sys.argv.pop(1)
    unittest.main(verbosity=2)
