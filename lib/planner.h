// The pipeline from a module tree and a policy to a plan:
// ignored state -> wrap policy -> wrapped modules -> units -> analysis.
#pragma once

#include <string>

#include "class_names.h"
#include "plan.h"

namespace fsdp_plan {

// `tree` must outlive the plan. `model_path` is only reported.
Plan make_plan(const ModuleTree& tree, const Policy& policy, const std::string& model_path);
// The same, sharing `matcher` (and the tree's classes it keeps) across the
// many plans of one tree, as fsdp-plan suggest makes.
Plan make_plan(const ModuleTree& tree, const Policy& policy, const std::string& model_path,
               const ClassMatcher& matcher);
// The plan points into the tree: planning a temporary would leave it dangling.
Plan make_plan(ModuleTree&& tree, const Policy& policy, const std::string& model_path) = delete;

}  // namespace fsdp_plan
