// The memory of one scaled_dot_product_attention call run as torch's ring
// (context parallelism): what the call allocates beyond its inputs, replayed
// allocation by allocation as torch 2.13's code makes and frees it
// (torch/distributed/tensor/experimental/_context_parallel/_attention.py:
// _templated_ring_attention and _templated_ring_attention_backward, the
// _AllGatherRotater / _AllToAllRotater, _SDPAMerger, _partial_update), each
// tensor freed when its last reference goes, as CPython frees it. Checked
// byte for byte against FSDPMemTracker around the real ring on the fake
// backend (tests/differential/test_context_parallel.py).
#pragma once

#include <cstdint>

namespace fsdp_plan {

struct RingCall {
  int64_t rank = 0;         // the cp rank replayed (the plan's: 0)
  int64_t cp = 2;           // the ring's size
  bool head_tail = true;    // _cp_options.enable_load_balance (the head-tail balancer runs)
  bool all_gather = true;   // rotate_method ALL_GATHER, else ALL_TO_ALL
  int64_t q_numel = 0;      // B x H x S_local x D
  int64_t kv_numel = 0;     // B x H_kv x S_local x D, each of K and V
  int64_t head_dim = 1;     // D: the logsumexp has q_numel / D elements
  int64_t itemsize = 4;     // the compute dtype's (the accumulators and the merger are float32)
  bool kv_contiguous = false;  // K and V reach the call contiguous (else .contiguous() copies them)
  bool q_contiguous = false;
};

// The most bytes the call holds at once beyond its inputs, and what it still
// holds when it returns (its outputs: out and logsumexp in forward; dq and
// the shared dK/dV storage in backward).
struct RingMemory {
  int64_t peak = 0, exit = 0;
};
RingMemory ring_forward_memory(const RingCall& call);
RingMemory ring_backward_memory(const RingCall& call);

}  // namespace fsdp_plan
