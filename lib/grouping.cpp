#include "grouping.h"

namespace fsdp_plan {

std::vector<Unit> group_units(const ModuleTree& tree, const std::vector<bool>& wrapped,
                              const std::vector<bool>& ignored_tensor) {
  auto is_unit = [&](ModuleId m) { return m == 0 || wrapped[static_cast<size_t>(m)]; };

  // Units in pre-order, each with its nearest enclosing unit.
  std::vector<Unit> units;
  std::vector<int> unit_of(tree.num_modules(), -1);  // the unit a module's state goes to
  for (ModuleId m : tree.preorder()) {
    int enclosing = m == 0 ? -1 : unit_of[static_cast<size_t>(tree.module(m).parent)];
    if (is_unit(m)) {
      Unit u;
      u.module = m;
      u.parent = enclosing;
      u.depth = enclosing < 0 ? 0 : units[static_cast<size_t>(enclosing)].depth + 1;
      units.push_back(std::move(u));
      unit_of[static_cast<size_t>(m)] = static_cast<int>(units.size()) - 1;
    } else {
      unit_of[static_cast<size_t>(m)] = enclosing;
    }
  }

  // Each unit's depth-first walk, skipping wrapped children, in unit order.
  std::vector<bool> param_seen = ignored_tensor;
  param_seen.resize(tree.num_tensors(), false);
  std::vector<bool> buffer_seen(tree.num_tensors(), false);
  // Each tensor goes to the first unit that reaches it.
  auto take = [](ModuleId m, const std::vector<TensorSlot>& slots, std::vector<bool>& seen, std::vector<Owned>& out) {
    for (size_t i = 0; i < slots.size(); ++i) {
      const auto t = static_cast<size_t>(slots[i].tensor);
      if (seen[t]) continue;
      seen[t] = true;
      out.push_back({m, static_cast<int32_t>(i), slots[i].tensor});
    }
  };
  std::vector<ModuleId> stack;
  for (Unit& u : units) {
    stack.assign(1, u.module);
    while (!stack.empty()) {
      ModuleId m = stack.back();
      stack.pop_back();
      const Module& mod = tree.module(m);
      for (auto it = mod.children.rbegin(); it != mod.children.rend(); ++it)
        if (!is_unit(*it)) stack.push_back(*it);
      take(m, mod.params, param_seen, u.params);
      take(m, mod.buffers, buffer_seen, u.buffers);
    }
  }
  return units;
}

}  // namespace fsdp_plan
