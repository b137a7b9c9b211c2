// With use_orig_params=True, FSDP1 leaves each original parameter it flattened
// in its module as a view into this rank's shard (FlatParamHandle's
// _use_sharded_views) and marks it flattened. _recursive_wrap sizes each module
// when it reaches it, `sum(p.numel() for p in module.parameters())`, so a tied
// weight flattened by a unit built earlier (bottom-up) counts there as its
// share of this rank's shard, not its full size: a size policy may then decide
// differently than on the untouched model, and by rank. We model rank 0, the
// rank the plan's sharded sizes describe.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "ignored.h"
#include "memory.h"
#include "module_tree.h"

namespace fsdp_plan {

class ShardedViews {
 public:
  ShardedViews(const ModuleTree& tree, const Ignored& ignored, const MemorySettings& settings);

  // FSDP1 has just built the unit at `unit` (`wrapped` marks the units
  // inside it, all built already): its flat parameter takes what the unit's
  // subtree reaches, minus wrapped subtrees and what is already flattened.
  void built(ModuleId unit, const std::vector<bool>& wrapped);

  // Elements that module `m`'s untouched count (subtree_numel) holds more
  // than FSDP sees now: full sizes of tied tensors already flattened, minus
  // their rank-0 views.
  int64_t shrink(ModuleId m) const;

 private:
  const ModuleTree& tree_;
  const Ignored& ignored_;
  int64_t group_ = 1;  // ranks a flat parameter is sharded over
  std::vector<int32_t> uses_;      // slots holding each tensor
  std::vector<bool> flattened_;    // by TensorId
  std::unordered_map<TensorId, std::vector<ModuleId>> tied_uses_;  // modules using each tied tensor
  // Tied tensors already flattened with a view smaller than the tensor: the
  // elements each hides, and the modules above any of its uses.
  struct Hidden {
    int64_t elements;
    std::unordered_set<ModuleId> above;
  };
  std::vector<Hidden> hidden_;
};

}  // namespace fsdp_plan
