#include "fsdp1/select.h"

#include <unordered_map>

#include "fsdp1/sharded_views.h"

namespace fsdp_plan {

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
