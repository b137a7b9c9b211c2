// Auto-wrap policies as small composable predicates, after PyTorch's wrap.py:
// policy(module, recurse, nonwrapped_numel) -> bool. With recurse=true the
// question is "may wrapping go below this module?"; with recurse=false it is
// "wrap this module, given the numel its wrapped children left over?".
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "model/class_names.h"
#include "model/module_tree.h"
#include "policy/policy.h"

namespace fsdp_plan {

using WrapPolicy = std::function<bool(ModuleId module, bool recurse, int64_t nonwrapped_numel)>;

// transformer_auto_wrap_policy / ModuleWrapPolicy.
WrapPolicy module_class_policy(ClassSet classes);
// size_based_auto_wrap_policy.
WrapPolicy size_based_policy(int64_t min_num_params, ClassSet force_leaf, ClassSet exclude_wrap);
// Mixed precision's ignored classes: each such module is its own unit.
WrapPolicy class_individually_policy(ClassSet classes);
// _or_policy: recurse if any says recurse; wrap if any says wrap.
WrapPolicy or_policy(std::vector<WrapPolicy> policies);

// The policy FSDP would run for this JSON policy; nullopt when it auto-wraps nothing.
std::optional<WrapPolicy> make_wrap_policy(const Policy& policy, const ModuleTree& tree,
                                           const ClassMatcher& matcher);

}  // namespace fsdp_plan
