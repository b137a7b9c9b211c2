#!/usr/bin/env python3
"""DeepSeek-V3-671B planned with expert parallelism, side by side with the same plan without it:
issue 43's target (the EP plan under 150 ms; suggest at 256 ranks under 2 s).

    .venv/bin/python bench/moe_ep_bench.py [--binary build/app/fsdp-plan] [--file DSV3.pt2] [--reps 9]

The file is DeepSeek-V3's config.json (below, as published with the model) exported by
fsdp-plan-export on the meta device at batch 1 x sequence 4096 in fp32 (torchtitan builds its model
in fp32; made once and kept at --file; about a minute and 12 MB). The plans, each with its output
thrown away:

    plain:  fsdp-plan FILE --policy {FSDP2 per DeepseekV3DecoderLayer, 256 ranks, bf16 mixed
            precision, full activation checkpointing per layer} -f json
    ep 64:  the same policy with "expert_parallel": {"degree": 64}
    suggest: fsdp-plan suggest FILE --policy (the ep 64 policy) --budget 80GiB -f json

Each rep runs plain, ep, suggest, then the next rep in reverse order (ABBA), so that the machine's
load hits all alike. Reports the median (min-max) wall time of each and the ep / plain ratio, and
the load average at the start and the end: on a shared 2-core machine compare ratios. The bench
measures; it asserts nothing.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# deepseek-ai/DeepSeek-V3 config.json (the fields the model reads).
CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_attention_heads": 128, "num_key_value_heads": 128, "n_shared_experts": 1, "n_routed_experts": 256,
    "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "qk_nope_head_dim": 128, "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
    "num_experts_per_tok": 8, "moe_layer_freq": 1, "first_k_dense_replace": 3, "norm_topk_prob": True,
    "scoring_func": "sigmoid", "hidden_act": "silu", "max_position_embeddings": 163840, "rms_norm_eps": 1e-06,
    "rope_theta": 10000, "tie_word_embeddings": False, "attention_bias": False, "attention_dropout": 0.0,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                     "original_max_position_embeddings": 4096, "type": "yarn"},
    "torch_dtype": "bfloat16",
}


def export(path):
    with tempfile.TemporaryDirectory() as tmp:
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(CONFIG, f)
        t = time.perf_counter()
        env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "python")}
        subprocess.run([sys.executable, "-m", "fsdp_plan.export", tmp, "-o", path, "--seq", "4096",
                        "--dtype", "float32"], check=True, env=env)
        print(f"exported {path} in {time.perf_counter() - t:.0f} s ({os.path.getsize(path) / 1e6:.1f} MB)")


def timed(argv):
    t = time.perf_counter()
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    if r.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()[-500:]}")
    return wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "app", "fsdp-plan"))
    ap.add_argument("--file", default=os.path.join(tempfile.gettempdir(), "deepseek_v3_671b_fp32.pt2"))
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    if not os.path.exists(a.file):
        export(a.file)
    base = {"module_classes": ["DeepseekV3DecoderLayer"], "fsdp": {"version": 2, "world_size": 256},
            "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
            "activation_checkpointing": {"module_classes": ["DeepseekV3DecoderLayer"]}}
    with tempfile.TemporaryDirectory() as tmp:
        plain, ep = os.path.join(tmp, "plain.json"), os.path.join(tmp, "ep.json")
        with open(plain, "w") as f:
            json.dump(base, f)
        with open(ep, "w") as f:
            json.dump({**base, "expert_parallel": {"degree": 64}}, f)
        runs = {
            "plain": [a.binary, a.file, "--policy", plain, "-f", "json"],
            "ep 64": [a.binary, a.file, "--policy", ep, "-f", "json"],
            "suggest ep 64": [a.binary, "suggest", a.file, "--policy", ep, "--budget", "80GiB", "-f", "json"],
        }
        for argv in runs.values():
            timed(argv)  # warm the page cache
        print(f"load average at start: {os.getloadavg()[0]:.2f}")
        times = {k: [] for k in runs}
        names = list(runs)
        for rep in range(a.reps):
            for k in names if rep % 2 == 0 else names[::-1]:
                times[k].append(timed(runs[k]))
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
    for k, v in times.items():
        print(f"{k:14s} median {statistics.median(v) * 1e3:8.1f} ms  (min {min(v) * 1e3:.1f}, max {max(v) * 1e3:.1f})")
    print(f"ep 64 / plain: {statistics.median(times['ep 64']) / statistics.median(times['plain']):.2f}")


if __name__ == "__main__":
    main()
