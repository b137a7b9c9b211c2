#!/usr/bin/python3
"""Loader benchmark for fsdp-plan.

  /usr/bin/python3 bench/loader_bench.py [--binary PATH] [--reps N] [--workdir DIR] [--quick]

1. Makes the models it needs in the work dir (reused when already there):
   torchvision vit_h_14 (weights=None) scripted and saved (~2.5 GB), and two
   synthetic archives of 5,000 and 50,000 modules.
2. Times fsdp-plan end to end on the two synthetic models (three times the
   reps, before anything big has run), then warms the page cache and times,
   interleaved rep by rep:
     fsdp-plan MODEL --policy P                 (archive loader, the default)
     fsdp-plan MODEL --policy P --loader jit
     /usr/bin/python3 -c 'torch.jit.load(MODEL)'  (a fresh process)
3. Prints medians, min/max, ratios and a PASS/MISS summary. Exits 0 either
   way: this is a measurement, not a test.

Wall time is time.perf_counter() around each child process (GNU time
included, about 1 ms). Peak RSS is what GNU `/usr/bin/time -f %M` prints for
that one child.

See bench/README.md.
"""
import argparse
import hashlib
import io
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PYTHON = "/usr/bin/python3"  # Debian's, the one with torch 1.13 + torchvision 0.14

GB = 10**9
MB = 10**6

# --- child scripts -----------------------------------------------------------

# Builds a torchvision model without weights, scripts and saves it. Runs in its
# own process so the eager model's memory is gone before anything is measured.
MAKE_TORCHVISION = r"""
import os, sys, time, torch, torchvision
arch, out = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
model = getattr(torchvision.models, arch)(weights=None).eval()
scripted = torch.jit.script(model)
tmp = out + ".tmp"
torch.jit.save(scripted, tmp)
os.replace(tmp, out)
n = sum(p.numel() for p in model.parameters())
print(f"{arch}: {n / 1e6:.1f}M params, built, scripted and saved in {time.perf_counter() - t0:.1f} s")
"""

# torch.jit.load in a fresh interpreter; prints the import and load times.
TORCH_JIT_LOAD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
m = torch.jit.load(sys.argv[1])
t2 = time.perf_counter()
print(json.dumps({"import": t1 - t0, "load": t2 - t1}))
"""

# The synthetic model, as a Python module: the hand-written archives below
# mirror what torch.jit.save writes for it (checked at a small size).
SYNTHETIC_PY = r"""
import sys, torch, torch.nn as nn

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(8, 8))
        self.bias = nn.Parameter(torch.zeros(8))
        self.register_buffer("scale", torch.ones(8))

    def forward(self, x):
        return (x @ self.weight + self.bias) * self.scale

class Net(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(n)])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x

torch.jit.save(torch.jit.script(Net(int(sys.argv[1]))), sys.argv[2])
"""

# --- the synthetic archive, written by hand ------------------------------------

# torch.jit.script + save of Net(N) takes minutes at N=50,000 (scripting is
# ~1 ms per block and saving grows faster than linearly), so the archive is
# written directly, in the exact layout torch.jit.save uses for Net(N):
# data.pkl (protocol 2), one data/<key> record per tensor, code/ with the
# class declarations and the unrolled forward, constants.pkl, version.

BLOCK_TENSORS = [  # name, shape, is_parameter, value of every element
    ("weight", (8, 8), True, 0.0),
    ("bias", (8,), True, 0.0),
    ("scale", (8,), False, 1.0),
]

NET_CODE_HEAD = """class Net(Module):
  __parameters__ = []
  __buffers__ = []
  training : bool
  _is_full_backward_hook : Optional[bool]
  blocks : __torch__.torch.nn.modules.container.ModuleList
  def forward(self: __torch__.Net,
    x: Tensor) -> Tensor:
    blocks = self.blocks
"""

BLOCK_CODE = """class Block(Module):
  __parameters__ = ["weight", "bias", ]
  __buffers__ = ["scale", ]
  weight : Tensor
  bias : Tensor
  scale : Tensor
  training : bool
  _is_full_backward_hook : Optional[bool]
  def forward(self: __torch__.Block,
    x: Tensor) -> Tensor:
    weight = self.weight
    _0 = torch.matmul(x, weight)
    bias = self.bias
    _1 = torch.add(_0, bias)
    scale = self.scale
    return torch.mul(_1, scale)
"""

MODULE_LIST_CODE_HEAD = """class ModuleList(Module):
  __parameters__ = []
  __buffers__ = []
  training : bool
  _is_full_backward_hook : NoneType
"""


class PickleWriter:
    """Writes pickle opcodes the way LibTorch's Pickler does (protocol 2):
    strings and globals memoized by value, BINPUT after each persistent id,
    tensor and object."""

    def __init__(self):
        self.out = io.BytesIO()
        self.memo = {}  # ("str" | "global", text) -> memo index
        self.next_id = 0

    def raw(self, b):
        self.out.write(b)

    def put(self):  # BINPUT / LONG_BINPUT
        i = self.next_id
        self.next_id += 1
        self.raw(b"q" + bytes([i]) if i <= 255 else b"r" + struct.pack("<I", i))
        return i

    def get(self, i):  # BINGET / LONG_BINGET
        self.raw(b"h" + bytes([i]) if i <= 255 else b"j" + struct.pack("<I", i))

    def memoized(self, key, write):
        if key in self.memo:
            self.get(self.memo[key])
        else:
            write()
            self.memo[key] = self.put()

    def string(self, text):  # BINUNICODE
        b = text.encode()
        self.memoized(("str", text), lambda: self.raw(b"X" + struct.pack("<I", len(b)) + b))

    def global_(self, module, name):  # GLOBAL
        self.memoized(("global", module + " " + name),
                      lambda: self.raw(b"c" + module.encode() + b"\n" + name.encode() + b"\n"))

    def int(self, n):  # BININT1 / BININT2 / BININT
        if 0 <= n <= 255:
            self.raw(b"K" + bytes([n]))
        elif 0 <= n <= 65535:
            self.raw(b"M" + struct.pack("<H", n))
        else:
            self.raw(b"J" + struct.pack("<i", n))

    def int_tuple(self, values):
        self.raw(b"(")
        for v in values:
            self.int(v)
        self.raw(b"t")

    def tensor(self, key, shape, requires_grad):
        numel = 1
        for d in shape:
            numel *= d
        stride = [1] * len(shape)
        for i in range(len(shape) - 2, -1, -1):
            stride[i] = stride[i + 1] * shape[i + 1]
        self.global_("torch._utils", "_rebuild_tensor_v2")
        self.raw(b"((")
        self.string("storage")
        self.global_("torch", "FloatStorage")
        self.string(key)
        self.string("cpu")
        self.int(numel)
        self.raw(b"tQ")  # TUPLE, BINPERSID
        self.put()
        self.int(0)  # storage offset
        self.int_tuple(shape)
        self.int_tuple(stride)
        self.raw(b"\x88" if requires_grad else b"\x89")
        self.global_("collections", "OrderedDict")
        self.raw(b")R")  # backward hooks: OrderedDict()
        self.raw(b"tR")  # TUPLE, REDUCE: _rebuild_tensor_v2(...)
        self.put()

    def object_start(self, module, cls):  # GLOBAL, EMPTY_TUPLE, NEWOBJ, EMPTY_DICT, MARK
        self.global_(module, cls)
        self.raw(b")\x81}(")

    def object_end(self):  # SETITEMS, BUILD
        self.raw(b"ub")
        self.put()

    def module_flags(self):
        self.string("training")
        self.raw(b"\x88")  # True
        self.string("_is_full_backward_hook")
        self.raw(b"N")  # None


def write_synthetic_archive(path, n_blocks):
    """Writes the TorchScript archive of Net(n_blocks): Net > ModuleList > n_blocks
    Blocks, each with 2 parameters and 1 buffer, as torch.jit.save would."""
    p = PickleWriter()
    records = []  # the data/<key> records, key = index
    p.raw(b"\x80\x02")
    p.object_start("__torch__", "Net")
    p.module_flags()
    p.string("blocks")
    p.object_start("__torch__.torch.nn.modules.container", "ModuleList")
    p.module_flags()
    for i in range(n_blocks):
        p.string(str(i))
        p.object_start("__torch__", "Block")
        for name, shape, is_param, value in BLOCK_TENSORS:
            p.string(name)
            p.tensor(str(len(records)), shape, is_param)
            numel = 1
            for d in shape:
                numel *= d
            records.append(struct.pack("<f", value) * numel)
        p.module_flags()
        p.object_end()
    p.object_end()  # ModuleList
    p.object_end()  # Net
    p.raw(b".")     # STOP

    net_code = [NET_CODE_HEAD]
    net_code += [f'    _{i} = getattr(blocks, "{i}")\n' for i in range(n_blocks)]
    x = "x"
    for i in range(n_blocks - 1):
        net_code.append(f"    x{i} = (_{i}).forward({x}, )\n")
        x = f"x{i}"
    net_code.append(f"    return (_{n_blocks - 1}).forward({x}, )\n")
    list_code = [MODULE_LIST_CODE_HEAD]
    list_code += [f'  __annotations__["{i}"] = __torch__.Block\n' for i in range(n_blocks)]
    list_code.append("  def __len__(self: __torch__.torch.nn.modules.container.ModuleList) -> int:\n"
                     f"    return {n_blocks}\n")

    prefix = os.path.splitext(os.path.basename(path))[0]
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as z:
        for key, data in enumerate(records):
            z.writestr(f"{prefix}/data/{key}", data)
        z.writestr(f"{prefix}/data.pkl", p.out.getvalue())
        z.writestr(f"{prefix}/code/__torch__.py", "".join(net_code) + BLOCK_CODE)
        z.writestr(f"{prefix}/code/__torch__/torch/nn/modules/container.py", "".join(list_code))
        z.writestr(f"{prefix}/constants.pkl", b"\x80\x02).")
        z.writestr(f"{prefix}/version", b"3\n")
    os.replace(tmp, path)


# --- running and measuring -----------------------------------------------------

def measure(cmd):
    """Runs cmd to completion; returns (wall seconds, peak RSS bytes, stdout, stderr, exit code).
    Peak RSS comes from GNU time around cmd: a child forked from this Python
    process starts its ru_maxrss at Python's own size (89 MB here), which
    hid everything below that."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as rss:
        t0 = time.perf_counter()
        p = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", rss.name, *cmd], stdout=out, stderr=err)
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        kb = int(rss.read().strip().splitlines()[-1])
        return wall, kb * 1024, out.read().decode(), err.read().decode(), p.returncode


class Case:
    """One command measured several times."""

    def __init__(self, name, cmd, ok_codes=(0, 1)):
        self.name, self.cmd, self.ok_codes = name, cmd, ok_codes
        self.walls, self.rss, self.load_calls, self.imports = [], [], [], []
        self.last_stdout = self.last_stderr = ""

    def run_once(self):
        wall, rss, out, err, rc = measure(self.cmd)
        if rc not in self.ok_codes:
            sys.exit(f"error: {' '.join(self.cmd)} exited {rc}:\n{err.strip()[-2000:]}")
        self.walls.append(wall)
        self.rss.append(rss)
        self.last_stdout, self.last_stderr = out, err
        if self.cmd[0] == PYTHON:  # the torch.jit.load child reports its own timings
            times = json.loads(out.strip().splitlines()[-1])
            self.load_calls.append(times["load"])
            self.imports.append(times["import"])


def run_interleaved(cases, reps, label):
    for rep in range(reps):
        for case in cases:
            case.run_once()
        summary = ", ".join(f"{c.name} {c.walls[-1]:.2f} s" for c in cases)
        print(f"  {label} rep {rep + 1}/{reps}: {summary}", flush=True)


def med(xs):
    return statistics.median(xs)


def fmt_s(xs):
    return f"{med(xs):8.3f} s  (min {min(xs):.3f}, max {max(xs):.3f})"


def fmt_mb(xs):
    return f"{med(xs) / MB:7.1f} MB (min {min(xs) / MB:.1f}, max {max(xs) / MB:.1f})"


def print_table(cases):
    width = max(len(c.name) for c in cases)
    print(f"  {'':{width}}  {'wall, median':>14}                      {'peak RSS, median'}")
    for c in cases:
        print(f"  {c.name:{width}}  {fmt_s(c.walls)}   {fmt_mb(c.rss)}")


def warm_page_cache(path):
    t0 = time.perf_counter()
    with open(path, "rb") as f:
        while f.read(64 * 2**20):
            pass
    print(f"warmed the page cache: read {os.path.getsize(path) / GB:.2f} GB "
          f"in {time.perf_counter() - t0:.1f} s")


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


# --- the benchmark -------------------------------------------------------------

def make_models(args, arch, workdir):
    big = os.path.join(workdir, f"{arch}.pt")
    if os.path.exists(big):
        print(f"reusing {big}")
    else:
        print(f"making {big} (torchvision {arch}, weights=None, scripted) ...", flush=True)
        subprocess.run([PYTHON, "-c", MAKE_TORCHVISION, arch, big], check=True)

    synthetic = {}
    for modules in args.synthetic_sizes:
        path = os.path.join(workdir, f"synthetic_{modules}.pt")
        if os.path.exists(path):
            print(f"reusing {path}")
        else:
            t0 = time.perf_counter()
            write_synthetic_archive(path, modules - 2)  # + Net + ModuleList
            print(f"wrote {path} ({modules} modules) in {time.perf_counter() - t0:.1f} s")
        synthetic[modules] = path
    return big, synthetic


def check_synthetic_format(binary, workdir, policy):
    """The hand-written archive must be what torch.jit.save writes. At 300
    blocks (past the 256 one-byte memo slots): every member byte-identical
    except the optional .debug_pkl source maps, and both loaders plan it
    exactly like torch's own."""
    n = 300
    by_torch = os.path.join(workdir, f"check_torch_{n}.pt")
    by_hand = os.path.join(workdir, f"check_hand_{n}.pt")
    script = os.path.join(workdir, "synthetic_model.py")  # torch.jit.script needs a source file
    with open(script, "w") as f:
        f.write(SYNTHETIC_PY)
    subprocess.run([PYTHON, script, str(n), by_torch], check=True)
    write_synthetic_archive(by_hand, n)

    def members(path):
        with zipfile.ZipFile(path) as z:
            return {name.split("/", 1)[1]: z.read(name) for name in z.namelist()
                    if not name.endswith(".debug_pkl")}

    if members(by_torch) != members(by_hand):
        sys.exit("error: the hand-written synthetic archive differs from torch.jit.save's")
    plans = []
    for path, loader in [(by_torch, "archive"), (by_hand, "archive"), (by_hand, "jit")]:
        _, _, out, err, rc = measure([binary, path, "--policy", policy, "-f", "json",
                                      "--loader", loader])
        if rc not in (0, 1):
            sys.exit(f"error: synthetic format check: {path} --loader {loader}: {err.strip()}")
        plan = json.loads(out)
        del plan["model"]["path"]
        plans.append(plan)
    if any(p != plans[0] for p in plans):
        sys.exit("error: the hand-written synthetic archive does not plan like torch.jit.save's")
    print(f"synthetic format check: the hand-written Net({n}) archive is byte-identical to "
          f"torch.jit.save's (but for .debug_pkl) and plans the same with both loaders")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default=os.path.join(REPO, "build", "app", "fsdp-plan"))
    ap.add_argument("--reps", type=int, help="repetitions per case (default 5; 2 with --quick)")
    ap.add_argument("--workdir", default="/tmp/fsdp_plan_bench",
                    help="where models are made and reused (default %(default)s)")
    ap.add_argument("--build-check", action="store_true",
                    help="also time a fresh build without LibTorch (bench/build_bench.py, default variant)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: vit_b_16 (~350 MB) instead of vit_h_14, 2 reps")
    args = ap.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # keep order with the children's output in a log
    args.reps = args.reps or (2 if args.quick else 5)
    args.synthetic_sizes = [5000, 50000]
    arch = "vit_b_16" if args.quick else "vit_h_14"
    source_binary = os.path.abspath(args.binary)
    if not os.access(source_binary, os.X_OK):
        sys.exit(f"error: no fsdp-plan binary at {source_binary} (build it, or pass --binary)")
    workdir = os.path.abspath(args.workdir)
    os.makedirs(workdir, exist_ok=True)
    # Run a copy, so that a rebuild during the run cannot mix two builds.
    binary = os.path.join(workdir, "fsdp-plan")
    shutil.copy2(source_binary, binary)
    # --loader jit's plugin is found beside the binary.
    plugin = os.path.join(os.path.dirname(source_binary), "fsdp_plan_jit.so")
    if not os.path.exists(plugin):
        sys.exit(f"error: no {plugin}: build with LibTorch to compare --loader jit")
    shutil.copy2(plugin, os.path.join(workdir, "fsdp_plan_jit.so"))
    with open(binary, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:12]
    revision = sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"])
    if sh(["git", "-C", REPO, "status", "--porcelain", "--", "app", "lib", "CMakeLists.txt"]):
        revision += " + uncommitted changes in app/ or lib/"

    print(f"fsdp-plan loader benchmark: {' '.join(sys.argv)}")
    print(f"binary {source_binary} (sha256 {digest}, run as a copy in the workdir), "
          f"reps {args.reps}, workdir {workdir}\n")

    big, synthetic = make_models(args, arch, workdir)
    size = os.path.getsize(big)
    print(f"{arch}.pt is {size / GB:.2f} GB")
    if not args.quick and size < 2 * GB:
        sys.exit(f"error: {big} is under 2 GB")

    vit_policy = os.path.join(workdir, "policy_vit.json")
    with open(vit_policy, "w") as f:
        json.dump({"module_classes": ["EncoderBlock"],
                   "mixed_precision": {"param_dtype": "bfloat16"}}, f)
    block_policy = os.path.join(workdir, "policy_block.json")
    with open(block_policy, "w") as f:
        json.dump({"module_classes": ["Block"],
                   "mixed_precision": {"param_dtype": "bfloat16"}}, f)
    check_synthetic_format(binary, workdir, block_policy)

    load_avg_start = os.getloadavg()

    # 1. plan time against model size in modules. First, before any 2.7 GB
    # process: while the kernel reclaims what those leave behind, runs of a
    # few hundred milliseconds stall (a 5,000-module run once took 0.155 s
    # instead of 0.04 s). Three times the reps, after one untimed rep: they are cheap.
    # The fixed cost of every fsdp-plan run: process start (and nothing of LibTorch).
    startup = Case("fsdp-plan --version", [binary, "--version"])
    syn_reps = 3 * args.reps
    print(f"\n== synthetic models: Net > ModuleList > Blocks (2 params + 1 buffer each), "
          f"policy wraps every Block; {syn_reps} reps, interleaved", flush=True)
    syn_cases = [Case(f"{m:,} modules", [binary, synthetic[m], "--policy", block_policy])
                 for m in args.synthetic_sizes]
    for c in syn_cases + [startup]:
        measure(c.cmd)
    run_interleaved(syn_cases + [startup], syn_reps, "synthetic")
    print()
    print_table(syn_cases + [startup])
    small, large = syn_cases
    large_tensors = 3 * (args.synthetic_sizes[1] - 2)  # Blocks of 2 params + 1 buffer
    ratio_syn = med(large.walls) / med(small.walls)
    floor = med(startup.walls)
    ratio_syn_net = (med(large.walls) - floor) / (med(small.walls) - floor)
    print(f"\n  ratio of medians, 50,000 / 5,000 modules: {ratio_syn:.1f}x end to end; "
          f"{ratio_syn_net:.1f}x after taking off the fsdp-plan --version median ({floor:.3f} s)")

    # Load libtorch and torch once, so the first timed run is not the one that
    # pulls the shared libraries into the page cache.
    measure([binary, "--version"])
    measure([binary, big, "--loader", "jit", "--dump-tree", "-o", os.devnull])
    measure([PYTHON, "-c", "import torch"])
    warm_page_cache(big)
    # 2. the big model, three ways
    archive = Case("fsdp-plan (archive)", [binary, big, "--policy", vit_policy])
    jit = Case("fsdp-plan --loader jit", [binary, big, "--policy", vit_policy, "--loader", "jit"])
    python = Case("python torch.jit.load", [PYTHON, "-c", TORCH_JIT_LOAD, big], ok_codes=(0,))
    print(f"\n== {arch}.pt ({size / GB:.2f} GB), policy {{module_classes: [EncoderBlock], "
          f"mixed_precision}}; {args.reps} reps, interleaved", flush=True)
    run_interleaved([archive, jit, python, startup], args.reps, arch)
    print()
    print_table([archive, jit, python, startup])
    print(f"  {'  of which torch.jit.load() alone':{len(python.name)}}  {fmt_s(python.load_calls)}")
    print(f"  {'  of which import torch':{len(python.name)}}  {fmt_s(python.imports)}")
    plan_head = archive.last_stdout.splitlines()[:2]
    print("\n  fsdp-plan says: " + "\n                  ".join(plan_head))

    ratio_py = med(python.walls) / med(archive.walls)
    ratio_py_load = med(python.load_calls) / med(archive.walls)
    ratio_jit = med(jit.walls) / med(archive.walls)
    print("\n  ratios of medians:")
    print(f"    python torch.jit.load process / fsdp-plan (archive)  {ratio_py:7.1f}x")
    print(f"    torch.jit.load() call alone   / fsdp-plan (archive)  {ratio_py_load:7.1f}x")
    print(f"    fsdp-plan --loader jit        / fsdp-plan (archive)  {ratio_jit:7.1f}x")

    print("\n== where the time goes: one more run of each with -v")
    verbose = [Case(c.name, c.cmd + ["-v"]) for c in syn_cases + [archive, jit]]
    for c in verbose:
        c.run_once()
        for line in c.last_stderr.strip().splitlines():
            print(f"  {c.name:<22} {line}")
        print(f"  {c.name:<22} end to end {c.walls[0]:.3f} s, peak RSS {c.rss[0] / MB:.1f} MB")

    # 3. summary
    load_avg_end = os.getloadavg()
    max_rss_syn = max(max(c.rss) for c in syn_cases)

    def verdict(ok):
        return "PASS" if ok else "MISS"

    print("\n== summary")
    print(f"  {verdict(ratio_py >= 50)}  fsdp-plan >= 50x faster than python torch.jit.load on {arch}: "
          f"{ratio_py:.1f}x ({med(python.walls):.2f} s / {med(archive.walls):.3f} s, whole processes; "
          f"the load call alone: {ratio_py_load:.1f}x)")
    print(f"  {verdict(max(archive.rss) < 30 * MB)}  fsdp-plan peak RSS under 30 MB on {arch}: "
          f"max {max(archive.rss) / MB:.1f} MB over {args.reps} runs")
    print(f"  {verdict(med(large.walls) < 0.5 and max(large.rss) < 150 * MB)}  50,000 modules "
          f"({large_tensors:,} tensors) under 0.5 s and 150 MB: {med(large.walls):.3f} s, "
          f"max {max(large.rss) / MB:.1f} MB")
    print(f"  {verdict(ratio_syn <= 11)}  10x the modules costs at most 11x the time: "
          f"{ratio_syn:.1f}x ({med(large.walls):.3f} s / {med(small.walls):.3f} s, end to end)")
    if args.build_check:
        sys.path.insert(0, HERE)
        import build_bench
        head, [(_, build_s, build_cpu, *_, libs)] = build_bench.measure([build_bench.DEFAULT], os.cpu_count() or 2)
        print(f"  {verdict(build_s < 60)}  fresh Release build of {head} without LibTorch "
              f"({os.cpu_count()} jobs, ccache off) under a minute: {build_s:.1f} s ({build_cpu:.0f} s of CPU)")
        print(f"  info  the LibTorch-free fsdp-plan links: {', '.join(libs)}")
    print(f"  info  50,000/5,000 ratio without the fixed start-up cost: {ratio_syn_net:.1f}x; "
          f"fsdp-plan --version alone takes {floor:.3f} s and {med(startup.rss) / MB:.0f} MB")
    print(f"  info  python torch.jit.load / fsdp-plan --version: {med(python.walls) / floor:.1f}x, "
          f"the most that any fsdp-plan run (which pays the start-up) could reach here")
    print(f"  info  peak RSS of each on {arch} (median): fsdp-plan {med(archive.rss) / MB:.0f} MB, "
          f"fsdp-plan --loader jit {med(jit.rss) / MB:.0f} MB, "
          f"python torch.jit.load {med(python.rss) / MB:.0f} MB")
    if args.quick:
        print(f"  (--quick: {arch} is {size / GB:.2f} GB, not the 2.5 GB model the target is about)")
    print("\n  machine:")
    print(f"    nproc {os.cpu_count()}, {sh(['grep', '-m1', 'model name', '/proc/cpuinfo']).split(':')[-1].strip()}")
    mem_kb = int(sh(["awk", "/MemTotal/ {print $2}", "/proc/meminfo"]) or 0)
    print(f"    memory {mem_kb / 2**20:.1f} GiB, {platform.platform()}")
    print(f"    load average at start {load_avg_start[0]:.2f}, at end {load_avg_end[0]:.2f} (1-minute)")
    print(f"    {sh([binary, '--version'])}, binary sha256 {digest}; repo at start: {revision}")
    print(f"    python torch {sh([PYTHON, '-c', 'import torch; print(torch.__version__)'])}")
    print(f"    command: {PYTHON} {' '.join(sys.argv)}")
    print("    wall = time.perf_counter() around the child; peak RSS = /usr/bin/time -f %M of that "
          "child; MB = 10^6 bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
