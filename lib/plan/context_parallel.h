// A plan's context-parallel part: the sequence each rank holds and the
// attention calls torch's context_parallel turns into a ring over the cp
// group (torch/distributed/tensor/experimental/_context_parallel/
// _attention.py). lib/cp/ computes it; cp/comm.cpp and the writers read it.
// Activations need nothing here: the walk runs at the local sequence
// (activations.h: rank_walk_dims).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/module_tree.h"
#include "policy/context_parallel.h"

namespace fsdp_plan {

// One scaled_dot_product_attention call of the forward, on rank 0.
struct CpAttention {
  ModuleId module = 0;  // the module whose forward calls it
  int unit = 0;         // the FSDP unit that module runs in
  // K and V as the call takes them on one rank: B x heads x seq/cp x head_dim each
  // (the kv heads where the call takes GQA's K/V unrepeated, 1/tp of them under TP).
  int64_t kv_numel = 0;
  std::string dtype;     // K/V's: the compute dtype (mixed precision's param_dtype)
  int64_t itemsize = 0;
  // Full activation checkpointing recomputes the call in backward (its ring
  // again); torchtitan's selective policy saves SDPA's outputs: no recompute.
  bool recomputed = false;
  // The ring's buffers: cat(K, V) flattened, in K/V's dtype; the gradients'
  // ring in fp32 (_cp_options.convert_to_f32).
  int64_t kv_bytes() const { return 2 * kv_numel * itemsize; }
  int64_t dkv_bytes() const { return 2 * kv_numel * 4; }
};

struct ContextParallelPlan {
  int64_t degree = 1;
  ContextParallel settings;  // as the policy says
  // Whether torch balances: the policy's head-tail, and a sequence 2 x cp
  // divides (_create_default_load_balancer returns None otherwise, silently).
  bool head_tail = false;
  int64_t seq = 0, local_seq = 0;  // the whole sequence and one rank's share
  std::string seq_dim;             // the graph's dimension name ("seq")
  std::vector<CpAttention> attention;  // in forward order
  std::vector<std::string> notes;      // what the plan assumes
};

}  // namespace fsdp_plan
