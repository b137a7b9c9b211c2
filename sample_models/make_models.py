#!/usr/bin/python3
"""Writes the sample TorchScript models next to this file.

Run with Debian's interpreter (torch 1.13):  /usr/bin/python3 sample_models/make_models.py
Deterministic: each model is built under torch.manual_seed(models.SEED).
"""
import os
import sys

# TorchScript writes class constants in Python set order; pin the hash seed so
# that the archives are byte-for-byte reproducible.
if os.environ.get("PYTHONHASHSEED") != "0":
    os.environ["PYTHONHASHSEED"] = "0"
    os.execv(sys.executable, [sys.executable] + sys.argv)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import models  # noqa: E402

MAX_BYTES = 2 * 1024 * 1024


def main(out_dir: str = HERE) -> int:
    for name in models.SAMPLE_MODELS:
        eager = models.build(name)
        scripted = torch.jit.script(eager)
        # Sanity: the scripted model runs and agrees with the eager one.
        x = models.example_input(name)
        with torch.no_grad():
            a, b = eager(x), scripted(x)
        if isinstance(a, dict):
            assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a), name
        else:
            assert torch.allclose(a, b, atol=1e-5), name
        path = os.path.join(out_dir, name + ".pt")
        torch.jit.save(scripted, path)
        size = os.path.getsize(path)
        assert size < MAX_BYTES, f"{path} is {size} bytes"
        n = sum(p.numel() for p in eager.parameters())
        print(f"{path}: {n} params, {size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
