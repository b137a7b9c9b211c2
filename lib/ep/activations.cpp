#include "ep/activations.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string_view>

#include "activations/walk_rules.h"
#include "model/dtype.h"
#include "plan/plan.h"

namespace fsdp_plan {
namespace {

// Ops whose output is their first input's data in another shape or dtype:
// an expert weight's dim 0 stays the experts' through them.
bool weight_view(const std::string& op) {
  static const char* const kViews[] = {"aten.transpose.", "aten.permute.", "aten.view.",      "aten._unsafe_view.",
                                       "aten.reshape.",   "aten.expand.",  "aten.unsqueeze.", "aten.squeeze.",
                                       "aten.t.",         "aten._to_copy.", "aten.to.",       "aten.alias.",
                                       "aten.clone.",     "aten.contiguous.", "aten.type_as.", "aten.slice."};
  return std::any_of(std::begin(kViews), std::end(kViews), [&](const char* v) { return op.rfind(v, 0) == 0; });
}

// Ops that write routed rows back into the tokens' tensor (the combine's
// index_add in transformers' and torchtitan's MoE): their output is the tokens'.
bool returns_to_tokens(std::string_view base) {
  static constexpr std::string_view kOps[] = {"index_add", "index_add_", "index_put", "index_put_", "index_copy",
                                              "index_copy_", "scatter", "scatter_", "scatter_add", "scatter_add_"};
  return std::find(std::begin(kOps), std::end(kOps), base) != std::end(kOps);
}

// Skewed routing (expert_parallel.imbalance): the busiest rank's experts
// receive imbalance x the routed rows. Its routed tensors are those of a MoE
// block between the dispatch and the combine: made of rows gathered from an
// activation (an index of a floating tensor: the dispatch's permutation), or
// of routed tensors, and read on the way to an expert weight (the experts'
// last matmul's output goes back by the combine, and what follows it is the
// tokens' again: torchtitan's token_dispatcher.py combines before the
// unpermute and, after the experts, the routing weights). Each is the graph's
// with its outermost dimension (the largest stride) imbalance x as long.
class RoutedRows {
 public:
  RoutedRows(const WalkGraph& g, const Plan& plan) : g_(g), ep_(*plan.expert_parallel) {
    const ModuleTree& tree = *plan.tree;
    block_.assign(tree.num_modules(), -1);
    for (size_t i = 0; i < ep_.modules.size(); ++i)
      if (ep_.modules[i].sizes_known) block_[static_cast<size_t>(ep_.modules[i].moe)] = static_cast<int>(i);
    for (ModuleId m : tree.preorder())  // parents first: a module inherits its block
      if (const ModuleId p = tree.module(m).parent; block_[static_cast<size_t>(m)] < 0 && p >= 0)
        block_[static_cast<size_t>(m)] = block_[static_cast<size_t>(p)];
    weight_.assign(g.tensors.size(), false);
    expert_weight_.assign(g.tensors.size(), false);
    for (const WalkPlaceholder& ph : g.placeholders) {
      if (ph.kind == WalkInput::UserInput || ph.tensor < 0) continue;
      weight_[static_cast<size_t>(ph.tensor)] = true;
      if (ph.kind == WalkInput::Parameter && ph.param >= 0 && static_cast<size_t>(ph.param) < ep_.expert_of.size() &&
          ep_.is_expert(ph.param))
        expert_weight_[static_cast<size_t>(ph.tensor)] = true;
    }
    made_in_.assign(g.tensors.size(), -1);
    routed_.assign(g.tensors.size(), false);
    token_shapes_.resize(ep_.modules.size());
  }

  // The routed tensors not in `local` yet, scaled, appended to `out`.
  void add(LocalTensors& out, std::vector<int32_t>& local) {
    for (const WalkNode& n : g_.nodes) visit(n);
    const std::vector<bool> feeds = feeds_experts();
    for (size_t t = 0; t < routed_.size(); ++t) {
      if (!routed_[t] || !feeds[t] || local[t] >= 0 || g_.tensors[t].sizes.empty()) continue;
      WalkTensor w = g_.tensors[t];
      size_t outer = 0;
      for (size_t d = 1; d < w.sizes.size() && w.strides.size() == w.sizes.size(); ++d)
        if (w.strides[d] > w.strides[outer]) outer = d;
      w.sizes[outer] = static_cast<int64_t>(std::ceil(ep_.imbalance * static_cast<double>(w.sizes[outer])));
      local[t] = static_cast<int32_t>(out.size());
      out.emplace_back(static_cast<int32_t>(t), std::move(w));
    }
  }

 private:
  // Per tensor: whether an expert weight (or a view of one) is computed with
  // it, or with what is made of it.
  std::vector<bool> feeds_experts() const {
    std::vector<bool> feeds(g_.tensors.size(), false);
    for (auto n = g_.nodes.rbegin(); n != g_.nodes.rend(); ++n) {
      bool on = false;
      for (const WalkArg& a : n->args)
        for (int32_t t : a.tensors) on = on || (t >= 0 && expert_weight_[static_cast<size_t>(t)]);
      for (int32_t o : n->outputs) on = on || (o >= 0 && feeds[static_cast<size_t>(o)]);
      if (!on) continue;
      for (const WalkArg& a : n->args)
        for (int32_t t : a.tensors)
          if (t >= 0 && !expert_weight_[static_cast<size_t>(t)]) feeds[static_cast<size_t>(t)] = true;
    }
    return feeds;
  }

  bool floating(int32_t t) const {
    const DtypeInfo* d = g_.tensors[static_cast<size_t>(t)].dtype;
    return d && is_floating_dtype(d->name);
  }

  void visit(const WalkNode& n) {
    const int b = n.module >= 0 ? block_[static_cast<size_t>(n.module)] : -1;
    bool from_routed = false;
    for (const WalkArg& a : n.args)
      for (int32_t t : a.tensors) {
        if (t < 0) continue;
        from_routed = from_routed || routed_[static_cast<size_t>(t)];
        if (b >= 0 && made_in_[static_cast<size_t>(t)] != b && !weight_[static_cast<size_t>(t)] && floating(t))
          token_shapes_[static_cast<size_t>(b)].insert(g_.tensors[static_cast<size_t>(t)].sizes);
      }
    const std::string_view base = aten_op_base(n.op);
    const int32_t first = n.args.empty() || n.args[0].tensors.empty() ? -1 : n.args[0].tensors[0];
    if (first >= 0 && expert_weight_[static_cast<size_t>(first)] && weight_view(n.op))
      for (int32_t o : n.outputs)
        if (o >= 0) expert_weight_[static_cast<size_t>(o)] = true;
    const bool gathers = (base == "index" || base == "index_select") && first >= 0 &&
                         !weight_[static_cast<size_t>(first)] && floating(first);
    for (int32_t o : n.outputs) {
      if (o < 0) continue;
      made_in_[static_cast<size_t>(o)] = b;
      if (b < 0 || !floating(o)) continue;
      // With top_k 1 the routed rows have the tokens' shape: only the write-back returns them.
      const bool tokens = returns_to_tokens(base) ||
                          (ep_.modules[static_cast<size_t>(b)].top_k > 1 &&
                           token_shapes_[static_cast<size_t>(b)].count(g_.tensors[static_cast<size_t>(o)].sizes) > 0);
      routed_[static_cast<size_t>(o)] = gathers || (from_routed && !tokens);
    }
  }

  const WalkGraph& g_;
  const ExpertParallelPlan& ep_;
  std::vector<int> block_;       // per module: the expert module whose MoE block holds it, or -1
  std::vector<bool> weight_;     // per tensor: a parameter, buffer or constant
  std::vector<bool> expert_weight_;  // per tensor: an expert parameter or a view of one
  std::vector<int> made_in_;     // per tensor: the block of the node that made it, or -1
  std::vector<bool> routed_;
  std::vector<std::set<std::vector<int64_t>>> token_shapes_;  // per block: shapes it reads from outside
};

}  // namespace

LocalTensors ep_local_tensors(const WalkGraph& graph, const Plan& plan) {
  const ExpertParallelPlan& ep = *plan.expert_parallel;
  LocalTensors out;
  // Per tensor: its index in `out`, where rank 0's dim 0 is not the export's.
  std::vector<int32_t> local(graph.tensors.size(), -1);
  auto shrink = [&](int32_t t, int64_t whole, int64_t to) {
    WalkTensor w = graph.tensors[static_cast<size_t>(t)];
    if (w.sizes.empty() || w.sizes[0] != whole || to == whole) return;
    w.sizes[0] = to;
    local[static_cast<size_t>(t)] = static_cast<int32_t>(out.size());
    out.emplace_back(t, std::move(w));
  };
  for (const WalkPlaceholder& ph : graph.placeholders) {
    if (ph.kind != WalkInput::Parameter || ph.param < 0 || ph.tensor < 0 || !ep.is_expert(ph.param)) continue;
    const std::vector<int64_t>& shape = ep.local_shape[static_cast<size_t>(ph.param)];
    const std::vector<int64_t>& sizes = graph.tensors[static_cast<size_t>(ph.tensor)].sizes;
    if (!sizes.empty() && !shape.empty()) shrink(ph.tensor, sizes[0], shape[0]);
  }
  for (const WalkNode& n : graph.nodes) {
    if (n.args.empty() || n.args[0].tensors.empty()) continue;
    const int32_t in = n.args[0].tensors[0];
    // The op's name last: it is compared with every view's, and few nodes read an expert weight.
    if (in < 0 || local[static_cast<size_t>(in)] < 0 || !weight_view(n.op)) continue;
    const int64_t whole = graph.tensors[static_cast<size_t>(in)].sizes[0];
    const int64_t to = out[static_cast<size_t>(local[static_cast<size_t>(in)])].second.sizes[0];
    for (int32_t o : n.outputs)
      if (o >= 0) shrink(o, whole, to);
  }
  if (ep.imbalance != 1.0) RoutedRows(graph, plan).add(out, local);
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

LocalWalkTensors ep_local_tensors(const Plan& plan) {
  if (!plan.expert_parallel || plan.mesh.size(MeshDim::Ep) <= 1) return {};
  return [&plan](const WalkGraph& g) { return ep_local_tensors(g, plan); };
}

}  // namespace fsdp_plan
