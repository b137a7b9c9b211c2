#include "suggest/groups.h"

#include <algorithm>

#include "model/class_names.h"
#include "util/strings.h"

namespace fsdp_plan {

EdgeModules edge_modules(const ModuleTree& tree, const std::vector<bool>& block, const std::vector<bool>& skip,
                         const std::vector<int64_t>& numel) {
  const size_t n = tree.num_modules();
  const std::vector<ModuleId> pre = tree.preorder();
  std::vector<bool> in_block(n, false), has_block(n, false);
  for (ModuleId m : pre) {
    const auto i = static_cast<size_t>(m);
    const ModuleId p = tree.module(m).parent;
    in_block[i] = block[i] || (p >= 0 && in_block[static_cast<size_t>(p)]);
  }
  for (auto it = pre.rbegin(); it != pre.rend(); ++it) {
    const auto i = static_cast<size_t>(*it);
    if (block[i]) has_block[i] = true;
    const ModuleId p = tree.module(*it).parent;
    if (has_block[i] && p >= 0) has_block[static_cast<size_t>(p)] = true;
  }
  EdgeModules out;
  if (!has_block[0]) return out;
  bool seen_block = false;
  std::vector<std::string> after;  // since the last block
  for (ModuleId m : pre) {
    const auto i = static_cast<size_t>(m);
    if (block[i]) {
      seen_block = true;
      after.clear();
      continue;
    }
    const ModuleId p = tree.module(m).parent;
    // A largest block-free subtree: its parent leads to a block.
    if (m == 0 || in_block[i] || has_block[i] || !has_block[static_cast<size_t>(p)]) continue;
    if (numel[i] == 0 || skip[i]) continue;
    if (is_container(bare_class(tree, m), false)) continue;  // fully_shard refuses containers
    (seen_block ? after : out.input).push_back(tree.path(m));
  }
  out.output = std::move(after);
  return out;
}

std::string group_label(const Fsdp2Group& g) {
  std::string out = "[" + join(g.modules) + "]";
  if (g.reshard_after_forward && g.reshard_after_forward->kind == ReshardAfterForward::Kind::False)
    out += " kept after forward";
  return out;
}

std::vector<GroupVariant> edge_group_variants(const EdgeModules& e) {
  std::vector<GroupVariant> out;
  auto add = [&](std::vector<Fsdp2Group> groups) {
    GroupVariant v;
    v.label = "groups ";
    for (size_t i = 0; i < groups.size(); ++i) v.label += (i ? ", " : "") + group_label(groups[i]);
    v.groups = std::move(groups);
    out.push_back(std::move(v));
  };
  const ReshardAfterForward kept{ReshardAfterForward::Kind::False, 0};
  auto group = [](std::vector<std::string> modules, std::optional<ReshardAfterForward> r = std::nullopt) {
    Fsdp2Group g;
    g.modules = std::move(modules);
    g.reshard_after_forward = r;
    return g;
  };
  std::vector<std::string> both = e.input;
  both.insert(both.end(), e.output.begin(), e.output.end());
  if (!e.input.empty()) add({group(e.input)});
  if (!e.output.empty()) {
    add({group(e.output)});
    add({group(e.output, kept)});
  }
  if (!e.input.empty() && !e.output.empty()) {
    add({group(e.input), group(e.output)});
    add({group(e.input), group(e.output, kept)});
    add({group(both)});
    add({group(both, kept)});
  }
  return out;
}

bool tie_in_one_group(Policy& policy, const std::vector<std::string>& users) {
  if (std::find(users.begin(), users.end(), "") != users.end()) return false;
  Fsdp2Group merged;
  std::vector<Fsdp2Group> kept;
  for (auto& g : policy.groups) {
    bool names_user = std::any_of(g.modules.begin(), g.modules.end(), [&](const std::string& m) {
      return std::find(users.begin(), users.end(), m) != users.end();
    });
    if (!names_user) {
      kept.push_back(std::move(g));
      continue;
    }
    if (merged.modules.empty()) merged.reshard_after_forward = g.reshard_after_forward;
    merged.modules.insert(merged.modules.end(), g.modules.begin(), g.modules.end());
  }
  for (const auto& u : users)
    if (std::find(merged.modules.begin(), merged.modules.end(), u) == merged.modules.end()) merged.modules.push_back(u);
  kept.push_back(std::move(merged));
  policy.groups = std::move(kept);
  return true;
}

}  // namespace fsdp_plan
