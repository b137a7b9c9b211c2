// With use_orig_params=True, FSDP1 leaves each original parameter it flattened
// in its module as a view into this rank's shard (FlatParamHandle's
// _use_sharded_views) and marks it flattened. _recursive_wrap sizes each module
// when it reaches it, `sum(p.numel() for p in module.parameters())`, so a tied
// weight flattened by a unit built earlier (bottom-up) counts there as its
// share of this rank's shard, not its full size: a size policy may then decide
// differently than on the untouched model, and by rank. The plan is rank 0's,
// the rank its sharded sizes describe; rank_disagreement checks the others.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "fsdp1/memory.h"
#include "fsdp1/wrap_policy.h"
#include "model/module_tree.h"
#include "policy/ignored.h"

namespace fsdp_plan {

class ShardedViews {
 public:
  ShardedViews(const ModuleTree& tree, const Ignored& ignored, const FsdpSettings& settings, int64_t rank = 0);

  // FSDP1 has just built the unit at `unit` (`wrapped` marks the units
  // inside it, all built already): its flat parameter takes what the unit's
  // subtree reaches, minus wrapped subtrees and what is already flattened.
  void built(ModuleId unit, const std::vector<bool>& wrapped);

  // Elements that module `m`'s untouched count (subtree_numel) holds more
  // than FSDP sees now: full sizes of tied tensors already flattened, minus
  // their rank-0 views.
  int64_t shrink(ModuleId m) const;

  // Ranks (within the shard group) where the views of the tied tensors
  // flattened so far change: ranks between two of them see the same views,
  // so they choose the same units as the one before.
  const std::set<int64_t>& rank_breaks() const { return breaks_; }

 private:
  const ModuleTree& tree_;
  const Ignored& ignored_;
  int64_t group_ = 1;  // ranks a flat parameter is sharded over
  int64_t rank_ = 0;   // within the group
  std::set<int64_t> breaks_;
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

// With use_orig_params and a policy that counts sizes: the ranks whose units
// differ from rank 0's `wrapped` (FSDP1 would then run different collectives
// on different ranks), as a message naming one such rank and the modules; ""
// when every rank agrees. `rank0` is the views rank 0's selection left; one
// rank per stretch of equal views is checked.
std::string rank_disagreement(const ModuleTree& tree, const Ignored& ignored, const FsdpSettings& settings,
                              const WrapPolicy& policy, const std::vector<bool>& wrapped, const ShardedViews& rank0);

}  // namespace fsdp_plan
