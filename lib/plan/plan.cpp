#include "plan/plan.h"

#include "util/strings.h"

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

std::vector<int> unit_postorder(const std::vector<Unit>& units) {
  // Units are in pre-order, so a unit's children follow it in order; a
  // post-order emits each unit after all later units it encloses.
  std::vector<std::vector<int>> children(units.size());
  for (size_t i = 1; i < units.size(); ++i) children[static_cast<size_t>(units[i].parent)].push_back(static_cast<int>(i));
  std::vector<int> order;
  order.reserve(units.size());
  if (units.empty()) return order;
  std::vector<std::pair<int, size_t>> stack{{0, 0}};  // unit, next child
  while (!stack.empty()) {
    auto& [u, next] = stack.back();
    const auto& kids = children[static_cast<size_t>(u)];
    if (next < kids.size()) {
      int child = kids[next++];
      stack.push_back({child, 0});
    } else {
      order.push_back(u);
      stack.pop_back();
    }
  }
  return order;
}

std::string unit_name(const ModuleTree& tree, const Unit& u, bool quoted) {
  auto name = [&](ModuleId m) { return quoted ? quoted_path(tree.path(m)) : tree.path(m); };
  if (u.modules.size() < 2) return name(u.module);
  std::vector<std::string> paths;
  for (ModuleId m : u.modules) paths.push_back(name(m));
  return "[" + join(paths) + "]";
}

const char* activation_source_name(ActivationSource s) {
  switch (s) {
    case ActivationSource::Unknown: return "unknown";
    case ActivationSource::Allowance: return "allowance";
    case ActivationSource::Graph: return "graph";
  }
  return "unknown";
}

std::vector<int> unit_of_modules(const Plan& plan) {
  const ModuleTree& tree = *plan.tree;
  std::vector<int> owner(tree.num_modules(), -1);
  for (size_t u = 0; u < plan.units.size(); ++u) {
    owner[static_cast<size_t>(plan.units[u].module)] = static_cast<int>(u);
    for (ModuleId m : plan.units[u].modules) owner[static_cast<size_t>(m)] = static_cast<int>(u);
  }
  if (owner[0] < 0) owner[0] = 0;
  for (ModuleId m : tree.preorder()) {  // a parent before its children
    const ModuleId parent = tree.module(m).parent;
    if (owner[static_cast<size_t>(m)] < 0 && parent >= 0) owner[static_cast<size_t>(m)] = owner[static_cast<size_t>(parent)];
  }
  return owner;
}

}  // namespace fsdp_plan
