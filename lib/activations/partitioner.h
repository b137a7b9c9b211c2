// Compiled blocks (issue 42): what AOTAutograd's min-cut partitioner saves for
// the backward of a compiled module's call, where eager autograd saves what
// each op's derivative asks for. torch.compile traces the call's forward and
// backward as one joint graph and min_cut_rematerialization_partition
// (torch/_functorch/partitioners.py, torch 2.13 defaults) chooses which
// forward values to save as a minimum cut between the call's inputs and the
// values the backward reads: cheap ops (the recomputable allowlist, pointwise
// ones) are recomputed in the backward from what is saved; matmuls,
// attention, random ops, large reductions and values a matmul's backward
// reads are saved.
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
  bool banned = false;   // may not be recomputed (should_ban_recomputation)
  bool needed = false;   // the backward reads it
  bool materialized = false;  // a forward user cannot fuse with it (is_materialized): weight x1, else x2
  std::vector<int32_t> users;
};

// Per value, whether the partitioner saves it (solve_min_cut: node
// capacities _size_of x 1.1^dist_from_bw, doubled where not materialized;
// parameters free; primals and banned values tied to the source, values the
// backward reads to the sink).
std::vector<bool> partitioner_saves(const std::vector<CutValue>& values);

// get_default_op_list(): whether the partitioner may recompute the node's op
// (its allowlist, or the ops a composite pre-dispatch op such as softmax or
// layer_norm decomposes into under inductor's decompositions are all on it),
// and whether it fuses (recomputable or random).
bool recomputable_node(const WalkNode& node);
bool fusible_node(const WalkNode& node);

}  // namespace fsdp_plan
