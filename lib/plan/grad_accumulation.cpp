#include "plan/grad_accumulation.h"

#include <string>

#include "model/dtype.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

// With no_sync: every trainable unit's unsharded gradient (see the header).
int64_t unsharded_grads_bytes(const Plan& plan) {
  const auto& mp = plan.policy.mixed_precision;
  int64_t total = 0;
  for (size_t i = 0; i < plan.units.size() && i < plan.memory.units.size(); ++i) {
    const Unit& u = plan.units[i];
    const UnitMemory& um = plan.memory.units[i];
    if (u.trainable_numel <= 0 || u.param_numel <= 0) continue;
    if (!plan.v2()) {  // FSDP1: the flat parameter's whole gradient, frozen parts included
      total += um.unsharded_bytes;
      continue;
    }
    const bool reduce = u.mixed_precision.value_or(false) && mp && mp->reduce_dtype;
    const int64_t itemsize = reduce ? dtype_itemsize(*mp->reduce_dtype) : um.compute_itemsize;
    if (!plan.tensor_parallel) {  // each parameter's unsharded gradient: its whole, unpadded numel
      total += u.trainable_numel * itemsize;
      continue;
    }
    // With tensor parallelism the TP-local tensors: the unit's padded TP-local numel, its trainable share.
    const double share = static_cast<double>(u.trainable_numel) / static_cast<double>(u.param_numel);
    total += static_cast<int64_t>(static_cast<double>(um.flat_numel) * share) * itemsize;
  }
  return total;
}

// The walk's points with the held gradients added: the largest is the peak.
void raise_peak(MemoryPlan& m, int64_t held, bool no_sync) {
  RankMemory& r = m.per_rank;
  if (m.timeline.empty()) {  // a ranking plan keeps no timeline: every point, as an upper bound
    r.peak_bytes += held;
    return;
  }
  int64_t best = -1;
  const MemoryStep* at = nullptr;
  int64_t added = 0;
  for (const MemoryStep& s : m.timeline) {
    if (s.phase == "optimizer step") continue;  // every gradient is there already
    const int64_t extra = no_sync ? held : r.grads_bytes - s.grads_bytes;
    if (s.total_bytes() + extra > best) best = s.total_bytes() + extra, at = &s, added = extra;
  }
  if (!at || best <= r.peak_bytes) return;
  r.peak_bytes = best;
  r.peak_phase = at->phase;
  r.peak_unit = at->unit;
  r.activation_bytes = at->activation_bytes;
  if (!at->categories.empty()) {
    r.peak_categories = at->categories;
    r.peak_categories.emplace_back(no_sync ? "accumulated_unsharded_grads" : "accumulated_sharded_grads", added);
  }
}

}  // namespace

void add_gradient_accumulation(Plan& plan) {
  MemoryPlan& m = plan.memory;
  GradAccumulation& a = m.accumulation;
  a.steps = plan.policy.fsdp.gradient_accumulation_steps;
  a.no_sync = plan.policy.fsdp.no_sync && a.steps > 1;
  a.micro_step_peak_bytes = m.per_rank.peak_bytes;
  if (a.steps <= 1) return;
  const std::string what = std::to_string(a.steps) + " micro-steps per optimizer step";
  if (m.settings.cpu_offload) {
    a.modelled = false;
    m.notes.push_back("gradient accumulation (" + what + "): not modelled with CPU offload (the gradients live on "
                      "the host); the peak is one micro-step's");
    return;
  }
  a.held_grads_bytes = a.no_sync ? unsharded_grads_bytes(plan) : m.per_rank.grads_bytes;
  raise_peak(m, a.held_grads_bytes, a.no_sync);
  m.notes.push_back(
      "gradient accumulation (" + what + (a.no_sync ? ", no_sync" : "") + "): the peak holds " +
      format_bytes(a.held_grads_bytes) +
      (a.no_sync ? " of unsharded gradients (FSDP1 no_sync() / FSDP2 set_requires_gradient_sync(False) keep them "
                   "until the last micro-step reduce-scatters)"
                 : " of sharded gradients (every micro-step reduce-scatters; the earlier ones' gradients are held "
                   "through the later ones)") +
      " at every point of the step, an ESTIMATE (an upper bound in the last backward); one micro-step alone peaks at " +
      format_bytes(a.micro_step_peak_bytes));
}

}  // namespace fsdp_plan
