#include "report/time_json.h"

namespace fsdp_plan {
namespace {

using ojson = nlohmann::ordered_json;

ojson seconds_or_null(bool known, double s) { return known ? ojson(s) : ojson(nullptr); }

const char* link_name(const CollectiveTime& t, const Collective& c) {
  if (c.group.size <= 1) return "none";
  return t.inter_node ? "inter_node" : "intra_node";
}

}  // namespace

ojson unit_comm_json(const Plan& plan, size_t i) {
  const UnitComm& u = plan.comm.units[i];
  return {{"all_gather_forward_bytes", u.all_gather_forward_bytes},
          {"all_gather_backward_bytes", u.all_gather_backward_bytes},
          {"reduce_scatter_bytes", u.reduce_scatter_bytes},
          {"all_reduce_bytes", u.all_reduce_bytes},
          {"host_to_device_bytes", u.host_to_device_bytes},
          {"device_to_host_bytes", u.device_to_host_bytes},
          {"calls", u.calls}};
}

ojson unit_time_json(const Plan& plan, size_t i) {
  const StepTime& t = plan.time;
  const UnitTime& u = t.units[i];
  const bool f = t.flops_known;
  return {{"all_gather_s", u.all_gather_s},
          {"reduce_scatter_s", u.reduce_scatter_s},
          {"all_reduce_s", u.all_reduce_s},
          {"host_copy_s", u.host_copy_s},
          {"forward_flops", f ? ojson(u.forward_flops) : ojson(nullptr)},
          {"backward_flops", f ? ojson(u.backward_flops) : ojson(nullptr)},
          {"forward_compute_s", seconds_or_null(f, u.forward_compute_s)},
          {"backward_compute_s", seconds_or_null(f, u.backward_compute_s)},
          {"exposed_forward_s", u.exposed_forward_s},
          {"exposed_backward_s", u.exposed_backward_s},
          {"exposed_tail_s", u.exposed_tail_s},
          {"exposed_s", u.exposed_s()}};
}

ojson comm_collective_json(const Plan& plan, size_t i) {
  const Collective& x = plan.comm.collectives[i];
  return {{"unit", x.unit},
          {"kind", collective_name(x.kind)},
          {"phase", phase_name(x.phase)},
          {"cause", x.cause},
          {"bytes", x.bytes},
          {"numel", x.numel},
          {"dtype", x.dtype},
          {"group_size", x.group.size},
          {"group_stride", x.group.stride},
          {"host_copy_bytes", x.host_copy_bytes}};
}

ojson comm_json(const Plan& plan) {
  const CommPlan& c = plan.comm;
  int64_t ag_f = 0, ag_b = 0, rs = 0, ar = 0, h2d = 0, d2h = 0;
  for (const Collective& x : c.collectives) {
    switch (x.kind) {
      case CollectiveKind::AllGather: (x.phase == StepPhase::Forward ? ag_f : ag_b) += x.bytes; h2d += x.host_copy_bytes; break;
      case CollectiveKind::ReduceScatter: rs += x.bytes; d2h += x.host_copy_bytes; break;
      case CollectiveKind::AllReduce: ar += x.bytes; d2h += x.host_copy_bytes; break;
    }
  }
  return {{"per_step", {{"all_gather", {{"forward", ag_f}, {"backward", ag_b}}},
                        {"reduce_scatter", {{"backward", rs}}},
                        {"all_reduce", {{"backward", ar}}},
                        {"host_to_device", h2d},
                        {"device_to_host", d2h},
                        {"calls", c.collectives.size()}}},
          {"rank", 0},
          {"notes", c.notes},
          {"collectives", ojson::array()}};  // comm_collective_json, one per collective
}

ojson time_collective_json(const Plan& plan, size_t i) {
  const CollectiveTime& c = plan.time.collectives[i];
  return {{"seconds", c.seconds},
          {"latency_s", c.latency_s},
          {"bandwidth_s", c.bandwidth_s},
          {"host_copy_s", c.host_copy_s},
          {"nodes", c.nodes},
          {"link", link_name(c, plan.comm.collectives[i])},
          {"start_s", seconds_or_null(plan.time.flops_known, c.start)},
          {"end_s", seconds_or_null(plan.time.flops_known, c.end)}};
}

ojson time_span_json(const Plan& plan, size_t i) {
  const TimeSpan& s = plan.time.timeline[i];
  return {{"what", s.compute ? "compute" : collective_name(plan.comm.collectives[static_cast<size_t>(s.collective)].kind)},
          {"unit", s.unit},
          {"collective", s.compute ? ojson(nullptr) : ojson(s.collective)},
          {"phase", s.backward ? "backward" : "forward"},
          {"start_s", s.start},
          {"end_s", s.end}};
}

ojson time_json(const Plan& plan) {
  const StepTime& t = plan.time;
  const HardwareFigures& h = t.hardware;
  const bool f = t.flops_known;
  ojson hw = {{"preset", h.preset},
              {"name", h.name},
              {"bf16_flops", h.bf16_flops},
              {"tf32_flops", h.tf32_flops},
              {"hbm_bytes_per_s", h.hbm_bytes_per_s},
              {"intra_node_bytes_per_s", h.intra_node_bytes_per_s},
              {"inter_node_bytes_per_s", h.inter_node_bytes_per_s},
              {"host_bytes_per_s", h.host_bytes_per_s},
              {"gpus_per_node", h.gpus_per_node},
              {"compute_efficiency", h.compute_efficiency},
              {"comm_efficiency", h.comm_efficiency},
              {"memory_efficiency", h.memory_efficiency},
              {"base_latency_s", h.base_latency_s},
              {"intra_step_latency_s", h.intra_step_latency_s},
              {"inter_step_latency_s", h.inter_step_latency_s},
              {"overridden", h.overridden}};
  return {{"estimate", true},
          {"flops_known", f},
          {"flops_source", f ? ojson(t.flops_source) : ojson(nullptr)},
          {"step_s", seconds_or_null(f, t.step_s)},
          {"compute_s", seconds_or_null(f, t.compute_s)},
          {"exposed_comm_s", t.exposed_comm_s},
          {"optimizer_s", seconds_or_null(f, t.optimizer_s)},
          {"comm_s", t.comm_s},
          {"channel_s", t.channel_s},
          {"forward_end_s", seconds_or_null(f, t.forward_end_s)},
          {"backward_compute_end_s", seconds_or_null(f, t.backward_compute_end_s)},
          {"backward_end_s", seconds_or_null(f, t.backward_end_s)},
          {"optimizer_trainable_shard_numel", f ? ojson(t.optimizer_trainable_shard_numel) : ojson(nullptr)},
          {"compute_dtype", f ? ojson(t.compute_dtype) : ojson(nullptr)},
          {"compute_peak_flops", f ? ojson(t.compute_peak_flops) : ojson(nullptr)},
          {"hardware", std::move(hw)},
          {"assumptions", t.assumptions},
          {"collectives", ojson::array()},  // time_collective_json, one per collective
          {"timeline", ojson::array()}};    // time_span_json, one per span
}

}  // namespace fsdp_plan
