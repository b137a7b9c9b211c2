#include "fsdp1/units.h"

namespace fsdp_plan {

std::vector<Unit> group_units(const ModuleTree& tree, const std::vector<bool>& wrapped,
                              const std::vector<bool>& ignored_tensor, bool use_orig_params) {
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

  // A unit's depth-first walk (named_modules order), skipping wrapped children.
  std::vector<ModuleId> stack;
  auto walk = [&](const Unit& u, auto&& visit) {
    stack.assign(1, u.module);
    while (!stack.empty()) {
      ModuleId m = stack.back();
      stack.pop_back();
      const Module& mod = tree.module(m);
      for (auto it = mod.children.rbegin(); it != mod.children.rend(); ++it)
        if (!is_unit(*it)) stack.push_back(*it);
      visit(m, mod);
    }
  };

  // Parameters, unit by unit in build order. `flattened`: what a later unit
  // no longer sees (ignored parameters, and with use_orig_params those an
  // earlier unit flattened); `taken_by`: the unit that listed a tensor last,
  // so a tensor reached twice within one unit is listed once.
  std::vector<bool> flattened = ignored_tensor;
  flattened.resize(tree.num_tensors(), false);
  std::vector<int> taken_by(tree.num_tensors(), -1);
  for (int ui : unit_postorder(units)) {
    Unit& u = units[static_cast<size_t>(ui)];
    walk(u, [&](ModuleId m, const Module& mod) {
      for (size_t i = 0; i < mod.params.size(); ++i) {
        const auto t = static_cast<size_t>(mod.params[i].tensor);
        if (flattened[t] || taken_by[t] == ui) continue;
        taken_by[t] = ui;
        u.params.push_back({m, static_cast<int32_t>(i), mod.params[i].tensor});
      }
    });
    if (use_orig_params)
      for (const Owned& o : u.params) flattened[static_cast<size_t>(o.tensor)] = true;
  }

  // Buffers: the first unit in module order that reaches each.
  std::vector<bool> buffer_seen(tree.num_tensors(), false);
  for (Unit& u : units)
    walk(u, [&](ModuleId m, const Module& mod) {
      for (size_t i = 0; i < mod.buffers.size(); ++i) {
        const auto t = static_cast<size_t>(mod.buffers[i].tensor);
        if (buffer_seen[t]) continue;
        buffer_seen[t] = true;
        u.buffers.push_back({m, static_cast<int32_t>(i), mod.buffers[i].tensor});
      }
    });
  return units;
}

}  // namespace fsdp_plan
