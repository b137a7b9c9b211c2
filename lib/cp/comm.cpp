#include "cp/comm.h"

namespace fsdp_plan {
namespace {

Collective ring_collective(const CpAttention& a, CollectiveKind kind, StepPhase phase, const char* cause,
                           const RankGroup& group, bool fp32) {
  Collective c;
  c.kind = kind;
  c.phase = phase;
  c.unit = a.unit;
  c.numel = 2 * a.kv_numel;  // cat(K.flatten(), V.flatten())
  c.bytes = fp32 ? a.dkv_bytes() : a.kv_bytes();
  c.dtype = fp32 ? "float32" : a.dtype;
  c.group = group;
  c.cause = cause;
  c.module = a.module;
  if (kind == CollectiveKind::AllGather) {  // the gathered output, as nccl-tests sizes it
    c.numel *= group.size;
    c.bytes *= group.size;
  } else {
    c.permute = true;
  }
  return c;
}

// K/V's ring once: one all-gather, or cp - 1 permutes.
void kv_ring(const CpAttention& a, const ContextParallel& cp, StepPhase phase, const char* cause,
             const RankGroup& group, std::vector<Collective>& out) {
  if (cp.rotate == ContextParallel::Rotate::AllGather) {
    out.push_back(ring_collective(a, CollectiveKind::AllGather, phase, cause, group, false));
    return;
  }
  for (int64_t i = 0; i + 1 < group.size; ++i)
    out.push_back(ring_collective(a, CollectiveKind::AllToAll, phase, cause, group, false));
}

}  // namespace

CpComm cp_comm(const Plan& plan) {
  CpComm out;
  if (!plan.context_parallel) return out;
  const ContextParallelPlan& cp = *plan.context_parallel;
  out.planned = true;
  out.group = plan.mesh.group(MeshDim::Cp);
  if (out.group.size <= 1) return out;  // a cp of one rank rings nothing
  std::vector<Collective> backward;
  for (const CpAttention& a : cp.attention) {
    kv_ring(a, cp.settings, StepPhase::Forward, "kv", out.group, out.collectives);
    // Backward, last call first: the recompute's ring, then the backward's K/V and gradients' rings.
    std::vector<Collective> b;
    if (a.recomputed) kv_ring(a, cp.settings, StepPhase::Backward, "recompute_kv", out.group, b);
    kv_ring(a, cp.settings, StepPhase::Backward, "backward_kv", out.group, b);
    for (int64_t i = 0; i < out.group.size; ++i)
      b.push_back(ring_collective(a, CollectiveKind::AllToAll, StepPhase::Backward, "dkv", out.group, true));
    backward.insert(backward.begin(), b.begin(), b.end());
  }
  out.collectives.insert(out.collectives.end(), backward.begin(), backward.end());
  return out;
}

}  // namespace fsdp_plan
