"""Hostile inputs for fsdp-plan's readers (issue 29), made in a scratch directory.

Shared by tests/cli/test_hostile.py and by anyone reproducing a case by hand:

    python3 tests/cli/hostile_inputs.py OUT_DIR   # writes every input, prints each command line

Each maker returns the argv after the binary. Nothing here needs torch.
"""
import json
import os
import random
import struct
import sys
import zipfile
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPT = os.path.join(ROOT, "sample_models", "tiny_gpt.pt")
PT2 = os.path.join(ROOT, "sample_models", "tiny_gpt.pt2")
PLAN = os.path.join(ROOT, "plans", "tiny_gpt.json")
MODELS_PY = "tiny_gpt/code/__torch__/models.py"


def write(name, data):
    with open(name, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)
    return name


# --- zip archives written record by record, so a record can hold any deflate stream ---

def deflate_bomb(size, byte=b"\0"):
    """A raw deflate stream of `size` copies of `byte` (size a multiple of 1 MiB), and its CRC-32.
    Each 1 MiB block ends in a full flush, so the compressed block repeats: a 1 GiB bomb is
    built in well under a second."""
    chunk = byte * (1 << 20)
    co = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = co.compress(chunk) + co.flush(zlib.Z_FULL_FLUSH)
    tail = co.flush()
    crc = 0
    for _ in range(size >> 20):
        crc = zlib.crc32(chunk, crc)
    return block * (size >> 20) + tail, crc


def write_zip(name, records):
    """records: [(name, stored bytes) or (name, (deflated bytes, crc, size))]: a zip with
    those records, in order (no ZIP64: every size below 4 GiB)."""
    out = bytearray()
    central = bytearray()
    for rec_name, data in records:
        if isinstance(data, tuple):
            comp, crc, size = data
            method = 8
        else:
            comp, crc, size, method = data, zlib.crc32(data), len(data), 0
        n = rec_name.encode()
        offset = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 20, 0, method, 0, 0, crc, len(comp), size, len(n), 0) + n
        out += comp
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 20, 20, 0, method, 0, 0, crc, len(comp), size,
                               len(n), 0, 0, 0, 0, 0, offset) + n
    count = len(records)
    out += central
    out += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, count, count, len(central), len(out) - len(central), 0)
    return write(name, bytes(out))


def records_of(path):
    with zipfile.ZipFile(path) as z:
        return [(i.filename, z.read(i.filename)) for i in z.infolist()]


def replaced(path, name, new_bytes_or_stream):
    return [(n, new_bytes_or_stream if n == name else d) for n, d in records_of(path)]


def pt_bomb(name, record, size=1 << 30):
    """tiny_gpt.pt with `record` a deflate bomb of `size` zero bytes."""
    comp, crc = deflate_bomb(size)
    return write_zip(name, replaced(GPT, record, (comp, crc, size)))


def pt2_bomb(name, size=1 << 30):
    """tiny_gpt.pt2 whose models/model.json is `size` spaces, deflated."""
    comp, crc = deflate_bomb(size, b" ")
    return write_zip(name, replaced(PT2, "tiny_gpt/models/model.json", (comp, crc, size)))


def edited_code(name, edit):
    """tiny_gpt.pt with code/__torch__/models.py changed by edit(bytes) (CRCs right)."""
    recs = [(n, edit(d) if n == MODELS_PY else d) for n, d in records_of(GPT)]
    return write_zip(name, recs)


def one_byte_edits(seed, count):
    """`count` (offset, new byte) edits of models.py, each a different offset, from `seed`."""
    data = dict(records_of(GPT))[MODELS_PY]
    rng = random.Random(seed)
    offsets = rng.sample(range(len(data)), count)
    out = []
    for at in offsets:
        new = data[at]
        while new == data[at]:
            new = rng.randrange(32, 127)
        out.append((at, new))
    return out


def deep_parens(name, depth=100000):
    """A code record whose forward holds `depth` nested parentheses."""
    def edit(d):
        line = b"    _deep = " + b"(" * depth + b"1" + b")" * depth + b"\n"
        at = d.index(b"    t = torch.size(idx, 1)\n")
        return d[:at] + line + d[at:]
    return edited_code(name, edit)


# --- YAML ---

def accelerate(name, body):
    return write(name, "distributed_type: FSDP\nnum_processes: 2\n" + body)


def laughs(levels):
    """Billion laughs: each level an anchored list of nine aliases of the one before."""
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append("l%d: &l%d [%s]" % (i, i, ", ".join(["*l%d" % (i - 1)] * 9)))
    return "\n".join(lines) + "\n"


# --- plans ---

def plan_doc():
    with open(PLAN) as f:
        return json.load(f)


def plan_with(name, change):
    doc = plan_doc()
    change(doc)
    return write(name, json.dumps(doc))


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "hostile"
    os.makedirs(out, exist_ok=True)
    os.chdir(out)
    print(pt_bomb("bomb_pkl.pt", "tiny_gpt/data.pkl"))
    print(pt_bomb("bomb_code.pt", MODELS_PY))
    print(pt2_bomb("bomb.pt2"))
    print(deep_parens("deep_parens.pt"))
    print(accelerate("laughs10.yaml", laughs(10)))
