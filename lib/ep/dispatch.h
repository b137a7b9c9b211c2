// What one MoE layer's all-to-all carries, read from the .pt2's graph: the
// tokens entering the module that routes to the experts (rows of `hidden`),
// and top_k, each token's experts (the policy's, else the routing indices
// the experts module reads, else the router's aten.topk).
#pragma once

#include "model/module_tree.h"
#include "plan/expert_parallel.h"
#include "policy/policy.h"

namespace fsdp_plan {

// Fills each module's tokens, top_k, hidden and dtype, or its unknown_reason.
void size_dispatch(const ModuleTree& tree, const Policy& policy, ExpertParallelPlan& plan);

}  // namespace fsdp_plan
