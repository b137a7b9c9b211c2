// Expert parallelism's planning step: which modules hold the routed experts,
// what rank 0 keeps of them after the ep split, how fully_shard places them
// on efsdp, and what one MoE layer's all-to-all carries (from the graph).
// After torchtitan 0.3: torchtitan/distributed/fsdp.py apply_fsdp_to_decoder
// (the expert parameters' shard_placement_fn), parallel_dims.py (the sparse
// mesh), models/common/token_dispatcher.py AllToAllTokenDispatcher.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "model/class_names.h"
#include "model/module_tree.h"
#include "plan/expert_parallel.h"
#include "policy/policy.h"
#include "util/warnings.h"

namespace fsdp_plan {

// How many experts each routed-expert module holds (find_experts' modules, in
// pre-order): what an ep degree must divide. Empty when the model has none.
std::vector<int64_t> routed_expert_counts(const ModuleTree& tree, const ExpertParallel& ep, const ClassMatcher& matcher);

// The plan's expert-parallel part on `mesh` (Plan::mesh, with its sparse
// layout), its all-to-alls sized at one rank's dimensions `rank_dims`
// (activations.h rank_walk_dims: with context parallelism the rank's share of
// the sequence). Throws InputError naming `model_path` when the model has no
// routed experts to split, or when the engines would refuse the split (a
// number of experts ep does not divide).
ExpertParallelPlan plan_expert_parallel(const ModuleTree& tree, const Policy& policy,
                                        const std::vector<std::pair<std::string, int64_t>>& rank_dims,
                                        const DeviceMesh& mesh, const ClassMatcher& matcher,
                                        const std::string& model_path);

}  // namespace fsdp_plan
