"""The step-time model of docs/time-model.md, in Python: the reference the C++ implementation is
to match number for number. model_check.py feeds it the oracles' JSON.

Everything here is an estimate from published peak figures times stated efficiencies; nothing
was measured on a GPU. Units: seconds, bytes, FLOPs.
"""
import math
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple


@dataclass(frozen=True)
class Hardware:
    """Peak figures per GPU, from the vendor's data sheets (docs/time-model.md, section 4)."""
    name: str
    bf16_flops: float       # dense (no 2:4 sparsity) Tensor Core peak, FLOP/s
    tf32_flops: float       # dense TF32 Tensor Core peak (fp32 matmuls), FLOP/s
    hbm_bytes_per_s: float  # memory bandwidth
    intra_node_bytes_per_s: float  # NVLink, per GPU, per direction
    inter_node_bytes_per_s: float  # the GPU's share of the node's network (one NIC per GPU), per direction
    host_bytes_per_s: float  # PCIe to the host, per direction (CPU offload copies)
    gpus_per_node: int = 8


PRESETS: Dict[str, Hardware] = {
    # NVIDIA H100 SXM5 80GB: BF16 989.4 TFLOP/s dense (1,979 with sparsity), TF32 494.7 dense,
    # HBM3 3.35 TB/s, NVLink 4 900 GB/s total = 450 GB/s per direction, PCIe Gen5 x16 64 GB/s per
    # direction; DGX H100: eight ConnectX-7 400 Gb/s (NDR) compute-fabric ports, one per GPU.
    "h100": Hardware("H100 SXM5 80GB", 989.4e12, 494.7e12, 3.35e12, 450e9, 50e9, 64e9),
    # NVIDIA H200 SXM 141GB: the same compute as H100 SXM, HBM3e 4.8 TB/s, NVLink 4 900 GB/s;
    # HGX/DGX H200 nodes: eight 400 Gb/s NICs.
    "h200": Hardware("H200 SXM 141GB", 989.4e12, 494.7e12, 4.8e12, 450e9, 50e9, 64e9),
    # NVIDIA A100 80GB SXM4: BF16 312 TFLOP/s dense (624 sparse), TF32 156 dense, HBM2e 2,039
    # GB/s, NVLink 3 600 GB/s total = 300 GB/s per direction, PCIe Gen4 x16 32 GB/s per
    # direction; DGX A100: eight ConnectX-6 200 Gb/s (HDR) ports, one per GPU.
    "a100": Hardware("A100 SXM4 80GB", 312e12, 156e12, 2.039e12, 300e9, 25e9, 32e9),
}


@dataclass
class Assumptions:
    """Every factor the model applies; printed with every estimate."""
    compute_efficiency: float = 0.5    # achieved / peak matmul FLOP/s
    comm_efficiency: float = 0.8       # achieved bus bandwidth / link peak
    memory_efficiency: float = 0.8     # achieved / peak HBM bandwidth (optimizer step)
    gpus_per_node: int = 8
    # NCCL ring, Simple protocol latency (NCCL src/graph/tuning.cc, as torch/_inductor/comm_analysis.py
    # copies it): base 8.4 us, 3.4 us per NVLink step, 14 us per network step.
    base_latency_s: float = 8.4e-6
    intra_step_latency_s: float = 3.4e-6
    inter_step_latency_s: float = 14e-6
    # AdamW on the sharded fp32 parameters as torch.optim's for-loop and foreach paths run it
    # (torch/optim/adam.py): eight elementwise passes, 84 bytes per trainable element
    # (lib/time/step_time.cpp optimizer_bytes_per_param; fused: 28). Every check here is non-fused.
    optimizer_bytes_per_param: int = 84
    cpu_ahead: bool = True  # the CPU issues kernels and collectives before the GPU needs them


# ------------------------------------------------------------------------------------ collectives

def nodes_spanned(ranks: List[int], gpus_per_node: int) -> int:
    """Ranks are placed on nodes in order (torchrun: rank // gpus_per_node)."""
    return len({r // gpus_per_node for r in ranks})


def collective_time(kind: str, nbytes: int, ranks: List[int], hw: Hardware, a: Assumptions) -> Dict[str, Any]:
    """Latency + bytes x ring factor / bandwidth for one collective (docs/time-model.md, section 2).
    `nbytes`: the whole buffer (all-gather output, reduce-scatter input, all-reduce tensor)."""
    n = len(ranks)
    if n <= 1:
        return {"seconds": 0.0, "latency_s": 0.0, "bandwidth_s": 0.0, "link": "none", "nodes": 1}
    nodes = nodes_spanned(ranks, a.gpus_per_node)
    if kind == "all_reduce":
        factor, steps, inter_steps = 2 * (n - 1) / n, 2 * (n - 1), 2 * (nodes - 1)
    elif kind in ("all_gather", "reduce_scatter"):
        factor, steps, inter_steps = (n - 1) / n, n - 1, nodes - 1
    else:
        raise ValueError(f"no time model for {kind}")
    link = "inter_node" if nodes > 1 else "intra_node"
    bw = (hw.inter_node_bytes_per_s if nodes > 1 else hw.intra_node_bytes_per_s) * a.comm_efficiency
    latency = a.base_latency_s + (steps - inter_steps) * a.intra_step_latency_s + inter_steps * a.inter_step_latency_s
    transfer = nbytes * factor / bw
    return {"seconds": latency + transfer, "latency_s": latency, "bandwidth_s": transfer, "link": link,
            "nodes": nodes, "ring_factor": factor}


# ------------------------------------------------------------------------------------ the step

def owner_unit(module: str, units: List[str]) -> str:
    """The FSDP unit that owns a module: the longest unit path that is the module or an ancestor."""
    best = ""
    for u in units:
        if u and (module == u or module.startswith(u + ".")) and len(u) > len(best):
            best = u
    return best


def unit_flops(flops: Dict[str, Any], units: List[str]) -> Dict[str, Tuple[int, int]]:
    """Each unit's own (forward, backward) FLOPs: its module's FlopCounterMode figures (exact at
    this level, FLOPS.md) minus those of the units nested in it."""
    mods = flops["modules"]
    out = {}
    for u in units:
        f, b = mods.get(u, {}).get("forward", 0), mods.get(u, {}).get("backward", 0)
        for v in units:
            if v != u and owner_unit(v, [x for x in units if x != v]) == u:
                f -= mods.get(v, {}).get("forward", 0)
                b -= mods.get(v, {}).get("backward", 0)
        out[u] = (f, b)
    return out


def segments(flops: Dict[str, Any], units: List[str]) -> Tuple[List[Tuple[str, int]], List[Tuple[str, int]]]:
    """(forward, backward) compute segments in execution order, as (unit, FLOPs).
    Forward: the FLOP trace's consecutive ops merged per owning unit (forward attribution is
    exact: module hooks nest), behind an empty root segment. Backward: the forward segments reversed, each with its unit's
    backward FLOPs split in proportion to the unit's forward FLOPs in that segment (FlopCounterMode
    attributes backward ops exactly per unit but not in order: its ModuleTracker keeps sibling
    modules open)."""
    fwd: List[List[Any]] = []
    for module, ph, n, _ in flops["trace"]:
        if ph != "forward":
            continue
        u = owner_unit("" if module == "Global" else module, units)
        if fwd and fwd[-1][0] == u:
            fwd[-1][1] += n
        else:
            fwd.append([u, n])
    # The root's pre-forward runs before anything else (its module's forward is the step's), and
    # its reduce-scatter waits for the end of backward (the embedding's gradient, last): an empty
    # root segment first, whatever the root's first counted op is.
    if "" in units and (not fwd or fwd[0][0] != ""):
        fwd.insert(0, ["", 0])
    totals = unit_flops(flops, units)
    per_unit_fwd: Dict[str, int] = defaultdict(int)
    for u, n in fwd:
        per_unit_fwd[u] += n
    bwd = []
    for u, n in reversed(fwd):
        share = n / per_unit_fwd[u] if per_unit_fwd[u] else 0.0
        bwd.append((u, int(round(totals[u][1] * share))))
    return [(u, n) for u, n in fwd], bwd


@dataclass
class UnitResult:
    unit: str
    all_gather_bytes: int = 0
    all_gather_s: float = 0.0
    reduce_scatter_bytes: int = 0
    reduce_scatter_s: float = 0.0
    all_reduce_bytes: int = 0
    all_reduce_s: float = 0.0
    host_copy_bytes: int = 0
    host_copy_s: float = 0.0
    forward_flops: int = 0
    backward_flops: int = 0
    forward_compute_s: float = 0.0
    backward_compute_s: float = 0.0
    exposed_forward_s: float = 0.0
    exposed_backward_s: float = 0.0
    exposed_tail_s: float = 0.0

    @property
    def exposed_s(self) -> float:
        return self.exposed_forward_s + self.exposed_backward_s + self.exposed_tail_s


def step_time(comm: Dict[str, Any], flops: Dict[str, Any], hw: Hardware, a: Assumptions) -> Dict[str, Any]:
    """Simulates one training step on two kinds of resources: one compute stream, and one channel
    per process group (an NCCL communicator runs its collectives one at a time, in issue order).
    Rules (docs/time-model.md, section 3):
      F1 forward compute runs the units' segments in execution order; a segment of unit u starts
         after u's forward all-gather has finished;
      F2 the forward all-gather number j (issue order) starts when its channel is free and, FSDP2,
         not before the forward compute of all-gather j-2's unit starts (two all-gather buffers in
         flight, _fsdp_param_group.py wait_for_unshard); FSDP1, not before that unit's forward
         compute ends if that unit reshards after forward (limit_all_gathers' rate limiter);
      B1 backward compute runs the backward segments in execution order; a segment of u starts
         after u's backward all-gathers (prefetched or not) have finished;
      B2 a backward all-gather of u starts when its channel is free and not before the backward
         compute of the unit just before u in backward order has started (it is issued in that
         unit's pre-backward, after that unit's copy-out, which the all-gather streams wait for:
         _fsdp_param_group.py pre_backward / wait_for_unshard);
      B3 a reduce-scatter (or NO_SHARD's all-reduce) of u starts when its channel is free and u's
         backward compute has ended; an HSDP all-reduce of u starts when the replicate channel is
         free and u's reduce-scatter has ended;
      B4 backward ends when compute and every collective have ended (FSDP waits for its
         reduce-scatters / all-reduces before the optimizer step); then the optimizer step.
    Waiting time of the compute stream is charged to the collective it waits for (exposed)."""
    version = comm["config"]["version"]
    units = [u["unit"] for u in comm["units"]]
    unknown = [u for u in units if u and u not in flops["modules"]]
    if unknown:
        raise ValueError(f"the FLOP case has no module for the units {unknown}: comm and FLOP cases of "
                         f"different models?")
    res: Dict[str, UnitResult] = {u: UnitResult(u) for u in units}
    mp_dtype = {u["unit"]: _unit_param_dtype(u) for u in comm["units"]}
    peak = hw.bf16_flops if all(d in ("bfloat16", "float16") for d in mp_dtype.values()) else hw.tf32_flops
    flop_rate = peak * a.compute_efficiency

    colls = []
    for r in comm["collectives"]:
        t = collective_time(r["kind"], r["bytes"], r["group_ranks"], hw, a)
        c = dict(r, **t)
        colls.append(c)
        u = res[r["unit"]]
        key = {"all_gather": "all_gather", "reduce_scatter": "reduce_scatter", "all_reduce": "all_reduce"}[r["kind"]]
        setattr(u, key + "_bytes", getattr(u, key + "_bytes") + r["bytes"])
        setattr(u, key + "_s", getattr(u, key + "_s") + t["seconds"])
    # CPU offload (FSDP2): the H2D copy of the sharded parameters before each all-gather and the
    # D2H copy of the sharded gradients after each reduce-scatter, over PCIe, added to them.
    host = defaultdict(float)
    for unit, phases in (comm.get("offload_summary") or {}).items():
        for phase, dirs in phases.items():
            for d, v in dirs.items():
                s = v["bytes"] / (hw.host_bytes_per_s * a.comm_efficiency)
                host[(unit, phase, d)] += s
                res[unit].host_copy_bytes += v["bytes"]
                res[unit].host_copy_s += s
    for c in colls:
        d = "host_to_device" if c["kind"] == "all_gather" else "device_to_host"
        n_same = sum(1 for x in colls if x["unit"] == c["unit"] and x["phase"] == c["phase"] and x["kind"] == c["kind"])
        c["seconds"] += host.get((c["unit"], c["phase"], d), 0.0) / max(n_same, 1)

    fwd, bwd = segments(flops, units)
    for u, f in fwd:
        res[u].forward_flops += f
        res[u].forward_compute_s += f / flop_rate
    for u, f in bwd:
        res[u].backward_flops += f
        res[u].backward_compute_s += f / flop_rate

    channel_free: Dict[Tuple[int, ...], float] = defaultdict(float)
    compute_free = 0.0
    timeline: List[Dict[str, Any]] = []

    def run_coll(c, gate):
        ch = tuple(c["group_ranks"])
        start = max(channel_free[ch], gate)
        c["start"], c["end"] = start, start + c["seconds"]
        channel_free[ch] = c["end"]
        timeline.append({"what": f"{c['kind']} {c['unit'] or '(root)'}", "phase": c["phase"], "start": start,
                         "end": c["end"]})

    # ---- forward
    f_ag = [c for c in colls if c["phase"] == "forward" and c["kind"] == "all_gather"]
    ag_of = {c["unit"]: c for c in f_ag}
    reshards = {c["unit"] for c in colls if c["phase"] == "backward" and c["kind"] == "all_gather"}
    seg_start: Dict[str, float] = {}
    seg_end: Dict[str, float] = {}
    order = {c["unit"]: j for j, c in enumerate(f_ag)}
    scheduled = 0

    def schedule_forward_ag(upto: int):
        nonlocal scheduled
        while scheduled <= upto and scheduled < len(f_ag):
            j, c = scheduled, f_ag[scheduled]
            gate = 0.0
            if j >= 2:
                prev = f_ag[j - 2]["unit"]
                if version == 2:
                    gate = seg_start.get(prev, 0.0)
                elif prev in reshards:
                    gate = seg_end.get(prev, 0.0)
            run_coll(c, gate)
            scheduled += 1

    for u, f in _with_missing(fwd, [c["unit"] for c in f_ag]):
        ready = compute_free
        if u in ag_of:
            schedule_forward_ag(order[u])
            ready = max(ready, ag_of[u]["end"])
        wait = ready - compute_free
        res[u].exposed_forward_s += wait
        start, end = ready, ready + f / flop_rate
        seg_start.setdefault(u, start)
        seg_end[u] = end
        compute_free = end
        timeline.append({"what": f"forward {u or '(root)'}", "phase": "forward", "start": start, "end": end})
    schedule_forward_ag(len(f_ag))
    forward_end = compute_free

    # ---- backward
    b_colls = [c for c in colls if c["phase"] == "backward"]
    b_ag: Dict[str, List[Dict[str, Any]]] = defaultdict(list)
    for c in b_colls:
        if c["kind"] == "all_gather":
            b_ag[c["unit"]].append(c)
    segs = list(_with_missing(bwd, [c["unit"] for c in b_colls]))
    last_seg = {u: i for i, (u, _) in enumerate(segs)}
    done_seg = 0
    bseg_end: Dict[str, float] = {}

    def run_segments(upto: int):
        nonlocal done_seg, compute_free
        while done_seg <= upto and done_seg < len(segs):
            u, f = segs[done_seg]
            ready = compute_free
            for c in b_ag.get(u, []):
                if "end" not in c:
                    raise RuntimeError(f"backward segment of {u!r} needs an all-gather issued after it")
                ready = max(ready, c["end"])
            res[u].exposed_backward_s += ready - compute_free
            start, end = ready, ready + f / flop_rate
            bseg_start[done_seg] = start
            bseg_end[u] = end
            compute_free = end
            timeline.append({"what": f"backward {u or '(root)'}", "phase": "backward", "start": start, "end": end})
            done_seg += 1

    bseg_start: Dict[int, float] = {}
    first_seg = {}
    for i, (u, _) in enumerate(segs):
        first_seg.setdefault(u, i)
    rs_end: Dict[str, float] = {}
    for c in b_colls:
        if c["kind"] == "all_gather":
            # B2: issued in the pre-backward of the unit that runs just before c's unit, after that
            # unit's copy-out, which the all-gather streams then wait for.
            idx = first_seg.get(c["unit"], len(segs)) - 1
            gate = 0.0
            if idx >= 0:
                run_segments(idx)
                gate = bseg_start[idx]
            run_coll(c, gate)
            continue
        hsdp_ar = c["kind"] == "all_reduce" and c["unit"] in rs_end
        if hsdp_ar:
            run_coll(c, rs_end[c["unit"]])
            continue
        run_segments(last_seg.get(c["unit"], -1))
        run_coll(c, bseg_end.get(c["unit"], compute_free))
        rs_end[c["unit"]] = c["end"]
    run_segments(len(segs))
    compute_end = compute_free
    backward_end = max([compute_end] + [c["end"] for c in colls])
    # The tail: collectives still running after the last backward compute, charged in order.
    covered = compute_end
    for c in sorted((c for c in colls if c["end"] > compute_end), key=lambda c: c["end"]):
        extra = c["end"] - max(covered, c["start"], compute_end)
        if extra > 0:
            res[c["unit"]].exposed_tail_s += extra
            covered = c["end"]

    trainable = sum(_unit_trainable_shard(u) for u in comm["units"])
    optimizer_s = trainable * a.optimizer_bytes_per_param / (hw.hbm_bytes_per_s * a.memory_efficiency)
    step = backward_end + optimizer_s
    compute_total = sum(r.forward_compute_s + r.backward_compute_s for r in res.values())
    exposed_total = sum(r.exposed_s for r in res.values())
    return {
        "estimate": True,
        "hardware": asdict(hw),
        "assumptions": asdict(a),
        "compute_peak_flops": peak,
        "units": [dict(_unit_dict(res[u])) for u in units],
        "forward_end_s": forward_end,
        "backward_compute_end_s": compute_end,
        "backward_end_s": backward_end,
        "optimizer_s": optimizer_s,
        "optimizer_trainable_shard_numel": trainable,
        "compute_s": compute_total,
        "exposed_comm_s": exposed_total,
        "step_s": step,
        "check_step_equals_compute_plus_exposed_plus_optimizer": abs(step - (compute_total + exposed_total + optimizer_s)),
        "timeline": timeline,
    }


def _with_missing(segs: List[Tuple[str, int]], units_in_order: List[str]):
    """Segments, plus an empty one for a unit that has a collective but counted no FLOP (so that its
    all-gather still gates the compute), placed before the next unit in `units_in_order`."""
    have = {u for u, _ in segs}
    missing = [u for u in dict.fromkeys(units_in_order) if u not in have]
    out = list(segs)
    for m in missing:
        idx = units_in_order.index(m)
        nxt = next((u for u in units_in_order[idx + 1:] if u in have), None)
        pos = next((i for i, (u, _) in enumerate(out) if u == nxt), len(out)) if nxt else len(out)
        out.insert(pos, (m, 0))
        have.add(m)
    return out


def _unit_param_dtype(u: Dict[str, Any]) -> str:
    if "param_dtype" in u:
        return u["param_dtype"]
    d = {p["param_dtype"] for p in u["params"]}
    return d.pop() if len(d) == 1 else "mixed"


def _unit_trainable_shard(u: Dict[str, Any]) -> int:
    """This rank's sharded trainable numel (padded, as FSDP allocates it)."""
    if "params" in u:  # FSDP2
        return sum(p["padded_sharded_numel"] for p in u["params"] if p["requires_grad"])
    return u["sharded_numel"] if u["requires_grad"] else 0


def _unit_dict(r: UnitResult) -> Dict[str, Any]:
    d = asdict(r)
    d["exposed_s"] = r.exposed_s
    return d


def fmt_s(s: float) -> str:
    if s == 0:
        return "0"
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    return f"{s * 1e3:.3f} ms" if s < 1 else f"{s:.3f} s"


def fmt_b(b: int) -> str:
    for unit, size in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if b >= size:
            return f"{b / size:.2f} {unit}"
    return f"{b} B"
