// A 2-D plan's tensor-parallel part: the device mesh, the module each plan
// entry applies to, and each parameter's placement on the "tp" dimension and
// its TP-local shape, which FSDP2 then shards on dim 0 (lib/tp/ computes it;
// fsdp2/memory.cpp and the writers read it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mesh/device_mesh.h"
#include "model/module_tree.h"
#include "policy/tensor_parallel.h"

namespace fsdp_plan {

// A parameter's placement on the tp mesh dimension.
struct TpPlacement {
  enum class Kind : int8_t { None, Replicate, Shard };  // None: no style touched it (a plain tensor)
  Kind kind = Kind::None;
  int dim = 0;           // Shard only
  int split_factor = 1;  // > 1: _StridedShard (transformers' packed styles: gate and up halves each split)
};

struct TpModule {
  ModuleId module;
  int entry;  // index into TensorParallel::plan
};

struct TensorParallelPlan {
  DeviceMesh mesh;  // Plan::mesh, which the placements were made on
  std::vector<TpModule> modules;  // in the order parallelize_module applies them
  // Per TensorId (parameters only; buffers keep None and their shape): what
  // the styles did, and rank 0's local shape (torch.chunk's: ceil(n / tp) rows
  // on the split dimension).
  std::vector<TpPlacement> placement;
  std::vector<std::vector<int64_t>> local_shape;
};

// "Shard(dim=0)", "Replicate()", or "" for none: DTensor's repr.
inline std::string tp_placement_repr(const TpPlacement& p) {
  switch (p.kind) {
    case TpPlacement::Kind::Shard:
      if (p.split_factor > 1)
        return "_StridedShard(dim=" + std::to_string(p.dim) + ", sf=" + std::to_string(p.split_factor) + ")";
      return "Shard(dim=" + std::to_string(p.dim) + ")";
    case TpPlacement::Kind::Replicate: return "Replicate()";
    case TpPlacement::Kind::None: break;
  }
  return "";
}

}  // namespace fsdp_plan
