#include "fsdp2/units.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "model/class_names.h"
#include "model/module_tree.h"


namespace fsdp_plan {
namespace {

std::vector<size_t> postorder_index(const ModuleTree& tree) {
  std::vector<size_t> index(tree.num_modules(), 0);
  size_t next = 0;
  for (ModuleId m : tree.postorder()) index[static_cast<size_t>(m)] = next++;
  return index;
}

// The module at a dotted path (-1 if there is none), walking down from the
// root by child names: suggest plans many candidates with groups, and a map of
// every module's path costs a string per module each time. Where the walk
// cannot be sure (a child name repeated under one parent, a name with a dot;
// never in PyTorch), the map decides, keeping the first module in pre-order.
ModuleId module_at(const ModuleTree& tree, const std::string& path) {
  auto by_map = [&] {
    std::unordered_map<std::string, ModuleId> by_path;
    const std::vector<std::string> paths = tree.paths();
    for (ModuleId x : tree.preorder()) by_path.emplace(paths[static_cast<size_t>(x)], x);
    auto it = by_path.find(path);
    return it == by_path.end() ? ModuleId{-1} : it->second;
  };
  ModuleId m = 0;
  for (size_t begin = 0; !path.empty() && begin <= path.size();) {
    size_t end = path.find('.', begin);
    if (end == std::string::npos) end = path.size();
    const std::string_view name(path.data() + begin, end - begin);
    ModuleId next = -1;
    for (ModuleId c : tree.module(m).children) {
      if (tree.module(c).name != name) continue;
      if (next >= 0) return by_map();
      next = c;
    }
    if (next < 0) return by_map();
    m = next;
    begin = end + 1;
  }
  return m;
}

}  // namespace

Fsdp2Calls fsdp2_calls(const ModuleTree& tree, const Policy& policy, const ClassMatcher& matcher,
                       const Ignored& ignored) {
  const size_t n = tree.num_modules();
  Fsdp2Calls out;
  std::vector<bool> in_group(n, false);

  struct Keyed {
    size_t key;
    Fsdp2Call call;
  };
  std::vector<Keyed> keyed;
  const std::vector<size_t> post = postorder_index(tree);
  for (const auto& g : policy.groups) {
    Fsdp2Call call;
    call.reshard_after_forward = g.reshard_after_forward.value_or(policy.fsdp.reshard_after_forward);
    size_t key = 0;
    for (const auto& path : g.modules) {
      const ModuleId m = module_at(tree, path);
      if (m <= 0) {  // the root is always the last call of its own
        out.unknown_paths.push_back(path);
        continue;
      }
      if (in_group[static_cast<size_t>(m)]) out.named_twice.push_back(path);
      in_group[static_cast<size_t>(m)] = true;
      call.modules.push_back(m);
      key = std::max(key, post[static_cast<size_t>(m)]);
    }
    if (!call.modules.empty()) keyed.push_back({key, std::move(call)});
  }

  // Auto-selected modules, as Accelerate's fsdp2_prepare_model picks them.
  std::optional<ClassSet> classes;
  if (policy.module_classes) classes.emplace(tree, matcher, *policy.module_classes);
  std::vector<int64_t> numel;
  if (policy.min_num_params) numel = subtree_numel(tree, std::vector<bool>(tree.num_tensors(), false));
  // Accelerate's size rule skips no class. exclude_wrap_modules, when the
  // policy names it (the fix an fsdp2_container refusal offers), takes its
  // classes out of the size rule, as size_based_auto_wrap_policy's
  // exclude_wrap_modules does for FSDP1 (fsdp/wrap.py); --emit accelerate then
  // finds no Accelerate config that says it.
  std::optional<ClassSet> excluded;
  if (policy.min_num_params && policy.exclude_wrap_given) excluded.emplace(tree, matcher, policy.exclude_wrap_modules);
  for (ModuleId m = 1; m < static_cast<ModuleId>(n); ++m) {
    const auto i = static_cast<size_t>(m);
    if (in_group[i] || ignored.module[i]) continue;
    const bool by_size =
        policy.min_num_params && numel[i] > *policy.min_num_params && !(excluded && excluded->contains(m));
    bool pick = (classes && classes->contains(m)) || by_size;
    if (pick) keyed.push_back({post[i], {{m}, policy.fsdp.reshard_after_forward}});
  }
  std::stable_sort(keyed.begin(), keyed.end(), [](const Keyed& a, const Keyed& b) { return a.key < b.key; });
  for (auto& k : keyed) out.calls.push_back(std::move(k.call));
  out.calls.push_back({{0}, {ReshardAfterForward::Kind::False, 0}});
  return out;
}

std::vector<Unit> group_units_fsdp2(const ModuleTree& tree, const std::vector<Fsdp2Call>& calls,
                                    const std::vector<bool>& ignored_tensor) {
  const size_t n = tree.num_modules();
  std::vector<bool> has_state(n, false);
  std::vector<int> visited(n, -1), root_of_call(n, -1);
  std::vector<int> param_seen(tree.num_tensors(), -1), buffer_seen(tree.num_tensors(), -1);
  std::vector<Unit> units;
  std::vector<ModuleId> managed;
  std::vector<std::pair<ModuleId, size_t>> stack;
  for (size_t ci = 0; ci < calls.size(); ++ci) {
    const int c = static_cast<int>(ci);
    const Fsdp2Call& call = calls[ci];
    for (ModuleId r : call.modules) root_of_call[static_cast<size_t>(r)] = c;
    // _get_managed_modules: post-order from each module of the call, not
    // entering a module an earlier call sharded.
    managed.clear();
    for (ModuleId r : call.modules) {
      if (visited[static_cast<size_t>(r)] == c) continue;
      visited[static_cast<size_t>(r)] = c;
      stack.assign(1, {r, 0});
      while (!stack.empty()) {
        auto& [m, child] = stack.back();
        const Module& mod = tree.module(m);
        if (child < mod.children.size()) {
          const auto k = static_cast<size_t>(mod.children[child++]);
          if (visited[k] == c || (has_state[k] && root_of_call[k] != c)) continue;
          visited[k] = c;
          stack.push_back({static_cast<ModuleId>(k), 0});
          continue;
        }
        managed.push_back(m);
        stack.pop_back();
      }
    }
    // _get_managed_states: duplicates removed within this call only.
    Unit u;
    u.module = call.modules.front();
    u.modules = call.modules;
    u.call = c;
    u.reshard_after_forward = call.reshard_after_forward;
    for (ModuleId m : managed) {
      const Module& mod = tree.module(m);
      for (size_t i = 0; i < mod.params.size(); ++i) {
        const auto t = static_cast<size_t>(mod.params[i].tensor);
        if (ignored_tensor[t] || param_seen[t] == c) continue;
        param_seen[t] = c;
        u.params.push_back({m, static_cast<int32_t>(i), mod.params[i].tensor});
      }
      for (size_t i = 0; i < mod.buffers.size(); ++i) {
        const auto t = static_cast<size_t>(mod.buffers[i].tensor);
        if (buffer_seen[t] == c) continue;
        buffer_seen[t] = c;
        u.buffers.push_back({m, static_cast<int32_t>(i), mod.buffers[i].tensor});
      }
    }
    for (ModuleId r : call.modules) has_state[static_cast<size_t>(r)] = true;
    units.push_back(std::move(u));
  }

  // Forward order: each group's pre-forward hook runs at its first module.
  std::vector<size_t> pre(n, 0);
  size_t k = 0;
  for (ModuleId m : tree.preorder()) pre[static_cast<size_t>(m)] = k++;
  auto first = [&](const Unit& u) {
    size_t best = pre[static_cast<size_t>(u.modules.front())];
    for (ModuleId m : u.modules) best = std::min(best, pre[static_cast<size_t>(m)]);
    return best;
  };
  // Sorted as (first module, call) pairs, then each Unit moved once: a Unit is
  // large, and sorting 37,000 of them moved each many times.
  std::vector<std::pair<size_t, size_t>> order(units.size());
  for (size_t i = 0; i < units.size(); ++i) order[i] = {first(units[i]), i};
  std::sort(order.begin(), order.end());
  {
    std::vector<Unit> sorted;
    sorted.reserve(units.size());
    for (const auto& [key, i] : order) sorted.push_back(std::move(units[i]));
    units = std::move(sorted);
  }
  std::vector<int> unit_at(n, -1);
  for (size_t i = 0; i < units.size(); ++i)
    for (ModuleId m : units[i].modules) unit_at[static_cast<size_t>(m)] = static_cast<int>(i);
  for (Unit& u : units) {
    ModuleId m = u.modules.front();
    for (ModuleId x : u.modules)
      if (pre[static_cast<size_t>(x)] < pre[static_cast<size_t>(m)]) m = x;
    int parent = -1;
    for (ModuleId cur = tree.module(m).parent; cur >= 0 && parent < 0; cur = tree.module(cur).parent)
      parent = unit_at[static_cast<size_t>(cur)];
    u.parent = parent;
  }
  // Parents come before children in pre-order, so one forward pass sets depths.
  for (Unit& u : units) u.depth = u.parent < 0 ? 0 : units[static_cast<size_t>(u.parent)].depth + 1;
  return units;
}

}  // namespace fsdp_plan
