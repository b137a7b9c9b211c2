// A plan's expert-parallel part: the sparse mesh, the routed-expert modules,
// each expert parameter's EP-local shape (rank 0's experts, before
// fully_shard) and FSDP's placement of it on efsdp, and what one MoE layer's
// all-to-all carries. lib/ep/ computes it; fsdp2/memory.cpp, fsdp2/comm.cpp,
// ep/comm.cpp and the writers read it.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "model/module_tree.h"

namespace fsdp_plan {

struct ExpertModule {
  ModuleId module;            // the experts' module: fused (one parameter per weight, experts on dim 0) or a
                              // container of one module per expert
  bool fused = true;
  int64_t num_experts = 0;    // E
  int64_t local_experts = 0;  // rank 0's: torch.chunk's ceil(E / ep) (DTensor Shard(0) on ep)
  // FSDP2's placement of the EP-local expert parameters on efsdp: Shard(0),
  // or Shard(1) where efsdp x ep > E (torchtitan's apply_fsdp_to_decoder, to
  // avoid padding); the per-expert container's modules always Shard(0).
  int shard_dim = 0;
  ModuleId moe = 0;           // the module that routes to it (the experts' parent)
  // One dispatch (or combine) all-to-all's input on rank 0: tokens x top_k
  // rows of `hidden` elements; known from the graph (or the policy's top_k).
  bool sizes_known = false;
  int64_t tokens = 0, top_k = 0, hidden = 0;
  std::string dtype;     // the tokens' (mixed precision's param_dtype where it casts them)
  int64_t itemsize = 0;
  std::string unknown_reason;
  int64_t dispatch_bytes() const { return tokens * top_k * hidden * itemsize; }
  // The busiest ep rank's share under skewed routing (ExpertParallelPlan::imbalance):
  // the rows its experts receive (its dispatch's output, its combine's input), rounded up.
  int64_t busiest_rows(double imbalance) const {
    return static_cast<int64_t>(std::ceil(imbalance * static_cast<double>(tokens * top_k)));
  }
  int64_t busiest_bytes(double imbalance) const { return busiest_rows(imbalance) * hidden * itemsize; }
};

struct ExpertParallelPlan {
  DeviceMesh mesh;  // Plan::mesh, with its sparse layout (efsdp, ep)
  std::vector<ExpertModule> modules;
  // Per TensorId: the index into `modules` of the expert module holding it,
  // or -1; for those, rank 0's EP-local shape (dim 0 the local experts; a
  // per-expert module held by another rank: {0}, nothing on rank 0).
  std::vector<int> expert_of;
  std::vector<std::vector<int64_t>> local_shape;
  std::vector<std::string> notes;  // what the plan assumes (routing, dtypes)
  // The policy's routing imbalance: the busiest rank's routed rows over the
  // mean; the plan (memory, all-to-alls, time) is that rank's. 1: uniform.
  double imbalance = 1.0;

  bool is_expert(TensorId t) const { return expert_of[static_cast<size_t>(t)] >= 0; }
  int64_t local_numel(TensorId t) const {
    const auto& s = local_shape[static_cast<size_t>(t)];
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
  }
};

}  // namespace fsdp_plan
