// Resolving the policy's ignored_modules / ignored_params globs against a tree,
// with FSDP's meaning: an ignored module takes its whole subtree with it, and
// every parameter in an ignored subtree is an ignored parameter.
#pragma once

#include <string>
#include <vector>

#include "model/module_tree.h"
#include "policy/policy.h"

namespace fsdp_plan {

struct Ignored {
  std::vector<bool> module;  // by ModuleId
  std::vector<bool> tensor;  // by TensorId; only parameters are ever ignored
  std::vector<std::string> unmatched_module_globs, unmatched_param_globs;
  bool root_ignored() const { return module[0]; }
};

Ignored resolve_ignored(const ModuleTree& tree, const Policy& policy);

}  // namespace fsdp_plan
