// Grouping parameters and buffers into units: the seed's
// _get_fully_sharded_module_to_states, given the wrapped modules.
#pragma once

#include <vector>

#include "plan.h"

namespace fsdp_plan {

// Units in `root.modules()` order (the root always first). Each owns the
// parameters and buffers of its subtree minus wrapped descendants' subtrees;
// a tensor reachable twice goes to the first unit that reaches it; ignored
// parameters go to no unit, buffers are never ignored. Fills module, parent,
// depth, params and buffers; sizes are left to the analysis.
std::vector<Unit> group_units(const ModuleTree& tree, const std::vector<bool>& wrapped,
                              const std::vector<bool>& ignored_tensor);

}  // namespace fsdp_plan
