// The collectives of one FSDP1 training step (FullyShardedDataParallel),
// per unit, in issue order: each unit's padded flat parameter all-gathered in
// forward (again in backward when resharded after forward), its flat gradient
// reduce-scattered (HYBRID_SHARD: then all-reduced across replicas; NO_SHARD:
// all-reduced whole). tests/timing/COMM.md, section FSDP1, counted on torch 2.13.
#pragma once

#include "plan/comm.h"

namespace fsdp_plan {

struct Plan;

// Reads the plan's units and its memory model (flat parameter sizes, strategy).
CommPlan fsdp1_comm(const Plan& plan);

}  // namespace fsdp_plan
