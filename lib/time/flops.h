// A training step's FLOPs per module from a .pt2 graph (issue 27, item 2),
// counted as torch.utils.flop_counter.FlopCounterMode counts them (torch
// 2.13): only the ops of its flop_registry, after composite ops (linear,
// matmul) decompose to mm / bmm / addmm; a multiply-add is 2 FLOPs; every
// other op (elementwise, norms, softmax, embedding, the loss) is 0, but for
// the grouped matmuls of MoE experts (aten._grouped_mm, transformers'
// grouped_mm_fallback), which it counts 0 and which are counted as the
// matmuls they run.
// tests/timing/FLOPS.md gives the table and graph_flops.py its Python model;
// tests/timing/test_plan_flops.py checks the plan against FlopCounterMode.
//
//  - forward: each FLOP op's formula on its argument shapes, at the plan's
//    dimensions;
//  - backward: what autograd's backward ops count: per operand that needs a
//    gradient one more product of the forward's size (mm's backward: two mm
//    when both operands need one, one for a frozen weight); the fused
//    attention kernels' backward formula (five bmm); a gradient flows from
//    the trainable parameters through every floating output;
//  - activation checkpointing: each checkpointed call's forward FLOPs again
//    in backward, up to the op that saves the call's last saved tensor
//    (non-reentrant checkpointing stops its recompute there).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "activations/walk.h"
#include "model/module_tree.h"
#include "plan/flops.h"

namespace fsdp_plan {

struct Plan;
class Graph;

// One node's FLOPs (FlopCounterMode's formulas), given which of its tensor
// arguments need a gradient. `counted` false: an op FlopCounterMode counts
// nothing for (its FLOPs are 0).
struct NodeFlops {
  int64_t forward = 0, backward = 0;
  bool counted = false;
  bool beyond_counter = false;  // counted where FlopCounterMode counts 0 (grouped matmuls)
};

NodeFlops node_flops(const WalkGraph& graph, const WalkNode& node, const std::vector<bool>& needs_grad);

struct GraphFlopOptions {
  std::vector<ModuleId> checkpointed;  // outermost checkpointed modules (activations.h)
  // Selective checkpointing (activations/selective.h): each call is recomputed
  // whole (torchtitan's early_stop=False) but for the nodes the policy saved
  // (ActivationPlan::sac_saved_nodes), which its cache hands back.
  bool selective = false;
  std::vector<int32_t> sac_saved_nodes;
  // Compiled calls: the nodes their backward runs again (ActivationPlan::compiled_recomputed_nodes).
  std::vector<int32_t> compiled_recomputed;
  std::vector<bool> trainable_params;  // per tree TensorId; empty: requires_grad as recorded
  // Tensor parallelism (tp/local.h): per graph tensor, whether a rank holds a
  // 1/tp share; an op with such an argument counts 1/tp of its FLOPs.
  std::vector<bool> tp_local;
  int64_t tp = 1;
  // Context parallelism: the graph runs at seq / cp, and attention's queries
  // meet every rank's keys (the ring), cp times the local ones.
  int64_t cp = 1;
};

// Per module its own FLOPs (not its submodules'), the forward's execution
// order and what the count leaves out, from a graph evaluated at the plan's
// dimensions. Module ids are `tree`'s. `source` and the dims are left to the caller.
// A count beyond int64 throws (plan_graph_flops turns it into an InputError).
FlopProfile count_graph_flops(const WalkGraph& graph, const ModuleTree& tree, const GraphFlopOptions& options);

// The plan's FLOPs from the model's .pt2 graph (plan.tree->graph() must be
// set): the plan's --dim values, its checkpointed modules and the parameters
// it trains. Source "graph".
FlopProfile plan_graph_flops(const Plan& plan, const Graph& graph);

}  // namespace fsdp_plan
