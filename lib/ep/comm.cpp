#include "ep/comm.h"

#include <algorithm>

namespace fsdp_plan {
namespace {

// Whether full checkpointing recomputes the experts' forward in backward.
bool recomputed(const Plan& plan, ModuleId experts) {
  const auto& ac = plan.policy.activation_checkpointing;
  if (!ac || ac->selective()) return false;
  const auto& regions = plan.activations.checkpointed;
  return std::any_of(regions.begin(), regions.end(),
                     [&](const CheckpointedModule& c) { return plan.tree->within(experts, c.module); });
}

// The unit whose forward runs the experts: the innermost unit holding its module.
int unit_of(const Plan& plan, ModuleId m) {
  int best = 0, depth = -1;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const ModuleId u = plan.units[i].module;
    const int d = plan.tree->depth(u);
    if (d > depth && plan.tree->within(m, u)) {
      best = static_cast<int>(i);
      depth = d;
    }
  }
  return best;
}

// `rows`: what this rank sends; `recv_rows`: what it receives (they differ on
// the busiest rank under skewed routing).
Collective all_to_all(const ExpertModule& x, StepPhase phase, const char* cause, int unit, const RankGroup& group,
                      int64_t rows, int64_t recv_rows) {
  Collective c;
  c.kind = CollectiveKind::AllToAll;
  c.phase = phase;
  c.unit = unit;
  c.numel = rows * x.hidden;
  c.bytes = c.numel * x.itemsize;  // the input buffer: every row, those this rank keeps included
  c.recv_bytes = recv_rows * x.hidden * x.itemsize;
  c.dtype = x.dtype;
  c.group = group;
  c.cause = cause;
  c.module = x.module;
  return c;
}

}  // namespace

EpComm ep_comm(const Plan& plan) {
  EpComm out;
  if (!plan.expert_parallel) return out;
  const ExpertParallelPlan& ep = *plan.expert_parallel;
  out.planned = true;
  out.group = plan.mesh.group(MeshDim::Ep);
  out.sizes_known = std::all_of(ep.modules.begin(), ep.modules.end(), [](const ExpertModule& x) { return x.sizes_known; });
  for (const ExpertModule& x : ep.modules)
    if (!x.sizes_known && out.unknown_reason.empty()) out.unknown_reason = x.unknown_reason;
  if (!out.sizes_known || out.group.size <= 1) return out;  // an ep of one rank moves nothing
  std::vector<Collective> backward;
  for (const ExpertModule& x : ep.modules) {
    const int unit = unit_of(plan, x.module);
    // The busiest rank sends its own tokens x top_k rows in dispatch and receives its experts' share
    // (imbalance x as many); combine returns them; each backward all-to-all is its forward's reversed.
    const int64_t own = x.tokens * x.top_k, hot = x.busiest_rows(ep.imbalance);
    const auto a2a = [&](StepPhase phase, const char* cause, bool to_experts) {
      return all_to_all(x, phase, cause, unit, out.group, to_experts ? own : hot, to_experts ? hot : own);
    };
    out.collectives.push_back(a2a(StepPhase::Forward, "dispatch", true));
    out.collectives.push_back(a2a(StepPhase::Forward, "combine", false));
    // Backward, last layer first: the recompute's pair, then combine's gradient, then dispatch's.
    std::vector<Collective> b;
    if (recomputed(plan, x.module)) {
      b.push_back(a2a(StepPhase::Backward, "recompute_dispatch", true));
      b.push_back(a2a(StepPhase::Backward, "recompute_combine", false));
    }
    b.push_back(a2a(StepPhase::Backward, "combine_grad", true));
    b.push_back(a2a(StepPhase::Backward, "dispatch_grad", false));
    backward.insert(backward.begin(), b.begin(), b.end());
  }
  out.collectives.insert(out.collectives.end(), backward.begin(), backward.end());
  return out;
}

}  // namespace fsdp_plan
