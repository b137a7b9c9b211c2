// The plan's activations (plan/activations.h), filled in by the planner
// after the units and before the memory models: from the .pt2 graph when the
// model has one (activations/walk.h), else the allowance given by hand, else
// unknown, with how to get them.
#pragma once

#include <functional>
#include <vector>

#include "activations/walk.h"
#include "model/class_names.h"
#include "plan/activations.h"
#include "plan/plan.h"
#include "util/warnings.h"

namespace fsdp_plan {

// The modules the policy's activation_checkpointing wraps, outermost only (a
// checkpointed module inside another adds nothing: the outer one's recompute
// runs it), in pre-order. Paths that name no module get an
// `unmatched_checkpoint` warning in `warnings` (classes that match none are
// plan/analysis.cpp's unmatched_class).
std::vector<ModuleId> checkpointed_modules(const ModuleTree& tree, const Policy& policy, const ClassMatcher& matcher,
                                           std::vector<Warning>* warnings);

// The modules the policy's compile names (isinstance), outermost only, in pre-order.
std::vector<ModuleId> compiled_modules(const ModuleTree& tree, const Policy& policy, const ClassMatcher& matcher);

// Per tree TensorId, whether autograd computes its gradient under the plan:
// as recorded, except FSDP1's flat parameters mixing frozen and trainable
// ones (activations.cpp: fsdp1_trainable); empty for FSDP2 (as recorded).
std::vector<bool> plan_trainable_params(const Plan& plan);

// The graph one rank runs, where that is not the graph as exported: tensor
// parallelism rewrites the walk's input to each tensor's local shape
// (tp/activations.h). Empty: the graph as exported.
using LocalWalkGraph = std::function<WalkGraph(const WalkGraph&)>;
// Where only some tensors' sizes differ on one rank (expert parallelism: the
// experts it holds, ep/activations.h): those tensors' rank-local metadata
// (walk.h: WalkOptions::local_tensors); the nodes stay the shared graph's.
using LocalWalkTensors = std::function<LocalTensors(const WalkGraph&)>;
struct RankLocal {
  LocalWalkGraph graph;
  LocalWalkTensors tensors;
};

// The dimensions one rank's graph runs at: the policy's --dim values, and
// with context parallelism the sequence split over cp (torch's
// context_parallel shards the inputs, labels and positions along it, so every
// op but attention's ring sees seq / cp tokens). Throws InputError naming the
// model where the graph has no dynamic seq or cp does not split it as torch's
// load balancer needs. The FLOP count walks the same dimensions.
std::vector<std::pair<std::string, int64_t>> rank_walk_dims(const Plan& plan, const Graph& graph);

// Warnings (operators the table lacks, paths that match nothing) go to `warnings`.
ActivationPlan plan_activations(const Plan& plan, const ClassMatcher& matcher, std::vector<Warning>* warnings,
                                const RankLocal& local = {});

}  // namespace fsdp_plan
