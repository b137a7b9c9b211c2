"""FLOPs of a training step from a torch.export graph (training IR), by the per-op formulas of
FLOPS.md: the algorithm the C++ planner will run on a .pt2, written here so that flop_oracle.py
can check it against FlopCounterMode on the same model.

Forward FLOPs of a node come from its argument shapes (node.meta["val"]); backward FLOPs from the
same shapes and from which arguments need a gradient, propagated through the graph from the
trainable parameters (a node's output needs a gradient when any tensor argument does and the
output is floating point; `*_like`, `new_*`, `detach` and integer results never do). Formulas
mirror torch/utils/flop_counter.py (torch 2.13): mm_flop / addmm_flop / bmm_flop /
baddbmm_flop (2*M*N*K), sdpa_flop_count, sdpa_backward_flop_count, conv_flop_count /
conv_backward_flop. Every other op counts 0 there (elementwise, norms, softmax, embedding,
the loss), and so here, but for the grouped matmuls of mixture-of-experts layers
(aten._grouped_mm, transformers' grouped_mm_fallback): torch 2.13 has no formula for them
(FlopCounterMode counts 0), and they are most of an MoE step's work; here, and in
flop_oracle.py's FlopCounterMode (custom_mapping), they count as the matmuls they run
(grouped_mm_flops).
"""
import math
import operator
from collections import Counter, defaultdict
from typing import Any, Dict, List, Optional, Tuple

import torch

aten = torch.ops.aten

# Ops whose FLOPs FlopCounterMode counts (after it decomposes composite ops such as linear and
# matmul into mm / bmm / addmm); anything else with one of these words in its name is reported.
MATMUL_WORDS = ("mm", "matmul", "linear", "attention", "conv", "einsum", "bilinear", "tensordot")
NO_GRAD_OPS = {"aten.detach.default", "aten.zeros_like.default", "aten.ones_like.default",
               "aten.empty_like.default", "aten.full_like.default", "aten.rand_like.default",
               "aten.randn_like.default", "aten.new_ones.default", "aten.new_zeros.default",
               "aten.new_empty.default", "aten.new_full.default", "aten.arange.start",
               "aten.arange.default", "aten.arange.start_step", "aten._assert_tensor_metadata.default"}


def _shape(node_or_val) -> Optional[Tuple[int, ...]]:
    val = node_or_val.meta.get("val") if isinstance(node_or_val, torch.fx.Node) else node_or_val
    return tuple(int(s) for s in val.shape) if isinstance(val, torch.Tensor) else None


def _numel(shape) -> int:
    return int(math.prod(shape)) if shape else 1


def _mm(m: int, k: int, n: int) -> int:
    # flop_counter.mm_flop: m * n * 2 * k ("should be 2 * k - 1 technically")
    return 2 * m * k * n


def matmul_dims(a: Tuple[int, ...], b: Tuple[int, ...]) -> Tuple[int, int, int, int]:
    """(batch, M, K, N) of torch.matmul(a, b), with broadcasting of the batch dimensions."""
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    batch = torch.broadcast_shapes(a2[:-2], b2[:-2]) if len(a2) > 2 or len(b2) > 2 else ()
    return _numel(batch), a2[-2], a2[-1], b2[-1]


def sdpa_forward(q, k, v) -> int:
    # flop_counter.sdpa_flop_count: q @ k^T and scores @ v, over the query heads (GQA broadcasts k/v).
    b, h, sq, dq = q
    sk, dv = k[-2], v[-1]
    return _mm(b * h * sq, dq, sk) + _mm(b * h * sq, sk, dv)


def sdpa_backward(q, k, v) -> int:
    # flop_counter.sdpa_backward_flop_count: the scores again (the fused kernels recompute them),
    # grad wrt scores and v, grad wrt q and k: five bmm = 2*b*h*sq*sk*(3*dq + 2*dv).
    b, h, sq, dq = q
    sk, dv = k[-2], v[-1]
    return 2 * b * h * sq * sk * (3 * dq + 2 * dv)


def grouped_mm_flops(a: Tuple[int, ...], b: Tuple[int, ...]) -> int:
    """2*M*K*N of each group's matmul, summed: a [M, K] against b [G, K, N] (each expert's rows
    times its weight), a [K, M] against b [M, N] split at offs (the weights' gradient) and a
    [G, M, K] against b [K, N] alike (each group's share of M or N), or a [G, M, K] against
    b [G, K, N] (a batched matmul)."""
    groups = a[0] if len(a) == 3 and len(b) == 3 else 1
    return groups * _mm(a[-2], a[-1], b[-1])


def node_flops(node: torch.fx.Node, needs_grad) -> Tuple[int, int, Optional[str]]:
    """(forward, backward, formula name) of one call_function node."""
    t = str(node.target)
    args = node.args
    if t == "aten.linear.default":
        x, w = _shape(args[0]), _shape(args[1])
        k, n = w[-1], w[0]
        f = _mm(_numel(x) // k, k, n)
        return f, f * (needs_grad(args[0]) + needs_grad(args[1])), "linear"
    if t in ("aten.matmul.default", "aten.bmm.default", "aten.mm.default"):
        bt, m, k, n = matmul_dims(_shape(args[0]), _shape(args[1]))
        f = bt * _mm(m, k, n)
        return f, f * (needs_grad(args[0]) + needs_grad(args[1])), "matmul"
    if t in ("aten.addmm.default", "aten.baddbmm.default"):
        bt, m, k, n = matmul_dims(_shape(args[1]), _shape(args[2]))
        f = bt * _mm(m, k, n)
        return f, f * (needs_grad(args[1]) + needs_grad(args[2])), "addmm"
    if t == "aten.scaled_dot_product_attention.default":
        q, k, v = (_shape(a) for a in args[:3])
        f = sdpa_forward(q, k, v)
        b = sdpa_backward(q, k, v) if any(needs_grad(a) for a in args[:3]) else 0
        return f, b, "sdpa"
    if t in ("aten.convolution.default", "aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default"):
        w, out = _shape(args[1]), _shape(node)
        transposed = bool(args[6]) if t == "aten.convolution.default" and len(args) > 6 else False
        # flop_counter.conv_flop_count: batch * prod(w) * prod(spatial of the larger of in / out) * 2
        spatial = _shape(args[0])[2:] if transposed else out[2:]
        f = out[0] * _numel(w) * _numel(spatial) * 2
        return f, f * (needs_grad(args[0]) + needs_grad(args[1])), "convolution"
    if t in ("aten._grouped_mm.default", "transformers.grouped_mm_fallback.default"):
        f = grouped_mm_flops(_shape(args[0]), _shape(args[1]))
        return f, f * (needs_grad(args[0]) + needs_grad(args[1])), "grouped_mm"
    if any(word in t for word in MATMUL_WORDS):
        return 0, 0, None  # reported as unknown by the caller
    return 0, 0, "zero"


def graph_flops(ep: "torch.export.ExportedProgram", strip_prefix: str = "") -> Dict[str, Any]:
    """Forward / backward FLOPs per module (hierarchical: a module includes its submodules; "" is
    the root), the op census, and any op that looks like a matmul but has no formula here."""
    sig = ep.graph_signature
    params = dict(sig.inputs_to_parameters)
    grad: Dict[str, bool] = {}
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            fqn = params.get(node.name)
            grad[node.name] = bool(fqn is not None and ep.state_dict[fqn].requires_grad)

    def needs(a) -> bool:
        return isinstance(a, torch.fx.Node) and grad.get(a.name, False)

    modules: Dict[str, Dict[str, int]] = defaultdict(lambda: {"forward": 0, "backward": 0})
    ops: Counter = Counter()
    unknown: Counter = Counter()
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        t = str(node.target)
        ops[t] += 1
        if node.target is operator.getitem:
            grad[node.name] = needs(node.args[0]) and _is_float(node)
            continue
        flat = _flat(node)
        grad[node.name] = t not in NO_GRAD_OPS and any(needs(a) for a in flat) and _is_float(node)
        f, b, formula = node_flops(node, needs)
        if formula is None:
            unknown[t] += 1
            continue
        if not (f or b):
            continue
        stack = node.meta.get("nn_module_stack") or {}
        path = list(stack.values())[-1][0] if stack else ""
        if strip_prefix and path.startswith(strip_prefix):
            path = path[len(strip_prefix):]
        elif strip_prefix and path == strip_prefix.rstrip("."):
            path = ""
        parts = path.split(".") if path else []
        for i in range(len(parts) + 1):
            m = modules[".".join(parts[:i])]
            m["forward"] += f
            m["backward"] += b
    return {"modules": {k: dict(v) for k, v in sorted(modules.items())}, "ops": dict(sorted(ops.items())),
            "unknown_ops": dict(sorted(unknown.items()))}


def _flat(node: torch.fx.Node) -> List[torch.fx.Node]:
    out: List[torch.fx.Node] = []
    torch.fx.node.map_arg((node.args, node.kwargs), lambda n: out.append(n))
    return out


def _is_float(node: torch.fx.Node) -> bool:
    val = node.meta.get("val")
    vals = val if isinstance(val, (list, tuple)) else [val]
    return any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in vals)


# What autograd saves for an op (tools/autograd/derivatives.yaml): "input" (saved before the op
# computes: its inputs, e.g. mm / linear save self and mat2), "output" (saved after: e.g. softmax,
# tanh, the SDPA kernels' out and logsumexp, dropout's mask, layer_norm's mean / rstd), or
# "none" (add, views, cat, casts). Ops not listed are taken as "input".
SAVES = {
    "aten.add.Tensor": "none", "aten.sub.Tensor": "none", "aten.add.Scalar": "none", "aten.neg.default": "none",
    "aten.view.default": "none", "aten.reshape.default": "none", "aten.transpose.int": "none",
    "aten.permute.default": "none", "aten.expand.default": "none", "aten.unsqueeze.default": "none",
    "aten.squeeze.dim": "none", "aten.slice.Tensor": "none", "aten.select.int": "none", "aten.cat.default": "none",
    "aten.split.Tensor": "none", "aten.split_with_sizes.default": "none", "aten.chunk.default": "none",
    "aten.contiguous.default": "none", "aten.clone.default": "none", "aten.alias.default": "none",
    "aten.to.dtype": "none", "aten.to.dtype_layout": "none", "aten.to.device": "none", "aten.t.default": "none",
    "aten.mean.dim": "none", "aten.sum.dim_IntList": "none", "aten.flatten.using_ints": "none",
    "aten.unflatten.int": "none", "aten.zeros_like.default": "none", "aten.detach.default": "none",
    "aten.mul.Scalar": "none", "aten.div.Scalar": "none", "aten._assert_tensor_metadata.default": "none",
    "aten.softmax.int": "output", "aten._softmax.default": "output", "aten.log_softmax.int": "output",
    "aten.tanh.default": "output", "aten.sigmoid.default": "output", "aten.rsqrt.default": "output",
    "aten.exp.default": "output", "aten.dropout.default": "output", "aten.native_dropout.default": "output",
    "aten.layer_norm.default": "output", "aten.native_layer_norm.default": "output",
    "aten.scaled_dot_product_attention.default": "output",
}


def recompute_flops(ep: "torch.export.ExportedProgram", region: str, strip_prefix: str = "") -> int:
    """Forward FLOPs that non-reentrant activation checkpointing recomputes for the module at path
    `region` (torch/utils/checkpoint.py: the recompute stops as soon as it has re-created the last
    tensor the region saved, `_StopRecomputationError`, early stop on by default): the FLOP ops of
    the region up to its last saving op, that op included only when it saves its output."""
    fwd = _node_forward_flops(ep)
    nodes = [n for n in ep.graph.nodes if n.op == "call_function" and _in_region(n, region, strip_prefix)]
    needs = _needs_grad_fn(ep)
    last, last_kind = -1, "none"
    for i, n in enumerate(nodes):
        kind = SAVES.get(str(n.target), "input")
        if kind != "none" and needs(n):
            last, last_kind = i, kind
    total = 0
    for i, n in enumerate(nodes):
        if i < last or (i == last and last_kind == "output"):
            total += fwd.get(n.name, 0)
    return total


def _in_region(node, region: str, strip_prefix: str) -> bool:
    stack = node.meta.get("nn_module_stack") or {}
    path = list(stack.values())[-1][0] if stack else ""
    if strip_prefix and path.startswith(strip_prefix):
        path = path[len(strip_prefix):]
    return path == region or path.startswith(region + ".")


def _needs_grad_fn(ep):
    """Whether a node's output needs a gradient (the propagation graph_flops uses)."""
    params = dict(ep.graph_signature.inputs_to_parameters)
    grad: Dict[str, bool] = {}
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            fqn = params.get(node.name)
            grad[node.name] = bool(fqn is not None and ep.state_dict[fqn].requires_grad)
        elif node.op == "call_function":
            if node.target is operator.getitem:
                grad[node.name] = grad.get(node.args[0].name, False) and _is_float(node)
            else:
                grad[node.name] = (str(node.target) not in NO_GRAD_OPS and _is_float(node)
                                   and any(grad.get(a.name, False) for a in _flat(node)))
    return lambda n: grad.get(n.name, False)


def _node_forward_flops(ep) -> Dict[str, int]:
    needs = _needs_grad_fn(ep)
    out = {}
    for node in ep.graph.nodes:
        if node.op == "call_function" and node.target is not operator.getitem:
            f, _, _ = node_flops(node, lambda a: isinstance(a, torch.fx.Node) and needs(a))
            if f:
                out[node.name] = f
    return out
