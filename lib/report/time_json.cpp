#include "report/time_json.h"

#include <optional>

#include "util/strings.h"

namespace fsdp_plan {
namespace {

// A figure the estimate has only when it knows the FLOPs: null otherwise.
template <class T>
std::optional<T> known_or_null(bool known, T x) {
  return known ? std::optional<T>(x) : std::nullopt;
}

const char* link_name(const CollectiveTime& t, const Collective& c) {
  if (c.group.size <= 1) return "none";
  return t.inter_node ? "inter_node" : "intra_node";
}

// comm.collectives[i]: one collective of the step, in issue order.
void comm_collective_json(JsonSink& w, const Plan& plan, size_t i) {
  const Collective& x = plan.comm.collectives[i];
  w.object([&] {
    w.field("unit", x.unit);
    w.field("kind", collective_name(x.kind));
    w.field("phase", phase_name(x.phase));
    w.field("cause", x.cause);
    w.field("bytes", x.bytes);
    w.field("numel", x.numel);
    w.field("dtype", x.dtype);
    w.field("group_size", x.group.size);
    w.field("group_stride", x.group.stride);
    w.field("host_copy_bytes", x.host_copy_bytes);
  });
}

// time.collectives[i]: what the model says collective i costs, and when it runs.
void time_collective_json(JsonSink& w, const Plan& plan, size_t i) {
  const CollectiveTime& c = plan.time.collectives[i];
  const bool f = plan.time.flops_known;
  w.object([&] {
    w.field("seconds", c.seconds);
    w.field("latency_s", c.latency_s);
    w.field("bandwidth_s", c.bandwidth_s);
    w.field("host_copy_s", c.host_copy_s);
    w.field("nodes", c.nodes);
    w.field("link", link_name(c, plan.comm.collectives[i]));
    w.field("start_s", known_or_null(f, c.start));
    w.field("end_s", known_or_null(f, c.end));
  });
}

// time.timeline[i]: one span of compute or communication.
void time_span_json(JsonSink& w, const Plan& plan, size_t i) {
  const TimeSpan& s = plan.time.timeline[i];
  w.object([&] {
    const char* what =
        s.compute ? "compute" : collective_name(plan.comm.collectives[static_cast<size_t>(s.collective)].kind);
    w.field("what", what);
    w.field("unit", s.unit);
    w.field("collective", s.compute ? std::nullopt : std::optional<int>(s.collective));
    w.field("phase", s.backward ? "backward" : "forward");
    w.field("start_s", s.start);
    w.field("end_s", s.end);
  });
}

// comm.tensor_parallel: tensor parallelism's collectives (CommPlan::tp), each
// with the module whose activations it moves and the mesh dimension it runs on.
void tp_comm_json(JsonSink& w, const Plan& plan) {
  const TpComm& tp = plan.comm.tp;
  int64_t bytes = 0;
  for (const Collective& x : tp.collectives) bytes += x.bytes;
  w.object([&] {
    w.field("sizes_known", tp.sizes_known);
    w.field("unknown_reason", tp.sizes_known ? std::nullopt : std::optional<std::string>(tp.unknown_reason));
    w.field("mesh_dim", "tp");
    w.field("group_size", tp.group.size);
    w.field("group_stride", tp.group.stride);
    w.field("calls", known_or_null(tp.sizes_known, tp.collectives.size()));
    w.field("bytes", known_or_null(tp.sizes_known, bytes));
    w.field("not_modelled", tp.not_modelled);
    w.array_field("collectives", [&] {
      for (const Collective& x : tp.collectives)
        w.object([&] {
          w.field("unit", x.unit);
          w.field("module", path_or_root(plan.tree->path(x.module)));
          w.field("kind", collective_name(x.kind));
          w.field("phase", phase_name(x.phase));
          w.field("cause", x.cause);
          w.field("bytes", x.bytes);
          w.field("numel", x.numel);
          w.field("dtype", x.dtype);
          w.field("mesh_dim", "tp");
          w.field("group_size", x.group.size);
          w.field("group_stride", x.group.stride);
        });
    });
  });
}

// time.tensor_parallel: their times, parallel to comm.tensor_parallel.collectives.
void tp_time_json(JsonSink& w, const Plan& plan) {
  const StepTime& t = plan.time;
  w.object([&] {
    w.field("blocking", true);
    w.field("comm_s", t.tp_comm_s);
    w.array_field("collectives", [&] {
      for (size_t i = 0; i < t.tp_collectives.size(); ++i) {
        const CollectiveTime& c = t.tp_collectives[i];
        w.object([&] {
          w.field("seconds", c.seconds);
          w.field("latency_s", c.latency_s);
          w.field("bandwidth_s", c.bandwidth_s);
          w.field("nodes", c.nodes);
          w.field("link", link_name(c, plan.comm.tp.collectives[i]));
        });
      }
    });
  });
}

}  // namespace

void unit_comm_json(JsonSink& w, const Plan& plan, size_t i) {
  const UnitComm& u = plan.comm.units[i];
  w.object([&] {
    w.field("all_gather_forward_bytes", u.all_gather_forward_bytes);
    w.field("all_gather_backward_bytes", u.all_gather_backward_bytes);
    w.field("reduce_scatter_bytes", u.reduce_scatter_bytes);
    w.field("all_reduce_bytes", u.all_reduce_bytes);
    w.field("host_to_device_bytes", u.host_to_device_bytes);
    w.field("device_to_host_bytes", u.device_to_host_bytes);
    w.field("calls", u.calls);
  });
}

void unit_time_json(JsonSink& w, const Plan& plan, size_t i) {
  const StepTime& t = plan.time;
  const UnitTime& u = t.units[i];
  const bool f = t.flops_known;
  w.object([&] {
    w.field("all_gather_s", u.all_gather_s);
    w.field("reduce_scatter_s", u.reduce_scatter_s);
    w.field("all_reduce_s", u.all_reduce_s);
    w.field("host_copy_s", u.host_copy_s);
    w.field("forward_flops", known_or_null(f, u.forward_flops));
    w.field("backward_flops", known_or_null(f, u.backward_flops));
    w.field("forward_compute_s", known_or_null(f, u.forward_compute_s));
    w.field("backward_compute_s", known_or_null(f, u.backward_compute_s));
    w.field("exposed_forward_s", u.exposed_forward_s);
    w.field("exposed_backward_s", u.exposed_backward_s);
    w.field("exposed_tail_s", u.exposed_tail_s);
    w.field("exposed_s", u.exposed_s());
    if (plan.comm.tp.planned) {  // 2-D plans only: the unit's blocking TP collectives
      w.field("tp_forward_s", known_or_null(f, u.tp_forward_s));
      w.field("tp_backward_s", known_or_null(f, u.tp_backward_s));
    }
  });
}

void comm_json(JsonSink& w, const Plan& plan) {
  const CommPlan& c = plan.comm;
  int64_t ag_f = 0, ag_b = 0, rs = 0, ar = 0, h2d = 0, d2h = 0;
  for (const Collective& x : c.collectives) {
    switch (x.kind) {
      case CollectiveKind::AllGather: (x.phase == StepPhase::Forward ? ag_f : ag_b) += x.bytes; h2d += x.host_copy_bytes; break;
      case CollectiveKind::ReduceScatter: rs += x.bytes; d2h += x.host_copy_bytes; break;
      case CollectiveKind::AllReduce: ar += x.bytes; d2h += x.host_copy_bytes; break;
    }
  }
  w.object([&] {
    w.object_field("per_step", [&] {
      w.object_field("all_gather", [&] {
        w.field("forward", ag_f);
        w.field("backward", ag_b);
      });
      w.object_field("reduce_scatter", [&] { w.field("backward", rs); });
      w.object_field("all_reduce", [&] { w.field("backward", ar); });
      w.field("host_to_device", h2d);
      w.field("device_to_host", d2h);
      w.field("calls", c.collectives.size());
    });
    w.field("rank", 0);
    w.field("notes", c.notes);
    w.array_field("collectives", [&] {
      for (size_t i = 0; i < c.collectives.size(); ++i) comm_collective_json(w, plan, i);
    });
    if (c.tp.planned) {
      w.key("tensor_parallel");
      tp_comm_json(w, plan);
    }
  });
}

void time_json(JsonSink& w, const Plan& plan) {
  const StepTime& t = plan.time;
  const HardwareFigures& h = t.hardware;
  const bool f = t.flops_known;
  w.object([&] {
    w.field("estimate", true);
    w.field("flops_known", f);
    w.field("flops_source", known_or_null(f, t.flops_source));
    w.field("step_s", known_or_null(f, t.step_s));
    w.field("compute_s", known_or_null(f, t.compute_s));
    w.field("exposed_comm_s", t.exposed_comm_s);
    w.field("optimizer_s", known_or_null(f, t.optimizer_s));
    w.field("comm_s", t.comm_s);
    w.field("channel_s", t.channel_s);
    w.field("forward_end_s", known_or_null(f, t.forward_end_s));
    w.field("backward_compute_end_s", known_or_null(f, t.backward_compute_end_s));
    w.field("backward_end_s", known_or_null(f, t.backward_end_s));
    w.field("optimizer_trainable_shard_numel", known_or_null(f, t.optimizer_trainable_shard_numel));
    w.field("compute_dtype", known_or_null(f, t.compute_dtype));
    w.field("compute_peak_flops", known_or_null(f, t.compute_peak_flops));
    w.object_field("hardware", [&] {
      w.field("preset", h.preset);
      w.field("name", h.name);
      w.field("bf16_flops", h.bf16_flops);
      w.field("tf32_flops", h.tf32_flops);
      w.field("hbm_bytes_per_s", h.hbm_bytes_per_s);
      w.field("intra_node_bytes_per_s", h.intra_node_bytes_per_s);
      w.field("inter_node_bytes_per_s", h.inter_node_bytes_per_s);
      w.field("host_bytes_per_s", h.host_bytes_per_s);
      w.field("gpus_per_node", h.gpus_per_node);
      w.field("compute_efficiency", h.compute_efficiency);
      w.field("comm_efficiency", h.comm_efficiency);
      w.field("memory_efficiency", h.memory_efficiency);
      w.field("base_latency_s", h.base_latency_s);
      w.field("intra_step_latency_s", h.intra_step_latency_s);
      w.field("inter_step_latency_s", h.inter_step_latency_s);
      w.field("overridden", h.overridden);
    });
    w.field("assumptions", t.assumptions);
    w.array_field("collectives", [&] {
      for (size_t i = 0; i < t.collectives.size(); ++i) time_collective_json(w, plan, i);
    });
    w.array_field("timeline", [&] {
      for (size_t i = 0; i < t.timeline.size(); ++i) time_span_json(w, plan, i);
    });
    if (plan.comm.tp.planned) {
      w.key("tensor_parallel");
      tp_time_json(w, plan);
    }
  });
}

}  // namespace fsdp_plan
