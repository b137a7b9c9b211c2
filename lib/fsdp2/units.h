// FSDP2 (fully_shard): which modules the calls are made on, in which order,
// and what each call manages (torch/distributed/fsdp/_fully_shard/_fully_shard.py: fully_shard,
// _fsdp_init.py: _get_managed_modules, _get_managed_states); docs/memory-model.md "FSDP2".
#pragma once

#include <string>
#include <vector>

#include "model/class_names.h"
#include "plan/plan.h"
#include "policy/ignored.h"

namespace fsdp_plan {

// One fully_shard call: fully_shard(modules[0]) or fully_shard([modules...]).
struct Fsdp2Call {
  std::vector<ModuleId> modules;
  ReshardAfterForward reshard_after_forward;
};

struct Fsdp2Calls {
  std::vector<Fsdp2Call> calls;             // in call order: children before parents, the root last
  std::vector<std::string> unknown_paths;   // "groups" paths that name no module
  std::vector<std::string> named_twice;     // modules named by two groups (fully_shard applied twice)
};

// The calls the policy makes: each explicit group, and every module the
// policy selects (module_classes: isinstance; min_num_params: Accelerate's
// FSDP2 rule, the module's whole parameter count > the threshold) that no
// group names; ordered bottom-up (a call comes at the post-order position of
// its last module), then the root with reshard_after_forward False (PyTorch's
// None for the root).
Fsdp2Calls fsdp2_calls(const ModuleTree& tree, const Policy& policy, const ClassMatcher& matcher,
                       const Ignored& ignored);

// One unit per call, in forward order (pre-order of each call's first module;
// the root first). A call manages the parameters and buffers of its modules'
// subtrees, not descending into modules an earlier call sharded; duplicates
// are removed within the call only, so a tensor reached by two calls is in
// both (PyTorch unties it). Ignored parameters are in no unit.
std::vector<Unit> group_units_fsdp2(const ModuleTree& tree, const std::vector<Fsdp2Call>& calls,
                                    const std::vector<bool>& ignored_tensor);

}  // namespace fsdp_plan
