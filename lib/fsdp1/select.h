// Which modules the auto-wrap policy wraps: PyTorch's _recursive_wrap, run
// with a recording wrapper as FSDP's dry-run grouping pass does.
#pragma once

#include <cstdint>
#include <vector>

#include "fsdp1/wrap_policy.h"
#include "model/module_tree.h"
#include "policy/ignored.h"

namespace fsdp_plan {

class ShardedViews;

// wrapped[m] is true for each module the policy wraps (the root only if the
// policy itself picks it). Iterative: deep chains do not touch the C stack.
// With `views` (use_orig_params=True), each module is sized as FSDP1 sees it
// when reaching it: tied weights flattened by units built before count as
// their rank-0 shard (sharded_views.h).
std::vector<bool> select_wrapped(const ModuleTree& tree, const WrapPolicy& policy, const Ignored& ignored,
                                 ShardedViews* views = nullptr);

}  // namespace fsdp_plan
