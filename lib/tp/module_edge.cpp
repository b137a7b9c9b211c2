#include "tp/module_edge.h"

#include <algorithm>

#include "model/dtype.h"

namespace fsdp_plan {
namespace {

bool floating(const Graph& g, ValueId v) {
  const DtypeInfo* dt = dtype_from_export_code(g.tensor(v).dtype);
  return dt && is_floating_dtype(dt->name);
}

}  // namespace

ModuleEdge module_edge(const Graph& g, const ModuleTree& tree, ModuleId module, const std::vector<bool>& grad) {
  ModuleEdge e;
  e.named_in_backward = module;
  std::vector<bool> in(tree.num_modules(), false);
  for (ModuleId m : tree.preorder(module)) in[static_cast<size_t>(m)] = true;
  auto inside = [&](NodeId n) { return in[static_cast<size_t>(g.node(n).module)]; };
  for (NodeId n = 0; n < g.num_nodes(); ++n)
    if (inside(n)) {
      if (e.first < 0) e.first = n;
      e.last = n;
    }
  if (e.first < 0) return e;
  bool named = false;
  for (NodeId n = e.first; n <= e.last; ++n) {
    if (!inside(n)) continue;
    for (const GraphArg& a : g.args(n)) {
      if (a.kind != ArgKind::Tensor || a.i < 0) continue;
      const ValueId v = static_cast<ValueId>(a.i);
      const NodeId p = g.value(v).producer;
      if (p == kNone || inside(p) || !floating(g, v)) continue;
      if (std::find(e.inputs.begin(), e.inputs.end(), v) == e.inputs.end()) e.inputs.push_back(v);
    }
    if (!named && g.node(n).module != module)
      for (ValueId v : g.outputs(n))
        if (v >= 0 && grad[static_cast<size_t>(v)]) named = true, e.named_in_backward = g.node(n).module;
  }
  std::vector<bool> made(static_cast<size_t>(g.num_values()), false);
  for (NodeId n = e.first; n <= e.last; ++n)
    if (inside(n))
      for (ValueId v : g.outputs(n))
        if (v >= 0) made[static_cast<size_t>(v)] = true;
  for (NodeId n = e.last + 1; n < g.num_nodes(); ++n)
    for (const GraphArg& a : g.args(n))
      if (a.kind == ArgKind::Tensor && a.i >= 0 && made[static_cast<size_t>(a.i)] &&
          floating(g, static_cast<ValueId>(a.i)) &&
          std::find(e.outputs.begin(), e.outputs.end(), static_cast<ValueId>(a.i)) == e.outputs.end())
        e.outputs.push_back(static_cast<ValueId>(a.i));
  return e;
}

}  // namespace fsdp_plan
