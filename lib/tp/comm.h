// Tensor parallelism's collectives in one training step (issue 26): where a
// ColwiseParallel / RowwiseParallel module's input or output DTensor is
// redistributed, on the tp group. From torch 2.13's styles
// (torch/distributed/tensor/parallel/style.py: ColwiseParallel,
// RowwiseParallel: _prepare_input_fn, _prepare_output_fn) and DTensor's
// redistribute rules (torch/distributed/tensor/_redistribute.py): a Partial
// output made Replicate is an all-reduce, made Shard a reduce-scatter; a
// Shard made Replicate an all-gather; in backward the same moves in reverse
// (a Replicate input's gradient comes back Partial: all-reduced). Under
// sequence parallelism a sequence_parallel module's Replicate parameters get
// Partial gradients, all-reduced in FSDP2's post-backward (cause
// "param_grad"; the Collective's module is then the one backward entered last
// in the unit, as CommDebugMode names it). Counted against CommDebugMode
// (tests/tensor_parallel/tp_comm_reference.py).
//
// The sizes are the activations': tokens x features x itemsize at the
// graph's dimensions, so only a .pt2 graph gives them (TpComm::sizes_known).
#pragma once

#include "plan/comm.h"

namespace fsdp_plan {

struct Plan;

// Needs plan.tensor_parallel and plan.units. Without a graph: sizes_known
// false, no collectives, unknown_reason saying why.
TpComm tp_comm(const Plan& plan);

}  // namespace fsdp_plan
