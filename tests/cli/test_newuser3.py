#!/usr/bin/python3
"""What a new user tripped over, round three (issue 41): the command line's part.

a. the text plan says whether the peak fits the --hardware GPU, with the headroom it assumes
   (CUDA context, NCCL buffers, allocator fragmentation), and against --max-peak-bytes; JSON
   has memory.fit;
b. identical consecutive unit rows fold ("layers.0 .. layers.7  x8"); -v and --wide unfold them;
c. suggest --pin-wrapping plans the --policy's wrapping as given (no search), and suggest states
   the headroom its budget leaves out;
d. diff summarises a changed list (its lengths, its first difference), not both arrays whole.

Each failed before (newuser3 at fa1beaa). The models are hand-written TorchScript archives
(test_big_trees.py's pickle writer): a Net with layers.0 .. layers.N-1 and a head.

Usage: test_newuser3.py FSDP_PLAN_BINARY   (Debian's python3: no torch needed)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from test_big_trees import Pickle, write_archive  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
BINARY = os.path.join(ROOT, "build", "app", "fsdp-plan")
GIB = 1 << 30


class TrainablePickle(Pickle):
    """Tensors with requires_grad=True (test_big_trees.py's are frozen)."""

    def tensor(self, numel):
        self.raw(b"ctorch._utils\n_rebuild_tensor_v2\n(")
        self.raw(b"(")
        self.string("storage")
        self.raw(b"ctorch\nFloatStorage\n")
        self.string("0")
        self.string("cpu")
        self.raw(b"J" + struct.pack("<i", numel) + b"tQ")
        self.raw(b"K\x00J" + struct.pack("<i", numel) + b"\x85K\x01\x85\x88")  # ..., requires_grad True
        self.raw(b"ccollections\nOrderedDict\n)Rt")
        self.raw(b"R")


def layers_archive(path, n, numel=1000, layer_class="Layer", list_name="layers"):
    """Net: `list_name` (a ModuleList of n `layer_class`, `numel` trainable weights each) and head
    (a `layer_class` of 500)."""
    p = TrainablePickle()
    p.begin_object("Net")
    p.string("training")
    p.raw(b"\x88")
    p.string(list_name)
    p.begin_object("ModuleList")
    p.string("training")
    p.raw(b"\x88")
    for i in range(n):
        p.string(str(i))
        p.begin_object(layer_class)
        p.string("training")
        p.raw(b"\x88")
        p.string("weight")
        p.tensor(numel)
        p.end_object()
    p.end_object()
    p.string("head")
    p.begin_object(layer_class)
    p.string("training")
    p.raw(b"\x88")
    p.string("weight")
    p.tensor(500)
    p.end_object()
    p.end_object()
    layer = (f"class {layer_class}(Module):\n  __parameters__ = [\"weight\", ]\n  __buffers__ = []\n"
             "  weight : Tensor\n  training : bool\n")
    modules = ("class ModuleList(Module):\n  __parameters__ = []\n  __buffers__ = []\n  training : bool\n" +
               "".join(f"  __annotations__[\"{i}\"] = __torch__.{layer_class}\n" for i in range(n)))
    net = ("class Net(Module):\n  __parameters__ = []\n  __buffers__ = []\n  training : bool\n"
           f"  {list_name} : __torch__.ModuleList\n  head : __torch__.{layer_class}\n")
    write_archive(path, p, layer + modules + net)


class Result:
    """A finished run; `text` is stdout with its line breaks and indents as single spaces (the text
    plan wraps at 100 columns)."""

    def __init__(self, r):
        self.returncode, self.stdout, self.stderr = r.returncode, r.stdout, r.stderr
        self.text = " ".join(r.stdout.split())


def run(*args):
    env = dict(os.environ)
    env.pop("COLUMNS", None)
    return Result(subprocess.run([BINARY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 timeout=120, env=env))


class Scratch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._dir = tempfile.TemporaryDirectory()
        cls.tmp = cls._dir.name
        cls.l8 = os.path.join(cls.tmp, "l8.pt")
        cls.l9 = os.path.join(cls.tmp, "l9.pt")
        layers_archive(cls.l8, 8)
        layers_archive(cls.l9, 9)
        cls.policy = os.path.join(cls.tmp, "layers.json")
        with open(cls.policy, "w") as f:
            json.dump({"module_classes": ["Layer"]}, f)

    @classmethod
    def tearDownClass(cls):
        cls._dir.cleanup()

    def plan(self, *extra, model=None):
        r = run(model or self.l8, "--policy", self.policy, "--world-size", "8", *extra)
        self.assertIn(r.returncode, (0, 1), r.stderr)
        return r


class FitsVerdict(Scratch):
    def verdict_line(self, text):
        lines = [line for line in text.splitlines() if line.lstrip().startswith("verdict ")]
        self.assertEqual(len(lines), 1, text)
        return lines[0]

    def test_a_small_plan_fits_and_names_the_headroom(self):
        r = self.plan()
        line = self.verdict_line(r.stdout)
        self.assertIn("verdict fits:", line)
        self.assertIn("H100 SXM5 80GB (--hardware h100, the default)", r.text)
        for said in ("5.5 GiB ASSUMED", "CUDA context", "NCCL buffers", "allocator fragmentation", "79.6 GiB"):
            self.assertIn(said, r.text)
        self.assertIn("the peak has no activations: a lower bound", r.text)

    def test_over_the_usable_memory_is_tight_and_over_the_device_does_not_fit(self):
        self.assertIn("verdict tight:", self.verdict_line(self.plan("--activation-bytes", "77GiB").stdout))
        self.assertIn("verdict does not fit:", self.verdict_line(self.plan("--activation-bytes", "90GiB").stdout))
        # An H200 holds what an H100 does not.
        self.assertIn("verdict fits:", self.verdict_line(self.plan("--activation-bytes", "90GiB", "--hardware",
                                                                   "h200").stdout))

    def test_max_peak_bytes_is_part_of_the_verdict(self):
        r = self.plan("--activation-bytes", "10GiB", "--max-peak-bytes", "8GiB")
        self.assertEqual(r.returncode, 1)
        self.assertIn("--max-peak-bytes 8.0 GiB: over by", r.text)
        self.assertIn("--max-peak-bytes 8.0 GiB: within", self.plan("--max-peak-bytes", "8GiB").text)

    def test_json_has_memory_fit(self):
        doc = json.loads(self.plan("-f", "json", "--activation-bytes", "77GiB", "--max-peak-bytes", "80GiB").stdout)
        fit = doc["memory"]["fit"]
        self.assertEqual(fit["verdict"], "tight")
        self.assertEqual(fit["hardware"], "h100")
        self.assertEqual(fit["device_bytes"], 81559 << 20)
        self.assertEqual(fit["usable_bytes"], fit["device_bytes"] - fit["assumed_headroom_bytes"])
        self.assertNotIn("peak_bytes", fit)  # memory.per_rank.peak_bytes: diff shows it once
        self.assertEqual(fit["max_peak_bytes"], 80 * GIB)
        self.assertTrue(fit["activations_known"])


class FoldedRows(Scratch):
    def test_identical_rows_fold_and_v_or_wide_unfold_them(self):
        folded = self.plan().stdout
        self.assertIn("layers.0 .. layers.7  x8", folded)
        self.assertNotIn("layers.3 ", folded)
        for flag in ("-v", "--wide"):
            with self.subTest(flag=flag):
                r = self.plan(flag)
                self.assertNotIn(" x8", r.stdout)
                for i in range(8):
                    self.assertRegex(r.stdout, rf"\n +{i + 1}  +layers\.{i} ")


    def test_one_module_groups_fold_in_the_policy_line(self):
        # An Accelerate FSDP2 config is a group per decoder layer: 48 of them filled 17 lines.
        policy = os.path.join(self.tmp, "groups.json")
        with open(policy, "w") as f:
            json.dump({"fsdp": {"version": 2}, "groups": [{"modules": [f"layers.{i}"]} for i in range(8)] +
                       [{"modules": ["head"]}]}, f)
        folded = run(self.l8, "--policy", policy, "--world-size", "8").text
        self.assertIn("groups [layers.0] .. [layers.7] x8, group [head]", folded)
        unfolded = run(self.l8, "--policy", policy, "--world-size", "8", "-v").text
        self.assertIn("group [layers.0], group [layers.1],", unfolded)


class SuggestPinned(Scratch):
    def suggest(self, *extra):
        r = run("suggest", self.l8, "--policy", self.policy, "--world-size", "8", "--budget", "1GiB", *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r

    def test_pin_wrapping_plans_the_policy_as_given(self):
        searched = json.loads(self.suggest("-f", "json").stdout)
        self.assertGreater(searched["tried"], 1)
        self.assertFalse(searched["settings"]["pin_wrapping"])
        pinned = json.loads(self.suggest("-f", "json", "--pin-wrapping").stdout)
        self.assertEqual(pinned["tried"], 1)
        self.assertTrue(pinned["settings"]["pin_wrapping"])
        self.assertEqual(pinned["candidates"][0]["units"], 10)  # the root, 8 layers, the head
        self.assertEqual(pinned["best"]["policy"]["module_classes"], ["Layer"])
        text = self.suggest("--pin-wrapping").text
        self.assertIn("--pin-wrapping: the --policy's wrapping as given", text)

    def test_suggest_states_the_headroom_its_budget_leaves_out(self):
        text = self.suggest().text
        self.assertIn("headroom", text)
        self.assertIn("CUDA context", text)
        self.assertIn("--budget 1.0 GiB is within it", text)
        r = run("suggest", self.l8, "--world-size", "8", "--budget", "79GiB")
        self.assertIn("is over that: a plan that fits it may not fit the GPU", r.text)
        doc = json.loads(self.suggest("-f", "json").stdout)
        self.assertEqual(doc["settings"]["usable_bytes"] + doc["settings"]["assumed_headroom_bytes"], 81559 << 20)


class DiffLists(Scratch):
    def test_a_changed_list_is_summarised(self):
        old = os.path.join(self.tmp, "old.json")
        new = os.path.join(self.tmp, "new.json")
        # One more layer, and a list that changes: memory.notes (the accumulation's note).
        for model, out, accum in ((self.l8, old, ("--grad-accum", "2")), (self.l9, new, ("--grad-accum", "4"))):
            r = self.plan("-f", "json", "-o", out, *accum, model=model)
            self.assertEqual(r.returncode, 0, r.stderr)
        r = run("diff", old, new)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertRegex(r.stdout, r"list of \d+ -> \d+")
        self.assertNotRegex(r.stdout, r"\[\[|\[\{")  # no raw JSON arrays of arrays or objects
        for line in r.stdout.splitlines():
            self.assertLess(len(line), 400, line)
        # JSON keeps both lists whole.
        doc = json.loads(run("diff", old, new, "-f", "json").stdout)
        self.assertTrue(any(isinstance(c.get("old"), list) for c in doc.get("other", [])), doc.get("other"))


class GradientAccumulation(Scratch):
    def memory(self, *extra):
        r = self.plan("-f", "json", *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)["memory"]

    def test_accumulation_holds_the_sharded_gradients(self):
        one = self.memory()
        self.assertNotIn("gradient_accumulation", one)
        four = self.memory("--grad-accum", "4")
        a = four["gradient_accumulation"]
        self.assertEqual(a["steps"], 4)
        self.assertFalse(a["no_sync"])
        self.assertEqual(a["held_grads_bytes"], four["per_rank"]["grads_bytes"])
        self.assertEqual(a["micro_step_peak_bytes"], one["per_rank"]["peak_bytes"])
        self.assertGreater(four["per_rank"]["peak_bytes"], one["per_rank"]["peak_bytes"])
        self.assertLessEqual(four["per_rank"]["peak_bytes"], one["per_rank"]["peak_bytes"] + a["held_grads_bytes"])

    def test_no_sync_holds_every_unsharded_gradient(self):
        one = self.memory()
        nosync = self.memory("--grad-accum", "4", "--no-sync")
        a = nosync["gradient_accumulation"]
        self.assertTrue(a["no_sync"])
        # FSDP1: each unit's padded flat gradient, float32: 8 layers of 1,000 and the head's 500 (padded to 504).
        self.assertEqual(a["held_grads_bytes"], 8 * 4000 + 504 * 4)
        self.assertGreater(nosync["per_rank"]["peak_bytes"], self.memory("--grad-accum", "4")["per_rank"]["peak_bytes"])
        self.assertGreaterEqual(nosync["per_rank"]["peak_bytes"], one["per_rank"]["peak_bytes"] + a["held_grads_bytes"] // 2)
        # FSDP2 (set_requires_gradient_sync(False)): each parameter's unsharded gradient, unpadded.
        v2 = self.memory("--grad-accum", "2", "--no-sync", "--fsdp-version", "2")
        self.assertEqual(v2["gradient_accumulation"]["held_grads_bytes"], 8 * 4000 + 500 * 4)

    def test_the_policy_keys_and_the_text(self):
        policy = os.path.join(self.tmp, "accum.json")
        with open(policy, "w") as f:
            json.dump({"module_classes": ["Layer"], "fsdp": {"gradient_accumulation_steps": 8, "no_sync": True}}, f)
        r = run(self.l8, "--policy", policy, "--world-size", "8")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("grad accumulation 8 micro-steps, no_sync", r.text)
        self.assertIn("UNSHARDED gradients", r.text)
        bad = os.path.join(self.tmp, "bad.json")
        with open(bad, "w") as f:
            json.dump({"fsdp": {"gradient_accumulation_steps": 0}}, f)
        r = run(self.l8, "--policy", bad)
        self.assertEqual(r.returncode, 2)
        self.assertIn("gradient_accumulation_steps", r.stderr)


class EmitMasterWeights(Scratch):
    def test_emit_torch_writes_the_fp32_upcast_the_plan_counts(self):
        for version in ("1", "2"):
            with self.subTest(fsdp_version=version):
                policy = os.path.join(self.tmp, f"mw{version}.json")
                with open(policy, "w") as f:
                    json.dump({"module_classes": ["Layer"], "mixed_precision": {"param_dtype": "bfloat16"},
                               "fsdp": {"version": int(version), "fp32_master_weights": True}}, f)
                r = run(self.l8, "--policy", policy, "--world-size", "8", "--emit", "torch")
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assertIn("fp32 master weights, as Accelerate upcasts", r.stdout)
                self.assertIn(".data.float()", r.stdout)
                compile(r.stdout, "apply_fsdp.py", "exec")
                plain = run(self.l8, "--policy", self.policy, "--world-size", "8", "--fsdp-version", version,
                            "--emit", "torch")
                self.assertNotIn(".data.float()", plain.stdout)


class NotModelled(Scratch):
    def test_float8_and_experts_say_they_are_not_modelled(self):
        f8 = os.path.join(self.tmp, "f8.pt")
        layers_archive(f8, 2, layer_class="Float8Linear")
        r = run(f8, "--world-size", "8")
        self.assertIn("not_modelled: float8 training", r.text)
        moe = os.path.join(self.tmp, "moe.pt")
        layers_archive(moe, 2, list_name="experts")
        r = run(moe, "--world-size", "8")
        self.assertIn("planned without expert parallelism", r.text)
        self.assertNotIn("not_modelled", run(self.l8, "--world-size", "8").stdout)

    def test_an_accelerate_config_with_fp8_or_dynamo_says_so(self):
        cfg = os.path.join(self.tmp, "acc.yaml")
        with open(cfg, "w") as f:
            f.write("compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nfsdp_config:\n"
                    "  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: Layer\n"
                    "  fsdp_version: 2\nmixed_precision: fp8\ndynamo_config:\n  dynamo_backend: INDUCTOR\n"
                    "num_machines: 1\nnum_processes: 8\n")
        r = run(self.l8, "--policy", cfg)
        self.assertIn("not_modelled: mixed_precision: fp8", r.text)
        self.assertIn("not_modelled: dynamo_backend INDUCTOR: torch.compile is not modelled", r.text)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
