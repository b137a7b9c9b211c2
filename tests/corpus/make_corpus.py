#!/usr/bin/env python3
"""Writes the corpus: OUTDIR/NAME.pt (TorchScript traced and saved by the venv's
torch, 2.13) and OUTDIR/index.json.

    $FSDP_PLAN_VENV/bin/python tests/corpus/make_corpus.py OUTDIR [NAME...] [--full]

Without names: every small model plus llama3_8b (meta device, structure only).
`--full` adds llama3_70b (about 20 s more). index.json maps each name to:
file, hf_class, how ("trace"), device ("cpu"|"meta"), no_split_modules,
param_numel, num_modules, torch and transformers versions. A model whose
archive would not hold the eager model's tree is an error (exit 1).
An existing corpus made from the same sources, torch and transformers is kept
(index.json records a hash of corpus.py and this file); `--force` remakes it.
"""
import argparse
import hashlib
import json
import os
import sys
import time
from importlib.metadata import version

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def make_one(name: str, out_dir: str) -> dict:
    import corpus  # imports torch and transformers: only when there is work
    t0 = time.time()
    model = corpus.build(name)
    path = os.path.join(out_dir, name + ".pt")
    traced = corpus.save(model, name, path)
    # The archive must hold the HF model's tree (the tracer keeps every submodule).
    if corpus.tree_signature(traced) != corpus.tree_signature(model):
        raise SystemExit(f"make_corpus: {name}: the traced module tree differs from the eager model")
    device = next(model.parameters()).device.type
    return {
        "file": name + ".pt",
        "hf_class": type(model).__name__,
        "qualified_class": type(model).__module__ + "." + type(model).__qualname__,
        "how": "trace",
        "device": device,
        "no_split_modules": corpus.no_split_modules(model),
        "param_numel": sum(p.numel() for p in model.parameters()),
        "num_modules": sum(1 for _ in model.modules()),
        "file_bytes": os.path.getsize(path),
        "seconds": round(time.time() - t0, 2),
    }


# corpus.SMALL's names, without importing transformers (a check below asserts they agree).
SMALL = ["gpt2", "llama", "llama_tied", "mistral", "mixtral", "qwen2_moe", "bert", "t5", "vit", "whisper"]


def sources_hash() -> str:
    h = hashlib.sha256()
    for f in ("corpus.py", "make_corpus.py"):
        with open(os.path.join(HERE, f), "rb") as fh:
            h.update(fh.read())
    return h.hexdigest()


def up_to_date(index_path: str, index: dict, names) -> bool:
    try:
        with open(index_path) as f:
            old = json.load(f)
    except (OSError, ValueError):
        return False
    if any(old.get(k) != index[k] for k in ("torch", "transformers", "sources")):
        return False
    models = old.get("models", {})
    return all(n in models and os.path.exists(os.path.join(os.path.dirname(index_path), models[n]["file"]))
               for n in names)


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir")
    ap.add_argument("names", nargs="*")
    ap.add_argument("--full", action="store_true", help="also llama3_70b")
    ap.add_argument("--force", action="store_true", help="remake even if up to date")
    args = ap.parse_args(argv)
    names = args.names or SMALL + ["llama3_8b"] + (["llama3_70b"] if args.full else [])
    os.makedirs(args.out_dir, exist_ok=True)
    index = {"torch": version("torch"), "transformers": version("transformers"), "sources": sources_hash(),
             "models": {}}
    index_path = os.path.join(args.out_dir, "index.json")
    if not args.force and up_to_date(index_path, index, names):
        print(f"make_corpus: {args.out_dir} is up to date", file=sys.stderr)
        return 0
    if args.names and os.path.exists(index_path):  # adding to an existing corpus
        with open(index_path) as f:
            old = json.load(f)
        if old.get("sources") == index["sources"]:
            index["models"] = old.get("models", {})
    import corpus
    if list(corpus.SMALL) != SMALL:
        raise SystemExit("make_corpus: SMALL differs from corpus.SMALL; update it")
    for name in names:
        index["models"][name] = entry = make_one(name, args.out_dir)
        print(f"{name}: {entry['file_bytes']} bytes, {entry['param_numel']} params, {entry['seconds']} s",
              file=sys.stderr)
    tmp = index_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(index, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, index_path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
