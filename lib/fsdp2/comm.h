// The collectives of one FSDP2 training step (fully_shard), per group, in
// issue order: the concatenated padded dim-0 shards all-gathered in
// param_dtype in forward (again in backward when resharded after forward,
// over k ranks for reshard_after_forward=k), the trainable parameters'
// gradients reduce-scattered in reduce_dtype (HSDP: then all-reduced across
// replicas), CPU offload's host copies with them. tests/timing/COMM.md, FSDP2.
#pragma once

#include "plan/comm.h"

namespace fsdp_plan {

struct Plan;

CommPlan fsdp2_comm(const Plan& plan);

}  // namespace fsdp_plan
