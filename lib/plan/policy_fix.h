// Policy fixes a warning can suggest, each as a changed Policy (to plan
// again and check) and the JSON fragment a user merges into the policy.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/plan.h"

namespace fsdp_plan {

struct PolicyFix {
  Policy policy;                    // the policy with the fix applied
  nlohmann::ordered_json fragment;  // arrays add to the policy's, objects merge
  std::string text;                 // "add X to module_classes"
};

PolicyFix wrap_classes(const Policy& policy, const std::vector<std::string>& classes);
PolicyFix ignore_params(const Policy& policy, const std::vector<std::string>& names);
PolicyFix use_orig_params(const Policy& policy);

// True if `after` has no warning of `kind` at severity `at_least` or worse,
// no error kind `before` lacked, and no more tied weights split across units.
bool fix_works(const Plan& before, const Plan& after, const std::string& kind, Severity at_least);

// The demangled classes of `modules`, first-seen order, containers left out
// (ModuleList and the like have no forward to wrap).
std::vector<std::string> wrappable_classes(const ModuleTree& tree, const std::vector<ModuleId>& modules);

}  // namespace fsdp_plan
