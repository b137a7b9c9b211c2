// Context parallelism's planning step: the sequence each rank holds and the
// scaled_dot_product_attention calls torch's context_parallel runs as a ring
// over the cp group, with what their K/V carry on one rank (from the graph at
// the local sequence). After torch 2.13's
// torch/distributed/tensor/experimental/_context_parallel/_attention.py
// (_templated_ring_attention, its rotaters, the SDPA handlers' checks) and
// torchtitan's parallelize (the cp mesh, FSDP over dp_shard x cp).
#pragma once

#include <optional>

#include "plan/context_parallel.h"
#include "plan/plan.h"

namespace fsdp_plan {

// After the activations (their checkpointed modules and selective saves).
// Throws InputError naming the model where torch would refuse the ring: no
// graph or no SDPA call to ring, an attention mask (attn_bias is not
// supported), a non-causal call under the head-tail load balancer, query and
// key sequences that differ under causal masking.
ContextParallelPlan plan_context_parallel(const Plan& plan);

// cp_load_balance_dropped where the policy asks for head-tail balancing and
// torch silently runs without it.
std::optional<Warning> load_balance_warning(const ContextParallelPlan& cp);

}  // namespace fsdp_plan
