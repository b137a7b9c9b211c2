#!/usr/bin/env python3
"""Every output of fsdp-plan on the project's own inputs, to compare two binaries byte for byte:

    bench/snapshot.py BINARY OUTDIR [--corpus DIR] [--synthetic DIR] [--jobs N]
    diff -r OUTDIR_A OUTDIR_B        # nothing printed: the refactor changed no output

The guard for refactors (issue 28): plan outputs (text, --wide, JSON, HTML, --dump-tree, --emit torch and
accelerate) of the sample models, the corpus (build/corpus, made by the `corpus` test), the synthetic
5,000-module archive and the fuzz regressions, under every policy in policies/ and tests/accelerate/configs/,
FSDP1 and FSDP2, at world sizes 1, 3 and 8 with the strategies, optimizers and gates; `suggest` and `diff` on
them. Each case writes NAME.out, NAME.err and NAME.rc (stdout, stderr, exit code); -o cases also the file.
Paths in outputs are relative to the repository, so two checkouts compare equal.
"""
import argparse
import concurrent.futures
import glob
import hashlib
import os
import subprocess
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))


TIMING = re.compile(rb"in [0-9]+(\.[0-9]+)? ms")


def rel(path):
    return os.path.relpath(path, ROOT)


def cases(corpus, synthetic):
    """(name, argv, output file or None), argv without the binary."""
    samples = sorted(glob.glob(os.path.join(ROOT, "sample_models", "*.pt*")))
    corpus_models = sorted(glob.glob(os.path.join(corpus, "*.pt*"))) if corpus else []
    fuzz_models = sorted(glob.glob(os.path.join(ROOT, "tests", "fuzz", "regressions", "archive", "*")) +
                         glob.glob(os.path.join(ROOT, "tests", "fuzz", "regressions", "export", "*")))
    fuzz_policies = sorted(glob.glob(os.path.join(ROOT, "tests", "fuzz", "regressions", "policy", "*")))
    policies = sorted(glob.glob(os.path.join(ROOT, "policies", "*.json")) +
                      glob.glob(os.path.join(ROOT, "policies", "*.yaml")))
    policies = [p for p in policies if not p.endswith("schema.json")]
    accelerate = sorted(glob.glob(os.path.join(ROOT, "tests", "accelerate", "configs", "*.yaml")))
    models = [rel(m) for m in samples + corpus_models]
    out = []

    def add(name, argv, ofile=None):
        out.append((name, argv, ofile))

    # Every model with every policy: the text plan at two world sizes, both versions.
    for m in models:
        tag = os.path.basename(m).replace(".", "_")
        add(f"tree_{tag}", [m, "--dump-tree"])
        add(f"treetext_{tag}", [m, "--dump-tree", "-f", "text"])
        for p in [None] + [rel(p) for p in policies + accelerate]:
            ptag = os.path.basename(p).replace(".", "_") if p else "nopolicy"
            pol = ["--policy", p] if p else []
            for v in ("1", "2"):
                for ws in ("1", "8"):
                    add(f"plan_{tag}_{ptag}_v{v}_w{ws}", [m, *pol, "--fsdp-version", v, "--world-size", ws])
            add(f"json_{tag}_{ptag}", [m, *pol, "--world-size", "8", "-f", "json"])
            add(f"json2_{tag}_{ptag}", [m, *pol, "--world-size", "8", "--fsdp-version", "2", "-f", "json"])
    # Settings and formats on a few models.
    for m in models[:6] + [rel(p) for p in corpus_models if "llama" in p or "mixtral" in p]:
        tag = os.path.basename(m).replace(".", "_")
        for p in [rel(p) for p in policies]:
            ptag = os.path.basename(p).replace(".", "_")
            base = [m, "--policy", p]
            for strat in ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"):
                for opt in ("adam", "sgd", "sgd-momentum", "none"):
                    add(f"mem_{tag}_{ptag}_{strat}_{opt}",
                        [*base, "--world-size", "16", "--sharding-strategy", strat, "--optimizer", opt, "-f", "json"])
            add(f"orig_{tag}_{ptag}", [*base, "--world-size", "3", "--use-orig-params"])
            add(f"hsdp_{tag}_{ptag}", [*base, "--world-size", "16", "--sharding-strategy", "HYBRID_SHARD",
                                       "--shard-group-size", "4", "-f", "json"])
            add(f"wide_{tag}_{ptag}", [*base, "--world-size", "8", "--wide"])
            add(f"html_{tag}_{ptag}", [*base, "--world-size", "8", "-f", "html"])
            add(f"html2_{tag}_{ptag}", [*base, "--world-size", "8", "--fsdp-version", "2", "-f", "html"])
            add(f"vv_{tag}_{ptag}", [*base, "--world-size", "8", "-vv"])
            add(f"aliases_{tag}_{ptag}", [*base, "--aliases", "-f", "json"])
            for emit in ("torch", "accelerate"):
                for v in ("1", "2"):
                    add(f"emit_{emit}_{tag}_{ptag}_v{v}", [*base, "--world-size", "8", "--fsdp-version", v,
                                                          "--emit", emit])
            add(f"gate_{tag}_{ptag}", [*base, "--world-size", "8", "--max-unit-numel", "1000", "--max-units", "3",
                                       "--max-root-share", "0.2", "--max-peak-bytes", "1MiB", "--fail-on", "any"])
            add(f"gatejson_{tag}_{ptag}", [*base, "--world-size", "8", "--max-units", "3", "-f", "json"])
            add(f"expect_{tag}_{ptag}", [*base, "--expect", "plans/tiny_gpt.json", "--world-size", "8"])
            add(f"o_{tag}_{ptag}", [*base, "--world-size", "8", "-o", "{OUT}"], "plan.txt")
    # Fuzz regressions: as models, and as policies.
    for f in fuzz_models:
        add(f"fuzz_{os.path.basename(f)}", [rel(f)])
    for f in fuzz_policies:
        add(f"fuzzpol_{os.path.basename(f)}", ["sample_models/tiny_gpt.pt", "--policy", rel(f)])
    # The synthetic 5,000-module archive.
    if synthetic:
        add("synthetic_5k", [synthetic, "--policy", "policies/transformer.json", "--world-size", "8"])
        add("synthetic_5k_json", [synthetic, "--policy", "policies/transformer.json", "-f", "json"])
    # suggest.
    for m in models:
        tag = os.path.basename(m).replace(".", "_")
        for v in ("1", "2"):
            for ws, budget in (("8", "80GiB"), ("8", "1MiB"), ("64", "24GiB")):
                add(f"suggest_{tag}_v{v}_{ws}x{budget}", ["suggest", m, "--world-size", ws, "--budget", budget,
                                                          "--fsdp-version", v])
            add(f"suggestjson_{tag}_v{v}", ["suggest", m, "--world-size", "8", "--budget", "80GiB",
                                            "--fsdp-version", v, "-f", "json"])
            add(f"suggesto_{tag}_v{v}", ["suggest", m, "--world-size", "8", "--budget", "80GiB",
                                         "--fsdp-version", v, "-o", "{OUT}"], "best.json")
    # Errors of the command lines themselves.
    for name, argv in (("usage_none", []), ("usage_help", ["--help"]), ("usage_version", ["--version"]),
                       ("usage_typo", ["sample_models/tiny_gpt.pt", "--polcy", "x"]),
                       ("usage_emit_format", ["sample_models/tiny_gpt.pt", "--emit", "torch", "-f", "json"]),
                       ("diff_help", ["diff", "--help"]), ("suggest_help", ["suggest", "--help"]),
                       ("missing_model", ["nonexistent.pt"]), ("policy_as_model", ["policies/transformer.json"])):
        add(name, argv)
    return out


def run_case(binary, outdir, case):
    name, argv, ofile = case
    argv = list(argv)
    if ofile:
        target = os.path.join(outdir, f"{name}.{ofile}")
        argv = [a.replace("{OUT}", target) for a in argv]
    r = subprocess.run([binary, *argv], capture_output=True, cwd=ROOT, env={**os.environ, "COLUMNS": "100"})
    for ext, data in (("out", r.stdout), ("err", r.stderr), ("rc", f"{r.returncode}\n".encode())):
        data = data.replace(outdir.encode(), b"{OUT}")
        data = TIMING.sub(b"in N ms", data)  # -v's timings are the only output that varies run to run
        with open(os.path.join(outdir, f"{name}.{ext}"), "wb") as f:
            f.write(data)
    return name, r.returncode


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("outdir")
    ap.add_argument("--corpus", default=os.path.join(ROOT, "build", "corpus"),
                    help="the corpus test's models (default build/corpus; skipped when absent)")
    ap.add_argument("--synthetic", default=os.path.join(ROOT, "build", "snapshot", "synthetic_5k.pt"),
                    help="where the synthetic 5,000-module archive is made (once)")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    binary = os.path.abspath(args.binary)
    outdir = os.path.abspath(args.outdir)
    os.makedirs(outdir, exist_ok=True)
    if not os.path.exists(args.synthetic):
        import loader_bench  # noqa: E402  (bench/, on sys.path above)
        os.makedirs(os.path.dirname(args.synthetic), exist_ok=True)
        loader_bench.write_synthetic_archive(args.synthetic, 5000 - 2)  # + Net + ModuleList
    corpus = args.corpus if os.path.isdir(args.corpus) else None
    all_cases = cases(corpus, rel(args.synthetic))
    names = [c[0] for c in all_cases]
    dup = {n for n in names if names.count(n) > 1}
    assert not dup, f"duplicate case names: {sorted(dup)[:5]}"
    # Diff diffs: pairs of the JSON plans written above, run after them.
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        codes = dict(pool.map(lambda c: run_case(binary, outdir, c), all_cases))
    jsons = sorted(n for n in codes if n.startswith("json_") and codes[n] in (0, 1))[:40]
    diff_cases = []
    for a, b in zip(jsons, jsons[1:] + jsons[:1]):
        for fmt in ("text", "json"):
            diff_cases.append((f"diff_{fmt}_{a}_{b}", ["diff", os.path.join(outdir, a + ".out"),
                                                      os.path.join(outdir, b + ".out"), "--format", fmt], None))
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        codes.update(pool.map(lambda c: run_case(binary, outdir, c), diff_cases))
    digest = hashlib.sha256()
    for n in sorted(os.listdir(outdir)):
        with open(os.path.join(outdir, n), "rb") as f:
            digest.update(n.encode() + b"\0" + f.read())
    by_code = {}
    for c in codes.values():
        by_code[c] = by_code.get(c, 0) + 1
    print(f"{len(codes)} cases ({', '.join(f'exit {k}: {v}' for k, v in sorted(by_code.items()))}), "
          f"{len(os.listdir(outdir))} files, sha256 {digest.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
