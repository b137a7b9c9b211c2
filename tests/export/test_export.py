#!/usr/bin/env python3
"""The torch.export (.pt2) loader against PyTorch itself (torch 2.13, the venv).

Every sample model (sample_models/models.py) and, when tests/corpus/corpus.py
is there, every small corpus model is exported with torch.export.export and
saved with torch.export.save to a temp dir. Then:

- plans: `fsdp-plan MODEL.pt2 --policy P --format json` must equal
  reference_plan.py's plan on the live module (PyTorch's wrap.py and FSDP's
  grouping pass), for the differential test's policies (sample models) or a
  class / size / mixed-precision set (corpus models). Compared as
  test_differential.py compares TorchScript plans. One difference is known
  and reported, not failed: a unit whose class the archive does not record
  shows the class "(unrecorded)".
- warnings: the modules in the plan's `unrecorded_class` / `inferred_class`
  warnings are exactly those whose forward never ran (no nn_module_stack).
- bytes: export_stats reads no weight record: the records it read are JSON
  records only, and bytes read + the weight records' sizes <= the file size
  + the central directory + libzip's 64 KiB end-record search.

    /work/venv/bin/python tests/export/test_export.py FSDP_PLAN EXPORT_STATS
        [--set samples|corpus|all] [-k SUBSTRING] [--keep DIR] [-v]

The last line is `N passed, M failed`; exit 1 on any failure. Models that do
not export are listed with torch's reason (not a failure: the loader is not
at fault).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings
import zipfile
from typing import Any, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "differential"))
sys.path.insert(0, os.path.join(REPO, "sample_models"))
sys.path.insert(0, os.path.join(REPO, "tests", "corpus"))
warnings.filterwarnings("ignore")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import models  # noqa: E402
import reference_plan as rp  # noqa: E402
import test_differential as td  # noqa: E402

UNRECORDED = "(unrecorded)"
JSON_RECORDS = ("archive_format", "archive_version", "models/", "data/weights/model_weights_config.json",
                "extra/fsdp_plan.json",
                "data/constants/model_constants_config.json")


def export_to(model: nn.Module, inputs: Tuple[Any, ...], kwargs: Dict[str, Any], path: str) -> None:
    ep = torch.export.export(model, inputs, kwargs=kwargs)
    torch.export.save(ep, path)


def called_paths(path: str) -> set:
    """Module paths some graph node's nn_module_stack names (their forward ran)."""
    with zipfile.ZipFile(path) as z:
        name = next(n for n in z.namelist() if n.endswith("/models/model.json"))
        prog = json.loads(z.read(name))
    out = set()
    for node in prog["graph_module"]["graph"]["nodes"]:
        stack = node.get("metadata", {}).get("nn_module_stack")
        for item in (stack.split(";") if stack else []):
            out.add(rp_split(item)[1])
    return out


def rp_split(item: str) -> List[str]:
    # "key,path,class" with commas inside brackets kept, as torch splits it.
    out, start, depth = [], 0, 0
    for i, c in enumerate(item):
        if c in "[(":
            depth += 1
        elif c in ")]":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(item[start:i])
            start = i + 1
    out.append(item[start:])
    return out


def run(cmd: List[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def sample_cases() -> Dict[str, Tuple[Any, Dict[str, Dict[str, Any]]]]:
    out = {}
    for name in models.SAMPLE_MODELS:
        policies = td.CASES[name][1] if name in td.CASES else {"empty": {}}
        out[name] = ((lambda n=name: (models.build(n), (models.example_input(n),), {})), policies)
    return out


def corpus_cases() -> Dict[str, Tuple[Any, Dict[str, Dict[str, Any]]]]:
    try:
        import corpus  # noqa: F401
    except Exception:
        return {}
    out = {}
    for name in corpus.SMALL:
        def build(n=name):
            # By keyword, as HF's forward takes them (T5's second argument is not decoder_input_ids).
            m = corpus.build(n)
            return m, (), dict(zip(corpus.builder(n).inputs, corpus.example_inputs(n, m)))
        out["corpus:" + name] = (build, None)  # policies depend on the model
    return out


def corpus_policies(model: nn.Module) -> Dict[str, Dict[str, Any]]:
    import corpus
    total = sum(p.numel() for p in model.parameters())
    pol: Dict[str, Dict[str, Any]] = {"empty": {}, "size_eighth": {"min_num_params": max(1, total // 8)},
                                      "size_hundredth": {"min_num_params": max(1, total // 100)}}
    classes = corpus.no_split_modules(model)
    if classes:
        pol["no_split"] = {"module_classes": classes}
        pol["no_split_mp"] = {"module_classes": classes, "mixed_precision": td.MP}
        pol["no_split_ignore_norm"] = {"module_classes": classes, "ignored_params": ["*norm*"]}
    return pol


def check_bytes(stats_bin: str, path: str) -> Tuple[List[str], Dict[str, Any]]:
    r = run([stats_bin, path])
    if r.returncode != 0:
        return [f"export_stats failed: {r.stderr.strip()}"], {}
    st = json.loads(r.stdout)
    msgs = []
    with zipfile.ZipFile(path) as z:
        infos = z.infolist()
        directory = os.path.getsize(path) - z.start_dir
    # libzip looks for the end record in the last 64 KiB (the longest zip
    # comment) and then reads the central directory: small files are read
    # whole, big ones must leave their weight records alone.
    tail = min(os.path.getsize(path), 65535 + 22)
    prefix = infos[0].filename.split("/")[0] + "/"
    weights = [i for i in infos if not i.filename[len(prefix):].startswith(JSON_RECORDS)
               and not i.filename.endswith((".data/version", "byteorder", "serialization_id"))]
    weight_bytes = sum(i.compress_size for i in weights)
    for rec in st["records_read"]:
        if not rec.startswith(JSON_RECORDS):
            msgs.append(f"read record {rec}, which is not a JSON record")
    if st["bytes_read"] + weight_bytes > st["file_size"] + directory + tail:
        msgs.append(f"read {st['bytes_read']} bytes of {st['file_size']}, but the weight and other "
                    f"records alone take {weight_bytes} (directory {directory}, end search {tail})")
    st["weight_bytes"] = weight_bytes
    return msgs, st


def main(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("stats")
    ap.add_argument("--set", default="all", choices=("samples", "corpus", "all"),
                    help="sample models, corpus models (tests/corpus, when present) or both")
    ap.add_argument("-k", dest="only", default=None)
    ap.add_argument("--keep", default=None)
    ap.add_argument("-v", dest="verbose", action="store_true")
    args = ap.parse_args(argv)
    tmp = tempfile.TemporaryDirectory(prefix="fsdp-pt2-")
    work = args.keep or tmp.name
    os.makedirs(work, exist_ok=True)
    passed = failed = 0
    not_exported: List[str] = []
    figures: List[str] = []

    def report(ok: bool, label: str, msgs: List[str], notes: List[str] = ()):
        nonlocal passed, failed
        passed += ok
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'} {label}" + ("" if ok or not msgs else f": {msgs[0]}"), flush=True)
        for m in (msgs[1:] if not ok else [])[: None if args.verbose else 10]:
            print(f"    {m}")
        for n in notes:
            print(f"    note: {n}")

    cases = {**(sample_cases() if args.set != "corpus" else {}),
             **(corpus_cases() if args.set != "samples" else {})}
    if args.set == "corpus" and not cases:
        print("SKIP no tests/corpus/corpus.py in this checkout")
    for mname, (builder, policies) in cases.items():
        if args.only and args.only not in mname and (policies is None or not any(
                args.only in f"{mname} / {p}" for p in policies)):
            continue
        path = os.path.join(work, mname.replace(":", "_") + ".pt2")
        try:
            model, inputs, kwargs = builder()
        except Exception as e:  # the corpus lacks a dependency, say
            not_exported.append(f"{mname}: could not build: {type(e).__name__}: {str(e)[:200]}")
            continue
        try:
            export_to(model, inputs, kwargs, path)
        except Exception as e:
            first = (str(e).strip().splitlines() or [""])[0][:240]
            not_exported.append(f"{mname}: torch.export.export fails: {type(e).__name__}: {first}")
            continue
        if policies is None:
            policies = corpus_policies(model)

        msgs, st = check_bytes(args.stats, path)
        report(not msgs, f"{mname} / no weight read", msgs)
        if st:
            figures.append(f"{mname}: {st['file_size']} bytes, read {st['bytes_read']} "
                           f"({', '.join(st['records_read'])}), {st['modules']} modules, "
                           f"{st['tensors']} tensors, load {st['load_ms']:.1f} ms")

        # Warnings name exactly the modules whose forward never ran.
        called = called_paths(path)
        never = [n for n, _ in model.named_modules(remove_duplicate=False) if n not in called]
        # Exit 1: a plan FSDP would refuse (Whisper's frozen position embeddings in a unit with
        # trainable parameters, tied_trunk's float64 head among float32): still a plan to compare.
        r = run([args.binary, path, "--format", "json"])
        if r.returncode not in (0, 1):
            report(False, f"{mname} / unrecorded classes", [f"exit {r.returncode}: {r.stderr.strip()}"])
        else:
            plan = json.loads(r.stdout)
            warned = [m for w in plan["warnings"] if w["kind"] in ("unrecorded_class", "inferred_class")
                      for m in w.get("modules", [])]
            ok = sorted(warned) == sorted(never)
            report(ok, f"{mname} / unrecorded classes",
                   [f"warnings name {sorted(warned)}, never called: {sorted(never)}"],
                   [f"{len(never)} modules never called: {never[:6]}"] if ok and never and args.verbose else [])

        for pname, policy in policies.items():
            label = f"{mname} / {pname}"
            if args.only and args.only not in label:
                continue
            ppath = os.path.join(work, f"{mname.replace(':', '_')}.{pname}.policy.json")
            with open(ppath, "w") as f:
                json.dump(policy, f)
            try:
                expected = rp.reference_plan(model, policy)
            except Exception as e:
                report(False, label, [f"reference failed: {type(e).__name__}: {e}"])
                continue
            actual, err = td.run_binary(args.binary, path, ppath, ok_codes=(0, 1))
            if actual is None:
                report(False, label, [err])
                continue
            msgs = td.compare_plans(expected, actual)
            # Known difference: a class the archive does not record.
            known = [m for m in msgs if m.endswith(f"plan has {UNRECORDED!r}")]
            msgs = [m for m in msgs if m not in known]
            report(not msgs, label, msgs, [f"known difference: {k}" for k in known][:3])

    for n in not_exported:
        print(f"NOT EXPORTED {n}")
    for f in figures:
        print(f"FIGURES {f}")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
