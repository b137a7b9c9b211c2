// Gradient accumulation (fsdp.gradient_accumulation_steps, fsdp.no_sync): the
// memory walk is of one step, its gradients freed by zero_grad before the
// forward; with accumulation the later micro-steps' forwards (and backwards)
// run with the gradients of the earlier ones held.
//  - Without no_sync every micro-step reduce-scatters: the sharded gradients
//    (FSDP1: _accumulate_sharded_grad adds to _saved_grad_shard; FSDP2:
//    sharded_param.grad += the new shard) are held whole from the second
//    micro-step on.
//  - With no_sync (FSDP1's no_sync(); FSDP2's set_requires_gradient_sync(False),
//    _fsdp_param_group.py: post_backward returns before the reduce-scatter,
//    _fsdp_param.py: to_accumulated_grad_if_needed / accumulate_unsharded_grad_if_needed)
//    every trainable parameter's UNSHARDED gradient is kept until the last
//    micro-step's backward reduce-scatters it: FSDP1 the unit's padded flat
//    gradient in the compute dtype; FSDP2 each parameter's TP-local gradient,
//    in reduce_dtype when mixed precision sets one, else in param_dtype.
// An ESTIMATE that holds them at every point of the step (an upper bound in the
// last micro-step's backward, where they are freed unit by unit).
#pragma once

#include "plan/plan.h"

namespace fsdp_plan {

// Raises plan.memory.per_rank.peak_bytes (and fills memory.accumulation)
// when the policy accumulates; a no-op at one step.
void add_gradient_accumulation(Plan& plan);

}  // namespace fsdp_plan
