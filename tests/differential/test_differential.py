#!/usr/bin/python3
"""Differential test: fsdp-plan's plan vs PyTorch's own plan.

For every sample model (rebuilt eagerly from sample_models/models.py, scripted
and saved to a temp dir) and a few torchvision architectures (weights=None,
scripted during the test), run several policies through

    fsdp-plan MODEL.pt --policy POLICY.json --format json

and compare with reference_plan.py (PyTorch 1.13's wrap.py + the seed's
grouping pass on the eager model): unit paths in order, then per unit the
ordered parameter names with shape and dtype, buffer names (same), class and
mixed_precision.

    /usr/bin/python3 tests/differential/test_differential.py [BINARY]
        [-k SUBSTRING] [--keep DIR] [-j JOBS] [-v]

BINARY defaults to $FSDP_PLAN, then /work/main/build/app/fsdp-plan (the
build tree next to this checkout). Prints one line per (model, policy) case,
then `N passed, M failed`; exits 1 on any failure.
"""
import argparse
import concurrent.futures
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
SAMPLES = os.path.join(REPO, "sample_models")
sys.path.insert(0, HERE)
sys.path.insert(0, SAMPLES)

warnings.filterwarnings("ignore")  # TorchScript chatter about constants

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import models  # noqa: E402
import reference_plan as rp  # noqa: E402
from plan_compare import compare_plans, default_binary, run_binary  # noqa: E402

from plan_compare import MAX_MESSAGES  # noqa: E402

MP = {"param_dtype": "bfloat16", "reduce_dtype": "float32", "buffer_dtype": "bfloat16"}


# ---------------------------------------------------------------------------
# Models and policies
# ---------------------------------------------------------------------------
def _tv():
    import torchvision  # noqa: F401
    return torchvision


def tv_resnet18():
    return _tv().models.resnet18(weights=None)


def tv_mobilenet_v3_small():
    return _tv().models.mobilenet_v3_small(weights=None)


# Reduced configurations of torchvision architectures: the same module classes
# as vit_b_16 / convnext_tiny / swin_v2_t at a fraction of the size.
def tv_vit_small():
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                             hidden_dim=32, mlp_dim=64, num_classes=10)


def tv_convnext_small():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    return ConvNeXt([CNBlockConfig(16, 32, 2), CNBlockConfig(32, None, 1)], num_classes=10)


def tv_swin_v2_small():
    from torchvision.models import swin_transformer as st
    return st.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[1, 1], num_heads=[1, 2],
                              window_size=[4, 4], num_classes=10,
                              block=st.SwinTransformerBlockV2, downsample_layer=st.PatchMergingV2)


def sample(name: str) -> Callable[[], nn.Module]:
    return lambda: models.build(name)


def tv(fn: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build():
        torch.manual_seed(0)
        return fn().eval()
    return build


# model name -> (builder, {policy name: policy dict})
CASES: Dict[str, Tuple[Callable[[], nn.Module], Dict[str, Dict[str, Any]]]] = {
    "tiny_gpt": (sample("tiny_gpt"), {
        "empty": {},
        "blocks": {"module_classes": ["Block"]},
        "blocks_dotted": {"module_classes": ["models.Block"]},
        "size_2e4": {"min_num_params": 20000},
        # Each Block (~50k) is below 6e4, the ModuleList (~150k) above: excluded by default.
        "size_6e4_exclude": {"min_num_params": 60000},
        "size_6e4_noexclude": {"min_num_params": 60000, "exclude_wrap_modules": []},
        "tied_linear_embedding": {"module_classes": ["Linear", "Embedding"]},
        "tied_linear_only": {"module_classes": ["torch.nn.Linear"]},
        "tied_head_ignored": {"module_classes": ["Block"], "ignored_modules": ["lm_head"]},
        # `lm_head.weight` is the tied tensor's second name (named_parameters()
        # reports it as tok_emb.weight); a glob on any name of a tied tensor
        # ignores the tensor (reference_plan.IGNORED_PARAMS_NAMES).
        "tied_alias_glob": {"module_classes": ["Block"], "ignored_params": ["lm_head.weight"]},
        "mp_only": {"mixed_precision": MP},
        "blocks_mp_ln": {"module_classes": ["Block"],
                         "mixed_precision": dict(MP, ignore_classes=["LayerNorm"])},
        "ignored_globs": {"module_classes": ["Block"], "ignored_modules": ["blocks.*.mlp"],
                          "ignored_params": ["*.bias"]},
        "ignore_whole_block": {"module_classes": ["Block"], "ignored_modules": ["blocks.1"]},
        "all_modules": {"module_classes": ["Module"]},
        "combo": {"module_classes": ["models.Block"], "min_num_params": 30000,
                  "mixed_precision": dict(MP, ignore_classes=["torch.nn.LayerNorm"]),
                  "ignored_params": ["pos_emb.*"], "ignored_modules": ["blocks.2.attn"]},
    }),
    "small_cnn": (sample("small_cnn"), {
        "empty": {},
        "blocks": {"module_classes": ["ConvBNReLU"]},
        "size_3e4": {"min_num_params": 30000},
        "size_1e4": {"min_num_params": 10000},
        # head (9866) wraps as a whole at 9000 unless Sequential is excluded.
        "size_9e3": {"min_num_params": 9000},
        "size_9e3_exclude_sequential": {"min_num_params": 9000,
                                        "exclude_wrap_modules": ["torch.nn.Sequential", "ModuleList"]},
        "batchnorm_base": {"module_classes": ["_BatchNorm"]},
        "conv_base": {"module_classes": ["torch.nn.modules.conv._ConvNd"]},
        "mp_only": {"mixed_precision": MP},
        "size_mp": {"min_num_params": 30000, "mixed_precision": MP},
        "ignored": {"module_classes": ["ConvBNReLU"], "ignored_modules": ["stage2.1", "head"],
                    "ignored_params": ["stem.*"]},
        # stem.bn is ignored: not a unit even though mixed precision wraps _BatchNorm.
        "size_mp_ignored_bn": {"min_num_params": 30000, "mixed_precision": MP,
                               "ignored_modules": ["stem"]},
        "size_0": {"min_num_params": 0},
    }),
    "mha_encoder": (sample("mha_encoder"), {
        "empty": {},
        "layers": {"module_classes": ["TransformerEncoderLayer"]},
        "layers_dotted": {"module_classes": ["torch.nn.TransformerEncoderLayer"]},
        # MHA (16640) is a force leaf: neither descended into nor wrapped.
        "size_5e3_forceleaf": {"min_num_params": 5000},
        "size_4e3_noleaf": {"min_num_params": 4000, "force_leaf_modules": []},
        # heads (ModuleDict, 585) is above 550, each head below: excluded by default.
        "size_550_moduledict": {"min_num_params": 550},
        "size_550_noexclude": {"min_num_params": 550, "exclude_wrap_modules": []},
        "linear_base": {"module_classes": ["torch.nn.Linear"]},
        "linear_plus_size": {"module_classes": ["Linear"], "min_num_params": 10 ** 9},
        "layers_mp_ln": {"module_classes": ["TransformerEncoderLayer"],
                         "mixed_precision": dict(MP, ignore_classes=["LayerNorm"])},
        "ignored": {"module_classes": ["TransformerEncoderLayer"],
                    "ignored_modules": ["encoder.layers.1.self_attn"],
                    "ignored_params": ["*in_proj*", "heads.*"]},
    }),
    "tied_trunk": (sample("tied_trunk"), {
        "empty": {},
        # trunk's remainder is 10550 - 12550 = -2000: not wrapped.
        "size_2e3_negative_remainder": {"min_num_params": 2000},
        "size_0": {"min_num_params": 0},
        # root's own `proj` is trunk.extra.weight: the root unit claims it first.
        "linear": {"module_classes": ["Linear"]},
        "trunk_and_linear": {"module_classes": ["Trunk", "Linear"]},
        "all_modules": {"module_classes": ["torch.nn.Module"]},
        "ignore_dec_alias": {"module_classes": ["Trunk"], "ignored_params": ["trunk.dec.weight"]},
        "ignore_dec_module": {"module_classes": ["Linear"], "ignored_modules": ["trunk.dec"]},
        "root_class_mp": {"module_classes": ["Linear"],
                          "mixed_precision": {"ignore_classes": ["TiedTrunk", "Embedding"]}},
    }),
    "resnet18": (tv(tv_resnet18), {
        "empty": {},
        "blocks": {"module_classes": ["BasicBlock"]},
        "size_1e5": {"min_num_params": 100000},
        "size_1e6": {"min_num_params": 1000000},
        "mp_size_1e6": {"min_num_params": 1000000, "mixed_precision": MP},
        "ignored": {"module_classes": ["BasicBlock"], "ignored_modules": ["layer4"],
                    "ignored_params": ["*.bn*.weight", "fc.*"]},
    }),
    "mobilenet_v3_small": (tv(tv_mobilenet_v3_small), {
        "empty": {},
        "blocks": {"module_classes": ["InvertedResidual"]},
        "conv_norm_act": {"module_classes": ["Conv2dNormActivation"]},
        "size_5e4": {"min_num_params": 50000},
        # Conv2dNormActivation is a torchvision subclass of nn.Sequential.
        "size_5e4_exclude_sequential": {"min_num_params": 50000,
                                        "exclude_wrap_modules": ["Sequential"]},
        "blocks_mp": {"module_classes": ["InvertedResidual"], "mixed_precision": MP},
    }),
    "vit_small": (tv(tv_vit_small), {
        "blocks": {"module_classes": ["EncoderBlock"]},
        # MHA is 4224 params: a force leaf at 4000.
        "size_4e3": {"min_num_params": 4000},
        "size_4e3_noleaf": {"min_num_params": 4000, "force_leaf_modules": []},
        # MLPBlock -> torchvision MLP -> nn.Sequential
        "mlp_base": {"module_classes": ["torchvision.ops.misc.MLP"]},
        "sequential": {"module_classes": ["Sequential"]},
        "blocks_mp_ln": {"module_classes": ["EncoderBlock"],
                         "mixed_precision": dict(MP, ignore_classes=["LayerNorm"])},
    }),
    "convnext_small": (tv(tv_convnext_small), {
        "blocks": {"module_classes": ["CNBlock"]},
        # LayerNorm2d is torchvision's subclass of nn.LayerNorm.
        "layernorm": {"module_classes": ["LayerNorm"]},
        "size_2e3": {"min_num_params": 2000},
        "blocks_mp_ln": {"module_classes": ["CNBlock"],
                         "mixed_precision": dict(MP, ignore_classes=["torch.nn.LayerNorm"])},
        "ignored": {"module_classes": ["CNBlock"], "ignored_params": ["*layer_scale"]},
    }),
    "swin_v2_small": (tv(tv_swin_v2_small), {
        # SwinTransformerBlockV2 -> SwinTransformerBlock (both torchvision)
        "blocks_base": {"module_classes": ["SwinTransformerBlock"]},
        "attn_base": {"module_classes": ["ShiftedWindowAttention"]},
        "size_2e3": {"min_num_params": 2000},
        "mp": {"module_classes": ["SwinTransformerBlockV2"], "mixed_precision": MP},
    }),
}


# ---------------------------------------------------------------------------
# Comparison (compare_plans lives in plan_compare.py)
# ---------------------------------------------------------------------------
def notes_for(expected: Dict[str, Any], actual: Dict[str, Any], policy: Dict[str, Any],
              model: nn.Module) -> List[str]:
    """Non-fatal observations (contract parts the test does not enforce)."""
    notes = []
    m = actual.get("model") or {}
    for key in ("param_numel", "buffer_numel", "num_modules"):
        if key in m and m[key] != expected["model"][key]:
            notes.append(f"model.{key}: PyTorch says {expected['model'][key]}, plan says {m[key]}")
    has_auto = "module_classes" in policy or "min_num_params" in policy
    if policy.get("mixed_precision") is not None and has_auto:
        ign = rp.mp_ignore_classes(policy, model)
        want = any(isinstance(x, ign) for x in model.modules())
        kinds = [w.get("kind", "") + " " + w.get("message", "") for w in actual.get("warnings") or []]
        got = any("mixed" in k.lower() for k in kinds)
        if want != got:
            notes.append(f"mixed-precision override warning: PyTorch {'warns' if want else 'does not warn'}, "
                         f"plan warnings: {[w.get('kind') for w in actual.get('warnings') or []]}")
    return notes


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------
def tree_signature(mod: nn.Module):
    return ([n for n, _ in mod.named_modules()],
            [(n, tuple(t.shape), t.dtype) for n, t in mod.named_parameters()],
            [(n, tuple(t.shape), t.dtype) for n, t in mod.named_buffers()])


def script_to(model: nn.Module, path: str) -> Optional[str]:
    """Scripts and saves `model`; returns a note if the archive's tree differs."""
    torch.jit.save(torch.jit.script(model), path)
    loaded = torch.jit.load(path)
    a, b = tree_signature(model), tree_signature(loaded)
    if a != b:
        for what, x, y in zip(("modules", "parameters", "buffers"), a, b):
            if x != y:
                diff = [v for v in y if v not in x][:5] + ["-"] + [v for v in x if v not in y][:5]
                return f"scripted {what} differ from the eager model: {diff}"
    return None


def check_committed_sample(name: str) -> List[str]:
    """sample_models/NAME.pt must hold exactly what models.build(NAME) builds."""
    path = os.path.join(SAMPLES, name + ".pt")
    if not os.path.exists(path):
        return [f"{path} is missing (run sample_models/make_models.py)"]
    eager = models.build(name)
    loaded = torch.jit.load(path)
    msgs = []
    if tree_signature(eager) != tree_signature(loaded):
        msgs.append(f"{path}: module tree differs from models.py; regenerate with make_models.py")
    else:
        for (n, a), (_, b) in zip(list(eager.named_parameters()) + list(eager.named_buffers()),
                                  list(loaded.named_parameters()) + list(loaded.named_buffers())):
            if not torch.equal(a, b):
                msgs.append(f"{path}: tensor {n!r} differs from models.py's seeded init; regenerate")
                break
    return msgs


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary", nargs="?", default=None)
    ap.add_argument("-k", dest="only", default=None, help="run cases whose 'model / policy' contains this")
    ap.add_argument("--keep", default=None, help="write models, policies, plans and references here")
    ap.add_argument("-j", dest="jobs", type=int, default=2, help="parallel binary runs (default 2)")
    ap.add_argument("-v", dest="verbose", action="store_true", help="print every difference and note")
    args = ap.parse_args(argv)
    binary = args.binary or default_binary()
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        print(f"fsdp-plan binary not found or not executable: {binary} (pass it or set FSDP_PLAN)")
        print("0 passed, 1 failed")
        return 1

    t0 = time.time()
    passed = failed = 0
    tmp = tempfile.TemporaryDirectory(prefix="fsdp-diff-")
    work = args.keep or tmp.name
    os.makedirs(work, exist_ok=True)

    def report(ok: bool, label: str, msgs: List[str], notes: List[str] = ()):
        nonlocal passed, failed
        if ok:
            passed += 1
        else:
            failed += 1
        head = msgs[0] if msgs else ""
        print(f"{'PASS' if ok else 'FAIL'} {label}" + (f": {head}" if not ok and head else ""), flush=True)
        limit = None if args.verbose else MAX_MESSAGES
        rest = msgs[1:] if not ok else []
        for m in rest[:limit]:
            print(f"    {m}")
        if limit is not None and len(rest) > limit:
            print(f"    ... {len(rest) - limit} more differences (-v shows all)")
        for n in notes:
            print(f"    note: {n}")

    # Committed sample archives are current.
    for name in models.SAMPLE_MODELS:
        label = f"{name} / committed sample_models/{name}.pt matches models.py"
        if args.only and args.only not in label:
            continue
        msgs = check_committed_sample(name)
        report(not msgs, label, msgs)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs))
    for mname, (builder, policies) in CASES.items():
        selected = {p: v for p, v in policies.items() if not args.only or args.only in f"{mname} / {p}"}
        if not selected:
            continue
        try:
            model = builder()
            model_path = os.path.join(work, mname + ".pt")
            tree_note = script_to(model, model_path)
        except Exception:
            for pname in selected:
                report(False, f"{mname} / {pname}", ["could not build/script the model:\n" + traceback.format_exc()])
            continue
        jobs = {}
        for pname, policy in selected.items():
            ppath = os.path.join(work, f"{mname}.{pname}.policy.json")
            with open(ppath, "w") as f:
                json.dump(policy, f, indent=1)
            # Exit 1: a plan FSDP would refuse (tied_trunk's float64 head among float32 is a mixed_dtype
            # error when they share a unit); the grouping is still compared.
            jobs[pname] = pool.submit(run_binary, binary, model_path, ppath, ok_codes=(0, 1))
        for pname, policy in selected.items():
            label = f"{mname} / {pname}"
            try:
                expected = rp.reference_plan(model, policy)
            except Exception:
                report(False, label, ["reference_plan failed:\n" + traceback.format_exc()])
                continue
            actual, err = jobs[pname].result()
            if args.keep:
                with open(os.path.join(work, f"{mname}.{pname}.expected.json"), "w") as f:
                    json.dump(expected, f, indent=1)
                if actual is not None:
                    with open(os.path.join(work, f"{mname}.{pname}.plan.json"), "w") as f:
                        json.dump(actual, f, indent=1)
            if actual is None:
                report(False, label, [err])
                continue
            msgs = compare_plans(expected, actual)
            notes = notes_for(expected, actual, policy, model)
            if tree_note:
                notes.insert(0, tree_note)
            if not msgs:
                label += f" ({len(expected['units'])} units)"
            report(not msgs, label, msgs, notes if (msgs or args.verbose) else [])
    pool.shutdown()
    print(f"# {time.time() - t0:.1f}s, binary {binary}", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
