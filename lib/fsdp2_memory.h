// Per-rank memory of a plan under FSDP2's rules (fully_shard): each parameter
// sharded on dim 0 with rank 0 holding ceil(d0/S) rows, groups gathered in
// param_dtype, reshard_after_forward per group, one group prefetched each
// way, reduce-scatter in reduce_dtype, sharded gradients and optimizer state.
// docs/memory-model.md "FSDP2" gives every formula and its source.
#pragma once

#include <cstdint>
#include <vector>

#include "memory.h"

namespace fsdp_plan {

struct Plan;

// The device mesh fully_shard gets: (shard) or, for HYBRID_SHARD, (replicate, shard).
struct Fsdp2Mesh {
  int64_t replicate = 1, shard = 1;
};
Fsdp2Mesh fsdp2_mesh(const MemorySettings& settings);

// The local shape of a parameter on rank 0, which is also every rank's padded
// shard: ceil(d0 / shard) rows (a 0-dim parameter, refused by fully_shard, as [1]).
std::vector<int64_t> fsdp2_sharded_shape(const std::vector<int64_t>& shape, int64_t shard);

// Throws std::invalid_argument for settings FSDP2 has no meaning for.
// Without `timeline`, MemoryPlan::timeline stays empty (the peak is the same):
// suggest's searches ask only for the peak.
MemoryPlan estimate_memory_fsdp2(const Plan& plan, const MemorySettings& settings, bool timeline = true);

}  // namespace fsdp_plan
