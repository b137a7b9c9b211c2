// Which values of the graph a tensor-parallel rank holds only its 1/tp share
// of (issue 26): the split parameters, a colwise module's output (Shard(-1),
// kept local: use_local_output), a rowwise module's output where it is
// reduce-scattered (Shard(1), sequence parallelism), and whatever is computed
// from one of those (attention over the local heads, the activation of the
// local FFN columns) until a rowwise module's all-reduce or a gathered output
// makes it whole again (torch/distributed/tensor/parallel/style.py:
// ColwiseParallel, RowwiseParallel). The step-time model divides the FLOPs
// of an op on such a value by tp: each rank computes its share.
#pragma once

#include <vector>

#include "activations/walk.h"

namespace fsdp_plan {

struct Plan;

// Per WalkGraph tensor id; empty without a tensor_parallel section (or tp 1).
std::vector<bool> tp_local_tensors(const WalkGraph& graph, const Plan& plan);

}  // namespace fsdp_plan
