#include "plan/comm.h"

namespace fsdp_plan {

const char* collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::AllGather: return "all_gather";
    case CollectiveKind::ReduceScatter: return "reduce_scatter";
    case CollectiveKind::AllReduce: return "all_reduce";
    case CollectiveKind::AllToAll: return "all_to_all";
  }
  return "all_gather";
}

const char* phase_name(StepPhase phase) { return phase == StepPhase::Forward ? "forward" : "backward"; }

void summarize_comm(CommPlan& comm, size_t num_units) {
  comm.units.resize(num_units);
  for (UnitComm& u : comm.units) {
    const int64_t keep = u.trainable_shard_numel;
    u = UnitComm{};
    u.trainable_shard_numel = keep;
  }
  for (const Collective& c : comm.collectives) {
    UnitComm& u = comm.units[static_cast<size_t>(c.unit)];
    ++u.calls;
    switch (c.kind) {
      case CollectiveKind::AllGather:
        (c.phase == StepPhase::Forward ? u.all_gather_forward_bytes : u.all_gather_backward_bytes) += c.bytes;
        u.host_to_device_bytes += c.host_copy_bytes;
        break;
      case CollectiveKind::ReduceScatter:
        u.reduce_scatter_bytes += c.bytes;
        u.device_to_host_bytes += c.host_copy_bytes;
        break;
      case CollectiveKind::AllReduce:
        u.all_reduce_bytes += c.bytes;
        u.device_to_host_bytes += c.host_copy_bytes;
        break;
      case CollectiveKind::AllToAll: break;  // expert parallelism's: CommPlan::ep, not FSDP's
    }
  }
}

}  // namespace fsdp_plan
