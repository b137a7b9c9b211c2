// Activations under tensor parallelism (issue 26): the graph one tp rank
// runs, with every tensor at its local shape, so that the activation walk
// (activations/walk.h) counts what that rank saves. Which tensors a rank
// holds only a 1/tp share of, and on which dimension, follows torch 2.13's
// styles (torch/distributed/tensor/parallel/style.py):
//  - ColwiseParallel: the output is Shard(-1), kept as the local tensor
//    (use_local_output), so everything computed from it until a rowwise
//    module is local: q/k/v over the local heads, SDPA's output and what it
//    saves (its logsumexp: heads / tp), the local FFN columns; with
//    output_layouts Replicate (a head gathering its logits) the local chunk
//    is all-gathered whole; with input_layouts Shard (sequence parallelism)
//    the input is all-gathered first, and the linear saves the whole input;
//  - RowwiseParallel: its input is the local tensor (Shard(-1)); its Partial
//    output is all-reduced whole (Replicate, the default: the residual stream
//    and the norms stay whole on every rank) or reduce-scattered on the
//    sequence dimension (output_layouts Shard(1): sequence parallelism, after
//    which the residual stream, the norms' inputs and outputs are 1/tp
//    along the sequence until the next colwise module gathers them);
//  - a parameter a style split is its local shard (not an activation).
// Everything else follows its input's sharded dimension through the op
// (views by their dimension arguments, elementwise and broadcasting ops by
// aligned shapes); a tensor whose dimension cannot be followed is taken as
// whole (an upper bound). An all-gather or chunk the styles add is a copy
// node in the rewritten graph (aten.clone: saves nothing, passes the
// gradient), in the module that runs it.
#pragma once

#include "activations/activations.h"
#include "activations/walk.h"

namespace fsdp_plan {

struct Plan;

// `graph` as tp rank 0 runs it under plan.tensor_parallel (rank 0's local
// shapes: torch.chunk's ceil(n / tp)). Needs plan.tensor_parallel and tp > 1.
WalkGraph tp_local_walk_graph(const WalkGraph& graph, const Plan& plan);

// For plan_activations: tp_local_walk_graph under a 2-D plan with tp > 1,
// else empty (the graph as exported).
LocalWalkGraph tp_local_graph(const Plan& plan);

}  // namespace fsdp_plan
