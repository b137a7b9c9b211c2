// Activations under expert parallelism: the graph rank 0 runs, as the
// activation walk (activations/walk.h) needs it. With routing uniform, each
// rank's experts see as many rows as the exported graph's (tokens x top_k in
// all, over E / ep experts instead of E), so the activations stand; what
// shrinks is the expert weights: each expert parameter is its EP-local
// tensor (ceil(E / ep) experts on dim 0; a per-expert module another rank
// holds, none), and so are the views and casts made of it (a transpose, an
// expand, a dtype copy for a grouped matmul), whose gradients autograd makes
// in backward at their size. With skewed routing (expert_parallel.imbalance)
// the graph is the busiest rank's: its routed rows are imbalance x as many.
#pragma once

#include "activations/activations.h"
#include "activations/walk.h"

namespace fsdp_plan {

struct Plan;

// The expert weights of `graph` and their views at rank 0's EP-local sizes,
// and with skewed routing the busiest rank's routed tensors.
LocalTensors ep_local_tensors(const WalkGraph& graph, const Plan& plan);

// For plan_activations: ep_local_tensors with an expert_parallel plan of ep > 1, else empty.
LocalWalkTensors ep_local_tensors(const Plan& plan);

}  // namespace fsdp_plan
