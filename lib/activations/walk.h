// The activation walk (issue 30): what autograd saves for backward, from a
// torch.export graph and the op table (saved_ops.h), and how those bytes rise
// and fall over a training step. tests/activations/graph_walk.py is its
// Python model; tests/activations/README.md "The walk" the rules:
//  1. placeholders: parameters (requires_grad as recorded, or as FSDP1's flat
//     parameter makes it), buffers and constants, user inputs, each its own
//     storage; parameters and user inputs are not activations;
//  2. nodes in order, arguments by schema name and the row's defaults; an
//     output aliases its argument's storage where the row says so (views,
//     in-place ops), else is a new storage; floating outputs require grad iff
//     the row records the call; the fused attention kernels' outputs take the
//     layout the row gives, and views after them strides derived from it;
//  3. a recorded call's saves, each storage once, attributed to the module of
//     the first node that saves it; an operator without a row saves all its
//     tensor arguments (a warning names it);
//  4. the forward's level at each node: saved storages, plus storages still to
//     be used (their last use is later) and the graph's outputs;
//  5. backward in reverse from the loss: each node's gradients for the inputs
//     that require grad appear, its outputs' gradients and the saves no
//     earlier node holds go; a parameter's gradient appears at the backward
//     of its last use in the forward and stays (the memory models free it),
//     counted in the run of the unit that owns it;
//  6. activation checkpointing: a checkpointed module call keeps only its
//     inputs made outside it; its backward starts by recomputing it, which
//     saves again what it saves;
//  8. compiled modules (WalkOptions::compiled, partitioner.h): a call's saves
//     are the partitioner's cut over what it reads and makes, each let go at
//     the backward of its first reader in the call;
//  7. selective checkpointing (WalkOptions::sac, selective.h): inside a
//     checkpointed call the outputs of the ops the policy saves are held too,
//     from the op to the call's recompute (then as long as autograd's saves in
//     the recompute hold them); the recompute runs the whole call
//     (torchtitan's early_stop=False), its working set (its saves so far and
//     the transients of the op then running) counted at its start.
// The walk reads WalkGraph, a neutral form of the graph evaluated at the
// plan's dimensions (activations/graph_input.h builds it from model/graph.h),
// so the rules are tested on hand-built graphs too.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "activations/saved_ops.h"
#include "activations/selective.h"
#include "activations/walk_rules.h"
#include "model/module_tree.h"
#include "plan/activations.h"
#include "util/warnings.h"

namespace fsdp_plan {

struct WalkTensor {
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  const DtypeInfo* dtype = nullptr;
  bool requires_grad = false;  // as recorded (parameters only, GRAPH.md item 1)
};

enum class WalkInput : uint8_t { Parameter, Buffer, Constant, UserInput };
struct WalkPlaceholder {
  int32_t tensor = -1;
  WalkInput kind = WalkInput::UserInput;
  TensorId param = -1;  // the tree's tensor for a parameter (or buffer), -1 if not known
};

// One argument: a tensor (tensor ids), a list of tensors (-1: a None entry),
// or a plain value, already evaluated (symbolic ints at the plan's dimensions).
struct WalkArg {
  std::string name;
  ArgValue value;                // plain values; tensors are filled in by the walk
  std::vector<int32_t> tensors;  // Tensor: one id; Tensors: the list
};

struct WalkNode {
  std::string op;                // "aten.linear.default", as the table names it
  std::vector<WalkArg> args;
  std::vector<int32_t> outputs;  // tensor ids; -1 for an output that is no tensor
  ModuleId module = -1;          // innermost module of nn_module_stack, -1: none recorded
  // `op`'s row in the op table (null: none), where `row_found`: walk_input
  // looks each node's up once per graph, where suggest walks it once per candidate.
  const OpRow* row = nullptr;
  bool row_found = false;
};

struct WalkGraph {
  std::vector<WalkTensor> tensors;
  std::vector<WalkPlaceholder> placeholders;
  std::vector<WalkNode> nodes;
  std::vector<int32_t> outputs;  // the graph's user outputs (tensor ids, -1 for non-tensors)
};

// A few tensors' rank-local metadata, by tensor id, ascending.
using LocalTensors = std::vector<std::pair<int32_t, WalkTensor>>;

// Tensor `t`'s metadata on this rank: `local`'s entry, else the graph's.
inline const WalkTensor& rank_tensor(const WalkGraph& g, const LocalTensors& local, int32_t t) {
  if (!local.empty()) {
    auto it = std::lower_bound(local.begin(), local.end(), t, [](const auto& e, int32_t id) { return e.first < id; });
    if (it != local.end() && it->first == t) return it->second;
  }
  return g.tensors[static_cast<size_t>(t)];
}

struct WalkOptions {
  SaveEnv env;
  std::vector<int> unit_of_module;      // per ModuleId: the unit its forward runs in
  std::vector<ModuleId> checkpointed;   // outermost checkpointed modules (activations.h)
  std::vector<bool> trainable_params;   // per tree TensorId: requires grad as the plan trains it; empty: as recorded
  // Per tree TensorId: the unit that owns the parameter (-1: none, ignored).
  // A run's backward peak counts the gradients its nodes make for its unit's
  // parameters (ActivationRun::backward_grads); empty: none counted.
  std::vector<int> unit_of_param;
  // Mixed precision: floating user inputs cast to this dtype in the forward
  // (FSDP's cast_forward_inputs): a copy, an activation where it is saved.
  const DtypeInfo* input_cast = nullptr;
  // Mixed precision: the forward runs in compute_dtype (param_dtype) where the
  // export recorded export_dtype (its parameters' floating dtype); walk.cpp: retype.
  const DtypeInfo* compute_dtype = nullptr;
  const DtypeInfo* export_dtype = nullptr;
  // Compiled modules (torch.compile, outermost): each call saves what
  // AOTAutograd's min-cut partitioner saves (partitioner.h).
  std::vector<ModuleId> compiled;
  double compile_memory_budget = 1;  // torch._functorch.config.activation_memory_budget
  // Selective checkpointing: every checkpointed call runs under this policy; nullptr: full AC.
  const SacPolicy* sac = nullptr;
  // Context parallelism: every SDPA call runs as torch's ring over `cp` ranks,
  // whose buffers live beside the call (walk_rules.h: ring_attention_extra).
  RingAttention ring;
  // Tensors whose metadata on this rank is not the graph's (activations.h: LocalWalkTensors).
  LocalTensors local_tensors;
};

// Walks `graph`; fills everything of `out` the graph decides (saved bytes per
// module and unit, the runs, the checkpointed modules' kept and recompute
// bytes, missing operators, the loss). Module ids are `tree`'s.
void walk_graph(const WalkGraph& graph, const ModuleTree& tree, size_t num_units, const WalkOptions& options,
                ActivationPlan& out, std::vector<Warning>* warnings);

}  // namespace fsdp_plan
