// Grouping parameters and buffers into units as FSDP1's wrapper class builds
// them (FullyShardedDataParallel with an auto_wrap_policy).
#pragma once

#include <vector>

#include "plan/plan.h"

namespace fsdp_plan {

// Units in `root.modules()` order (the root always first). Each unit's
// parameters are those of its subtree minus wrapped descendants' subtrees, in
// named_modules order, a tensor reached twice listed once. FSDP1 builds the
// units bottom-up (post-order, the root last), and a tensor reached from
// several units (a tied weight split across units) goes:
//  - use_orig_params=false: to every unit that reaches it, each flattening its
//    own copy (FlatParamHandle marks the original parameter as flattened only
//    with use_orig_params, so later units still see it);
//  - use_orig_params=true: to the first unit built, later ones skip it.
// Ignored parameters go to no unit. Buffers are never flattened nor ignored;
// each goes to the first unit in module order that reaches it (the seed's
// _get_fully_sharded_module_to_states). Fills module, parent, depth, params
// and buffers; sizes are left to the analysis.
std::vector<Unit> group_units(const ModuleTree& tree, const std::vector<bool>& wrapped,
                              const std::vector<bool>& ignored_tensor, bool use_orig_params);

}  // namespace fsdp_plan
