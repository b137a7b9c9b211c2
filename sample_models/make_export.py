#!/usr/bin/env python3
"""Writes tiny_gpt.pt2: the sample TinyGPT exported with torch.export (the
project's venv: torch 2.13), for the .pt2 examples and docs/errors.md rows.

    /work/venv/bin/python sample_models/make_export.py [OUT_DIR]

Not byte-reproducible (torch writes a random serialization id), but its
module tree, parameters and buffers are those of models.build("tiny_gpt").
"""
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
warnings.filterwarnings("ignore")

import torch  # noqa: E402

import models  # noqa: E402


def main(out_dir: str = HERE) -> int:
    name = "tiny_gpt"
    model = models.build(name)
    ep = torch.export.export(model, (models.example_input(name),))
    path = os.path.join(out_dir, name + ".pt2")
    torch.export.save(ep, path)
    print(f"{path}: {os.path.getsize(path)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
