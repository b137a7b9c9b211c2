#include "fsdp1/wrap_policy.h"

#include <string_view>
#include <unordered_map>
#include <utility>

namespace fsdp_plan {

WrapPolicy module_class_policy(ClassSet classes) {
  return [classes = std::move(classes)](ModuleId m, bool recurse, int64_t) {
    return recurse || classes.contains(m);
  };
}

WrapPolicy size_based_policy(int64_t min_num_params, ClassSet force_leaf, ClassSet exclude_wrap) {
  return [=, force_leaf = std::move(force_leaf), exclude_wrap = std::move(exclude_wrap)](
             ModuleId m, bool recurse, int64_t numel) {
    bool is_large = numel >= min_num_params;
    return recurse ? is_large && !force_leaf.contains(m) : is_large && !exclude_wrap.contains(m);
  };
}

WrapPolicy class_individually_policy(ClassSet classes) {
  // Same predicate as module_class_policy; kept separate to read like FSDP.
  return module_class_policy(std::move(classes));
}

WrapPolicy or_policy(std::vector<WrapPolicy> policies) {
  return [policies = std::move(policies)](ModuleId m, bool recurse, int64_t numel) {
    for (const auto& p : policies)
      if (p(m, recurse, numel)) return true;
    return false;
  };
}

std::optional<WrapPolicy> make_wrap_policy(const Policy& policy, const ModuleTree& tree,
                                           const ClassMatcher& matcher) {
  if (!policy.auto_wrap()) return std::nullopt;
  std::vector<WrapPolicy> parts;
  if (policy.module_classes) parts.push_back(module_class_policy(ClassSet(tree, matcher, *policy.module_classes)));
  if (policy.min_num_params)
    parts.push_back(size_based_policy(*policy.min_num_params,
                                      ClassSet(tree, matcher, policy.force_leaf_modules),
                                      ClassSet(tree, matcher, policy.exclude_wrap_modules)));
  if (policy.mixed_precision)
    parts.push_back(class_individually_policy(ClassSet(tree, matcher, policy.mixed_precision->ignore_classes)));
  if (parts.size() == 1) return std::move(parts.front());
  return or_policy(std::move(parts));
}

}  // namespace fsdp_plan
