#!/usr/bin/env python3
"""Every output of two fsdp-plan binaries on .pt2 files, compared byte for byte.

    python3 bench/pt2_outputs.py OLD_BINARY NEW_BINARY PATH... [--jobs 1]

PATH is a .pt2 file or a folder of them (searched recursively). bench/snapshot.py
covers TorchScript files only; this is its twin for torch.export archives, for
changes to the .pt2 reader, the graph walk, the FLOPs and the planner. Each file
runs under several option sets (no policy; the usual block classes, FSDP1 JSON
and FSDP2 text; with activation checkpointing and bf16 mixed precision; at
--dim batch=2 --dim seq=64, which a static export refuses; --dump-tree) and
each case's stdout, stderr and exit code must be the same for both binaries.
Prints the number of cases and every case that differs; exits 1 if any does.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

BLOCKS = ("LlamaDecoderLayer,GPT2Block,BertLayer,MistralDecoderLayer,MixtralDecoderLayer,"
          "Qwen2MoeDecoderLayer,T5Block,ViTLayer,Linear")


def option_sets(policy: str) -> dict:
    return {
        "root_json": ["-f", "json"],
        "blocks_fsdp1_json": ["--module-classes", BLOCKS, "--world-size", "8", "-f", "json"],
        "blocks_fsdp2_text": ["--module-classes", BLOCKS, "--world-size", "8", "--fsdp-version", "2", "-f", "text",
                              "--wide"],
        "ac_mp_fsdp2_json": ["--policy", policy, "--world-size", "8", "--fsdp-version", "2", "-f", "json"],
        "ac_mp_fsdp1_json": ["--policy", policy, "--world-size", "4", "-f", "json"],
        "dims_json": ["--module-classes", BLOCKS, "--dim", "batch=2", "--dim", "seq=64", "-f", "json"],
        "dump_tree": ["--dump-tree", "-f", "json"],
    }


def files_under(paths: list) -> list:
    out = []
    for p in paths:
        if os.path.isdir(p):
            for root, _, names in os.walk(p):
                out += [os.path.join(root, n) for n in names if n.endswith(".pt2")]
        else:
            out.append(p)
    return sorted(set(out))


def run(binary: str, args: list) -> tuple:
    p = subprocess.run([binary] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False)
    return p.returncode, p.stdout, p.stderr.replace(binary.encode(), b"BINARY")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("paths", nargs="+")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        policy = os.path.join(tmp, "policy.json")
        with open(policy, "w") as f:
            json.dump({"module_classes": BLOCKS.split(","),
                       "activation_checkpointing": {"module_classes": BLOCKS.split(",")[:-1]},
                       "mixed_precision": {"param_dtype": "bfloat16"}}, f)
        cases = [(path, name, [path] + opts) for path in files_under(args.paths)
                 for name, opts in option_sets(policy).items()]

        def compare(case):
            path, name, argv = case
            return case, run(args.old, argv), run(args.new, argv)

        differ = []
        codes = {}
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for (path, name, _), old, new in pool.map(compare, cases):
                codes[old[0]] = codes.get(old[0], 0) + 1
                if old != new:
                    differ.append((path, name, old[0], new[0], old[1] == new[1], old[2] == new[2]))
    print(f"{len(cases)} cases ({len(files_under(args.paths))} files x {len(option_sets('p'))} option sets); "
          f"old exit codes {dict(sorted(codes.items()))}; {len(differ)} differ")
    for path, name, rc_old, rc_new, same_out, same_err in differ:
        print(f"  DIFFERS {path} [{name}]: exit {rc_old} -> {rc_new}, stdout {'same' if same_out else 'differs'}, "
              f"stderr {'same' if same_err else 'differs'}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
