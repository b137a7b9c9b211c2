#include "sharded_views.h"

#include <algorithm>

namespace fsdp_plan {

ShardedViews::ShardedViews(const ModuleTree& tree, const Ignored& ignored, const MemorySettings& settings)
    : tree_(tree), ignored_(ignored), uses_(tree.num_tensors(), 0), flattened_(tree.num_tensors(), false) {
  // As estimate_memory: one rank, or NO_SHARD, keeps whole parameters.
  if (settings.world_size > 1 && settings.strategy != ShardingStrategy::NoShard)
    group_ = settings.strategy == ShardingStrategy::HybridShard ? hybrid_group_size(settings) : settings.world_size;
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
    total += tree_.tensor(t).numel();
  }
  if (total % group_ != 0) total += group_ - total % group_;
  const int64_t shard = total / group_;  // rank 0 holds [0, shard)
  for (size_t i = 0; i < params.size(); ++i) {
    const TensorId t = params[i];
    if (uses_[static_cast<size_t>(t)] < 2) continue;  // nobody outside this unit reaches it
    const int64_t numel = tree_.tensor(t).numel();
    const int64_t view = std::max<int64_t>(0, std::min(offsets[i] + numel, shard) - offsets[i]);
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
