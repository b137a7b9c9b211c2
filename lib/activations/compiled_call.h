// A compiled call's saves (walk.h rule 8): the walk's saves of the call's
// nodes replaced by what AOTAutograd's min-cut partitioner saves
// (partitioner.h), over the storages the call reads and makes, with what the
// traced graph makes differently from the eager run (dropout's and relu's
// bool masks).
#pragma once

#include "activations/walk.h"
#include "activations/walk_rules.h"
#include "activations/walk_state.h"

namespace fsdp_plan {

// Rewrites `w`'s saves of the nodes in `call` (and adds the storages the
// traced graph makes); each saved storage is held for the backward of its
// first reader in the call. `memory_budget`: activation_memory_budget.
void partition_compiled_call(const WalkGraph& g, WalkState& w, const NodeRun& call, double memory_budget);

}  // namespace fsdp_plan
