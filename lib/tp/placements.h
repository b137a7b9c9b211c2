// Tensor parallelism's placements, as parallelize_module makes them, and
// fully_shard's dim-0 shard on top (torch/distributed/tensor/parallel/api.py,
// style.py; torch/distributed/fsdp/_fully_shard/_fsdp_param.py).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/module_tree.h"
#include "plan/tensor_parallel.h"
#include "policy/tensor_parallel.h"
#include "util/warnings.h"

namespace fsdp_plan {

// Matches each plan entry to modules, applies its style to their parameters,
// and appends the refusals (tp_unmatched_pattern, tp_style_class,
// tp_applied_twice, tp_uneven_split) to `warnings`. The mesh must be valid
// (device_mesh_error says "").
TensorParallelPlan plan_tensor_parallel(const ModuleTree& tree, const TensorParallel& tp, const DeviceMesh& mesh,
                                        std::vector<Warning>& warnings);

// The mesh, and every parameter as no style touched it
// (placement None, its full shape): where both appliers start.
TensorParallelPlan untouched_tp_plan(const ModuleTree& tree, const DeviceMesh& mesh);

// The same for a model's own plan ("plan": "model"), as transformers applies
// it (tp/transformers_apply.cpp); plan_tensor_parallel calls it.
TensorParallelPlan plan_transformers_tensor_parallel(const ModuleTree& tree, const TensorParallel& tp,
                                                     const DeviceMesh& mesh, std::vector<Warning>& warnings);

// Where the file records the attention's head counts: tp_uneven_split when
// tp does not divide the key-value heads (or the heads) and a key projection
// is planned colwise.
void tp_heads_check(const ModuleTree& tree, const TensorParallel& tp, int64_t T, std::vector<Warning>& warnings);

// tp_sequence_rotary when the plan shards the sequence and the model computes
// its rotary embeddings outside the layers (Hugging Face's Llama): torch's
// first forward fails.
void tp_sequence_rotary_check(const ModuleTree& tree, const TensorParallel& tp, int64_t T,
                              std::vector<Warning>& warnings);

// parallelize_module's key matching: the key's dot-separated tokens, each
// matched with Python's fnmatch against child names, level by level ("" is
// the module itself).
bool fnmatch_token(const std::string& pattern, const std::string& name);

// A parameter after fully_shard on the dp sub-mesh: its placements on the
// full mesh, the mesh's dimension names, and rank 0's local shard (FSDP2's
// padded shard: ceil(d0 / dp_shard) rows of the TP-local tensor).
struct Fsdp2TpParam {
  std::vector<std::string> placements, mesh_dims;
  std::vector<int64_t> local_shape;
};
Fsdp2TpParam fsdp2_tp_param(const TensorParallelPlan& plan, const ModuleTree& tree, TensorId t);

}  // namespace fsdp_plan
