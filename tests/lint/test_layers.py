#!/usr/bin/env python3
"""The layers of lib/ run one way (docs/architecture.md): a file includes only its own folder and the
folders of lower layers; folders of one layer (fsdp1 | fsdp2, report | emit) do not include each other.

    tests/lint/test_layers.py [ROOT]     exits 1 and lists every include that runs back up
"""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Lowest first. A folder may include any folder of a lower layer.
# mesh/: the device mesh, built from the policy's settings; below plan (a collective carries its RankGroup).
# activations/: the graph walk and the activation schedule; after plan (it fills plan/activations.h
# from the units and the policy), before fsdp1 | fsdp2 (their memory models read its results).
# cp/: context parallelism's ring, after tp/ (it reads which K/V are tp-local).
LAYERS = [["util"], ["model"], ["policy"], ["mesh"], ["plan"], ["activations"], ["fsdp1", "fsdp2", "tp", "ep"], ["cp"], ["time"], ["accelerate"], ["planner"],
          ["report", "emit"], ["suggest"]]
RANK = {folder: i for i, layer in enumerate(LAYERS) for folder in layer}
INCLUDE = re.compile(r'^#include "([a-z0-9_]+)/[^"]+"', re.M)


def main():
    lib = os.path.join(ROOT, "lib")
    bad, folders = [], set()
    for d, _, files in os.walk(lib):
        rel = os.path.relpath(d, lib)
        if rel == ".":
            continue
        top = rel.split(os.sep)[0]
        folders.add(top)
        for f in files:
            if not f.endswith((".h", ".cpp")):
                continue
            path = os.path.join(d, f)
            for target in INCLUDE.findall(open(path).read()):
                if target == top:
                    continue
                if target not in RANK or top not in RANK:
                    bad.append(f"{os.path.relpath(path, ROOT)}: includes {target}/ (a folder no layer names)")
                elif RANK[target] >= RANK[top]:
                    bad.append(f"{os.path.relpath(path, ROOT)}: includes {target}/, which is not below {top}/")
    unknown = folders - set(RANK)
    for folder in sorted(unknown):
        bad.append(f"lib/{folder}/: not in LAYERS (tests/lint/test_layers.py): say where it belongs")
    for line in bad:
        print(line)
    print(f"{len(bad)} failed, {0 if bad else 1} passed" if bad else "1 passed, 0 failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
