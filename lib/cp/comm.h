// Context parallelism's collectives of one training step, per attention
// call, on the cp group, as torch 2.13's ring issues them
// (torch/distributed/tensor/experimental/_context_parallel/_attention.py):
// forward, cat(K, V) rotated around the ring: one all_gather_single with
// rotate_method ALL_GATHER (_AllGatherRotater gathers once), cp - 1
// permute_tensor calls (all_to_all_single to the next rank) with ALL_TO_ALL;
// backward (_templated_ring_attention_backward), K/V's ring again the same
// way, and the gradients' ring, always all-to-all: cp permutes of cat(dK, dV)
// in fp32 (convert_to_f32). Full checkpointing runs the forward's ring again.
// Blocking: the ring waits for each buffer before its step's attention.
#pragma once

#include "plan/comm.h"
#include "plan/plan.h"

namespace fsdp_plan {

// Empty (planned false) without a context_parallel section.
CpComm cp_comm(const Plan& plan);

}  // namespace fsdp_plan
