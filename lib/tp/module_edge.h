// What crosses a module's edge in the exported graph, for the styles whose
// collectives sit there rather than at a linear: torch's PrepareModuleInput
// (its inputs redistributed as the module is entered) and transformers'
// MoeExpertsParallel (the experts' inputs' gradients and output all-reduced).
#pragma once

#include <vector>

#include "model/graph.h"
#include "model/module_tree.h"

namespace fsdp_plan {

struct ModuleEdge {
  NodeId first = -1, last = -1;  // the module's (its subtree's) first and last graph node; -1: it never ran
  // Floating activations made by a node outside and read inside, in the order
  // first read (parameters, buffers and the batch are placeholders: not here).
  std::vector<ValueId> inputs;
  // Floating values made inside and read after the module's last node.
  std::vector<ValueId> outputs;
  // The module CommDebugMode names for a collective at the edge in backward,
  // the one whose backward it entered last: the subtree's first module (in
  // forward order) below the module itself whose node makes a value with a
  // gradient, else the module.
  ModuleId named_in_backward = -1;
};

// `grad`: per value, whether it carries a gradient (values_with_grad).
ModuleEdge module_edge(const Graph& g, const ModuleTree& tree, ModuleId module, const std::vector<bool>& grad);

}  // namespace fsdp_plan
