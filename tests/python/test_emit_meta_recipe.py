#!/usr/bin/env python3
"""docs/accelerate.md's recipe for running --emit torch output without GPUs (issue 41, item 11):
its python block, run as written on the FSDP2 plan it names, must shard every parameter.

Usage: test_emit_meta_recipe.py FSDP_PLAN_BINARY   (the venv's python: torch)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main():
    binary = os.path.abspath(sys.argv[1])
    with open(os.path.join(ROOT, "docs", "accelerate.md")) as f:
        text = f.read()
    blocks = re.findall(r"^```python\n(.*?)^```$", text, re.M | re.S)
    recipe = [b for b in blocks if "FakeStore" in b and "apply_fsdp" in b]
    assert len(recipe) == 1, f"docs/accelerate.md: {len(recipe)} recipe blocks"
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(ROOT, "sample_models"), os.path.join(tmp, "sample_models"))
        subprocess.run([binary, "sample_models/tiny_gpt.pt", "--policy", os.path.join(ROOT, "policies", "fsdp2.json"),
                        "--emit", "torch", "-o", "apply_fsdp.py"], cwd=tmp, check=True)
        with open(os.path.join(tmp, "recipe.py"), "w") as f:
            f.write(recipe[0])
        r = subprocess.run([sys.executable, "recipe.py"], cwd=tmp, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        rows = [line.split() for line in r.stdout.splitlines()]
        assert len(rows) >= 10, r.stdout
        # world size 8: rank 0 holds an eighth of the embedding's rows
        sys.path.insert(0, os.path.join(ROOT, "sample_models"))
        from models import TinyGPT
        vocab, dim = TinyGPT().tok_emb.weight.shape
        shapes = {row[0]: " ".join(row[1:-1]) for row in rows}
        assert shapes["tok_emb.weight"] == f"({-(-vocab // 8)}, {dim})", shapes["tok_emb.weight"]
    print("ok: the recipe shards", len(rows), "parameters")


if __name__ == "__main__":
    main()
