#include "plan/plan.h"

namespace fsdp_plan {

bool one_dtype(const ModuleTree& tree, const std::vector<Owned>& owned) {
  for (const auto& o : owned)
    if (tree.tensor(o.tensor).dtype != tree.tensor(owned.front().tensor).dtype) return false;
  return true;
}

bool Plan::has_errors() const {
  for (const auto& w : warnings)
    if (w.severity == Severity::Error) return true;
  return false;
}

std::string Plan::param_name(const Owned& o) const {
  return tree->qualify(o.module, tree->module(o.module).params[static_cast<size_t>(o.slot)].name);
}

std::string Plan::buffer_name(const Owned& o) const {
  return tree->qualify(o.module, tree->module(o.module).buffers[static_cast<size_t>(o.slot)].name);
}

}  // namespace fsdp_plan
