#include "plan/unused_params.h"

#include <algorithm>

#include "model/graph.h"

namespace fsdp_plan {

std::vector<TensorId> trainable_params_never_read(const ModuleTree& tree) {
  const std::shared_ptr<const Graph>& graph = tree.graph();
  if (!graph) return {};
  const Graph& g = *graph;
  std::vector<char> read(static_cast<size_t>(g.num_values()), 0);
  auto mark = [&](ValueId v) {
    if (v >= 0 && v < g.num_values()) read[static_cast<size_t>(v)] = 1;
  };
  for (NodeId n = 0; n < g.num_nodes(); ++n) {
    for (const GraphArg& a : g.args(n)) {
      if (a.kind == ArgKind::Tensor || a.kind == ArgKind::OptionalTensor) mark(static_cast<ValueId>(a.i));
      if (a.kind == ArgKind::Tensors || a.kind == ArgKind::OptionalTensors)
        for (ValueId v : g.arg_values(a)) mark(v);
    }
  }
  // A tensor is read if any of its placeholders is (a tied weight has one).
  std::vector<char> used(tree.num_tensors(), 0), listed(tree.num_tensors(), 0);
  for (const GraphInput& in : g.inputs()) {
    if (in.kind != InputKind::Parameter || in.tensor < 0 || static_cast<size_t>(in.tensor) >= tree.num_tensors())
      continue;
    listed[static_cast<size_t>(in.tensor)] = 1;
    if (in.value >= 0 && in.value < g.num_values() && read[static_cast<size_t>(in.value)])
      used[static_cast<size_t>(in.tensor)] = 1;
  }
  std::vector<TensorId> out;
  for (TensorId t = 0; t < static_cast<TensorId>(tree.num_tensors()); ++t)
    if (listed[static_cast<size_t>(t)] && !used[static_cast<size_t>(t)] && tree.tensor(t).requires_grad)
      out.push_back(t);
  return out;
}

void find_ungraded_params(Plan& plan) {
  plan.ungraded_params = trainable_params_never_read(*plan.tree);
  if (plan.ungraded_params.empty()) return;
  for (const Unit& u : plan.units) {
    for (const Owned& o : u.params) {
      if (!std::binary_search(plan.ungraded_params.begin(), plan.ungraded_params.end(), o.tensor)) continue;
      const std::string name = plan.param_name(o);
      plan.warnings.push_back(make_warning(
          "fsdp2_unused_param",
          "trainable parameter " + name + " is never read by the exported forward: autograd gives it no "
              "gradient, so FSDP2 leaves it out of its group's reduce-scatter and the optimizer keeps no state "
              "for it (planned so); if training reads it (another input, a branch the export did not take), "
              "export with those inputs"));
      plan.warnings.back().modules = {plan.tree->path(o.module)};
      plan.warnings.back().params = {name};
    }
  }
}

bool receives_gradient(const Plan& plan, TensorId t) {
  return plan.tree->tensor(t).requires_grad &&
         !std::binary_search(plan.ungraded_params.begin(), plan.ungraded_params.end(), t);
}

}  // namespace fsdp_plan
