#include "report/time_json.h"

#include <array>
#include <optional>

#include "util/strings.h"

namespace fsdp_plan {
namespace {

// Fields that exist only with CPU offload: the host copies (FSDP2's
// CPUOffloadPolicy; zero in every other plan, so absent there).
bool offloads(const Plan& plan) { return plan.memory.settings.cpu_offload; }

// The process groups a list of collectives runs on, in the order of first
// use (comm.groups): `index[i]` is collective i's group, `first[k][kind]`
// the first collective of that kind on group k (-1: none).
struct Groups {
  std::vector<RankGroup> groups;
  std::vector<int> index;
  std::vector<std::array<long, 3>> first;
};

Groups groups_of(const std::vector<Collective>& colls) {
  Groups g;
  g.index.resize(colls.size());
  size_t k = 0;
  for (size_t i = 0; i < colls.size(); ++i) {
    const RankGroup& group = colls[i].group;
    if (i == 0 || !(g.groups[k] == group)) {  // runs of one group are the rule
      k = 0;
      while (k < g.groups.size() && !(g.groups[k] == group)) ++k;
      if (k == g.groups.size()) {
        g.groups.push_back(group);
        g.first.push_back({-1, -1, -1});
      }
    }
    g.index[i] = static_cast<int>(k);
    long& first = g.first[k][static_cast<size_t>(colls[i].kind)];
    if (first < 0) first = static_cast<long>(i);
  }
  return g;
}

// Group k's figures in the estimate: the nodes it spans and each kind's ring
// latency on it (docs/time-model.md section 2). A collective's seconds are
// that latency, its bytes over the link, and CPU offload's copy.
void group_time_json(JsonSink& w, const Groups& g, size_t k, const std::vector<CollectiveTime>& times) {
  const CollectiveKind kinds[] = {CollectiveKind::AllGather, CollectiveKind::ReduceScatter, CollectiveKind::AllReduce};
  w.object([&] {
    int64_t nodes = 1;
    for (const long i : g.first[k])
      if (i >= 0) nodes = times[static_cast<size_t>(i)].nodes;
    w.field("nodes", nodes);
    w.object_field("latency_s", [&] {
      for (CollectiveKind kind : kinds)
        if (const long i = g.first[k][static_cast<size_t>(kind)]; i >= 0)
          w.field(collective_name(kind), times[static_cast<size_t>(i)].latency_s);
    });
  });
}

// comm.collectives[i]: one collective of the step, in issue order; its
// estimate under "time".
void collective_json(JsonSink& w, const Plan& plan, size_t i, int group, bool offload) {
  const Collective& x = plan.comm.collectives[i];
  w.object([&] {
    w.field("unit", x.unit);
    w.field("kind", collective_name(x.kind));
    w.field("phase", phase_name(x.phase));
    w.field("cause", x.cause);
    w.field("bytes", x.bytes);
    w.field("dtype", x.dtype);
    w.field("group", group);
    if (offload) w.field("host_copy_bytes", x.host_copy_bytes);
    if (plan.time.computed) {
      const CollectiveTime& c = plan.time.collectives[i];
      w.object_field("time", [&] {
        w.field("seconds", c.seconds);
        if (offload) w.field("host_copy_s", c.host_copy_s);
      });
    }
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
    if (!s.compute) w.field("collective", s.collective);
    w.field("phase", s.backward ? "backward" : "forward");
    w.field("start_s", s.start);
    w.field("end_s", s.end);
  });
}

// Blocking collectives on one mesh dimension's group, each with the module
// whose activations it moves: tensor parallelism's (CommPlan::tp) and expert
// parallelism's all-to-alls (CommPlan::ep).
struct BlockingComm {
  const char* mesh_dim;
  bool sizes_known;
  const std::string& unknown_reason;
  const RankGroup& group;
  const std::vector<Collective>& collectives;
  const std::vector<CollectiveTime>& times;
  const std::vector<std::string>* not_modelled;
};

void blocking_comm_json(JsonSink& w, const Plan& plan, const BlockingComm& b, bool events) {
  const bool timed = plan.time.computed;
  int64_t bytes = 0;
  for (const Collective& x : b.collectives) bytes += x.bytes;
  w.object([&] {
    w.field("sizes_known", b.sizes_known);
    if (!b.sizes_known) w.field("unknown_reason", b.unknown_reason);
    w.field("mesh_dim", b.mesh_dim);
    w.field("group_size", b.group.size);
    w.field("group_stride", b.group.stride);
    if (timed && !b.collectives.empty()) {
      w.key("time");
      group_time_json(w, groups_of(b.collectives), 0, b.times);
    }
    w.field("calls", b.sizes_known ? std::optional<size_t>(b.collectives.size()) : std::nullopt);
    w.field("bytes", b.sizes_known ? std::optional<int64_t>(bytes) : std::nullopt);
    if (b.not_modelled) w.field("not_modelled", *b.not_modelled);
    if (events)
      w.array_field("collectives", [&] {
        for (size_t i = 0; i < b.collectives.size(); ++i) {
          const Collective& x = b.collectives[i];
          w.object([&] {
            w.field("unit", x.unit);
            w.field("module", path_or_root(plan.tree->path(x.module)));
            w.field("kind", collective_name(x.kind));
            w.field("phase", phase_name(x.phase));
            w.field("cause", x.cause);
            w.field("bytes", x.bytes);
            w.field("dtype", x.dtype);
            if (x.permute) w.field("permute", true);  // the whole buffer to one peer (context parallelism's ring)
            if (timed) w.object_field("time", [&] { w.field("seconds", b.times[i].seconds); });
          });
        }
      });
  });
}

void tp_comm_json(JsonSink& w, const Plan& plan, bool events) {
  const TpComm& tp = plan.comm.tp;
  blocking_comm_json(w, plan, {"tp", tp.sizes_known, tp.unknown_reason, tp.group, tp.collectives,
                               plan.time.tp_collectives, &tp.not_modelled}, events);
}

void ep_comm_json(JsonSink& w, const Plan& plan, bool events) {
  const EpComm& ep = plan.comm.ep;
  blocking_comm_json(w, plan, {"ep", ep.sizes_known, ep.unknown_reason, ep.group, ep.collectives,
                               plan.time.ep_collectives, nullptr}, events);
}

void cp_comm_json(JsonSink& w, const Plan& plan, bool events) {
  const CpComm& cp = plan.comm.cp;
  blocking_comm_json(w, plan, {"cp", true, "", cp.group, cp.collectives, plan.time.cp_collectives, nullptr}, events);
}

}  // namespace

void unit_comm_json(JsonSink& w, const Plan& plan, size_t i) {
  const UnitComm& u = plan.comm.units[i];
  w.object([&] {
    w.field("all_gather_forward_bytes", u.all_gather_forward_bytes);
    w.field("all_gather_backward_bytes", u.all_gather_backward_bytes);
    w.field("reduce_scatter_bytes", u.reduce_scatter_bytes);
    w.field("all_reduce_bytes", u.all_reduce_bytes);
    if (offloads(plan)) {
      w.field("host_to_device_bytes", u.host_to_device_bytes);
      w.field("device_to_host_bytes", u.device_to_host_bytes);
    }
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
    if (offloads(plan)) w.field("host_copy_s", u.host_copy_s);
    if (f) {
      w.field("forward_flops", u.forward_flops);
      w.field("backward_flops", u.backward_flops);
      w.field("forward_compute_s", u.forward_compute_s);
      w.field("backward_compute_s", u.backward_compute_s);
    }
    w.field("exposed_forward_s", u.exposed_forward_s);
    w.field("exposed_backward_s", u.exposed_backward_s);
    w.field("exposed_tail_s", u.exposed_tail_s);
    if (f && plan.comm.tp.planned) {  // 2-D plans with FLOPs: the unit's blocking TP collectives
      w.field("tp_forward_s", u.tp_forward_s);
      w.field("tp_backward_s", u.tp_backward_s);
    }
  });
}

void comm_json(JsonSink& w, const Plan& plan, bool events) {
  const CommPlan& c = plan.comm;
  const bool offload = offloads(plan);
  int64_t ag_f = 0, ag_b = 0, rs = 0, ar = 0, h2d = 0, d2h = 0;
  for (const Collective& x : c.collectives) {
    switch (x.kind) {
      case CollectiveKind::AllGather: (x.phase == StepPhase::Forward ? ag_f : ag_b) += x.bytes; h2d += x.host_copy_bytes; break;
      case CollectiveKind::ReduceScatter: rs += x.bytes; d2h += x.host_copy_bytes; break;
      case CollectiveKind::AllReduce: ar += x.bytes; d2h += x.host_copy_bytes; break;
      case CollectiveKind::AllToAll: break;  // expert parallelism's, in comm.expert_parallel
    }
  }
  const Groups groups = groups_of(c.collectives);
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
    w.array_field("groups", [&] {
      for (size_t k = 0; k < groups.groups.size(); ++k)
        w.object([&] {
          w.field("size", groups.groups[k].size);
          w.field("stride", groups.groups[k].stride);
          if (plan.time.computed) {
            w.key("time");
            group_time_json(w, groups, k, plan.time.collectives);
          }
        });
    });
    if (events)
      w.array_field("collectives", [&] {
        for (size_t i = 0; i < c.collectives.size(); ++i) collective_json(w, plan, i, groups.index[i], offload);
      });
    if (c.tp.planned) {
      w.key("tensor_parallel");
      tp_comm_json(w, plan, events);
    }
    if (plan.comm.ep.planned) {
      w.key("expert_parallel");
      ep_comm_json(w, plan, events);
    }
    if (plan.comm.cp.planned) {
      w.key("context_parallel");
      cp_comm_json(w, plan, events);
    }
  });
}

void time_json(JsonSink& w, const Plan& plan, bool events) {
  const StepTime& t = plan.time;
  const HardwareFigures& h = t.hardware;
  const bool f = t.flops_known;
  // Null without FLOPs: the figures the estimate has only when it knows them.
  const auto known = [f](auto x) { return f ? std::optional<decltype(x)>(x) : std::nullopt; };
  w.object([&] {
    w.field("estimate", true);
    w.field("flops_known", f);
    w.field("flops_source", known(t.flops_source));
    w.field("step_s", known(t.step_s));
    w.field("compute_s", known(t.compute_s));
    w.field("exposed_comm_s", t.exposed_comm_s);
    w.field("optimizer_s", t.optimizer_modelled ? known(t.optimizer_s) : std::nullopt);  // CPU offload: not modelled
    w.field("comm_s", t.comm_s);
    w.field("channel_s", t.channel_s);
    w.field("forward_end_s", known(t.forward_end_s));
    w.field("backward_compute_end_s", known(t.backward_compute_end_s));
    w.field("optimizer_trainable_shard_numel", known(t.optimizer_trainable_shard_numel));
    w.field("compute_dtype", known(t.compute_dtype));
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
    if (events)
      w.array_field("timeline", [&] {
        for (size_t i = 0; i < t.timeline.size(); ++i) time_span_json(w, plan, i);
      });
    if (plan.comm.tp.planned)
      w.object_field("tensor_parallel", [&] {
        w.field("blocking", true);
        w.field("comm_s", t.tp_comm_s);
      });
    if (plan.comm.ep.planned)
      w.object_field("expert_parallel", [&] {
        w.field("blocking", true);
        w.field("comm_s", t.ep_comm_s);
      });
    if (plan.comm.cp.planned)
      w.object_field("context_parallel", [&] {
        w.field("blocking", true);
        w.field("comm_s", t.cp_comm_s);
      });
  });
}

}  // namespace fsdp_plan
