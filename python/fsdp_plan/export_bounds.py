"""What fsdp-plan-export accepts before it builds anything (issue 39).

fsdp-plan-export runs on configs from pull requests. Everything here runs
before torch or transformers is imported, on the JSON as read, and refuses
with an ExportError (one line, exit 2) what would take minutes, gigabytes or
forever to build: docs/limits.md ("fsdp-plan-export") names each limit and
why it is that much. Nothing here imports a config's folder or runs its code.
"""
import json
import math
import os
import stat
from typing import Any, Dict, List, Optional, Tuple

# A config.json is a few KB; the largest in the corpus (an image classifier's
# id2label of 21,843 ImageNet-22k classes) is about 1 MB.
MAX_CONFIG_BYTES = 4 << 20
# A PEFT adapter_config.json is under 2 KB.
MAX_ADAPTER_BYTES = 1 << 20
# A config nests 3 deep (text_config.rope_scaling.factor); Python's json
# raises RecursionError near 1,000.
MAX_NESTING = 32
# Llama 3.1 405B has 126 layers; building one costs ~2 ms and ~30 KB on the
# meta device, so 100,000 layers ran 90 s at 3.5 GB.
MAX_LAYERS = 1024
# DeepSeek-V3 routes 256 experts, Kimi K2 384.
MAX_EXPERTS = 4096
# layers x experts: the modules an MoE builds (61 x 256 in DeepSeek-V3).
MAX_LAYER_EXPERTS = 1 << 18
# --batch and --seq: the example step's sizes (a dynamic dimension's example too).
MAX_BATCH = 1 << 16
MAX_SEQ = 1 << 24  # 16M tokens: past any model's positions today (Llama 4 Scout: 10M)
MAX_TOKENS = 1 << 31  # batch x seq: torch indexes some kernels with int32
# A LoRA target_modules regex: peft re.fullmatch()es it against every module path.
MAX_PATTERN = 4096

# Config keys that count layers or experts (transformers' names across model types).
LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
              "num_encoder_layers", "num_decoder_layers")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts", "n_shared_experts",
               "num_shared_experts")


class BoundsError(Exception):
    """The one-line reason; export.py raises it again as an ExportError."""


def read_bounded_json(path: str, max_bytes: int, what: str) -> Any:
    """The JSON in `path`, read only if it is a regular file of at most max_bytes, nested at most MAX_NESTING."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise BoundsError(f"{path}: cannot read: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise BoundsError(f"{path}: not a regular file (a device, a pipe or a socket is not {what})")
    if st.st_size > max_bytes:
        raise BoundsError(f"{path}: {st.st_size} bytes, more than {what} can be ({max_bytes} bytes)")
    try:
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise BoundsError(f"{path}: cannot read: {e.strerror}") from None
    if len(raw) > max_bytes:
        raise BoundsError(f"{path}: more than {what} can be ({max_bytes} bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BoundsError(f"{path}: not UTF-8: {e.reason} at byte {e.start}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise BoundsError(f"{path}: not JSON: {e}") from None
    except RecursionError:  # the C scanner's own guard, near 1,000 levels
        raise BoundsError(f"{path}: nested more than {MAX_NESTING} deep") from None
    except ValueError as e:  # an integer of more than 4,300 digits
        raise BoundsError(f"{path}: not JSON: {str(e)[:200]}") from None
    if json_depth(data) > MAX_NESTING:
        raise BoundsError(f"{path}: nested more than {MAX_NESTING} deep")
    return data


def json_depth(data: Any) -> int:
    """How deep lists and objects nest in `data` (a scalar is 0); iterative, no recursion."""
    best = 0
    stack = [(data, 1)]
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, dict):
            children = obj.values()
        elif isinstance(obj, list):
            children = obj
        else:
            continue
        best = max(best, depth)
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))
    return best


def _counts(data: Any, keys: Tuple[str, ...], where: str = "") -> List[Tuple[str, Any]]:
    """Every (dotted key, value) of `keys` anywhere in the config (text_config, vision_config, ...)."""
    out: List[Tuple[str, Any]] = []
    stack = [(where, data)]
    while stack:
        prefix, obj = stack.pop()
        if isinstance(obj, dict):
            for k, v in obj.items():
                name = f"{prefix}.{k}" if prefix else str(k)
                if k in keys:
                    out.append((name, v))
                if isinstance(v, (dict, list)):
                    stack.append((name, v))
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                if isinstance(v, (dict, list)):
                    stack.append((f"{prefix}[{i}]", v))
    return out


def _whole(v: Any) -> Optional[int]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return int(v)


def check_config(data: Any, path: str) -> None:
    """Refuses a config that would build more layers or experts than the limits."""
    if not isinstance(data, dict):
        raise BoundsError(f"{path}: not a model config (a JSON object with model_type)")
    layers = 0
    for name, v in _counts(data, LAYER_KEYS):
        n = _whole(v)
        if n is not None and n > MAX_LAYERS:
            raise BoundsError(f"{path}: {name} is {n}, more than fsdp-plan-export builds ({MAX_LAYERS}; "
                              "docs/limits.md)")
        if n is not None:
            layers = max(layers, n)
    experts = 0
    for name, v in _counts(data, EXPERT_KEYS):
        n = _whole(v)
        if n is not None and n > MAX_EXPERTS:
            raise BoundsError(f"{path}: {name} is {n}, more than fsdp-plan-export builds ({MAX_EXPERTS}; "
                              "docs/limits.md)")
        if n is not None:
            experts = max(experts, n)
    if layers * experts > MAX_LAYER_EXPERTS:
        raise BoundsError(f"{path}: {layers} layers of {experts} experts, more modules than fsdp-plan-export "
                          f"builds (layers x experts at most {MAX_LAYER_EXPERTS}; docs/limits.md)")


def check_step(batch: Optional[int], seq: Optional[int]) -> None:
    """--batch and --seq within the limits (each, and their product)."""
    for flag, v, most in (("batch", batch, MAX_BATCH), ("seq", seq, MAX_SEQ)):
        if v is not None and v < 1:
            raise BoundsError(f"--{flag} {v}: must be at least 1")
        if v is not None and v > most:
            raise BoundsError(f"--{flag} {v}: more than fsdp-plan-export exports ({most}; docs/limits.md)")
    if batch and seq and batch * seq > MAX_TOKENS:
        raise BoundsError(f"--batch {batch} x --seq {seq}: {batch * seq} tokens, more than fsdp-plan-export "
                          f"exports ({MAX_TOKENS}; docs/limits.md)")


def check_output(path: str) -> None:
    """-o names a file that can be written: its directory exists and takes a new file, and it is no
    device, pipe or directory (/proc/..., /dev/...). Checked by making the temporary file
    torch.export.save would write beside it, before anything is built."""
    out_dir = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(out_dir):
        raise BoundsError(f"{path}: no such directory {out_dir}")
    try:
        st = os.stat(path)
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise BoundsError(f"{path}: not a regular file; -o writes a .pt2 file")
    import tempfile
    try:
        fd, probe = tempfile.mkstemp(prefix=".fsdp-plan-export-probe-", dir=out_dir)
    except OSError as e:
        raise BoundsError(f"{path}: cannot write in {out_dir}: {e.strerror}") from None
    os.close(fd)
    os.unlink(probe)


def check_target_modules(target: Any, path: str) -> None:
    """A LoRA target_modules regex peft can match in linear time: a string of at most MAX_PATTERN
    characters without a repeat nested in a repeat (`(.*.*)*x` backtracks exponentially in
    Python's re, which peft uses: peft/tuners/tuners_utils.py, check_target_module_exists)."""
    if not isinstance(target, str):
        if isinstance(target, list) and len(target) > 10000:
            raise BoundsError(f"{path}: target_modules lists {len(target)} names, more than 10000")
        return
    if len(target) > MAX_PATTERN:
        raise BoundsError(f"{path}: target_modules is a pattern of {len(target)} characters, more than "
                          f"{MAX_PATTERN}")
    try:
        import re._parser as sre_parse  # Python 3.11+
    except ImportError:  # pragma: no cover
        import sre_parse  # type: ignore
    try:
        parsed = sre_parse.parse(target)
    except Exception as e:  # re.error, RecursionError, OverflowError
        raise BoundsError(f"{path}: target_modules is not a regular expression: {str(e)[:200]}") from None
    if _nested_repeat(parsed, sre_parse):
        raise BoundsError(f"{path}: target_modules {target[:200]!r} repeats a group that itself repeats "
                          "(a nested quantifier, as in (a*)*): Python's re, which peft matches with, can take "
                          "exponential time on it; write it without the nesting")


def _nested_repeat(parsed: Any, sre: Any) -> bool:
    """Whether a repeat of more than one time holds another such repeat, anywhere in the pattern."""
    repeats = {sre.MAX_REPEAT, sre.MIN_REPEAT}
    possessive = getattr(sre, "POSSESSIVE_REPEAT", None)
    if possessive is not None:
        repeats.add(possessive)
    stack = [(parsed, False)]  # (items, inside a repeat)
    while stack:
        items, inside = stack.pop()
        for op, av in items:
            if op in repeats:
                _lo, hi, sub = av
                many = hi is sre.MAXREPEAT or hi > 1
                if many and inside:
                    return True
                stack.append((sub, inside or many))
            elif op is sre.SUBPATTERN:
                stack.append((av[-1], inside))
            elif op is sre.BRANCH:
                for b in av[1]:
                    stack.append((b, inside))
            elif op in (sre.ASSERT, sre.ASSERT_NOT):
                stack.append((av[1], inside))
    return False


def adapter_targets(data: Dict[str, Any]) -> Any:
    return data.get("target_modules") if isinstance(data, dict) else None
