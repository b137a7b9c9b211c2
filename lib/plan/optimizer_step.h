// What Adam's step allocates beyond its state, by how torch.optim runs it
// (policy/settings.h OptimizerImpl). Read by both FSDP memory models.
#pragma once

#include <cstdint>
#include <vector>

#include "policy/settings.h"

namespace fsdp_plan {

// The largest moment of the step's temporaries, given each parameter's state
// tensor bytes (one exp_avg_sq, on this rank) in the optimizer's order:
// - for-loop (torch/optim/adam.py: _single_tensor_adam): per parameter,
//   denom = (exp_avg_sq.sqrt() / c).add_(eps) makes two temporaries of its
//   size while the previous parameter's denom is still referenced;
// - foreach (_multi_tensor_adam): exp_avg_sq_sqrt = torch._foreach_sqrt(
//   exp_avg_sqs) is one new tensor per parameter of the group, all at once
//   (then divided and added to in place);
// - fused (_fused_adam): one kernel updates in place, nothing more.
int64_t adam_step_temp_bytes(const std::vector<int64_t>& state_bytes, OptimizerImpl impl);

}  // namespace fsdp_plan
