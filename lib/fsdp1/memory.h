// Per-rank memory of a plan under FSDP1's rules: flat parameters padded for
// sharding, gathered units in the order FSDP gathers and frees them, sharded
// gradients and optimizer state. docs/memory-model.md gives every formula and
// the FSDP behaviour it follows.
#pragma once

#include "plan/memory.h"
#include "policy/settings.h"

namespace fsdp_plan {

struct Plan;

// Throws std::invalid_argument when device_mesh_error() (mesh/device_mesh.h) has something to say.
// Without `timeline`, MemoryPlan::timeline stays empty (the peak is the same):
// suggest's searches ask only for the peak, hundreds of times.
MemoryPlan estimate_memory(const Plan& plan, const FsdpSettings& settings, bool timeline = true);

}  // namespace fsdp_plan
