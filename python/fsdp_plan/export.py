"""fsdp-plan-export: a model fsdp-plan can plan (a torch.export .pt2 archive)
from a Hugging Face config.json, a PEFT LoRA adapter config, or your own
factory function; no download, no weights.

    fsdp-plan-export CONFIG.json|DIR -o model.pt2 [--batch B] [--seq S] [--dynamic batch,seq]
                     [--dtype bfloat16] [--task causal-lm|seq2seq|...] [--lora ADAPTER_CONFIG.json]
    fsdp-plan-export --factory package.module:function -o model.pt2

The model is built on the meta device (shapes and dtypes, no storage) from
the local config (`AutoConfig.from_pretrained` of the directory, or the JSON
file), in train mode with `attn_implementation="sdpa"` (eager where the
architecture has no SDPA) and no KV cache, and exported with
`torch.export.export(..., strict=False)` at the training shapes with `labels`,
so the loss is in the graph. A Hugging Face model is traced with the attention
eager training runs (is_causal, no materialised causal mask, no repeat_kv):
transformers picks another one under export (_hf_training_attention says why). The archive holds no weights: each distinct
tensor is written as a one-element stand-in expanded to its shape, so that the
names of a tied weight still share one record (torch writes every meta tensor
to the same empty record, which loses ties). What the file alone cannot say
(`_no_split_modules`, the tensor-parallel plan, the dtype, the task, the
shapes, the exporter's versions) goes into the archive's `extra/fsdp_plan.json`
(docs/export-metadata.md).

torch is imported only when a model is exported, transformers only for a
config, peft only with --lora: they come from your environment.

Exit codes: 0 written; 2 a missing or bad input, or a model that does not
build or export (one line on stderr naming the file and the problem).
"""
import argparse
import contextlib
import importlib
import json
import os
import sys
import tempfile
import time
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import export_bounds as bounds

METADATA_NAME = "fsdp_plan.json"  # torch.export.save puts it at <archive>/extra/fsdp_plan.json
METADATA_FORMAT = 1
EXIT_INPUT = 2

DTYPES = ("float32", "bfloat16", "float16")

# --task -> the transformers Auto class and what its forward takes.
TASKS: Dict[str, str] = {
    "causal-lm": "AutoModelForCausalLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "masked-lm": "AutoModelForMaskedLM",
    "sequence-classification": "AutoModelForSequenceClassification",
    "token-classification": "AutoModelForTokenClassification",
    "image-classification": "AutoModelForImageClassification",
    "speech-seq2seq": "AutoModelForSpeechSeq2Seq",
}
# The same tasks by the name lists transformers.models.auto.modeling_auto keeps
# (an `architectures` entry of config.json is found in one of them).
_TASK_MAPPINGS = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "speech-seq2seq": "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "sequence-classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "token-classification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
}
DEFAULT_SEQ = 4096  # capped at the model's maximum positions


class ExportError(Exception):
    """One line for the user: what (a file) and the problem. Exit 2."""


# ---------------------------------------------------------------------------
# Exporting a module: shared by the command line and fsdp_plan.plan()
# ---------------------------------------------------------------------------
def export_module(module: Any, args: Sequence[Any], kwargs: Dict[str, Any], path: str,
                  dynamic_shapes: Any = None, metadata: Optional[Dict[str, Any]] = None,
                  what: str = "the module", fast: bool = True) -> Dict[str, Any]:
    """torch.export.export(module, args, kwargs, strict=False) saved to `path`
    with weight stand-ins and the metadata record. Returns the record as written,
    with the times taken (`seconds`: export, save). Raises ExportError.
    fast=False traces and saves without the two skips below (_no_stack_traces,
    _no_canonical_form_check), as torch alone would: the tests compare the two
    archives byte for byte."""
    import torch

    skip_traces = _no_stack_traces if fast else contextlib.nullcontext
    skip_check = _no_canonical_form_check if fast else contextlib.nullcontext
    t0 = time.perf_counter()
    try:
        with _quiet(), _hf_training_attention(module) as hf_attention, skip_traces():
            ep = torch.export.export(module, tuple(args), kwargs=dict(kwargs), dynamic_shapes=dynamic_shapes,
                                     strict=False)
    except Exception as e:  # torch's reasons are many; the first line names it
        raise ExportError(f"{what}: torch.export.export failed: {_first_line(e)}") from e
    t1 = time.perf_counter()
    record = dict(metadata or {})
    record.update(_common_metadata(module, ep))
    record["hf_attention"] = hf_attention
    _stand_in_weights(ep)
    _drop_stack_traces(ep)
    # Through a temporary directory beside `path`, under path's own name: torch
    # names the archive's root folder after the file.
    directory = os.path.dirname(os.path.abspath(path))
    tmp_dir = tempfile.mkdtemp(prefix=".fsdp-plan-export-", dir=directory)
    tmp = os.path.join(tmp_dir, os.path.basename(path))
    try:
        with _quiet(), skip_check():
            torch.export.save(ep, tmp, extra_files={METADATA_NAME: _dumps(record)})
        os.replace(tmp, path)  # atomically, as fsdp-plan -o: a failed run leaves `path` alone
    except Exception as e:
        raise ExportError(f"{path}: torch.export.save failed: {_first_line(e)}") from e
    finally:
        import shutil
        shutil.rmtree(tmp_dir, ignore_errors=True)
    t2 = time.perf_counter()
    record["seconds"] = {"export": round(t1 - t0, 3), "save": round(t2 - t1, 3)}
    return record


@contextlib.contextmanager
def _hf_training_attention(module: Any):
    """Makes torch.export trace the attention a Hugging Face model runs in eager
    training; yields what the record says of it ("eager", or None for a model
    that is not transformers').

    Under export, transformers 5 (masking_utils.py: `_ignore_causal_mask_sdpa`
    returns False when `is_torchdynamo_exporting()`, and
    `find_packed_sequence_indices` returns a traced tensor that turns off
    `allow_is_causal_skip`) materialises the causal mask as a [B, 1, S, S] bool
    tensor; SDPA then gets `attn_mask=` instead of `is_causal=True`, and with a
    mask given, `integrations/sdpa_attention.py: use_gqa_in_sdpa` is false, so
    grouped-query models copy k and v to every head (`repeat_kv`). Eager
    training on a batch without padding or packing does neither: a Llama-3-8B
    step at seq 4096 saves 2.5 GiB less (tests/activations/GRAPH.md item 8).
    Here both checks answer as in eager (not exporting, no packed sequences).
    An attention_mask among the inputs is still traced, so the mask stays
    where eager would build it for padding (is_tracing(padding_mask)), and so
    do sliding windows. tests/activations/actmodels.py: hf_training_export is
    the same recipe, which the activation references were made with."""
    mu = None
    if "transformers" in sys.modules:
        transformers = sys.modules["transformers"]
        pretrained = getattr(transformers, "PreTrainedModel", None)
        if pretrained is not None and any(isinstance(m, pretrained) for m in module.modules()):
            with contextlib.suppress(ImportError):
                import transformers.masking_utils as mu
    if mu is None or not all(hasattr(mu, n) for n in ("is_torchdynamo_exporting", "find_packed_sequence_indices")):
        yield None
        return
    saved = mu.is_torchdynamo_exporting, mu.find_packed_sequence_indices
    mu.is_torchdynamo_exporting = lambda: False
    mu.find_packed_sequence_indices = lambda *args, **kwargs: None
    try:
        yield "eager"
    finally:
        mu.is_torchdynamo_exporting, mu.find_packed_sequence_indices = saved


@contextlib.contextmanager
def _no_stack_traces():
    """Tracing without each node's Python stack trace, which _drop_stack_traces
    throws away after: torch.fx.config.do_not_emit_stack_traces (torch/fx/config.py)
    skips CapturedTraceback.extract() and its symbolisation per node
    (torch/fx/proxy.py: TracerBase.create_proxy): torch.export.export of a
    Llama 3 70B at seq 8192 took 20.5 s of CPU with them, 15.6 s without
    (bench/export_bench.py's config, measured in-process at load 12-16). The
    archive is byte-identical. A torch without the flag traces as before."""
    import torch.fx.config as fx_config
    if not hasattr(fx_config, "do_not_emit_stack_traces"):
        yield
        return
    saved = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        fx_config.do_not_emit_stack_traces = saved


@contextlib.contextmanager
def _no_canonical_form_check():
    """torch.export.save without its self-check of the canonical form:
    torch/_export/serde/serialize.py: ExportedProgramSerializer.serialize calls
    canonicalize(serialized_ep, ...) ("Test canonical form is well defined")
    and discards the result, after a copy.deepcopy of the whole serialised
    program: save of the 70B Llama above took 8.7 s of CPU with it, 4.5 s
    without, and nothing of it reaches the file (byte-identical archives). Skipped only where serialize's source shows that call as a bare
    statement (its result unused), so a torch that uses the result saves as
    it would."""
    try:
        import ast
        import inspect
        import textwrap

        import torch._export.serde.serialize as ser
        tree = ast.parse(textwrap.dedent(inspect.getsource(ser.ExportedProgramSerializer.serialize)))
    except Exception:  # no source (a frozen install), another torch layout: save as torch does
        yield
        return
    uses = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id == "canonicalize"]
    bare = [n for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Name) and n.value.func.id == "canonicalize"]
    if len(uses) != 1 or len(bare) != 1:
        yield
        return
    saved = ser.canonicalize
    ser.canonicalize = lambda ep, constants=None: ep
    try:
        yield
    finally:
        ser.canonicalize = saved


def read_metadata(path: str) -> Optional[Dict[str, Any]]:
    """The metadata record of a .pt2 written here, or None (zipfile only, no torch)."""
    import zipfile
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if name.endswith("/extra/" + METADATA_NAME):
                return json.loads(z.read(name))
    return None


def _common_metadata(module: Any, ep: Any) -> Dict[str, Any]:
    import torch

    from . import __version__
    versions = {"fsdp_plan": __version__, "torch": torch.__version__}
    for name in ("transformers", "peft"):
        mod = sys.modules.get(name)
        if mod is not None and getattr(mod, "__version__", None):
            versions[name] = mod.__version__
    no_split = getattr(module, "_no_split_modules", None)
    return {
        "format": "fsdp-plan-export",
        "format_version": METADATA_FORMAT,
        "exporter": versions,
        "root_class": _class_name(type(module)),
        "no_split_modules": sorted(no_split) if no_split is not None else None,
        "dtype": _param_dtype(module),
        "training": bool(module.training),
        "tied_parameters": _tied_parameters(module),
        "module_classes": _module_classes(module),
        "num_parameters": sum(p.numel() for p in module.parameters()),
        "weights": "stand-in",
        "stack_traces": False,
        "loss_in_graph": _loss_in_graph(ep),
    }


def _stand_in_weights(ep: Any) -> None:
    """Each distinct tensor of the program's state_dict and constants becomes
    a one-element CPU tensor expanded (stride 0) to the tensor's shape, shared
    where the model shares: torch.export.save groups weights by storage
    (torch/export/pt2_archive/_package_weights.py: group_weights), which for
    meta tensors is one group per dtype, losing ties; one storage per tensor
    keeps them, in torch's own record (same path_name, same view: what
    lib/model/loaders/export_program.cpp reads as one tensor), at a few bytes each."""
    import torch

    made: Dict[int, Any] = {}

    def stand_in(t):
        key = id(t)
        if key not in made:
            # A 0-dim tensor (Gemma 3's embed_scale) has no dimension to expand: its own one element.
            s = torch.zeros(1, dtype=t.dtype).expand(t.shape) if t.dim() else torch.zeros((), dtype=t.dtype)
            made[key] = torch.nn.Parameter(s, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else s
        return made[key]

    for table in (ep.state_dict, ep.constants):
        for k, v in list(table.items()):
            if isinstance(v, torch.Tensor):
                table[k] = stand_in(v)


def _drop_stack_traces(ep: Any) -> None:
    """Each graph node's Python stack trace is debug text for torch users: for
    a Llama 3 70B at seq 8192 it is a third of the file and half of
    torch.export.save's time (bench/export_bench.py). fsdp-plan reads
    nn_module_stack, which stays; so does everything torch.export.load needs."""
    for gm in [ep.graph_module, *[m for _, m in ep.graph_module.named_modules() if hasattr(m, "graph")]]:
        for node in gm.graph.nodes:
            node.meta.pop("stack_trace", None)


def _tied_parameters(module: Any) -> List[List[str]]:
    """Groups of parameter names that are one tensor (named_parameters(remove_duplicate=False))."""
    groups: Dict[int, List[str]] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    return [names for names in groups.values() if len(names) > 1]


def _module_classes(module: Any) -> Dict[str, str]:
    """Every module's class by its qualified name ("" the root), including those whose forward
    never runs in the graph (a ModuleList has no nn_module_stack entry): what FSDP2's refusals of
    containers and class policies need to be exact from a .pt2."""
    return {name: _class_name(type(m)) for name, m in module.named_modules(remove_duplicate=False)}


def _param_dtype(module: Any) -> Optional[str]:
    counts: Dict[str, int] = {}
    for p in module.parameters():
        if p.is_floating_point():
            counts[_dtype_name(p.dtype)] = counts.get(_dtype_name(p.dtype), 0) + p.numel()
    return max(counts, key=counts.get) if counts else None


def _loss_in_graph(ep: Any) -> bool:
    names = [getattr(spec.arg, "name", "") for spec in ep.graph_signature.output_specs]
    return any("loss" in n for n in names)


# ---------------------------------------------------------------------------
# Hugging Face configs
# ---------------------------------------------------------------------------
def load_config(source: str, trust_remote_code: bool = False):
    """A transformers config from a local directory (its config.json) or a JSON file."""
    if not os.path.exists(source):
        raise ExportError(f"{source}: no such file or directory")
    config_file = os.path.join(source, "config.json") if os.path.isdir(source) else source
    if not os.path.isfile(config_file):
        raise ExportError(f"{source}: no config.json in this directory")
    try:  # bounded before transformers reads it (export_bounds.py, docs/limits.md)
        data = bounds.read_bounded_json(config_file, bounds.MAX_CONFIG_BYTES, "a model config")
        bounds.check_config(data, config_file)
    except bounds.BoundsError as e:
        raise ExportError(str(e)) from None
    quant = data.get("quantization_config")
    if quant:
        # QLoRA's bitsandbytes (or GPTQ, AWQ, ...) weights: the export would build the model unquantized,
        # and the plan would count weights and all-gathers ~4x too large. Not modelled: refused.
        method = quant.get("quant_method", "unknown") if isinstance(quant, dict) else "unknown"
        raise ExportError(f"{config_file}: quantization_config (quant_method {method}) is not modelled: fsdp-plan "
                          "plans unquantized weights, so a 4-bit or 8-bit model's weights and all-gathers would "
                          "come out 2-4x too large; remove quantization_config to plan the unquantized model")
    # A local config only: never the hub (remote code, a base model named in the config).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    _import("torch", config_file)  # transformers builds nothing without it: name it first
    transformers = _import("transformers", config_file)
    try:
        with _quiet():
            if os.path.isdir(source):
                return transformers.AutoConfig.from_pretrained(source, local_files_only=True,
                                                               trust_remote_code=trust_remote_code)
            if "model_type" not in data:
                raise ExportError(f"{config_file}: no model_type: not a Hugging Face model config")
            cls = transformers.AutoConfig.for_model(data["model_type"]).__class__
            return cls.from_dict(data)
    except ExportError:
        raise
    except Exception as e:
        raise ExportError(f"{config_file}: transformers cannot read this config: {_first_line(e)}") from e


def model_class(config, task: Optional[str], where: str):
    """(the class to build, its task): --task's Auto class, else the config's `architectures`."""
    transformers = sys.modules["transformers"]
    if task:
        auto = getattr(transformers, TASKS[task])
        mapping = auto._model_mapping
        try:
            return mapping[type(config)], task
        except KeyError:
            raise ExportError(f"{where}: transformers has no {TASKS[task]} for model_type "
                              f"{config.model_type!r}") from None
    archs = list(getattr(config, "architectures", None) or [])
    if not archs:
        raise ExportError(f"{where}: the config names no architectures; say which head with --task "
                          f"({', '.join(TASKS)})")
    name = archs[0]
    cls = getattr(transformers, name, None)
    if cls is None:
        raise ExportError(f"{where}: transformers {transformers.__version__} has no class {name} "
                          "(architectures[0])")
    from transformers.models.auto import modeling_auto
    for t, table in _TASK_MAPPINGS.items():
        if name in getattr(modeling_auto, table, {}).values():
            return cls, t
    raise ExportError(f"{where}: {name} is not a head fsdp-plan-export knows the inputs of; say --task "
                      f"({', '.join(TASKS)})")


def build_model(config, cls, dtype: Optional[str], where: str) -> Tuple[Any, str]:
    """The model on the meta device, in train mode; (model, attn_implementation used)."""
    import torch
    if hasattr(config, "use_cache"):
        config.use_cache = False  # training: no KV cache (what Trainer and gradient checkpointing set)
    kwargs: Dict[str, Any] = {}
    if dtype:
        kwargs["dtype"] = getattr(torch, dtype)
    last: Optional[Exception] = None
    for attn in ("sdpa", "eager"):
        try:
            with _quiet(), torch.device("meta"):
                model = cls._from_config(config, attn_implementation=attn, **kwargs)
            model.train()
            return model, attn
        except (ValueError, ImportError) as e:  # this architecture has no SDPA: eager
            last = e
        except Exception as e:
            raise ExportError(f"{where}: {cls.__name__} does not build from this config: {_first_line(e)}") from e
    raise ExportError(f"{where}: {cls.__name__} does not build from this config: {_first_line(last)}")


def apply_lora(model, adapter: str):
    """get_peft_model with the adapter config (a JSON file or a directory with adapter_config.json)."""
    if not os.path.exists(adapter):
        raise ExportError(f"{adapter}: no such file or directory")
    path = os.path.join(adapter, "adapter_config.json") if os.path.isdir(adapter) else adapter
    if not os.path.isfile(path):
        raise ExportError(f"{adapter}: no adapter_config.json in this directory")
    data = read_adapter(path)
    peft = _import("peft", path)
    try:
        with _quiet():
            cfg = peft.get_peft_config(data)
            wrapped = peft.get_peft_model(model, cfg)
        wrapped.train()
        return wrapped, {"peft_type": str(getattr(cfg.peft_type, "value", cfg.peft_type)),
                         "r": getattr(cfg, "r", None),
                         "target_modules": sorted(cfg.target_modules) if isinstance(cfg.target_modules, (set, list))
                         else cfg.target_modules,
                         "trainable_parameters": sum(p.numel() for p in wrapped.parameters() if p.requires_grad)}
    except Exception as e:
        raise ExportError(f"{path}: peft cannot apply this adapter config: {_first_line(e)}") from e


def read_adapter(path: str) -> Dict[str, Any]:
    """The adapter config's JSON, bounded, its target_modules a pattern peft matches in linear time."""
    try:
        data = bounds.read_bounded_json(path, bounds.MAX_ADAPTER_BYTES, "an adapter config")
        if not isinstance(data, dict):
            raise bounds.BoundsError(f"{path}: not an adapter config (a JSON object with peft_type)")
        bounds.check_target_modules(bounds.adapter_targets(data), path)
    except bounds.BoundsError as e:
        raise ExportError(str(e)) from None
    return data


def adapter_path(adapter: str) -> str:
    if not os.path.exists(adapter):
        raise ExportError(f"{adapter}: no such file or directory")
    path = os.path.join(adapter, "adapter_config.json") if os.path.isdir(adapter) else adapter
    if not os.path.isfile(path):
        raise ExportError(f"{adapter}: no adapter_config.json in this directory")
    return path


def _max_positions(config) -> Optional[int]:
    for key in ("max_position_embeddings", "n_positions", "max_target_positions"):
        v = getattr(config, key, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def training_inputs(model, config, task: str, batch: int, seq: int, dynamic: Sequence[str]
                    ) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]], Dict[str, Any]]:
    """(kwargs, dynamic_shapes, shapes record) of one training step with labels, on the meta device."""
    import torch
    meta = torch.device("meta")
    dims: Dict[str, Any] = {}
    max_pos = _max_positions(config)
    if "batch" in dynamic:
        dims["batch"] = torch.export.Dim("batch", min=1)
    if "seq" in dynamic:
        dims["seq"] = torch.export.Dim("seq", min=2, max=max_pos) if max_pos else torch.export.Dim("seq", min=2)

    def ids(*shape):
        return torch.zeros(shape, dtype=torch.long, device=meta)

    main = getattr(model, "main_input_name", "input_ids")
    kwargs: Dict[str, Any] = {}
    spec: Dict[str, Dict[int, str]] = {}
    if main == "pixel_values":
        size = config.image_size if isinstance(config.image_size, (list, tuple)) else (config.image_size,) * 2
        kwargs["pixel_values"] = torch.zeros((batch, config.num_channels, *size), dtype=_float_dtype(model),
                                             device=meta)
        spec["pixel_values"] = {0: "batch"}
    elif main == "input_features":
        frames = 2 * getattr(config, "max_source_positions", 1500)  # Whisper's conv stride 2
        kwargs["input_features"] = torch.zeros((batch, config.num_mel_bins, frames), dtype=_float_dtype(model),
                                               device=meta)
        spec["input_features"] = {0: "batch"}
    else:
        kwargs["input_ids"] = ids(batch, seq)
        spec["input_ids"] = {0: "batch", 1: "seq"}
    if task in ("sequence-classification", "image-classification"):
        kwargs["labels"] = ids(batch)
        spec["labels"] = {0: "batch"}
    else:
        kwargs["labels"] = ids(batch, seq)
        spec["labels"] = {0: "batch", 1: "seq"}
    dynamic_shapes = None
    if dims:
        dynamic_shapes = {k: {i: dims[d] for i, d in axes.items() if d in dims} or None for k, axes in spec.items()}
    shapes = {k: {"shape": list(v.shape), "dtype": _dtype_name(v.dtype),
                  "dynamic": {str(i): d for i, d in spec[k].items() if d in dims}} for k, v in kwargs.items()}
    ranges = {name: {"min": int(d.min), "max": None if d.max is None or d.max > 2 ** 62 else int(d.max)}
              for name, d in dims.items()}
    return kwargs, dynamic_shapes, {"inputs": shapes, "dims": ranges}


def _float_dtype(model):
    import torch
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


# ---------------------------------------------------------------------------
# --factory
# ---------------------------------------------------------------------------
def call_factory(spec: str) -> Tuple[Any, Tuple[Any, ...], Dict[str, Any], Any]:
    """package.module:function -> (module, args, kwargs, dynamic_shapes)."""
    if ":" not in spec:
        raise ExportError(f"{spec}: --factory takes package.module:function")
    mod_name, fn_name = spec.split(":", 1)
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the user's own package in the working directory
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:
        raise ExportError(f"{spec}: cannot import {mod_name}: {_first_line(e)}") from e
    fn = getattr(mod, fn_name, None)
    if not callable(fn):
        raise ExportError(f"{spec}: {mod_name} has no function {fn_name}")
    try:
        out = fn()
    except Exception as e:
        raise ExportError(f"{spec}: the factory raised {_first_line(e)}") from e
    import torch
    dynamic_shapes = None
    if isinstance(out, dict):
        module, args, kwargs = out.get("module"), out.get("args", ()), out.get("kwargs", {})
        dynamic_shapes = out.get("dynamic_shapes")
    elif isinstance(out, tuple) and len(out) == 2:
        module, inputs = out
        args, kwargs = ((), inputs) if isinstance(inputs, dict) else (inputs, {})
    elif isinstance(out, tuple) and len(out) == 3:
        module, args, kwargs = out
    else:
        raise ExportError(f"{spec}: the factory must return (module, example_inputs), (module, args, kwargs) "
                          "or a dict with module, args, kwargs, dynamic_shapes")
    if not isinstance(module, torch.nn.Module):
        raise ExportError(f"{spec}: the factory's first value is a {type(module).__name__}, not a torch.nn.Module")
    if isinstance(args, torch.Tensor):
        args = (args,)
    return module, tuple(args or ()), dict(kwargs or {}), dynamic_shapes


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------
def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="fsdp-plan-export", description=__doc__.split("\n\n")[0],
                                 epilog="docs/install.md has examples; docs/export-metadata.md the record it writes.")
    ap.add_argument("source", nargs="?", help="a Hugging Face config.json, or a directory with one")
    ap.add_argument("-o", "--output", required=True, help="the .pt2 to write (atomically)")
    ap.add_argument("--factory", metavar="MODULE:FUNCTION",
                    help="your own model: a function returning (module, example_inputs) or (module, args, kwargs)")
    ap.add_argument("--task", choices=sorted(TASKS), help="the head to build (default: the config's architectures)")
    ap.add_argument("--batch", type=int, help="batch size of the example step (default 1; 2 with --dynamic batch)")
    ap.add_argument("--seq", type=int, help=f"sequence length (default the model's maximum positions, at most "
                                            f"{DEFAULT_SEQ}; 2 at least)")
    ap.add_argument("--dynamic", default="", metavar="DIMS",
                    help="comma-separated dimensions to export as dynamic: batch, seq")
    ap.add_argument("--dtype", choices=DTYPES, help="parameter dtype (default: what transformers builds, "
                                                    "the config's dtype)")
    ap.add_argument("--lora", metavar="ADAPTER_CONFIG", help="a PEFT adapter config (adapter_config.json or its "
                                                             "directory) applied with get_peft_model")
    ap.add_argument("--trust-remote-code", action="store_true",
                    help="allow a local directory's own modeling code (transformers' trust_remote_code)")
    ap.add_argument("-q", "--quiet", action="store_true", help="errors only")
    return ap.parse_args(argv)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    t_start = time.perf_counter()
    dynamic = [d.strip() for d in args.dynamic.split(",") if d.strip()]
    for d in dynamic:
        if d not in ("batch", "seq"):
            raise ExportError(f"--dynamic {args.dynamic}: unknown dimension {d!r} (batch, seq)")
    try:  # every bound before torch is imported or anything is built (export_bounds.py)
        bounds.check_step(args.batch, args.seq)
        bounds.check_output(args.output)
    except bounds.BoundsError as e:
        raise ExportError(str(e)) from None
    if bool(args.factory) == bool(args.source):
        raise ExportError("give a config (CONFIG.json or a directory) or --factory MODULE:FUNCTION, not both"
                          if args.factory else "no model: give CONFIG.json, a directory with one, or --factory")
    if args.lora and not args.factory:
        read_adapter(adapter_path(args.lora))
    config = load_config(args.source, args.trust_remote_code) if args.source else None
    _import("torch", args.source or args.factory)
    record: Dict[str, Any] = {}
    if args.factory:
        if dynamic or args.task or args.lora or args.batch or args.seq:
            raise ExportError(f"{args.factory}: --dynamic, --task, --lora, --batch and --seq describe a config; "
                              "a factory returns its own inputs (and dynamic_shapes, in a dict)")
        module, fargs, fkwargs, dynamic_shapes = call_factory(args.factory)
        if args.dtype:
            import torch
            module = module.to(getattr(torch, args.dtype))
        module.train()
        record["source"] = {"kind": "factory", "factory": args.factory}
        what = args.factory
    else:
        cls, task = model_class(config, args.task, args.source)
        max_pos = _max_positions(config)
        seq = args.seq or max(2, min(DEFAULT_SEQ, max_pos or DEFAULT_SEQ))
        batch = args.batch or (2 if "batch" in dynamic else 1)
        for name, v in (("batch", batch), ("seq", seq)):
            if name in dynamic and v < 2:
                raise ExportError(f"--{name} {v}: a dynamic dimension needs an example of at least 2 "
                                  "(torch.export specializes sizes 0 and 1)")
        if max_pos and seq > max_pos:
            raise ExportError(f"--seq {seq}: the model has {max_pos} positions")
        t0 = time.perf_counter()
        module, attn = build_model(config, cls, args.dtype, args.source)
        record["source"] = {"kind": "config", "config": args.source, "model_type": config.model_type,
                            "architectures": list(getattr(config, "architectures", None) or []),
                            "task": task, "attn_implementation": attn}
        tp = getattr(config, "base_model_tp_plan", None)
        record["base_model_tp_plan"] = dict(tp) if tp else None
        record["tp_model"] = tp_model_record(module, config)
        if args.lora:
            module, lora = apply_lora(module, args.lora)
            record["lora"] = dict(lora, adapter_config=args.lora)
        fargs = ()
        fkwargs, dynamic_shapes, shapes = training_inputs(module, config, task, batch, seq, dynamic)
        record.update(shapes)
        build_seconds = time.perf_counter() - t0
        what = args.source
    record = export_module(module, fargs, fkwargs, args.output, dynamic_shapes, record, what=what)
    if not args.factory:
        record["seconds"]["build"] = round(build_seconds, 3)
    record["seconds"]["total"] = round(time.perf_counter() - t_start, 3)
    return record


def tp_model_record(module: Any, config: Any) -> Optional[Dict[str, Any]]:
    """What a tensor-parallel plan of the model's own (policy "plan": "model") needs beyond the
    config's base_model_tp_plan: the base model's prefix its keys sit under, the head's own
    plan (the class's _tp_plan, {"lm_head": "colwise_gather_output"}), and the attention's head
    counts and size, which tp must divide (transformers 5: PreTrainedModel.post_init joins
    base_model_tp_plan under base_model_prefix with _tp_plan). None without a base_model_tp_plan."""
    if not getattr(config, "base_model_tp_plan", None):
        return None
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None)
    if head_dim is None and heads:
        head_dim = getattr(config, "hidden_size", 0) // heads or None
    return {"base_model_prefix": getattr(module, "base_model_prefix", "") or "",
            "head_tp_plan": dict(getattr(type(module), "_tp_plan", None) or {}),
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim}


def next_command(path: str, classes: Optional[List[str]]) -> str:
    """What to run next: --module-classes where the installed binary has it, else a policy file."""
    from ._binary import FsdpPlanError, find_binary
    plan = f"fsdp-plan {_shell(path)}"
    if not classes:
        return f"{plan} --world-size 8   # no _no_split_modules recorded: try `fsdp-plan suggest {_shell(path)}`"
    has_flag = False  # no binary to ask: the form every fsdp-plan takes
    with contextlib.suppress(FsdpPlanError, OSError, ValueError):
        import subprocess
        r = subprocess.run([find_binary(), "--help"], capture_output=True, text=True, timeout=30)
        has_flag = "--module-classes" in r.stdout
    if has_flag:
        return f"{plan} --module-classes {','.join(classes)} --world-size 8"
    policy = json.dumps({"module_classes": classes})
    return f"echo '{policy}' > policy.json && {plan} --policy policy.json --world-size 8"


def main(argv: Optional[Sequence[str]] = None) -> None:
    args = parse_args(argv)
    try:
        record = run(args)
    except ExportError as e:
        sys.stderr.write(f"fsdp-plan-export: {e}\n")
        sys.exit(EXIT_INPUT)
    except KeyboardInterrupt:
        sys.exit(130)
    if not args.quiet:
        size = os.path.getsize(args.output)
        secs = record["seconds"]
        shape = ", ".join(f"{k} {'x'.join(map(str, v['shape']))}" for k, v in (record.get("inputs") or {}).items())
        dims = record.get("dims") or {}
        sys.stderr.write(
            f"fsdp-plan-export: wrote {args.output} ({size / 1e6:.2f} MB): {record['root_class'].rsplit('.', 1)[-1]}, "
            f"{_count(record['num_parameters'])} parameters, {record['dtype']}"
            + (f", {shape}" if shape else "") + (f", dynamic {', '.join(dims)}" if dims else "")
            + (", loss in the graph" if record.get("loss_in_graph") else "") + "\n"
            f"fsdp-plan-export: {secs['total']:.1f} s in all"
            + (f", build {secs['build']:.1f} s" if "build" in secs else "")
            + f", export {secs['export']:.1f} s, save {secs['save']:.1f} s\n"
            f"next: {next_command(args.output, record.get('no_split_modules'))}\n")


# ---------------------------------------------------------------------------
def _import(name: str, where: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ExportError(f"{where}: needs {name} in this environment ({_first_line(e)}); "
                          f"pip install {name}") from None


@contextlib.contextmanager
def _quiet():
    """transformers' and torch's warnings about tracing and stand-in weights are not the user's."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    if line.endswith(":") and len(lines) > 1:  # "Class validation error for validator ...:" then the reason
        line = f"{line} {lines[1]}"
    return f"{type(e).__name__}: {line[:300]}" if line else type(e).__name__


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _dtype_name(dtype: Any) -> str:
    return str(dtype).rsplit(".", 1)[-1]


def _dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, indent=1) + "\n"


def _count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def _shell(s: str) -> str:
    import shlex
    return shlex.quote(s)


if __name__ == "__main__":
    main()
