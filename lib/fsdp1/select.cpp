#include "fsdp1/select.h"

#include <unordered_map>

#include "fsdp1/sharded_views.h"

namespace fsdp_plan {

std::vector<int64_t> subtree_numel(const ModuleTree& tree, const std::vector<bool>& ignored_tensor) {
  const size_t n = tree.num_modules();
  // How many slots hold each tensor: most hold one, tied weights more.
  std::vector<int32_t> uses(tree.num_tensors(), 0);
  for (const auto& m : tree.modules())
    for (const auto& s : m.params) ++uses[static_cast<size_t>(s.tensor)];

  // Tensors used once add to every ancestor: a bottom-up sum does it.
  std::vector<int64_t> own(n, 0);
  for (size_t i = 0; i < n; ++i)
    for (const auto& s : tree.modules()[i].params)
      if (!ignored_tensor[static_cast<size_t>(s.tensor)] && uses[static_cast<size_t>(s.tensor)] == 1)
        own[i] += tree.numel(s.tensor);
  std::vector<int64_t> total = own;
  for (size_t i = n; i-- > 1;) total[static_cast<size_t>(tree.modules()[i].parent)] += total[i];

  // A tied tensor counts once in each module above any of its uses: walk up
  // from each use, stopping where an earlier walk for this tensor passed.
  std::unordered_map<TensorId, std::vector<ModuleId>> tied_uses;
  for (size_t i = 0; i < n; ++i)
    for (const auto& s : tree.modules()[i].params)
      if (!ignored_tensor[static_cast<size_t>(s.tensor)] && uses[static_cast<size_t>(s.tensor)] > 1)
        tied_uses[s.tensor].push_back(static_cast<ModuleId>(i));
  std::vector<TensorId> marked_by(n, -1);
  for (const auto& [t, mods] : tied_uses) {
    const int64_t numel = tree.numel(t);
    for (ModuleId m : mods) {
      for (ModuleId cur = m; cur >= 0 && marked_by[static_cast<size_t>(cur)] != t; cur = tree.module(cur).parent) {
        marked_by[static_cast<size_t>(cur)] = t;
        total[static_cast<size_t>(cur)] += numel;
      }
    }
  }
  return total;
}

std::vector<bool> select_wrapped(const ModuleTree& tree, const WrapPolicy& policy, const Ignored& ignored,
                                 ShardedViews* views) {
  const std::vector<int64_t> numel = subtree_numel(tree, ignored.tensor);
  std::vector<bool> wrapped(tree.num_modules(), false);

  // One frame per module on the path being explored; `wrapped_by_children`
  // sums what each child's _recursive_wrap call returned.
  struct Frame {
    ModuleId module;
    int64_t numel;  // nonwrapped_numel when the call began
    size_t next_child = 0;
    int64_t wrapped_by_children = 0;
  };
  std::vector<Frame> stack;
  int64_t returned = 0;  // the value the last finished call returned
  auto enter = [&](ModuleId m) {
    const int64_t n = numel[static_cast<size_t>(m)] - (views ? views->shrink(m) : 0);
    if (policy(m, /*recurse=*/true, n)) {
      stack.push_back({m, n});
      return true;
    }
    returned = 0;  // nothing below m is wrapped
    return false;
  };

  enter(0);
  while (!stack.empty()) {
    Frame& f = stack.back();
    const Module& mod = tree.module(f.module);
    if (f.next_child < mod.children.size()) {
      ModuleId child = mod.children[f.next_child++];
      if (ignored.module[static_cast<size_t>(child)]) continue;
      if (!enter(child)) f.wrapped_by_children += returned;
      continue;
    }
    const int64_t n = f.numel;
    const int64_t remainder = n - f.wrapped_by_children;  // negative with tied weights, as in PyTorch
    if (policy(f.module, /*recurse=*/false, remainder)) {
      wrapped[static_cast<size_t>(f.module)] = true;
      if (views) views->built(f.module, wrapped);
      returned = n;
    } else {
      returned = f.wrapped_by_children;
    }
    stack.pop_back();
    if (!stack.empty()) stack.back().wrapped_by_children += returned;
  }
  return wrapped;
}

}  // namespace fsdp_plan
