#!/usr/bin/python3
"""Checks every row of docs/errors.md: each bad input is made here, the binary
runs on it, and its exit code and exact message must match the table.

Usage: test_errors.py FSDP_PLAN_BINARY
"""
import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile_inputs as hostile  # noqa: E402  (issue 29's inputs, shared with test_hostile.py)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "app", "fsdp-plan")
GPT = os.path.join(ROOT, "sample_models", "tiny_gpt.pt")
# A small .pt2 with dynamic batch and seq (graph_reader_test.cpp reads it too).
DYN = os.path.join(ROOT, "tests", "export", "data", "llama_dyn.pt2")
PT2 = os.path.join(ROOT, "sample_models", "tiny_gpt.pt2")
ERRORS_MD = os.path.join(ROOT, "docs", "errors.md")


def read_table():
    """{id: (exit code, message)} from the rows of docs/errors.md's tables."""
    rows = {}
    for line in open(ERRORS_MD):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not re.fullmatch(r"`[a-z0-9-]+`", cells[0]):
            continue
        message = cells[3]
        assert message.startswith("`") and message.endswith("`"), line
        # ``...`` (Markdown code with a backtick inside): the message between "`` " and " ``".
        fence = 3 if message.startswith("`` ") and message.endswith(" ``") else 1
        rows[cells[0].strip("`")] = (int(cells[2]), message[fence:-fence])
    return rows


# --- inputs, each made in the scratch directory; returns the argv after the binary ---

def model(name, data):
    with open(name, "wb") as f:
        f.write(data)
    return [name]


def policy(text):
    with open("policy.json", "w") as f:
        f.write(text)
    return [GPT, "--policy", "policy.json"]


def flops(text):
    """A --flops file (FLOPs per module, lib/time/flop_file.cpp) with this text."""
    with open("flops.json", "w") as f:
        f.write(text)
    return [GPT, "--flops", "flops.json"]


def accelerate(fsdp_config, top="num_processes: 2\n"):
    """An Accelerate config file (FSDP) with these fsdp_config lines."""
    with open("accel.yaml", "w") as f:
        f.write("distributed_type: FSDP\n" + top + "fsdp_config:\n" + fsdp_config)
    return [GPT, "--policy", "accel.yaml"]


def gpt_bytes():
    with open(GPT, "rb") as f:
        return f.read()


def rezip(name, keep=lambda n: True, edit=None):
    """A copy of the sample model with records dropped or rewritten."""
    with zipfile.ZipFile(GPT) as src, zipfile.ZipFile(name, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            if not keep(info.filename):
                continue
            data = src.read(info.filename)
            dst.writestr(info.filename, edit(info.filename, data) if edit else data)
    return [name]


def damaged_pickle(name):
    """Change a name inside data.pkl (stored uncompressed) without fixing its CRC:
    the pickle still parses, only the CRC can tell."""
    blob = bytearray(gpt_bytes())
    with zipfile.ZipFile(GPT) as z:
        pkl = z.read("tiny_gpt/data.pkl")
    at = bytes(blob).find(pkl)
    assert at > 0
    where = pkl.find(b"ln_f")
    blob[at + where:at + where + 4] = b"ln_g"
    return model(name, bytes(blob))


def huge_sizes(name):
    """The central directory claims data.pkl is nearly 4 GiB."""
    blob = bytearray(gpt_bytes())
    at = blob.find(b"PK\x01\x02")
    while at != -1:
        name_len = struct.unpack_from("<H", blob, at + 28)[0]
        if bytes(blob[at + 46:at + 46 + name_len]).endswith(b"data.pkl"):
            struct.pack_into("<II", blob, at + 20, 0xFFFFFFF0, 0xFFFFFFF0)
        at = blob.find(b"PK\x01\x02", at + 4)
    return model(name, bytes(blob))


def pt2_bytes():
    with open(PT2, "rb") as f:
        return f.read()


def rezip_pt2(name, keep=lambda n: True, edit=None):
    """A copy of the sample .pt2 with records dropped or rewritten (edit gets the
    record name without the top folder)."""
    with zipfile.ZipFile(PT2) as src, zipfile.ZipFile(name, "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            record = info.filename.split("/", 1)[1]
            if not keep(record):
                continue
            data = src.read(info.filename)
            dst.writestr(info.filename, edit(record, data) if edit else data)
    return [name]


def pt2_json(name, record, change):
    """The sample .pt2 with one JSON record changed by change(obj) in place."""
    def edit(rec, data):
        if rec != record:
            return data
        obj = json.loads(data)
        change(obj)
        return json.dumps(obj).encode()
    return rezip_pt2(name, edit=edit)


def pt2_raw(name, record, new_bytes):
    return rezip_pt2(name, edit=lambda rec, data: new_bytes(data) if rec == record else data)


def pt2_with_record(name, text):
    """The sample .pt2 with an fsdp-plan-export record (extra/fsdp_plan.json) added."""
    rezip_pt2(name)
    top = zipfile.ZipFile(PT2).namelist()[0].split("/")[0]
    with zipfile.ZipFile(name, "a", zipfile.ZIP_STORED) as z:
        z.writestr(top + "/extra/fsdp_plan.json", text)
    return [name]


def tree_json(name, doc):
    with open(name, "w") as f:
        f.write(doc if isinstance(doc, str) else json.dumps(doc))
    return [name]


def tree_module(path, params=()):
    return {"path": path, "type": "Net" if not path else "Block", "bases": ["torch.nn.modules.module.Module"],
            "params": list(params), "buffers": []}


def pt2_damaged(name):
    """Change a name inside models/model.json (stored) without fixing its CRC."""
    blob = bytearray(pt2_bytes())
    with zipfile.ZipFile(PT2) as z:
        rec = z.read("tiny_gpt/models/model.json")
    at = bytes(blob).find(rec)
    assert at > 0
    where = rec.find(b"tok_emb")
    blob[at + where:at + where + 7] = b"tok_emc"
    return model(name, bytes(blob))


def pt2_old_format(name):
    with zipfile.ZipFile(name, "w") as z:
        z.writestr("m/serialized_exported_program.json", "{}")
        z.writestr("m/version", "8.0")
    return [name]


WEIGHTS_CONFIG = "data/weights/model_weights_config.json"


def emb_sizes(sizes):
    def change(obj):
        obj["config"]["tok_emb.weight"]["tensor_meta"]["sizes"] = sizes
    return change


def torch_save(name, obj_factory):
    import torch
    torch.save(obj_factory(), name)
    return [name]


def linear():
    import torch.nn as nn
    return nn.Linear(2, 2)


def refused(kind):
    """A two-Linear model FSDP1 refuses as one unit, scripted by Debian's torch."""
    import torch
    import torch.nn as nn

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            if kind == "frozen":  # LoRA-like: one frozen weight among trainable parameters
                self.a.weight.requires_grad_(False)
            if kind == "dtypes":
                self.b.double()
            self.scale = nn.Parameter(torch.tensor(1.0) if kind == "scalar" else torch.ones(1))

        def forward(self, x):
            return self.b(self.a(x).to(self.b.weight.dtype)) * self.scale.to(self.b.weight.dtype)

    torch.jit.save(torch.jit.script(Pair()), kind + ".pt")
    return [kind + ".pt"]


def jit_custom_op(name):
    """A scripted module calling torchvision's nms: LibTorch alone does not know the op."""
    import torch
    import torchvision  # noqa: F401  (registers torchvision::nms)

    class Nms(torch.nn.Module):
        def forward(self, boxes, scores):
            return torch.ops.torchvision.nms(boxes, scores, 0.5)
    torch.jit.save(torch.jit.script(Nms()), name)
    return [name, "--loader", "jit"]


def yaml_file(body):
    """An Accelerate config (FSDP, 2 processes) with these lines after the first two."""
    hostile.accelerate("accel.yaml", body)
    return [GPT, "--policy", "accel.yaml"]


def regex(pattern):
    return yaml_file("fsdp_config:\n  fsdp_ignored_modules: '%s'\n" % pattern)


def code_edit(old, new):
    hostile.edited_code("damaged.pt", lambda d: d.replace(old, new, 1))
    return ["damaged.pt"]


def plan_file(change):
    hostile.plan_with("plan.json", change)
    return ["diff", "plan.json", hostile.PLAN]


def set_numel(value):
    def change(doc):
        doc["units"][0]["params"][0]["numel"] = value
    return change


def units_twice(doc):
    doc["units"] = doc["units"] + doc["units"]


def escape_path(doc):
    doc["units"][1]["path"] = "\x1b[2J" + doc["units"][1]["path"]


CASES = {
    "model-missing": lambda: ["missing.pt"],
    "model-directory": lambda: (os.mkdir("adir"), ["adir"])[1],
    "model-empty": lambda: model("empty.pt", b""),
    "model-not-zip": lambda: model("notes.pt", b"these are notes, not a model\n"),
    "model-truncated-10": lambda: model("cut10.pt", gpt_bytes()[:10]),
    "model-truncated-100": lambda: model("cut100.pt", gpt_bytes()[:100]),
    "model-truncated-half": lambda: model("half.pt", gpt_bytes()[:len(gpt_bytes()) // 2]),
    "model-truncated-end": lambda: model("end.pt", gpt_bytes()[:-10]),
    "model-damaged-record": lambda: damaged_pickle("damaged.pt"),
    "model-no-data-pkl": lambda: rezip("nodata.pt", keep=lambda n: not n.endswith("data.pkl")),
    "model-no-code": lambda: rezip("nocode.pt", keep=lambda n: "/code/" not in n),
    "model-huge-sizes": lambda: huge_sizes("huge.pt"),
    "model-state-dict": lambda: torch_save("state_dict.pt", lambda: linear().state_dict()),
    "model-eager-save": lambda: torch_save("eager.pt", linear),
    "model-other-pickle": lambda: model("other.pkl", pickle.dumps({"epoch": 3})),
    "model-other-zip": lambda: (zipfile.ZipFile("docs.zip", "w").writestr("a.txt", "text"), ["docs.zip"])[1],
    "pt2-truncated-half": lambda: model("half.pt2", pt2_bytes()[:len(pt2_bytes()) // 2]),
    "pt2-damaged-record": lambda: pt2_damaged("damaged.pt2"),
    "pt2-archive-version": lambda: pt2_raw("v1.pt2", "archive_version", lambda d: b"1"),
    "pt2-schema-version": lambda: pt2_json("schema.pt2", "models/model.json",
                                           lambda j: j["schema_version"].update(major=9, minor=1)),
    "pt2-no-program": lambda: rezip_pt2("noprog.pt2", keep=lambda r: r != "models/model.json"),
    "pt2-no-weights-config": lambda: rezip_pt2("noweights.pt2", keep=lambda r: r != WEIGHTS_CONFIG),
    "pt2-invalid-json": lambda: pt2_raw("badjson.pt2", "models/model.json", lambda d: d[:100]),
    "pt2-json-deep": lambda: pt2_raw("deep.pt2", "models/model.json", lambda d: b"[" * 200000 + b"]" * 200000),
    "pt2-json-wrong-type": lambda: pt2_json("wrongtype.pt2", "models/model.json",
                                            lambda j: j["graph_module"].update(module_call_graph="all")),
    "pt2-json-negative-shape": lambda: pt2_json("negative.pt2", WEIGHTS_CONFIG,
                                                emb_sizes([{"as_int": -1}, {"as_int": 64}])),
    "pt2-json-huge-shape": lambda: pt2_json("hugeshape.pt2", WEIGHTS_CONFIG,
                                            emb_sizes([{"as_int": 2 ** 62}, {"as_int": 64}])),
    "pt2-json-symbolic-shape": lambda: pt2_json("symbolic.pt2", WEIGHTS_CONFIG,
                                                emb_sizes([{"as_expr": {"expr_str": "s0"}}, {"as_int": 64}])),
    "pt2-old-format": lambda: pt2_old_format("old.pt2"),
    "pt2-inferred-class": lambda: [PT2],
    "pt2-record-damaged": lambda: pt2_with_record("rec.pt2", "{ not json"),
    "pt2-record-version": lambda: pt2_with_record("rec2.pt2", json.dumps(
        {"format": "fsdp-plan-export", "format_version": 2, "no_split_modules": None})),
    "tree-damaged": lambda: tree_json("t.tree.json", {"tree_format": 1, "num_tensors": 1, "modules": [tree_module(
        "", [{"name": "w", "tensor": 0, "shape": [-1], "dtype": "float32", "itemsize": 4, "requires_grad": True}])]}),
    "tree-format-version": lambda: tree_json("v2.tree.json", '{"tree_format": 2, "modules": []}'),
    "tree-orphan": lambda: tree_json("orphan.tree.json", {"tree_format": 1, "num_tensors": 0, "modules": [
        tree_module(""), tree_module("blocks.0")]}),
    "model-is-policy": lambda: tree_json("policy.json", '{"module_classes": ["Block"]}'),
    "model-jit-custom-op": lambda: jit_custom_op("nms.pt"),
    "policy-missing": lambda: [GPT, "--policy", "missing.json"],
    "policy-invalid-json": lambda: policy('{\n  "module_classes": ["Block"],\n}\n'),
    "policy-not-object": lambda: policy('["Block"]'),
    "policy-wrong-type": lambda: policy('{"module_classes": "Block"}'),
    "policy-unknown-key": lambda: policy('{"min_num_param": 100000}'),
    "policy-unknown-nested-key": lambda: policy('{"mixed_precision": {"param_type": "bfloat16"}}'),
    "policy-negative": lambda: policy('{"min_num_params": -5}'),
    "policy-fractional": lambda: policy('{"min_num_params": 2.5}'),
    "policy-huge": lambda: policy('{"min_num_params": 1e30}'),
    "policy-overflow": lambda: policy('{"min_num_params": 1e400}'),
    "policy-empty-classes": lambda: policy('{"module_classes": []}'),
    "policy-duplicate-class": lambda: policy('{"module_classes": ["Block", "Block"]}'),
    "policy-bad-dtype": lambda: policy('{"mixed_precision": {"param_dtype": "bf16"}}'),
    "policy-bad-strategy": lambda: policy('{"fsdp": {"sharding_strategy": "FULL_SHARDS"}}'),
    "policy-bad-root-share": lambda: policy('{"checks": {"warn_root_share": 1.5}}'),
    "policy-bad-fsdp-version": lambda: policy('{"fsdp": {"version": 3}}'),
    "policy-groups-fsdp1": lambda: policy('{"groups": [{"modules": ["tok_emb"]}]}'),
    "policy-tp-fsdp1": lambda: policy('{"fsdp": {"world_size": 4}, '
                                      '"tensor_parallel": {"degree": 2, "plan": {"blocks.*.fc1": "colwise"}}}'),
    "policy-tp-mesh-size": lambda: policy('{"fsdp": {"version": 2, "world_size": 6}, "tensor_parallel": '
                                          '{"degree": 2, "plan": {"blocks.*.fc1": "colwise"}, "mesh": {"dp_shard": 4}}}'),
    # Issue 39: 2^24 x 419021 x 10496005 = 2^24 + 4 x 2^64, the world size in 64-bit arithmetic.
    "policy-tp-mesh-wraps": lambda: policy('{"fsdp": {"version": 2, "world_size": 16777216}, "tensor_parallel": '
                                           '{"degree": 10496005, "plan": {"blocks.*.attn.qkv": "colwise"}, '
                                           '"mesh": {"dp_replicate": 16777216, "dp_shard": 419021}}}'),
    "accelerate-parallelism-wraps": lambda: accelerate(
        "  fsdp_version: 2\n", "num_processes: 8\nparallelism_config:\n"
        "  parallelism_config_dp_replicate_size: 4611686018427387905\n  parallelism_config_dp_shard_size: 2\n"
        "  parallelism_config_tp_size: 4\n"),
    "policy-tp-no-fsdp-dim": lambda: policy('{"fsdp": {"version": 2, "world_size": 2}, '
                                            '"tensor_parallel": {"degree": 2, "plan": {"blocks.*.fc1": "colwise"}}}'),
    "policy-tp-bad-style": lambda: policy('{"fsdp": {"version": 2, "world_size": 4}, '
                                          '"tensor_parallel": {"degree": 2, "plan": {"blocks.*.fc1": "colwse"}}}'),
    "policy-tp-bad-layout": lambda: policy('{"fsdp": {"version": 2, "world_size": 4}, "tensor_parallel": {"degree": 2, '
                                           '"plan": {"blocks.*.fc2": {"style": "rowwise", "output_layouts": "Shard(1)"}}}}'),
    "policy-tp-prepare-lengths": lambda: policy(
        '{"fsdp": {"version": 2, "world_size": 4}, "tensor_parallel": {"degree": 2, "plan": {"blocks.*": '
        '{"style": "prepare_module_input", "input_layouts": ["shard(1)", null], "desired_input_layouts": "replicate"}}}}'),
    "policy-tp-transformers-style": lambda: policy(
        '{"fsdp": {"version": 2, "world_size": 4}, "tensor_parallel": {"degree": 2, "plan": {"blocks.*.fc1": '
        '"packed_colwise"}}}'),
    # The message names the model file: a copy here, so that the row's path is relative.
    "policy-tp-model-plan": lambda: [shutil.copy(GPT, "tiny_gpt.pt")] + policy(
        '{"fsdp": {"version": 2, "world_size": 4}, "tensor_parallel": {"degree": 2, "plan": "model"}}')[1:],
    "policy-mp-bad-flag": lambda: policy('{"mixed_precision": {"keep_low_precision_grads": "yes"}}'),
    "policy-mp-fsdp1-field-fsdp2": lambda: policy('{"mixed_precision": {"param_dtype": "bfloat16", '
                                                  '"keep_low_precision_grads": true}, "fsdp": {"version": 2}}'),
    "policy-mp-fsdp2-field-fsdp1": lambda: policy('{"mixed_precision": {"output_dtype": "bfloat16"}}'),
    "policy-glob-no-module": lambda: policy('{"ignored_modules": ["decoder.*"]}'),
    "policy-glob-no-param": lambda: policy('{"ignored_params": ["*.gamma"]}'),
    "policy-class-no-module": lambda: policy('{"module_classes": ["Blok"]}'),
    "accelerate-unknown-top-key": lambda: accelerate("  fsdp_version: 1\n", "fsdp_confg: {}\n"),
    "accelerate-yaml-comments-only": lambda: (open("accel.yaml", "w").write("# fsdp\n\n# nothing else\n"),
                                              [GPT, "--policy", "accel.yaml"])[1],
    "accelerate-yaml-list": lambda: (open("accel.yaml", "w").write("- distributed_type: FSDP\n"),
                                     [GPT, "--policy", "accel.yaml"])[1],
    "accelerate-json-unknown-top-key": lambda: (open("accel.json", "w").write(
        '{"distributed_type": "FSDP", "num_processes": 2, "fsdp_confg": {}}'), [GPT, "--policy", "accel.json"])[1],
    "accelerate-yaml-named-json": lambda: (open("accel.json", "w").write("distributed_type: FSDP\nnum_processes: 2\n"),
                                           [GPT, "--policy", "accel.json"])[1],
    "accelerate-not-fsdp": lambda: (open("accel.yaml", "w").write("distributed_type: MULTI_GPU\n"),
                                    [GPT, "--policy", "accel.yaml"])[1],
    "accelerate-bad-wrap-policy": lambda: accelerate("  fsdp_auto_wrap_policy: SIZE_BASED\n"),
    "accelerate-float-min-num-params": lambda: accelerate("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n"
                                                          "  fsdp_min_num_params: 1e8\n"),
    "accelerate-stale-key": lambda: accelerate("  fsdp_backward_prefetch_policy: BACKWARD_PRE\n"),
    "accelerate-class-missing": lambda: accelerate("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                                                   "  fsdp_transformer_layer_cls_to_wrap: Blok\n"),
    "accelerate-module-classes-size": lambda: accelerate("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n")
    + ["--module-classes", "Block"],
    "accelerate-no-class-list": lambda: accelerate("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"),
    "policy-class-case": lambda: policy('{"module_classes": ["block"]}'),
    "policy-class-prefix": lambda: policy('{"module_classes": ["nn.Linear"]}'),
    "policy-is-model": lambda: (model("model.pt", gpt_bytes()), [GPT, "--policy", "model.pt"])[1],
    "policy-empty": lambda: policy(" \n"),
    "policy-yaml-mapping": lambda: (open("policy.yaml", "w").write("module_classes: [Block]\n"),
                                    [GPT, "--policy", "policy.yaml"])[1],
    "policy-empty-ignored-module": lambda: policy('{"ignored_modules": [""]}'),
    "output-stdout-full": lambda: {"argv": [GPT], "stdout": "/dev/full"},
    "output-stdout-closed": lambda: {"argv": [GPT], "stdout": "closed"},
    "output-no-directory": lambda: [GPT, "-o", "missing/plan.json"],
    "output-is-input": lambda: (model("model.pt", gpt_bytes()), ["model.pt", "-o", "model.pt"])[1],
    "output-is-input-link": lambda: (policy('{"module_classes": ["Block"]}'), os.symlink("policy.json", "link.json"),
                                     [GPT, "--policy", "policy.json", "-o", "link.json"])[2],
    "output-is-directory": lambda: (os.mkdir("out"), [GPT, "-o", "out"])[1],
    "output-disk-full": lambda: [GPT, "-o", "/dev/full"],
    "usage-no-model": lambda: [],
    "refused-mixed-requires-grad": lambda: refused("frozen"),
    "refused-mixed-dtype": lambda: refused("dtypes"),
    "refused-scalar-param": lambda: refused("scalar"),
    "root-too-large": lambda: policy('{"module_classes": ["LayerNorm"]}'),
    "tied-weight-split": lambda: policy('{"min_num_params": 20000}'),
    "tied-weight-split-orig-params": lambda: policy('{"min_num_params": 20000, '
                                                    '"fsdp": {"use_orig_params": true, "world_size": 8}}'),
    "usage-bad-format": lambda: [GPT, "--format", "yaml"],
    "usage-bad-world-size": lambda: [GPT, "--world-size", "0"],
    "usage-emit-format": lambda: [GPT, "--emit", "accelerate", "-f", "json"],
    "emit-accelerate-fsdp2-group": lambda: policy('{"groups": [{"modules": ["blocks.0", "blocks.1"]}], '
                                                  '"fsdp": {"version": 2}}') + ["--emit", "accelerate"],
    "emit-accelerate-fsdp2-ignored-params": lambda: policy('{"module_classes": ["Block"], "ignored_params": '
                                                           '["lm_head.*"], "fsdp": {"version": 2}}')
    + ["--emit", "accelerate"],
    "emit-accelerate-keep-low-grads": lambda: policy('{"module_classes": ["Block"], "mixed_precision": '
                                                     '{"param_dtype": "bfloat16", "reduce_dtype": "bfloat16", '
                                                     '"buffer_dtype": "bfloat16", "keep_low_precision_grads": true}}')
    + ["--emit", "accelerate"],
    "emit-accelerate-checkpointing": lambda: policy('{"module_classes": ["Block"], "activation_checkpointing": '
                                                    '{"modules": ["blocks.1"]}}') + ["--emit", "accelerate"],
    "emit-torch-fsdp2-root-checkpointed": lambda: policy('{"module_classes": ["Block"], "activation_checkpointing": '
                                                         '{"modules": [""]}, "fsdp": {"version": 2}}')
    + ["--emit", "torch"],
    "emit-accelerate-fsdp2-cast-inputs": lambda: policy('{"module_classes": ["Block"], "mixed_precision": '
                                                        '{"param_dtype": "bfloat16", "reduce_dtype": "bfloat16", '
                                                        '"cast_forward_inputs": false}, "fsdp": {"version": 2}}')
    + ["--emit", "accelerate"],
    "usage-hybrid-group": lambda: [GPT, "--world-size", "12", "--sharding-strategy", "HYBRID_SHARD",
                                   "--shard-group-size", "8"],
    "usage-option-typo": lambda: [GPT, "--polcy", "p.json"],
    "usage-fractional-count": lambda: [GPT, "--max-unit-numel", "2.5"],
    "usage-fsdp2-strategy": lambda: [GPT, "--fsdp-version", "2", "--sharding-strategy", "SHARD_GRAD_OP"],
    "usage-dim-format": lambda: [GPT, "--dim", "seq"],
    "pt2-dim-unknown": lambda: (shutil.copy(DYN, "dyn.pt2"), ["dyn.pt2", "--dim", "heads=2"])[1],
    "pt2-dim-twice": lambda: (shutil.copy(DYN, "dyn.pt2"), ["dyn.pt2", "--dim", "seq=64", "--dim", "input_ids.1=32"])[1],
    "model-dim-torchscript": lambda: (shutil.copy(GPT, "tiny.pt"), ["tiny.pt", "--dim", "seq=64"])[1],
    "usage-nan-share": lambda: [GPT, "--max-root-share", "nan"],
    # Issue 27: the step-time estimate's options and --flops files.
    "hardware-bad-preset": lambda: [GPT, "--hardware", "h300"],
    "hardware-zero-bandwidth": lambda: [GPT, "--intra-node-bandwidth", "0"],
    "hardware-negative-bandwidth": lambda: [GPT, "--inter-node-bandwidth", "-5"],
    "hardware-nan-bandwidth": lambda: [GPT, "--intra-node-bandwidth", "nan"],
    "hardware-huge-bandwidth": lambda: [GPT, "--inter-node-bandwidth", "1e400"],
    "hardware-bandwidth-unit": lambda: [GPT, "--intra-node-bandwidth", "450GB"],
    "hardware-efficiency-above-one": lambda: [GPT, "--efficiency", "1.5"],
    "hardware-efficiency-zero": lambda: [GPT, "--memory-efficiency", "0"],
    "hardware-efficiency-nan": lambda: [GPT, "--comm-efficiency", "nan"],
    "hardware-efficiency-text": lambda: [GPT, "--efficiency", "half"],
    "hardware-gpus-per-node-zero": lambda: [GPT, "--gpus-per-node", "0"],
    "hardware-gpus-per-node-fraction": lambda: [GPT, "--gpus-per-node", "2.5"],
    "hardware-policy-preset": lambda: policy('{"hardware": {"preset": "h300"}}'),
    "hardware-policy-bandwidth": lambda: policy('{"hardware": {"intra_node_bandwidth": 0}}'),
    "hardware-policy-efficiency": lambda: policy('{"hardware": {"compute_efficiency": 2}}'),
    "hardware-policy-gpus-per-node": lambda: policy('{"hardware": {"gpus_per_node": 0}}'),
    "hardware-policy-unknown-key": lambda: policy('{"hardware": {"nvlink": 900}}'),
    "flops-missing": lambda: [GPT, "--flops", "missing.json"],
    "flops-not-json": lambda: flops("not json\n"),
    "flops-no-modules": lambda: flops('{"x": 1}'),
    "flops-unknown-module": lambda: flops('{"modules": {"": {"forward": 10, "backward": 20}, '
                                          '"blocks.9": {"forward": 1, "backward": 2}}}'),
    "flops-no-root": lambda: flops('{"modules": {"blocks.0": {"forward": 1, "backward": 2}}}'),
    "flops-no-backward": lambda: flops('{"modules": {"": {"forward": 10}}}'),
    "flops-negative": lambda: flops('{"modules": {"": {"forward": -1, "backward": 20}}}'),
    "flops-fractional": lambda: flops('{"modules": {"": {"forward": 1.5, "backward": 2}}}'),
    "flops-children-exceed": lambda: flops('{"modules": {"": {"forward": 10, "backward": 20}, '
                                           '"blocks.0": {"forward": 11, "backward": 2}}}'),
    # Issue 29: hostile inputs (docs/limits.md).
    "policy-device": lambda: [GPT, "--policy", "/dev/zero"],
    "policy-too-big": lambda: (hostile.write("big.json", "{}" + " " * (16 << 20)), [GPT, "--policy", "big.json"])[1],
    "policy-duplicate-key": lambda: policy('{"module_classes": ["Block"],\n "module_classes": ["MLP"]}'),
    "policy-json-deep": lambda: policy('{"$schema": ' + "[" * 100 + "]" * 100 + "}"),
    "policy-control-char": lambda: policy('{"module_classes": ["\\u001b[31mBlock"]}'),
    "policy-long-string": lambda: policy(json.dumps({"module_classes": ["B" * 5000]})),
    "policy-long-list": lambda: policy(json.dumps({"ignored_params": ["p%d" % i for i in range(100001)]})),
    "expect-device": lambda: [GPT, "--expect", "/dev/zero"],
    "plan-duplicate-unit": lambda: plan_file(units_twice),
    "plan-bad-numel": lambda: plan_file(set_numel(2 ** 64 + 7)),
    "plan-control-char": lambda: plan_file(escape_path),
    "accelerate-yaml-unterminated": lambda: yaml_file('mixed_precision: "bf16\n'),
    "accelerate-yaml-python-tag": lambda: yaml_file('x: !!python/object/apply:os.system ["echo hi"]\n'),
    "accelerate-yaml-documents": lambda: yaml_file("---\ndistributed_type: FSDP\n"),
    "accelerate-yaml-control-char": lambda: yaml_file("x\x1b[31m: 1\n"),
    "accelerate-yaml-utf8": lambda: (hostile.write("accel.yaml", b"distributed_type: FSDP\nx: \xff\n"),
                                     [GPT, "--policy", "accel.yaml"])[1],
    "accelerate-yaml-tab": lambda: yaml_file("mixed_precision:\tbf16\n"),
    "accelerate-yaml-undefined-alias": lambda: yaml_file("x: *nowhere\n"),
    "accelerate-yaml-self-alias": lambda: yaml_file("x: &a [*a]\n"),
    "accelerate-yaml-laughs": lambda: yaml_file(hostile.laughs(6)),
    "accelerate-yaml-deep": lambda: yaml_file("tpu_env: " + "[" * 64 + "]" * 64 + "\n"),
    "accelerate-yaml-long-scalar": lambda: yaml_file("tpu_name: " + "n" * 70000 + "\n"),
    "accelerate-yaml-int-base": lambda: yaml_file("tpu_name: 0b_\n"),
    "accelerate-yaml-int-huge": lambda: yaml_file("tpu_name: 0x8000000000000000\n"),
    "accelerate-regex-backref": lambda: regex(r"(blocks)\.\1"),
    "accelerate-regex-lookahead": lambda: regex(r"blocks\.(?!0)\d+"),
    "accelerate-regex-deep": lambda: regex("(" * 101 + "lm_head" + ")" * 101),
    "accelerate-hsdp-uneven": lambda: (hostile.write("accel.yaml", "distributed_type: FSDP\nnum_processes: 8\n"
                                                     "num_machines: 3\nfsdp_config:\n"
                                                     "  fsdp_sharding_strategy: HYBRID_SHARD\n"),
                                       [GPT, "--policy", "accel.yaml"])[1],
    "model-deflate-bomb": lambda: [hostile.pt_bomb("bomb.pt", "tiny_gpt/data.pkl")],
    "model-jit-deflate-bomb": lambda: [hostile.pt_bomb("bomb.pt", "tiny_gpt/data.pkl"), "--loader", "jit"],
    "model-code-nesting": lambda: [hostile.deep_parens("deep.pt")],
    "model-code-header": lambda: code_edit(b"class Block(Module):", b"class Block(Module1:"),
    "model-code-attribute": lambda: code_edit(b"  blocks : ", b"  blocks ; "),
    "model-code-undeclared": lambda: code_edit(b"  blocks : ", b"  blocks = "),
    "model-code-slot-type": lambda: code_edit(b"  mlp : __torch__.models.MLP", b"  mlp : __torch__.models.MLQ"),
    "model-code-flag": lambda: code_edit(b'__buffers__ = ["mask", ]', b'__buffers__ = ["masq", ]'),
    "pt2-deflate-bomb": lambda: [hostile.pt2_bomb("bomb.pt2")],
    "usage-module-classes-empty": lambda: [GPT, "--module-classes", "Block,,Head"],
}


class ErrorTable(unittest.TestCase):
    def jit_loader_built(self):
        """False for a binary built without LibTorch: its --loader jit rows cannot be checked."""
        if not hasattr(self, "_jit"):
            r = subprocess.run([BINARY, os.path.join(ROOT, "sample_models", "tiny_gpt.pt"), "--loader", "jit",
                                "-f", "json"], capture_output=True, text=True, timeout=120)
            self._jit = "--loader jit is not available" not in r.stderr
        return self._jit

    def test_every_row(self):
        rows = read_table()
        self.assertEqual(sorted(rows), sorted(CASES), "docs/errors.md rows and this test's cases differ")
        for case, (code, message) in sorted(rows.items()):
            with self.subTest(case=case), tempfile.TemporaryDirectory() as tmp:
                cwd = os.getcwd()
                os.chdir(tmp)
                try:
                    argv = CASES[case]()
                    # A case may send standard output elsewhere: a file, or nowhere (closed).
                    stdout = argv.get("stdout") if isinstance(argv, dict) else None
                    argv = argv["argv"] if isinstance(argv, dict) else argv
                    if "--loader" in argv and argv[argv.index("--loader") + 1] == "jit" and not self.jit_loader_built():
                        self.skipTest("this fsdp-plan was built without LibTorch (no --loader jit)")
                    before = set(os.listdir("."))
                    if stdout is None:
                        # -f json for the plan's warnings; --emit writes no plan (and refuses --format).
                        fmt = [] if "--emit" in argv else ["-f", "json"]
                        r = subprocess.run([BINARY, *argv, *fmt], capture_output=True, text=True, timeout=120)
                    else:
                        command = [BINARY, *argv, "-f", "json"]
                        if stdout == "closed":
                            command = ["sh", "-c", 'exec "$@" >&-', "sh", *command]
                            out = None
                        else:
                            out = open(stdout, "w")
                        try:
                            r = subprocess.run(command, stdout=out, stderr=subprocess.PIPE, text=True, timeout=120)
                        finally:
                            if out:
                                out.close()
                        r.stdout = ""
                    after = set(os.listdir("."))
                finally:
                    os.chdir(cwd)
                self.assertEqual(r.returncode, code, f"{case}: {r.stderr}")
                if code == 2:
                    self.assertEqual(r.stdout, "", case)
                    self.assertEqual(r.stderr, message + "\n", case)
                    self.assertEqual(after, before, f"{case}: left files behind")
                else:
                    warnings = [w["kind"] + ": " + w["message"] for w in json.loads(r.stdout)["warnings"]]
                    self.assertIn(message, warnings, case)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        BINARY = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
