// One SDPA call run as torch's ring (activations/ring_attention.h): the bytes it
// holds beyond its inputs, against a Python replay of torch 2.13's
// _templated_ring_attention(_backward) whose first seven rows equal
// FSDPMemTracker's measurement around the real ring on the fake backend (the
// cp_models decoder: B 2, 4 heads of 16, seq 256, rank 0; tests/differential/
// test_context_parallel.py checks the whole step).
#include <doctest/doctest.h>

#include "activations/ring_attention.h"

namespace fsdp_plan {
namespace {

struct Row {
  int64_t rank, cp;
  bool head_tail, all_gather;
  int64_t q, kv, head_dim, itemsize;
  bool kv_contiguous, q_contiguous;
  int64_t forward_peak, forward_exit, backward_peak, backward_exit;
};

const Row kRows[] = {
    {0, 2, true, true, 16384, 16384, 16, 4, false, false, 524288, 69632, 1214464, 196608},
    {0, 2, true, false, 16384, 16384, 16, 4, false, false, 393216, 69632, 1083392, 196608},
    {0, 2, true, true, 16384, 16384, 16, 2, false, false, 352256, 36864, 837632, 98304},
    {0, 4, true, true, 8192, 8192, 16, 4, false, false, 428032, 34816, 786432, 98304},
    {0, 4, true, false, 8192, 8192, 16, 4, false, false, 314368, 34816, 607232, 98304},
    {0, 4, true, true, 8192, 8192, 16, 2, false, false, 247808, 18432, 507904, 49152},
    {0, 4, true, false, 8192, 8192, 16, 2, false, false, 182272, 18432, 418816, 49152},
    // Llama-3-8B-shaped GQA (32 heads, 8 KV heads of 128) at 512 tokens per rank, cp 8, bf16.
    {0, 8, true, true, 2097152, 524288, 128, 2, true, false, 44171264, 4259840, 52461568, 6291456},
    // Without the balancer, other ranks, an odd ring.
    {0, 4, false, true, 8192, 4096, 16, 4, false, false, 231424, 34816, 425984, 65536},
    {0, 4, false, false, 8192, 4096, 16, 2, true, true, 100352, 18432, 278528, 32768},
    {2, 4, true, true, 8192, 8192, 16, 4, false, false, 428032, 34816, 786432, 98304},
    {3, 4, true, false, 8192, 8192, 16, 2, false, false, 219136, 18432, 425984, 49152},
    {1, 3, true, true, 24576, 6144, 32, 2, true, true, 525312, 52224, 493056, 73728},
    {0, 2, false, false, 16384, 16384, 16, 4, false, false, 393216, 69632, 1114112, 196608},
};

}  // namespace

TEST_CASE("ring attention: torch's ring, allocation by allocation") {
  for (const Row& r : kRows) {
    RingCall c;
    c.rank = r.rank;
    c.cp = r.cp;
    c.head_tail = r.head_tail;
    c.all_gather = r.all_gather;
    c.q_numel = r.q;
    c.kv_numel = r.kv;
    c.head_dim = r.head_dim;
    c.itemsize = r.itemsize;
    c.kv_contiguous = r.kv_contiguous;
    c.q_contiguous = r.q_contiguous;
    CAPTURE(r.rank);
    CAPTURE(r.cp);
    CAPTURE(r.head_tail);
    CAPTURE(r.all_gather);
    CAPTURE(r.itemsize);
    const RingMemory f = ring_forward_memory(c), b = ring_backward_memory(c);
    CHECK(f.peak == r.forward_peak);
    CHECK(f.exit == r.forward_exit);
    CHECK(b.peak == r.backward_peak);
    CHECK(b.exit == r.backward_exit);
  }
}

}  // namespace fsdp_plan
