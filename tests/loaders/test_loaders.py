#!/usr/bin/python3
"""Loader tests: makes archives with Debian's torch in a temp dir and runs
tree_dump on them.

  test_loaders.py TREE_DUMP GROUP

GROUP is one of:
  equal          small hand-written models: both loaders give byte-identical dumps
  torchvision    torchvision models (weights=None), same check
  archive_only   archives the JIT loader refuses but the archive loader reads
  not_torchscript  non-TorchScript inputs get a clear InputError
  robustness     truncated/corrupted archives and a 100,000-deep chain: exit 0 or 2, never crash
  hostile        truncated, damaged, oversized and incomplete archives and hostile pickles each
                 get their own clear InputError; the fuzzer's saved inputs (REGRESSIONS dir) too

Must run with /usr/bin/python3 (the interpreter with torch).
"""
import io
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import zipfile
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn

TREE_DUMP = None
TMP = None
FAILURES = []


def run(kind, path, *extra, timeout=600):
    p = subprocess.run([TREE_DUMP, kind, path, *extra], capture_output=True, text=True,
                       errors="replace", timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    print(("ok    " if cond else "FAIL  ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def save(name, module):
    path = os.path.join(TMP, name + ".pt")
    torch.jit.save(module, path)
    return path


TORCH2 = int(torch.__version__.split(".")[0]) >= 2


def assert_same(name, path):
    rc_a, out_a, err_a = run("archive", path)
    rc_j, out_j, err_j = run("jit", path)
    if TORCH2 and rc_a == 0 and rc_j == 2 and "torch::jit::load failed" in err_j:
        # Debian's LibTorch 1.13 cannot read every torch 2.x archive; the
        # build against the torch 2.13 wheel's LibTorch compares them all.
        print(f"      {name}: the jit plugin's LibTorch cannot read this torch {torch.__version__} "
              f"archive ({err_j.strip()[:160]}); archive loader alone")
        check_no_storage_read(name, path)
        return out_a
    same = rc_a == 0 and rc_j == 0 and out_a == out_j
    detail = ""
    if not same:
        detail = f" (archive rc={rc_a} {err_a.strip()[:200]}; jit rc={rc_j} {err_j.strip()[:200]})"
        if rc_a == 0 and rc_j == 0:
            a, j = json.loads(out_a)["modules"], json.loads(out_j)["modules"]
            for x, y in zip(a, j):
                if x != y:
                    detail += f"\n      archive: {json.dumps(x)[:300]}\n      jit:     {json.dumps(y)[:300]}"
                    break
            detail += f"\n      modules: archive {len(a)} jit {len(j)}"
    check(same, f"{name}: loaders agree{detail}")
    check_no_storage_read(name, path)
    return out_a


def check_no_storage_read(name, path):
    """The archive loader must not read any data/ record: what it reads from
    the file plus the bytes of all storages must fit in the file."""
    with zipfile.ZipFile(path) as z:
        data_bytes = sum(i.file_size for i in z.infolist() if "/data/" in i.filename)
        n_storages = sum(1 for i in z.infolist() if "/data/" in i.filename)
        # libzip looks for the end record in the last 64 KiB (the longest
        # zip comment) and then reads the central directory: small files
        # are read whole, big ones must leave their storages alone.
        directory = os.path.getsize(path) - z.start_dir
        tail = min(os.path.getsize(path), 65535 + 22)
    rc, _, err = run("archive", path, "--stats")
    stats = dict(kv.split("=") for kv in err.split())
    size, read = int(stats["file_size"]), int(stats["bytes_read"])
    check(rc == 0 and read + data_bytes <= size + directory + tail and int(stats["storages_requested"]) > 0,
          f"{name}: no storage read (file {size} B, read {read} B, storages {data_bytes} B "
          f"in {n_storages} records, requested {stats['storages_requested']})")


# ---------------------------------------------------------------- models

class Tied(nn.Module):
    """Embedding and output head sharing one weight, plus the usual suspects."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.layers = nn.ModuleList([nn.Linear(4, 4), nn.BatchNorm1d(4)])
        self.d = nn.ModuleDict({"b": nn.Linear(4, 4, bias=False), "a": nn.ReLU()})
        self.head = nn.Linear(4, 10)
        self.head.weight = self.emb.weight
        self.register_buffer("none_buf", None)
        self.register_parameter("none_param", None)
        self.register_buffer("steps", torch.zeros(3, dtype=torch.int64))
        self.p_bf16 = nn.Parameter(torch.zeros(2, 3, dtype=torch.bfloat16))
        self.p_half = nn.Parameter(torch.zeros(5, dtype=torch.half))
        self.mha = nn.MultiheadAttention(4, 2)
        self.mha_kv = nn.MultiheadAttention(4, 2, add_bias_kv=True)
        self.frozen = nn.Linear(4, 2)  # requires_grad=False survives TorchScript
        self.frozen.weight.requires_grad_(False)

    def forward(self, x):
        y = self.emb(x)
        for l in self.layers:
            y = l(y)
        return self.head(self.d["b"](y))


class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.norm = nn.LayerNorm(n)
        self.ff = nn.Sequential(nn.Linear(n, 2 * n), nn.GELU(), nn.Linear(2 * n, n))
        self.register_buffer("mask", torch.ones(n, dtype=torch.bool))

    def forward(self, x):
        return x + self.ff(self.norm(x))


@torch.jit.script
class Holder:  # a script class, not a module: never a child
    def __init__(self, t: torch.Tensor):
        self.t = t


class Custom(nn.Module):
    """Custom classes, nesting, containers, non-module attributes."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(8), Block(8))
        self.extra = nn.ModuleList([nn.Sequential(Block(8)), nn.Identity()])
        self.shared = nn.Linear(8, 8)
        self.shared_again = self.shared  # one module object reachable twice
        self.conv = nn.Conv2d(3, 4, 3)
        self.holder = Holder(torch.zeros(2))
        self.table: Dict[str, torch.Tensor] = {"x": torch.zeros(1)}
        self.tensors: List[torch.Tensor] = [torch.zeros(3)]
        self.opt: Optional[torch.Tensor] = None
        self.scale = 2.0

    def forward(self, x):
        return self.shared_again(self.shared(self.blocks(x))) * self.scale


class Traceable(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                                      nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(8, 4)
        self.unused = nn.Linear(2, 2)  # traced modules keep unused submodules
        self.register_buffer("ids", torch.arange(4))

    def forward(self, x):
        return self.fc(self.features(x).flatten(1)) + self.ids


class WithSetstate(nn.Module):
    """Restores its parameter in __setstate__: the archive loader cannot run
    that and must say so rather than guess."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(3))

    def forward(self, x):
        return x * self.w.sum()

    @torch.jit.export
    def __getstate__(self):
        return (self.w, self.training)

    @torch.jit.export
    def __setstate__(self, state: Tuple[torch.Tensor, bool]):
        self.w = state[0]
        self.training = state[1]


class QStatic(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = torch.ao.quantization.QuantStub()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)
        self.dequant = torch.ao.quantization.DeQuantStub()

    def forward(self, x):
        x = self.bn(self.conv(self.quant(x)))
        return self.dequant(self.fc(x.mean([2, 3])))


def quantized_models():
    torch.backends.quantized.engine = "qnnpack"
    dyn = torch.ao.quantization.quantize_dynamic(
        nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)), {nn.Linear}, dtype=torch.qint8)
    out = [("quantized_dynamic", torch.jit.script(dyn))]
    m = QStatic().eval()
    m.qconfig = torch.ao.quantization.get_default_qconfig("qnnpack")
    prepared = torch.ao.quantization.prepare(m)
    prepared(torch.randn(2, 3, 8, 8))
    out.append(("quantized_static", torch.jit.script(torch.ao.quantization.convert(prepared))))
    return out


# ---------------------------------------------------------------- groups

def group_equal():
    out = assert_same("scripted_tied", save("tied", torch.jit.script(Tied())))
    assert_same("scripted_custom", save("custom", torch.jit.script(Custom())))
    assert_same("traced", save("traced", torch.jit.trace(Traceable().eval(), torch.randn(1, 3, 8, 8))))
    assert_same("scripted_traceable", save("traceable", torch.jit.script(Traceable())))
    half = Traceable().half()
    assert_same("half_model", save("half", torch.jit.script(half)))
    for name, m in quantized_models():
        assert_same(name, save(name, m))
    frozen = [m for m in json.loads(out)["modules"] if m["path"] == "frozen"]
    check(frozen and [p["requires_grad"] for p in frozen[0]["params"]] == [False, True],
          f"frozen weight: requires_grad false, bias true ({frozen and frozen[0]['params']})")


def group_torchvision():
    import torchvision.models as tvm
    for name in ["resnet18", "mobilenet_v3_small", "vit_b_16"]:
        model = getattr(tvm, name)(weights=None).eval()
        assert_same(name + "_scripted", save(name, torch.jit.script(model)))
    model = tvm.resnet18(weights=None).eval()
    assert_same("resnet18_traced",
                save("resnet18_traced", torch.jit.trace(model, torch.randn(1, 3, 64, 64))))


def rewrite_zip(src, dst, edit=None, extra=None):
    """Copies zip src to dst, passing each member through edit(name, bytes)
    and appending extra {suffix: bytes} under the archive's directory."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        prefix = zin.namelist()[0].split("/")[0]
        for info in zin.infolist():
            data = zin.read(info.filename)
            if edit:
                data = edit(info.filename, data)
            zout.writestr(info.filename, data)
        for suffix, data in (extra or {}).items():
            zout.writestr(prefix + "/" + suffix, data)


def group_archive_only():
    orig = save("orig", torch.jit.script(Custom()))
    _, want, _ = run("archive", orig)
    check(want.startswith("{"), "original archive loads")

    bad_op = os.path.join(TMP, "bad_op.pt")
    count = [0]

    def edit(name, data):
        if name.endswith(".py") and b"torch.linear(" in data:
            count[0] += 1
            return data.replace(b"torch.linear(", b"torch.nonexistent_op(")
        return data

    rewrite_zip(orig, bad_op, edit=edit)
    check(count[0] > 0, "unknown-op archive: some code file was edited")
    rc, out, err = run("jit", bad_op)
    check(rc == 2, f"unknown-op archive: jit loader refuses it (rc={rc}: {err.strip()[:150]})")
    rc, out, err = run("archive", bad_op)
    check(rc == 0 and out == want, f"unknown-op archive: archive loader gives the original tree {err}")

    p = save("setstate", torch.jit.script(WithSetstate()))
    rc, out, err = run("jit", p)
    rc_a, _, err_a = run("archive", p)
    check(rc == 0 and rc_a == 2 and "__setstate__" in err_a and "jit" in err_a,
          f"__setstate__ module: jit reads it (rc={rc} {err.strip()[:100]}), archive refuses "
          f"clearly (rc={rc_a} {err_a.strip()})")

    newer = os.path.join(TMP, "newer.pt")
    rewrite_zip(orig, newer, extra={"byteorder": b"little", ".data/version": b"3\n",
                                    ".data/serialization_id": b"1234567890123456789012345678"})
    rc, out, err = run("archive", newer)
    check(rc == 0 and out == want, f"newer-records archive: archive loader gives the original tree {err}")
    rc, _, err = run("jit", newer)
    print(f"      (jit loader on it: rc={rc} {err.strip()[:150]})")


def expect_input_error(name, path, *words):
    rc, out, err = run("archive", path)
    ok = rc == 2 and err.startswith("InputError: ") and err.count("\n") == 1 and \
        all(w in err for w in words)
    check(ok, f"{name}: InputError mentioning {words} -> rc={rc} {err.strip()}")


def group_not_torchscript():
    model = Traceable()
    p = os.path.join(TMP, "state_dict.pt")
    torch.save(model.state_dict(), p)
    expect_input_error("torch.save(state_dict)", p, "torch.save", "state_dict", "torch.jit.script",
                       "torch.jit.trace")
    p = os.path.join(TMP, "pickled_model.pt")
    torch.save(model, p)
    expect_input_error("torch.save(model)", p, "torch.save", "pickled", "torch.jit.script")
    p = os.path.join(TMP, "legacy.pt")
    torch.save(model.state_dict(), p, _use_new_zipfile_serialization=False)
    expect_input_error("legacy torch.save", p, "legacy torch.save", "torch.jit.script")
    rnd = random.Random(1)
    for name, names in [("flat", ["a.txt", "b.txt"]), ("in_dir", ["docs/a.txt", "docs/b.txt"])]:
        p = os.path.join(TMP, f"text_{name}.zip")
        with zipfile.ZipFile(p, "w") as z:
            for n in names:
                z.writestr(n, "".join(rnd.choice("abc \n") for _ in range(500)))
        expect_input_error(f"zip of text files ({name})", p, "zip", "not", "torch.jit.script")
    p = os.path.join(TMP, "text.txt")
    with open(p, "w") as f:
        f.write("hello, not a model\n" * 10)
    expect_input_error("text file", p, "not a zip", "torch.jit.script")
    p = os.path.join(TMP, "empty.pt")
    open(p, "w").close()
    expect_input_error("empty file", p, "empty")
    expect_input_error("missing file", os.path.join(TMP, "nope.pt"), "cannot open")
    expect_input_error("directory", TMP, "not a regular file")


def deep_chain_archive(path, depth):
    """A hand-written archive: a chain of `depth` modules, the last with a
    weight. Python's own picklers recurse, so the pickle is written by hand.
    There is no data/ record at all: a loader that read storages would fail."""
    out = io.BytesIO()
    w = out.write

    def s(text):  # BINUNICODE
        b = text.encode()
        w(b"X" + struct.pack("<I", len(b)) + b)

    w(b"\x80\x02")
    for i in range(depth):
        w(b"c__torch__\nChain\n)\x81}(")  # GLOBAL, EMPTY_TUPLE, NEWOBJ, EMPTY_DICT, MARK
        s("training"); w(b"\x88")
        s("weight")
        if i == depth - 1:
            w(b"ctorch._utils\n_rebuild_tensor_v2\n(")
            w(b"(");  s("storage"); w(b"ctorch\nFloatStorage\n"); s("0"); s("cpu")
            w(b"K\x06tQ")  # BININT1 6, TUPLE, BINPERSID
            w(b"K\x00K\x02K\x03\x86K\x03K\x01\x86\x89")  # offset, size, stride, requires_grad
            w(b"ccollections\nOrderedDict\n)Rt")  # backward hooks, TUPLE
            w(b"R")  # REDUCE
            s("child"); w(b"N")
        else:
            w(b"N")
            s("child")
    w(b"ub" * depth + b".")  # SETITEMS, BUILD per level, STOP
    code = ("class Chain(Module):\n  __parameters__ = [\"weight\", ]\n  __buffers__ = []\n"
            "  weight : Optional[Tensor]\n  training : bool\n"
            "  child : Optional[__torch__.Chain]\n")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        z.writestr("chain/data.pkl", out.getvalue())
        z.writestr("chain/code/__torch__.py", code)
        z.writestr("chain/constants.pkl", b"\x80\x02).")
        z.writestr("chain/version", b"3\n")


def group_robustness():
    for depth in [3, 100000]:
        p = os.path.join(TMP, f"chain{depth}.pt")
        deep_chain_archive(p, depth)
        rc, out, err = run("archive", p, "--summary", timeout=120)
        want = f"modules={depth} tensors=1 max_depth={depth - 1} params=1"
        check(rc == 0 and out.strip() == want, f"chain of {depth}: {out.strip()} {err.strip()[:200]}")

    src = save("robust", torch.jit.script(Tied()))
    blob = open(src, "rb").read()
    rnd = random.Random(7)
    outcomes = {}
    # Truncations, and random byte flips inside data.pkl and the code files.
    with zipfile.ZipFile(src) as z:
        spans = []
        for info in z.infolist():
            if info.filename.endswith(("data.pkl", ".py")):
                start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
                spans.append((start, start + info.file_size))
    variants = [blob[:n] for n in (10, 100, len(blob) // 2, len(blob) - 10)]
    for _ in range(150):
        b = bytearray(blob)
        a, e = rnd.choice(spans)
        for _ in range(rnd.randint(1, 4)):
            b[rnd.randrange(a, e)] = rnd.randrange(256)
        variants.append(bytes(b))
    bad = []
    for i, data in enumerate(variants):
        p = os.path.join(TMP, f"corrupt{i}.pt")
        with open(p, "wb") as f:
            f.write(data)
        try:
            rc, _, err = run("archive", p, timeout=60)
        except subprocess.TimeoutExpired:
            rc, err = "timeout", ""
        outcomes[rc] = outcomes.get(rc, 0) + 1
        line = err[:-1] if err.endswith("\n") else err
        if rc not in (0, 2) or (rc == 2 and not (line.isascii() and line.isprintable())):
            bad.append((i, rc, err.strip()[:200]))
        os.remove(p)
    check(not bad, f"{len(variants)} corrupted archives: exit codes {outcomes}, bad: {bad[:5]}")


def patch_central(blob, member, edit):
    """Returns blob with member's central directory entry passed through
    edit(bytearray entry_header_46_bytes)."""
    b = bytearray(blob)
    pos = b.rfind(b"PK\x05\x06")
    cd = struct.unpack_from("<I", b, pos + 16)[0]
    while b[cd:cd + 4] == b"PK\x01\x02":
        n, x, c = struct.unpack_from("<HHH", b, cd + 28)
        if b[cd + 46:cd + 46 + n].decode().endswith(member):
            head = bytearray(b[cd:cd + 46])
            edit(head)
            b[cd:cd + 46] = head
            return bytes(b)
        cd += 46 + n + x + c
    raise KeyError(member)


def member_span(path, suffix):
    blob = open(path, "rb").read()
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            if info.filename.endswith(suffix):
                # The local header's extra field (torch's alignment padding) is
                # not the central directory's.
                n, x = struct.unpack_from("<HH", blob, info.header_offset + 26)
                start = info.header_offset + 30 + n + x
                return info.filename.split("/", 1)[1], start, start + info.compress_size
    raise KeyError(suffix)


def write(name, data):
    p = os.path.join(TMP, name)
    with open(p, "wb") as f:
        f.write(data)
    return p


def edit_pickle(src, name, new_pickle):
    """A copy of src whose data.pkl is new_pickle, with a correct CRC."""
    dst = os.path.join(TMP, name)
    rewrite_zip(src, dst, edit=lambda n, d: new_pickle if n.endswith("/data.pkl") else d)
    return dst


def without(src, name, drop):
    dst = os.path.join(TMP, name)
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        for info in zin.infolist():
            if not drop(info.filename.split("/", 1)[1]):
                zout.writestr(info.filename, zin.read(info.filename))
    return dst


def group_hostile():
    src = save("hostile", torch.jit.script(Custom()))
    blob = open(src, "rb").read()
    # 1. Truncated copies: damaged, not "export again".
    for n in (10, 100, len(blob) // 2, len(blob) - 10):
        expect_input_error(f"cut at {n} bytes", write(f"cut{n}.pt", blob[:n]),
                           "central directory is missing", "truncated or damaged", "copy or save")
        rc, _, err = run("archive", os.path.join(TMP, f"cut{n}.pt"))
        check("torch.jit.script" not in err, f"cut at {n} bytes: no advice to export again")
    # 2. Damaged records: CRC-32 checked for every record read.
    for suffix in ("data.pkl", "code/__torch__.py", "version"):
        name, a, e = member_span(src, suffix)
        b = bytearray(blob)
        b[(a + e) // 2] ^= 0x20
        expect_input_error(f"flipped byte in {name}", write("flip.pt", bytes(b)),
                           f"record {name} is damaged (CRC mismatch)")
    # 3. Enormous claimed sizes: refused before any allocation.
    def huge(h):
        struct.pack_into("<II", h, 20, 0xFFFFFFF0, 0xFFFFFFF0)
    p = write("huge.pt", patch_central(blob, "/data.pkl", huge))
    expect_input_error("data.pkl sizes 0xFFFFFFF0", p, "record data.pkl claims to be 4294967280 bytes",
                       "more than the file holds")
    def huge_deflate(h):
        struct.pack_into("<H", h, 10, 8)
        struct.pack_into("<I", h, 24, 0xFFFFFFF0)
    p = write("huge_deflate.pt", patch_central(blob, "/data.pkl", huge_deflate))
    expect_input_error("data.pkl deflated to 4 GiB", p, "record data.pkl claims to be 4294967280 bytes")
    p = write("huge_version.pt", patch_central(blob, "/version", huge))
    expect_input_error("version sizes 0xFFFFFFF0", p, "version claims to be 4294967280 bytes")
    # 4. Missing records.
    expect_input_error("no data.pkl", without(src, "no_data.pt", lambda n: n == "data.pkl"),
                       "without data.pkl", "incomplete or damaged")
    expect_input_error("no code/", without(src, "no_code.pt", lambda n: n.startswith("code/")),
                       "without code/", "incomplete or damaged")
    code_name = member_span(src, ".py")[0]
    expect_input_error("a code file missing", without(src, "no_code_file.pt", lambda n: n == code_name),
                       f"record {code_name} is missing")
    expect_input_error("no version", without(src, "no_version.pt", lambda n: n in ("version", ".data/version")),
                       "record version is missing")
    # 5. Hostile pickles with correct CRCs: the Unpickler never sees them.
    with zipfile.ZipFile(src) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))
    cases = [
        ("string of 4 GiB", b"\x80\x02X\xf0\xff\xff\xff" + b"a" * 8 + b".", "a string claims 4294967280 bytes"),
        ("memo index 2^32-1", b"\x80\x02Nr\xff\xff\xff\xff.", "memo index 4294967295 out of order"),
        ("odd dict", b"\x80\x02(Nd.", "a dict item has no value"),
        ("tuple past the stack", b"\x80\x02(N" + b"\x85" * 1 + b"0t.", "unknown opcode"),
        ("nested a million deep", b"\x80\x02N" + b"\x85" * 1000000 + b".", "nested more than"),
        ("no STOP", pkl[:-1], "runs past the end"),
    ]
    for what, data, words in cases:
        expect_input_error(what, edit_pickle(src, "pkl.pt", data), "data.pkl is damaged", words)
    rnd = random.Random(11)
    outcomes, bad = {}, []
    for i in range(80):  # each run loads LibTorch: keep the group to a few minutes
        b = bytearray(pkl)
        for _ in range(rnd.randint(1, 6)):
            b[rnd.randrange(len(b))] = rnd.randrange(256)
        p = edit_pickle(src, "fuzzed.pt", bytes(b))
        try:
            rc, _, err = run("archive", p, timeout=60)
        except subprocess.TimeoutExpired:
            rc, err = "timeout", ""
        outcomes[rc] = outcomes.get(rc, 0) + 1
        if rc not in (0, 2) or (rc == 2 and err.count("\n") != 1):
            bad.append((i, rc, err.strip()[:200]))
    check(not bad, f"80 pickles with flipped bytes and good CRCs: exit codes {outcomes}, bad: {bad[:5]}")
    # 6. What the fuzzer found: each saved input now gives a tree or one InputError line.
    regressions = os.environ.get("REGRESSIONS", "")
    files = sorted(os.listdir(regressions)) if regressions else []
    for f in files:
        rc, _, err = run("archive", os.path.join(regressions, f), timeout=60)
        check(rc == 0 or (rc == 2 and err.startswith("InputError: ") and err.count("\n") == 1),
              f"fuzzer regression {f}: rc={rc} {err.strip()[:200]}")
    print(f"      ({len(files)} fuzzer regressions)")


def main():
    global TREE_DUMP, TMP
    TREE_DUMP, group = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="fsdp_plan_loaders_") as tmp:
        TMP = tmp
        globals()["group_" + group]()
    if FAILURES:
        print(f"{len(FAILURES)} failure(s)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
