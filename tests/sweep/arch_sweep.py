#!/usr/bin/env python3
"""Every causal-LM architecture of the pinned transformers, planned and measured (issue 40, item 5).

For each model_type of transformers' MODEL_FOR_CAUSAL_LM_MAPPING_NAMES: its default config made tiny
(tiny_config: 2 layers, hidden 64, 4 heads of 16, 2 KV heads, vocab 256, 4 experts of 2 per token,
...), built with a fixed seed in float32, SDPA, train mode; exported by fsdp_plan.export.export_module
(the exporter's own path: weight stand-ins, the eager attention checks) with input_ids and labels at
batch 2, seq 128; planned by the binary (`--device cpu`, FSDP2 on each repeated `_no_split_modules`
class, AdamW, the world size, activation checkpointing on those classes or none); and measured: the
same model on the fake backend (rank 0), fully_shard on the same classes and the root, AdamW, two
steps under FSDPMemTracker on real CPU tensors (so transformers takes the branch eager training takes),
the second step's peak and the activations held after its forward (tests/activations/peak_oracle.py: two_steps).

Each architecture runs in a process of its own (8 GB of address space, 600 s) and gets one outcome,
the first stage that fails (`limit`: it ran out of either): `config` (the tiny config does not
build a model), `export` (torch.export or the exporter refuses; its one line), `plan` (the binary
exits 2 or 3), `reference` (the tracked step fails: the architecture does not train this way on CPU),
else `ok` when every case's peak is within TOLERANCE of the tracker's, `miss` otherwise (the ratios).

    $VENV/bin/python tests/sweep/arch_sweep.py BINARY [--only a,b,...] [--subset ci] [--worlds 1,8] [--jobs N]
                                              [--json FILE] [--markdown FILE]

Prints a line per architecture and the counts per outcome; exit 1 when an architecture of --only or of
the subset is not `ok` (the full sweep reports and exits 0).
"""
import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "activations"))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

import torch  # noqa: E402
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy  # noqa: E402

import peak_oracle  # noqa: E402
from fsdp_plan.export import ExportError, export_module  # noqa: E402

TOLERANCE = 0.05
ONE_TIMEOUT_S = 600  # per architecture
ONE_MEMORY_GB = 8    # address space per architecture (RLIMIT_AS)
BATCH, SEQ = 2, 128
# The subset CI runs (ctest arch_sweep): 16 of the 30 that were all `ok` in the full sweep of 2026-12-05
# (docs/fidelity.md), one per pattern a fix covered: dense (llama), GQA (qwen3), Gemma 3's 0-dim buffer and
# type_as norms (gemma3_text), fused QKV (phi3), Conv1D (gpt2), parallel residual (gpt_neox), post-norm
# (olmo2), LayerNorm with bias (starcoder2), logit scale (cohere), NoPE layers (smollm3), MoE (mixtral,
# qwen3_moe, granitemoe), MLA (deepseek_v3), attention sinks (gpt_oss), complex rotary (llama4_text).
# 461 s for 30 at ctest's -j2 (2026-12-06); the other 14 run in the full sweep.
CI_SUBSET = [
    "llama", "qwen3", "gemma3_text", "phi3", "gpt2", "gpt_neox", "olmo2", "starcoder2", "cohere", "smollm3",
    "mixtral", "qwen3_moe", "granitemoe", "deepseek_v3", "gpt_oss", "llama4_text",
]

# Attribute names transformers' configs use for one quantity, and the tiny value.
TINY = [
    (("num_hidden_layers", "n_layer", "num_layers", "n_layers"), 2),
    (("hidden_size", "n_embd", "d_model", "dim"), 64),
    (("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"), 128),
    (("num_attention_heads", "n_head", "n_heads", "num_heads"), 4),
    (("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"), 2),
    (("head_dim", "kv_channels"), 16),
    # DeepSeek's multi-head latent attention, and its grouped routing.
    (("qk_rope_head_dim", "qk_nope_head_dim"), 8),
    (("v_head_dim",), 16),
    (("kv_lora_rank", "q_lora_rank"), 32),
    (("n_group", "topk_group", "first_k_dense_replace"), 1),
    (("num_kv_shared_layers",), 0),  # Gemma 3n: layers that reuse an earlier layer's cache
    (("vocab_size",), 256),
    (("max_position_embeddings", "n_positions", "max_seq_len", "n_ctx"), 128),
    (("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"), 4),
    (("num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token"), 2),
    (("moe_intermediate_size", "expert_intermediate_size", "shared_expert_intermediate_size"), 64),
]


def tiny_config(model_type: str):
    """The model_type's default config with every size above made tiny; per-layer lists cut to the
    layer count. Raises whatever transformers raises."""
    from transformers import CONFIG_MAPPING
    cfg = CONFIG_MAPPING[model_type]()
    text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    for c in {id(cfg): cfg, id(text): text}.values():
        for names, value in TINY:
            for n in names:
                if isinstance(getattr(c, n, None), int) and not isinstance(getattr(c, n), bool):
                    with contextlib.suppress(AttributeError):  # a derived property (Falcon's head_dim)
                        setattr(c, n, value)
        layers = next((getattr(c, n) for n in TINY[0][0] if isinstance(getattr(c, n, None), int)), 2)
        for n in ("layer_types", "mlp_only_layers", "block_types", "attn_layer_indices"):
            v = getattr(c, n, None)
            if isinstance(v, list) and len(v) > layers and n in ("layer_types", "block_types"):
                setattr(c, n, v[:layers])
        if isinstance(getattr(c, "qk_rope_head_dim", None), int):  # MLA: rotary dims are the head_dim
            with contextlib.suppress(AttributeError):
                c.head_dim = c.qk_rope_head_dim
                if hasattr(c, "qk_head_dim"):
                    c.qk_head_dim = c.qk_nope_head_dim + c.qk_rope_head_dim
        c.use_cache = False  # training: no KV cache in the outputs (torch.export refuses DynamicCache)
        for n in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            v = getattr(c, n, None)
            if isinstance(v, int) and v >= 256:
                setattr(c, n, 0)
    return cfg


def build(model_type: str):
    from transformers import AutoModelForCausalLM
    torch.manual_seed(0)
    try:
        model = AutoModelForCausalLM.from_config(tiny_config(model_type), attn_implementation="sdpa")
    except ValueError as e:  # no SDPA (Mamba, gpt-oss's sinks): the architecture's own attention
        if "attention implementation" not in str(e):
            raise
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(tiny_config(model_type), attn_implementation="eager")
    return model.float().train()


def layer_classes(model) -> List[str]:
    """The repeated classes of _no_split_modules; without one, the repeated *Layer / *Block classes."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    count: Dict[str, int] = {}
    for m in model.modules():
        count[type(m).__name__] = count.get(type(m).__name__, 0) + 1
    out = sorted(n for n in names if count.get(n, 0) > 1)
    return out or sorted(n for n, k in count.items() if k > 1 and n.endswith(("Layer", "Block")))


def inputs(model) -> Dict[str, torch.Tensor]:
    vocab = min(int(getattr(model.config.get_text_config(), "vocab_size", 256) or 256), 256)
    g = torch.Generator().manual_seed(1)
    return {"input_ids": torch.randint(3, vocab, (BATCH, SEQ), generator=g),
            "labels": torch.randint(3, vocab, (BATCH, SEQ), generator=g)}


def tracked(model_type: str, world: int, ac: bool) -> Dict[str, int]:
    peak_oracle.init_fake(world)
    mesh = init_device_mesh("cpu", (world,))
    model = build(model_type)
    classes = tuple({type(m) for m in model.modules() if type(m).__name__ in layer_classes(model)})
    if ac:
        peak_oracle.apply_fsdp2_ac(model, classes)
    peak_oracle.apply_fully_shard(model, classes, mesh, MixedPrecisionPolicy())
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, foreach=False)
    kwargs = inputs(model)
    tracker = FSDPMemTracker(model, optim)
    tracker.track_inputs(tuple(kwargs.values()))
    res = peak_oracle.two_steps(tracker, model, optim, kwargs)
    return {"peak": res["peak_bytes"], "after_forward": res["after_forward"].get("Activation", 0)}


def planned(binary: str, pt2: str, tmp: str, classes: List[str], world: int, ac: bool) -> Dict[str, int]:
    policy = {"module_classes": classes, "fsdp": {"version": 2, "world_size": world, "optimizer": "adamw"}}
    if ac:
        policy["activation_checkpointing"] = {"module_classes": classes}
    path = os.path.join(tmp, f"policy_w{world}_{ac}.json")
    with open(path, "w") as f:
        json.dump(policy, f)
    r = subprocess.run([binary, pt2, "--policy", path, "--device", "cpu", "-f", "json", "-q"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode not in (0, 1):
        raise RuntimeError(f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ''}")
    memory = json.loads(r.stdout)["memory"]
    return {"peak": memory["per_rank"]["peak_bytes"],
            "after_forward": memory["activations"].get("held_after_forward_bytes", 0)}


def first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (type(e).__name__ + ": " + (text[0] if text else ""))[:200]


def sweep_one(binary: str, model_type: str, worlds: List[int], tmp: str) -> Dict[str, Any]:
    out: Dict[str, Any] = {"arch": model_type}
    t0 = time.perf_counter()
    quiet = contextlib.redirect_stderr(io.StringIO())
    try:
        with quiet:
            model = build(model_type)
        classes = layer_classes(model)
        out["layer_classes"] = classes
        out["params"] = sum(p.numel() for p in model.parameters())
    except Exception as e:  # noqa: BLE001  (a sweep records every failure)
        return {**out, "outcome": "config", "why": first_line(e)}
    pt2 = os.path.join(tmp, model_type + ".pt2")
    try:
        with quiet:
            export_module(model, (), inputs(model), pt2)
    except (ExportError, Exception) as e:  # noqa: BLE001
        return {**out, "outcome": "export", "why": first_line(e)}
    cases = []
    for world in worlds:
        for ac in (False, True):
            try:
                plan = planned(binary, pt2, tmp, classes, world, ac)
            except Exception as e:  # noqa: BLE001
                return {**out, "outcome": "plan", "why": first_line(e)}
            try:
                with quiet:
                    ref = tracked(model_type, world, ac)
            except Exception as e:  # noqa: BLE001
                return {**out, "outcome": "reference", "why": first_line(e),
                        "trace": traceback.format_exc().splitlines()[-3:]}
            cases.append({"world": world, "ac": ac, "plan": plan, "tracker": ref,
                          "ratio": plan["peak"] / ref["peak"],
                          "activations_ratio": plan["after_forward"] / max(1, ref["after_forward"])})
    out["cases"] = cases
    out["outcome"] = "ok" if all(abs(c["ratio"] - 1) <= TOLERANCE and
                                 abs(c["activations_ratio"] - 1) <= TOLERANCE for c in cases) else "miss"
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def markdown(results: List[Dict[str, Any]], worlds: List[int]) -> str:
    head = "| architecture | outcome | " + " | ".join(f"w{w} {a}" for w in worlds for a in ("no AC", "AC")) + " |"
    lines = [head, "|" + "---|" * (2 + 2 * len(worlds))]
    for r in results:
        cells = ([f"{c['ratio']:.3f} / {c['activations_ratio']:.3f}" for c in r["cases"]] if r.get("cases")
                 else [r.get("why", "").replace("|", "/")[:90]] + [""] * (2 * len(worlds) - 1))
        lines.append(f"| {r['arch']} | {r['outcome']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def sweep_isolated(binary: str, arch: str, worlds: List[int]) -> Dict[str, Any]:
    """sweep_one in a process of its own, under a memory limit and a timeout: an architecture that
    balloons or hangs is an outcome (`limit`), not the end of the sweep."""
    cmd = [sys.executable, os.path.abspath(__file__), binary, "--one", arch, "--worlds", ",".join(map(str, worlds))]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=ONE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"arch": arch, "outcome": "limit", "why": f"over {ONE_TIMEOUT_S} s"}
    last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    try:
        return json.loads(last)
    except json.JSONDecodeError:
        return {"arch": arch, "outcome": "limit", "why": f"exit {r.returncode} (memory limit {ONE_MEMORY_GB} GB?)"}


def one(binary: str, arch: str, worlds: List[int]) -> int:
    import resource
    limit = ONE_MEMORY_GB << 30
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    with tempfile.TemporaryDirectory(prefix="arch_sweep_") as tmp:
        try:
            r = sweep_one(binary, arch, worlds, tmp)
        except MemoryError:
            r = {"arch": arch, "outcome": "limit", "why": f"MemoryError under {ONE_MEMORY_GB} GB"}
    print(json.dumps(r))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--only", help="comma-separated model types")
    ap.add_argument("--subset", choices=["ci"], help="the fixed subset CI runs")
    ap.add_argument("--worlds", default="1,8")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="architectures at once")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # sweep_isolated's child
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args()
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    archs = list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    strict = bool(args.only or args.subset)
    if args.only:
        archs = args.only.split(",")
    elif args.subset == "ci":
        archs = CI_SUBSET
    worlds = [int(w) for w in args.worlds.split(",")]
    if args.one:
        return one(args.binary, args.one, worlds)
    results = []
    t0 = time.perf_counter()
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each architecture is a process of its own
        for r in pool.map(lambda arch: sweep_isolated(args.binary, arch, worlds), archs):
            results.append(r)
            detail = (" ".join(f"{c['ratio']:.3f}/{c['activations_ratio']:.3f}" for c in r["cases"])
                      if r.get("cases") else r.get("why", ""))
            print(f"{r['arch']:28s} {r['outcome']:9s} {detail}", flush=True)
    counts: Dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    print(f"{len(results)} architectures in {time.perf_counter() - t0:.0f} s: " +
          ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "counts": counts, "tolerance": TOLERANCE,
                       "batch": BATCH, "seq": SEQ, "worlds": worlds}, f, indent=1)
            f.write("\n")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(results, worlds))
    return 1 if strict and any(r["outcome"] != "ok" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
