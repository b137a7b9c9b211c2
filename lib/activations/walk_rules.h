// The activation walk's rules per operator (walk.h): backward temporaries,
// view strides after a restrided kernel output, gradient pass-through.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "activations/saved_ops.h"
#include "model/module_tree.h"

namespace fsdp_plan {

struct WalkGraph;

// Context parallelism (torch's context_parallel): SDPA as a ring over cp ranks.
struct RingAttention {
  int64_t cp = 1;          // 1: no ring
  bool all_gather = true;  // _cp_options.rotate_method ALL_GATHER, else ALL_TO_ALL
  bool head_tail = true;   // the head-tail load balancer runs (its partial steps and merges)
};

// What a node holds while it runs beyond its outputs (forward) and beyond the
// input gradients (backward): composite operators' backward temporaries
// (walk_rules.cpp), and with context parallelism an SDPA call's ring (the
// exchanged K/V, the merger's fp32 state; in backward the K/V ring again, the
// fp32 gradient accumulators and the gradients' ring: activations/ring_attention.h).
struct NodeExtra {
  int64_t forward = 0, backward = 0;
};
NodeExtra node_extra(std::string_view op, const char* case_name, const CallArgs& args, const RingAttention& ring);

// The op table's kernel output strides (saved_ops.h: op_output_strides), but
// dense for an SDPA whose ring hands rank 0 a merged output: with head-tail
// balancing its merges rebuild it with torch.cat (_partial_update).
std::optional<std::vector<int64_t>> kernel_output_strides(std::string_view op, const OpCase& c, const CallArgs& args,
                                                          const std::vector<const OpTensor*>& outs,
                                                          const SaveEnv& env, const RingAttention& ring);

// The view's strides from its input's, where the input's were corrected
// (graph_walk.py: _view_strides); nullopt when not derivable.
std::optional<std::vector<int64_t>> view_strides(std::string_view name, const OpTensor& t, const OpTensor& o,
                                                 const CallArgs& args);

// Operators whose backward returns the output's gradient itself to an input of the same size.
bool passes_gradient(std::string_view op);

// One call of a module as the walk sees it: a maximal run of consecutive graph nodes inside it.
struct NodeRun {
  ModuleId module = -1;
  int32_t first = 0, last = 0;  // nodes
};

// The calls of `modules` (each with its subtree; a node with no module, such
// as sym_size, stays in the call around it); `node_call` gets each node's call, -1: none.
std::vector<NodeRun> module_calls(const WalkGraph& g, const ModuleTree& tree, const std::vector<ModuleId>& modules,
                                     std::vector<int32_t>& node_call);

// "aten.transpose.int" -> "transpose"
std::string_view aten_op_base(std::string_view op);

}  // namespace fsdp_plan
