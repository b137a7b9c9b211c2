#include "planner.h"

#include "analysis.h"
#include "grouping.h"
#include "ignored.h"
#include "memory.h"
#include "selection.h"
#include "wrap_policy.h"

namespace fsdp_plan {

Plan make_plan(const ModuleTree& tree, const Policy& policy, const std::string& model_path) {
  ClassMatcher matcher;
  Ignored ignored = resolve_ignored(tree, policy);
  std::vector<bool> wrapped(tree.num_modules(), false);
  if (auto wrap_policy = make_wrap_policy(policy, tree, matcher))
    wrapped = select_wrapped(tree, *wrap_policy, ignored);

  Plan plan;
  plan.tree = &tree;
  plan.policy = policy;
  plan.model.path = model_path;
  plan.units = group_units(tree, wrapped, ignored.tensor);
  analyse(plan, ignored, matcher);
  plan.memory = estimate_memory(plan, policy.fsdp);
  return plan;
}

}  // namespace fsdp_plan
