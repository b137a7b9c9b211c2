// What one MoE layer's all-to-all carries, read from the .pt2's graph: the
// tokens entering the module that routes to the experts (rows of `hidden`),
// and top_k, each token's experts (the policy's, else the routing indices
// the experts module reads, else the router's aten.topk).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/module_tree.h"
#include "plan/expert_parallel.h"
#include "policy/policy.h"

namespace fsdp_plan {

// Fills each module's tokens, top_k, hidden and dtype, or its unknown_reason,
// at one rank's dimensions (`rank_dims`: the --dim values, the sequence split
// over cp).
void size_dispatch(const ModuleTree& tree, const Policy& policy,
                   const std::vector<std::pair<std::string, int64_t>>& rank_dims, ExpertParallelPlan& plan);

}  // namespace fsdp_plan
