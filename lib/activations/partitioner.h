// Compiled blocks (issue 42): what AOTAutograd's min-cut partitioner saves for
// the backward of a compiled module's call, where eager autograd saves what
// each op's derivative asks for. torch.compile traces the call's forward and
// backward as one joint graph and min_cut_rematerialization_partition
// (torch/_functorch/partitioners.py, torch 2.13 defaults) chooses which
// forward values to save as a minimum cut between the call's inputs and the
// values the backward reads: cheap ops (the recomputable allowlist, pointwise
// ones) are recomputed in the backward from what is saved; matmuls,
// attention, random ops, large reductions and values a matmul's backward
// reads are saved. Under an activation_memory_budget below 1,
// choose_saved_values_set relaxes the bans step by step and at last picks the
// banned ops to recompute with a knapsack over their FLOPs.
//
// The model works on the walk's storages (a view is its base) over the
// exported graph, with the op table's saves as what the backward reads. It
// leaves out the partitioner's two fusion heuristics (ban_if_used_far_apart,
// ban_if_long_fusible_chains) and backward values computable from the forward
// alone; docs/memory-model.md "Compiled blocks" gives its measured accuracy.
#pragma once

#include <cstdint>
#include <vector>

#include "activations/walk.h"

namespace fsdp_plan {

// One storage a compiled call makes or reads: a node of the cut's graph.
// Values are in the order they are made; `users` are later values made from it.
struct CutValue {
  int64_t bytes = 0;     // what saving it holds (the partitioner's _size_of)
  bool input = false;    // made before the call: a primal, always available
  bool free = false;     // a parameter or buffer (treat_parameters_as_free_to_save)
  // should_ban_recomputation's reasons, by the option that turns each off.
  bool off_allowlist = false;    // not on the recomputable allowlist (ban_recompute_not_in_allowlist)
  bool compute = false;          // compute-intensive or random: banned whatever the options
  bool reduction = false;        // a reduction to a quarter of its inputs or less (ban_recompute_reductions)
  bool materialized_bw = false;  // a matmul's or attention's backward reads it (ban_recompute_materialized_backward)
  bool needed = false;   // the backward reads it
  bool materialized = false;  // a forward user cannot fuse with it (is_materialized): weight x1, else x2
  int32_t node = -1;     // the graph node that makes it (values of one node are one knapsack item)
  double flops = 1;      // that node's FLOPs (estimate_runtime's "flops" mode: at least 1)
  std::vector<int32_t> users;
};

// Per value, whether the partitioner saves it at `memory_budget`
// (activation_memory_budget, 0 to 1; 1 is the default min cut), and whether
// the backward computes it again (on the sink's side of the cut: what the
// backward reads and what it is made from since the saved values).
struct CutResult {
  std::vector<bool> saved, recomputed;
};
CutResult partitioner_cut(const std::vector<CutValue>& values, double memory_budget = 1);
inline std::vector<bool> partitioner_saves(const std::vector<CutValue>& values, double memory_budget = 1) {
  return partitioner_cut(values, memory_budget).saved;
}

// get_default_op_list(): whether the partitioner may recompute the node's op
// (its allowlist, or the ops a composite pre-dispatch op such as softmax or
// layer_norm decomposes into under inductor's decompositions are all on it),
// whether it fuses (recomputable or random), and whether it is random or
// compute-intensive (mm, bmm, addmm, convolution, the CUDA fused attention
// kernels, _scaled_mm: banned whatever the options; `case_name` is the op
// table's case, which says SDPA's kernel).
bool recomputable_node(const WalkNode& node);
bool fusible_node(const WalkNode& node);
bool compute_or_random_node(const WalkNode& node, const char* case_name);

}  // namespace fsdp_plan
