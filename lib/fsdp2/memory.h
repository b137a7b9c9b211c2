// Per-rank memory of a plan under FSDP2's rules (fully_shard): each parameter
// sharded on dim 0 with rank 0 holding ceil(d0/S) rows, groups gathered in
// param_dtype, reshard_after_forward per group, one group prefetched each
// way, reduce-scatter in reduce_dtype, sharded gradients and optimizer state.
// docs/memory-model.md "FSDP2" gives every formula and its source.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "mesh/device_mesh.h"
#include "plan/activations.h"
#include "plan/expert_parallel.h"
#include "plan/memory.h"
#include "policy/settings.h"

namespace fsdp_plan {

struct Plan;

// The local shape of a parameter on rank 0, which is also every rank's padded
// shard: ceil(d0 / shard) rows (a 0-dim parameter, refused by fully_shard, as [1]).
std::vector<int64_t> fsdp2_sharded_shape(const std::vector<int64_t>& shape, int64_t shard);

// The model in two steps: what depends on the plan alone (each parameter's
// dim 0, row size and dtypes, the units' buffers and nesting and the order of
// their hooks, the parameters no unit holds) is gathered once, then estimate() works out one setting
// (world size, strategy, optimizer, CPU offload) from it. suggest's fit advice
// asks one plan about many settings. It keeps no reference to the plan.
class Fsdp2Memory {
 public:
  explicit Fsdp2Memory(const Plan& plan);
  // Throws std::invalid_argument for settings FSDP2 has no meaning for.
  // Without `timeline`, MemoryPlan::timeline stays empty (the peak is the same):
  // suggest's searches ask only for the peak.
  MemoryPlan estimate(const FsdpSettings& settings, bool timeline = true) const;

 private:
  class Estimate;  // one estimate(): the groups' sizes at a shard size, then the step's walk
  // The constructor's steps, in order.
  using GradParams = std::vector<std::vector<std::pair<TensorId, int64_t>>>;
  void add_units(const Plan& plan, GradParams& grad_params);
  void add_late_gradients(const Plan& plan, const GradParams& grad_params);
  void order_hooks(const Plan& plan);
  void add_unowned_params(const Plan& plan);
  struct Param;
  static void expert_param(const ExpertParallelPlan& ep, TensorId t, Param& p);

  struct Param {              // one parameter of a unit
    int64_t dim0, row;        // padded shard: ceil(dim0 / S) * row elements (row 0 when dim0 is)
    int32_t orig, pe, rd;     // itemsize: own dtype, gathered (param_dtype), reduced (reduce_dtype)
    bool trainable;
    // A routed expert's (plan/expert_parallel.h): sharded over efsdp, not dp_shard,
    // and when fused, on dim 1 (dim1, row1) where efsdp x ep > `experts`.
    bool expert = false;
    int64_t experts = 0, dim1 = 0, row1 = 0;
  };
  struct UnitParams {
    size_t begin = 0, end = 0;  // into params_
    int parent = -1;
    ReshardAfterForward reshard_after_forward;
    int64_t compute_itemsize = 0;
    int64_t grads_unsharded = 0;    // autograd's gradients: unpadded, param_dtype
    bool rs_output_is_grad = true;  // reduce dtype == own dtype for every trainable parameter
  };
  std::vector<Param> params_;
  std::vector<UnitParams> units_;
  // Units in post-order (post-forward hooks; backward runs it in reverse), and
  // how many enclosing groups finish before unit j's forward and before the
  // k-th unit of the reversed post-order's backward.
  std::vector<size_t> post_order_;
  std::vector<int> forward_closes_, backward_closes_;
  int64_t buffers_bytes_ = 0;
  // With tensor parallelism: the plan's mesh, whatever the settings say.
  std::optional<DeviceMesh> tp_mesh_;
  // With expert or context parallelism: their degrees, for the mesh at each setting's world size.
  std::optional<ExpertParallel> expert_parallel_;
  std::optional<ContextParallel> context_parallel_;
  // The plan's activations (plan/activations.h) and the units' parents, for activations/schedule.h.
  ActivationPlan activations_;
  std::vector<int> parents_;
  // Gradients of enclosing groups' parameters used after a group in the
  // forward, live during its backward (activations/schedule.h: LateGradients):
  // per unit j, of j's enclosing groups; and of j and its enclosing groups
  // after j's last descendant (j's own backward after its children's).
  std::vector<int64_t> late_outer_, late_in_;
  // The trainable parameters as the optimizer steps them (module registration order): indices into params_.
  std::vector<size_t> optim_order_;
  // Parameters in no unit (ignored): whole on every rank.
  int64_t unowned_bytes_ = 0, unowned_trainable_bytes_ = 0, unowned_largest_trainable_ = 0;
};

// Fsdp2Memory(plan).estimate(settings, timeline).
MemoryPlan estimate_memory_fsdp2(const Plan& plan, const FsdpSettings& settings, bool timeline = true);

}  // namespace fsdp_plan
