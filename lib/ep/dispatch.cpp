#include "ep/dispatch.h"

#include <optional>

#include "model/dtype.h"
#include "model/graph.h"

namespace fsdp_plan {
namespace {

// The graph's reads, node by node: each tensor argument a node of a root's
// subtree takes from outside it (a user input, or a value made by a node
// outside), in execution order. `visit` returns true to stop. Each root's
// nodes are listed once, in one pass over the graph (a pass per root was a
// twentieth of DeepSeek-V3's plan: 58 MoE layers x 2 roots x every node).
class OutsideReads {
 public:
  OutsideReads(const ModuleTree& tree, const std::vector<ModuleId>& roots) : tree_(tree), g_(*tree.graph()) {
    weight_.assign(static_cast<size_t>(g_.num_values()), false);
    for (const GraphInput& in : g_.inputs())
      if (in.value >= 0 && in.kind != InputKind::UserInput) weight_[static_cast<size_t>(in.value)] = true;
    slot_.assign(tree.num_modules(), -1);
    for (ModuleId r : roots)
      if (slot_[static_cast<size_t>(r)] < 0) {
        slot_[static_cast<size_t>(r)] = static_cast<int>(nodes_.size());
        nodes_.emplace_back();
      }
    for (NodeId n = 0; n < g_.num_nodes(); ++n)
      for (ModuleId m = g_.node(n).module; m >= 0; m = tree.module(m).parent)
        if (const int s = slot_[static_cast<size_t>(m)]; s >= 0) nodes_[static_cast<size_t>(s)].push_back(n);
  }

  // The nodes of `root`'s subtree in execution order (root one of the constructor's).
  const std::vector<NodeId>& nodes(ModuleId root) const {
    return nodes_[static_cast<size_t>(slot_[static_cast<size_t>(root)])];
  }

  template <class Visit>
  void each(ModuleId root, Visit visit) const {
    for (NodeId n : nodes(root)) {
      for (const GraphArg& a : g_.args(n)) {
        if (a.kind == ArgKind::Tensor && outside(static_cast<ValueId>(a.i), root) && visit(n, static_cast<ValueId>(a.i)))
          return;
        if (a.kind != ArgKind::Tensors) continue;
        for (ValueId v : g_.arg_values(a))
          if (outside(v, root) && visit(n, v)) return;
      }
    }
  }

 private:
  bool outside(ValueId v, ModuleId root) const {
    if (!g_.is_tensor(v) || weight_[static_cast<size_t>(v)]) return false;
    const NodeId p = g_.value(v).producer;
    return p == kNone || !tree_.within(g_.node(p).module, root);
  }
  const ModuleTree& tree_;
  const Graph& g_;
  std::vector<bool> weight_;
  std::vector<int> slot_;                  // per module: its index into nodes_, or -1
  std::vector<std::vector<NodeId>> nodes_;
};

const DtypeInfo* dtype_of(const Graph& g, ValueId v) { return dtype_from_export_code(g.tensor(v).dtype); }

// The routed tokens: the first floating tensor the routing module reads from outside, [..., hidden].
bool size_tokens(const Graph& g, const OutsideReads& reads, const DimValues& dims, ExpertModule& x) {
  bool found = false;
  reads.each(x.moe, [&](NodeId, ValueId v) {
    const DtypeInfo* d = dtype_of(g, v);
    if (!d || !is_floating_dtype(d->name) || g.tensor(v).rank < 1) return false;
    x.hidden = dims.size(v, -1);
    x.tokens = x.hidden > 0 ? dims.numel(v) / x.hidden : 0;
    x.dtype = d->name;
    x.itemsize = d->itemsize;
    return found = true;
  });
  return found;
}

// top_k: the routing indices the experts module reads ([tokens, k], an
// integer tensor), else the k of the router's aten.topk.
std::optional<int64_t> graph_top_k(const Graph& g, const OutsideReads& reads, const DimValues& dims,
                                   const ExpertModule& x) {
  std::optional<int64_t> k;
  reads.each(x.module, [&](NodeId, ValueId v) {
    const DtypeInfo* d = dtype_of(g, v);
    if (!d || is_floating_dtype(d->name) || g.tensor(v).rank != 2 || dims.size(v, 0) != x.tokens) return false;
    k = dims.size(v, 1);
    return true;
  });
  if (k) return k;
  for (NodeId n : reads.nodes(x.moe)) {
    if (k) break;
    if (g.op_name(g.node(n).op) != "aten.topk.default") continue;
    if (const GraphArg* a = g.arg(n, "k"); a && (a->kind == ArgKind::Int || a->kind == ArgKind::SymInt))
      k = dims.eval(g.arg_ints(*a)[0]);
  }
  return k;
}

}  // namespace

void size_dispatch(const ModuleTree& tree, const Policy& policy,
                   const std::vector<std::pair<std::string, int64_t>>& rank_dims, ExpertParallelPlan& plan) {
  if (!tree.graph()) {
    for (ExpertModule& x : plan.modules)
      x.unknown_reason = "no op graph (a TorchScript model): the all-to-all's rows come from a .pt2's graph";
    return;
  }
  const Graph& g = *tree.graph();
  const DimValues dims = DimValues::hints(g, rank_dims);
  std::vector<ModuleId> roots;
  for (const ExpertModule& x : plan.modules) roots.insert(roots.end(), {x.moe, x.module});
  const OutsideReads reads(tree, roots);
  const auto& mp = policy.mixed_precision;
  for (ExpertModule& x : plan.modules) {
    if (!size_tokens(g, reads, dims, x)) {
      x.unknown_reason = "the graph shows no tokens entering " + tree.path(x.moe);
      continue;
    }
    std::optional<int64_t> k = policy.expert_parallel->top_k;
    if (!k) k = graph_top_k(g, reads, dims, x);
    if (!k) {
      x.unknown_reason = "the graph shows no routing indices or aten.topk for " + tree.path(x.module) +
                         ": give \"expert_parallel.top_k\"";
      continue;
    }
    x.top_k = *k;
    // FSDP2's param_dtype: the layers before compute in it, so the tokens arrive in it.
    if (mp && mp->param_dtype && dtype_itemsize(*mp->param_dtype) > 0) {
      x.dtype = *mp->param_dtype;
      x.itemsize = dtype_itemsize(*mp->param_dtype);
    }
    x.sizes_known = true;
  }
}

}  // namespace fsdp_plan
