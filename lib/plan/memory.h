// What the memory models (fsdp1/memory.h, fsdp2/memory.h) work out for a
// plan: per unit, per rank, and the training step's timeline. Part of the
// plan's data model; docs/memory-model.md gives every formula.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "policy/settings.h"

namespace fsdp_plan {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct UnitMemory {
  int64_t flat_numel = 0;     // the flat parameter, alignment padding included
  int64_t sharded_numel = 0;  // per rank: ceil(flat_numel / shard group size)
  int64_t sharded_bytes = 0;  // in the parameters' own dtype
  int64_t unsharded_bytes = 0;  // gathered, padded, in the dtype it is gathered in
  int64_t compute_itemsize = 0;
};

struct RankMemory {
  int64_t params_bytes = 0;     // sharded flat parameters + ignored parameters
  int64_t grads_bytes = 0;      // sharded gradients (+ ignored parameters' gradients)
  int64_t optimizer_bytes = 0;  // optimizer state of what this rank holds
  int64_t buffers_bytes = 0;    // buffers are replicated, never sharded
  int64_t steady_bytes = 0;
  int64_t peak_bytes = 0;       // activations included when known (ActivationPlan)
  int64_t activation_bytes = 0;  // activations and their temporaries live at the peak
  std::string peak_phase;  // "forward", "backward" or "optimizer step"
  int peak_unit = -1;      // the unit being computed at the peak
  std::vector<int> peak_gathered;  // units gathered at the peak
  // FSDP2: the device bytes at the peak by category (sharded_params,
  // unsharded_params, all_gather, reduce_scatter, sharded_grads,
  // unsharded_grads, optimizer_state, buffers), and with CPU offload what
  // lives on the host (sharded parameters, gradients, optimizer state).
  std::vector<std::pair<std::string, int64_t>> peak_categories;
  int64_t host_bytes = 0;
};

// What a rank holds at one point of a training step: while `unit` runs its
// forward or backward, or in the optimizer step (unit -1). The series walks
// forward unit by unit, backward in reverse, then the optimizer step; the peak
// (RankMemory) is its largest total.
struct MemoryStep {
  std::string phase;  // "forward", "backward" or "optimizer step"
  int unit = -1;
  int64_t params_bytes = 0;     // sharded parameters (+ ignored ones), always held
  int64_t optimizer_bytes = 0;  // always held
  int64_t buffers_bytes = 0;    // always held
  int64_t gathered_bytes = 0;   // unsharded parameters gathered now, prefetch included
  int64_t unsharded_grads_bytes = 0;  // gradients before their reduce-scatter
  int64_t grads_bytes = 0;      // sharded gradients left so far (+ ignored parameters' gradients)
  int64_t activation_bytes = 0;  // saved activations, activation gradients and recompute live (0 when unknown)
  // FSDP2: the same bytes in FSDPMemTracker's categories (as RankMemory::peak_categories).
  std::vector<std::pair<std::string, int64_t>> categories;
  int64_t total_bytes() const {
    return params_bytes + optimizer_bytes + buffers_bytes + gathered_bytes + unsharded_grads_bytes + grads_bytes +
           activation_bytes;
  }
};

// fsdp.gradient_accumulation_steps > 1 (plan/grad_accumulation.h): what the
// micro-steps add to one step's peak.
struct GradAccumulation {
  int64_t steps = 1;
  bool no_sync = false;
  int64_t micro_step_peak_bytes = 0;  // the walk's peak: one step, gradients freed before its forward
  int64_t held_grads_bytes = 0;       // held from the second micro-step's forward on (sharded, or unsharded with no_sync)
  bool modelled = true;               // false with CPU offload (the gradients live on the host)
};

struct MemoryPlan {
  FsdpSettings settings;
  GradAccumulation accumulation;
  ShardingStrategy effective_strategy = ShardingStrategy::FullShard;
  int64_t shard_group_size = 1;  // ranks a flat parameter (FSDP2: each parameter) is sharded over
  int64_t replicate_size = 1;    // FSDP2 HSDP: the mesh's replicate dimension
  std::vector<UnitMemory> units;  // parallel to Plan::units
  RankMemory per_rank;
  std::vector<MemoryStep> timeline;  // one training step, in order
  std::vector<std::string> notes;
};

}  // namespace fsdp_plan
