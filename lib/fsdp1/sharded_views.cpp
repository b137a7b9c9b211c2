#include "fsdp1/sharded_views.h"

#include <algorithm>

#include "fsdp1/select.h"
#include "mesh/device_mesh.h"
#include "util/strings.h"

namespace fsdp_plan {

ShardedViews::ShardedViews(const ModuleTree& tree, const Ignored& ignored, const FsdpSettings& settings,
                           int64_t rank)
    : tree_(tree), ignored_(ignored), rank_(rank), uses_(tree.num_tensors(), 0), flattened_(tree.num_tensors(), false) {
  // As estimate_memory: one rank, or NO_SHARD, keeps whole parameters.
  group_ = device_mesh(settings).size(MeshDim::DpShard);
  for (const auto& m : tree.modules())
    for (const auto& s : m.params) ++uses_[static_cast<size_t>(s.tensor)];
  for (ModuleId m = 0; m < static_cast<ModuleId>(tree.num_modules()); ++m)
    for (const auto& s : tree.module(m).params)
      if (uses_[static_cast<size_t>(s.tensor)] > 1) tied_uses_[s.tensor].push_back(m);
}

void ShardedViews::built(ModuleId unit, const std::vector<bool>& wrapped) {
  // The flat parameter's tensors in named_modules order, each once.
  std::vector<TensorId> params;
  std::vector<ModuleId> stack{unit};
  while (!stack.empty()) {
    ModuleId m = stack.back();
    stack.pop_back();
    const Module& mod = tree_.module(m);
    for (auto it = mod.children.rbegin(); it != mod.children.rend(); ++it)
      if (!wrapped[static_cast<size_t>(*it)]) stack.push_back(*it);
    for (const auto& s : mod.params) {
      const auto t = static_cast<size_t>(s.tensor);
      if (flattened_[t] || ignored_.tensor[t]) continue;
      flattened_[t] = true;
      params.push_back(s.tensor);
    }
  }
  if (params.empty() || group_ == 1) return;
  // FlatParamHandle's layout with align_addresses (memory.cpp's flat_numel):
  // each tensor at a multiple of 16 bytes, the whole a multiple of the group.
  int64_t itemsize = 1;
  for (TensorId t : params) itemsize = std::max(itemsize, tree_.tensor(t).itemsize);
  const int64_t aligned = std::max<int64_t>(1, 16 / itemsize);
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (TensorId t : params) {
    if (total % aligned != 0) total += aligned - total % aligned;
    offsets.push_back(total);
    total += tree_.numel(t);
  }
  if (total % group_ != 0) total += group_ - total % group_;
  const int64_t shard = total / group_;  // rank r holds [r * shard, (r + 1) * shard)
  const int64_t begin = rank_ * shard, end = begin + shard;
  for (size_t i = 0; i < params.size(); ++i) {
    const TensorId t = params[i];
    if (uses_[static_cast<size_t>(t)] < 2) continue;  // nobody outside this unit reaches it
    const int64_t numel = tree_.numel(t);
    if (numel == 0) continue;
    // Ranks [lo, hi] hold part of it: first and last partly, those between whole.
    const int64_t lo = offsets[i] / shard, hi = (offsets[i] + numel - 1) / shard;
    for (int64_t r : {lo, lo + 1, hi, hi + 1})
      if (r > 0 && r < group_) breaks_.insert(r);
    const int64_t view = std::max<int64_t>(0, std::min(offsets[i] + numel, end) - std::max(offsets[i], begin));
    if (view == numel) continue;
    Hidden h{numel - view, {}};
    for (ModuleId m : tied_uses_.at(t))
      for (ModuleId cur = m; cur >= 0 && !h.above.count(cur); cur = tree_.module(cur).parent) h.above.insert(cur);
    hidden_.push_back(std::move(h));
  }
}

int64_t ShardedViews::shrink(ModuleId m) const {
  int64_t out = 0;
  for (const Hidden& h : hidden_)
    if (h.above.count(m)) out += h.elements;
  return out;
}

}  // namespace fsdp_plan

namespace fsdp_plan {

std::string rank_disagreement(const ModuleTree& tree, const Ignored& ignored, const FsdpSettings& settings,
                              const WrapPolicy& policy, const std::vector<bool>& wrapped, const ShardedViews& rank0) {
  constexpr size_t kMaxRanks = 64;  // stretches checked; a handful in practice
  size_t checked = 0;
  for (int64_t r : rank0.rank_breaks()) {
    if (++checked > kMaxRanks) break;
    ShardedViews views(tree, ignored, settings, r);
    const std::vector<bool> other = select_wrapped(tree, policy, ignored, &views);
    if (other == wrapped) continue;
    std::vector<std::string> only0, onlyr;
    for (ModuleId m = 0; m < static_cast<ModuleId>(tree.num_modules()); ++m) {
      const auto i = static_cast<size_t>(m);
      if (wrapped[i] && !other[i]) only0.push_back("'" + tree.path(m) + "'");
      if (!wrapped[i] && other[i]) onlyr.push_back("'" + tree.path(m) + "'");
    }
    std::string diff;
    if (!only0.empty()) diff += "rank 0 wraps " + listing(only0) + " and rank " + std::to_string(r) + " does not";
    if (!onlyr.empty())
      diff += std::string(diff.empty() ? "" : ", ") + "rank " + std::to_string(r) + " wraps " + listing(onlyr) +
              " and rank 0 does not";
    return diff;
  }
  return "";
}

}  // namespace fsdp_plan
