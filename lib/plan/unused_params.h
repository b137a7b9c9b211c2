// Trainable parameters the exported forward never reads (DINOv2's
// mask_token without bool_masked_pos). Autograd gives them no gradient, so
// FSDP2 leaves them out of the step: _fsdp_param_group.py post_backward
// reduce-scatters only the parameters whose unsharded_param.grad is set
// (foreach_reduce's inputs), their sharded .grad stays None, and the
// optimizer (torch/optim/adamw.py, _init_group) keeps no state for a
// parameter without a gradient. FSDP1's flat parameter gets a gradient as a
// whole (zeros where a parameter was unused): nothing changes there.
#pragma once

#include <vector>

#include "plan/plan.h"

namespace fsdp_plan {

// From the tree's .pt2 graph: every parameter that requires grad whose
// placeholder no node reads, sorted. Empty without a graph.
std::vector<TensorId> trainable_params_never_read(const ModuleTree& tree);

// FSDP2: sets plan.ungraded_params and warns (fsdp2_unused_param) per parameter.
void find_ungraded_params(Plan& plan);

// Whether FSDP2 gives the trainable parameter `t` a gradient (requires_grad,
// and not in plan.ungraded_params).
bool receives_gradient(const Plan& plan, TensorId t);

}  // namespace fsdp_plan
