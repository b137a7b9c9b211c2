#include "tp/comm.h"

#include <algorithm>
#include <optional>

#include "model/dtype.h"
#include "model/graph.h"
#include "plan/plan.h"
#include "tp/module_edge.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

// A style's layout as the policy writes it: "replicate" or "shard(d)".
bool is_shard(const std::optional<std::string>& layout) { return layout && layout->rfind("shard", 0) == 0; }

// Which graph values carry a gradient: the trainable parameters (the only
// tensors the export marks requires_grad, GRAPH.md 1) and whatever is
// computed from one. A Replicate input without a gradient sends none back.
std::vector<bool> values_with_grad(const Graph& g) {
  std::vector<bool> grad(static_cast<size_t>(g.num_values()), false);
  for (ValueId v = 0; v < g.num_values(); ++v)
    if (g.is_tensor(v) && g.value(v).producer == kNone && g.tensor(v).requires_grad) grad[static_cast<size_t>(v)] = true;
  for (NodeId n = 0; n < g.num_nodes(); ++n) {
    bool any = false;
    for (const GraphArg& a : g.args(n)) {
      if (a.kind == ArgKind::Tensor || a.kind == ArgKind::OptionalTensor) {
        if (a.i >= 0 && grad[static_cast<size_t>(a.i)]) any = true;
      } else if (a.kind == ArgKind::Tensors || a.kind == ArgKind::OptionalTensors) {
        for (ValueId v : g.arg_values(a))
          if (v >= 0 && grad[static_cast<size_t>(v)]) any = true;
      }
    }
    if (!any) continue;
    for (ValueId v : g.outputs(n))
      if (v >= 0) grad[static_cast<size_t>(v)] = true;
  }
  return grad;
}

// The layouts' DTensor-ness at a styled module's output (style.py: each
// style's _prepare_output_fn): ColwiseParallel / RowwiseParallel hand on the
// local tensor unless use_local_output is false; SequenceParallel a DTensor
// unless it is true. The Prepare* styles' layouts are not in the policy.
bool output_is_dtensor(const TpStyleSpec& s) {
  switch (s.style) {
    case TpStyle::Colwise:
    case TpStyle::Rowwise: return !s.use_local_output.value_or(true);
    case TpStyle::SequenceParallel: return !s.use_local_output.value_or(false);
    case TpStyle::Replicate: return false;
    // transformers' styles hand on plain tensors (EmbeddingParallel's to_local,
    // MoeExpertsParallel's all-reduced output); the packed ones hook no forward.
    case TpStyle::EmbeddingRowwise:
    case TpStyle::PackedColwise:
    case TpStyle::PackedRowwise:
    case TpStyle::MoeExperts:
    case TpStyle::GradAllReduce: return false;
    case TpStyle::PrepareModuleInput:
    case TpStyle::PrepareModuleOutput: return true;
  }
  return true;
}

bool inside(const ModuleTree& tree, ModuleId m, ModuleId ancestor) {
  for (; m >= 0; m = tree.module(m).parent)
    if (m == ancestor) return true;
  return false;
}

// The ops that save their inputs for backward on every path: a checkpointed
// region's last one stands for where the recompute stops (a linear; the MoE
// experts' grouped matmuls after the router's linear).
bool is_matmul(const std::string& op) {
  return op == "aten.linear.default" || op == "aten.mm.default" || op == "aten.bmm.default" ||
         op == "aten.matmul.default" || op == "aten._grouped_mm.default" ||
         op == "transformers.grouped_mm_fallback.default";
}

// The nearest module at or above `m` a plan entry styled, below `stop` (the
// styled module whose inputs are asked about: its own ancestors do not
// redistribute what flows inside them); -1 if none.
ModuleId styled_at_or_above(const ModuleTree& tree, const std::vector<int>& entry_of, ModuleId m, ModuleId stop) {
  for (; m >= 0 && !inside(tree, stop, m); m = tree.module(m).parent)
    if (entry_of[static_cast<size_t>(m)] >= 0) return m;
  return -1;
}

// Which values are DTensors, as torch runs the styled model: everything
// computed inside a styled module (its input made a DTensor by
// _prepare_input_fn, its parameters DTensors), a value leaving one as its
// _prepare_output_fn leaves it (output_is_dtensor), and what a plain op
// computes from a DTensor.
class DTensorFlow {
 public:
  DTensorFlow(const ModuleTree& tree, const Graph& g, const TensorParallel& policy_tp, const std::vector<int>& entry_of)
      : tree_(tree), g_(g), policy_tp_(policy_tp), entry_of_(entry_of),
        dt_(static_cast<size_t>(g.num_values()), false) {
    for (NodeId n = 0; n < g.num_nodes(); ++n) {
      const ModuleId m = g.node(n).module;
      bool any = styled_at_or_above(tree, entry_of, m, -1) >= 0;
      for (ValueId v : inputs(n)) any = any || seen(v, m);
      for (ValueId v : g.outputs(n))
        if (v >= 0) dt_[static_cast<size_t>(v)] = any;
    }
  }
  // The tensor values node n reads.
  std::vector<ValueId> inputs(NodeId n) const {
    std::vector<ValueId> vals;
    for (const GraphArg& a : g_.args(n)) {
      if (a.kind == ArgKind::Tensor || a.kind == ArgKind::OptionalTensor) {
        if (a.i >= 0) vals.push_back(static_cast<ValueId>(a.i));
      } else if (a.kind == ArgKind::Tensors || a.kind == ArgKind::OptionalTensors) {
        for (ValueId v : g_.arg_values(a))
          if (v >= 0) vals.push_back(v);
      }
    }
    return vals;
  }
  // The tensor v is: through a .to() that changes nothing (Tensor.to returns
  // self), which the export records as a node of the module it ran in (an
  // RMSNorm's .to(float32) of a float32 input is then the residual stream
  // the layer adds to, though torch's tensor never entered the norm's style).
  ValueId origin(ValueId v) const {
    for (;;) {
      const NodeId p = g_.value(v).producer;
      if (p == kNone || g_.op_name(g_.node(p).op).rfind("aten.to.", 0) != 0) return v;
      const ValueId in = g_.tensor_arg(p, "self");
      if (in < 0 || !g_.is_tensor(in) || g_.tensor(in).dtype != g_.tensor(v).dtype) return v;
      v = in;
    }
  }
  // Whether value v is a DTensor where a node in module `at` reads it.
  bool seen(ValueId v, ModuleId at) const {
    v = origin(v);
    const NodeId p = g_.value(v).producer;
    if (p == kNone) return false;  // a parameter, buffer or the batch, outside every style: a plain tensor
    const ModuleId s = styled_at_or_above(tree_, entry_of_, g_.node(p).module, at);
    if (s >= 0) return output_is_dtensor(style_of(s));  // it leaves styled module s
    return dt_[static_cast<size_t>(v)];
  }
  const TpStyleSpec& style_of(ModuleId m) const {
    return policy_tp_.plan[static_cast<size_t>(entry_of_[static_cast<size_t>(m)])].second;
  }

 private:
  const ModuleTree& tree_;
  const Graph& g_;
  const TensorParallel& policy_tp_;
  const std::vector<int>& entry_of_;
  std::vector<bool> dt_;
};

// Why a sequence_parallel module's redistributions are not followed, or ""
// when they are: SequenceParallel._prepare_input_fn makes a plain input a
// Shard(sequence_dim) DTensor with from_local (no collective; its gradient
// goes back with to_local, none either), but redistributes a DTensor input;
// its output stays a DTensor (use_local_output false), which only a colwise
// module that takes a sequence-sharded input (input_layouts shard: its
// all-gather, counted there) redistributes as counted. What else a DTensor
// meets is DTensor's sharding propagation, not followed here.
std::string sequence_parallel_unfollowed(const ModuleTree& tree, const Graph& g, const DTensorFlow& flow,
                                         const std::vector<int>& entry_of, ModuleId sp) {
  const bool dtensor_out = output_is_dtensor(flow.style_of(sp));
  // A PrepareModuleInput around the reader that takes a sharded input
  // redistributes it as it is entered (counted at its edge).
  auto prepared = [&](ModuleId m) {
    for (; m >= 0 && !inside(tree, sp, m); m = tree.module(m).parent) {
      if (entry_of[static_cast<size_t>(m)] < 0) continue;
      const TpStyleSpec& c = flow.style_of(m);
      if (c.style == TpStyle::PrepareModuleInput)
        for (const auto& l : c.prepare_layouts)
          if (is_shard(l)) return true;
    }
    return false;
  };
  for (NodeId n = 0; n < g.num_nodes(); ++n) {
    const bool in_sp = inside(tree, g.node(n).module, sp);
    for (ValueId read : flow.inputs(n)) {
      const ValueId v = flow.origin(read);
      const NodeId p = g.value(v).producer;
      if (p == kNone) continue;  // a parameter, buffer or the batch
      const bool from_sp = inside(tree, g.node(p).module, sp);
      if (in_sp && !from_sp && flow.seen(v, g.node(n).module)) {  // the module's input, a DTensor
        return "its input is a DTensor, which it redistributes";
      } else if (!in_sp && from_sp && dtensor_out) {  // its output, a DTensor, read outside
        const ModuleId s = styled_at_or_above(tree, entry_of, g.node(n).module, sp);
        const TpStyleSpec* c = s >= 0 ? &flow.style_of(s) : nullptr;
        if ((!c || c->style != TpStyle::Colwise || !is_shard(c->input_layouts)) && !prepared(g.node(n).module))
          return "its output DTensor reaches " + (s >= 0 ? path_or_root(tree.path(s)) : g.op_name(g.node(n).op)) +
                 ", whose redistribution DTensor decides";
      }
    }
  }
  return "";
}

// The walk over the exported graph that lists tensor parallelism's
// collectives in the order torch issues them: the forward's, then the
// backward's with each checkpointed region's recompute and FSDP2's
// post-backward gradient all-reduces where backward reaches them.
class TpCommWalk {
 public:
  TpCommWalk(const Plan& plan, const Graph& graph, TpComm& out)
      : plan_(plan), tpp_(*plan.tensor_parallel), policy_tp_(*plan.policy.tensor_parallel), tree_(*plan.tree),
        graph_(graph), out_(out), dims_(DimValues::hints(graph, plan.policy.activations.dims)),
        owner_(unit_of_modules(plan)), grad_(values_with_grad(graph)), entry_of_(tree_.num_modules(), -1),
        seen_(tree_.num_modules(), false) {
    // The style of each module parallelize_module applied one to (Linear and Embedding only carry collectives).
    for (const TpModule& m : tpp_.modules) entry_of_[static_cast<size_t>(m.module)] = m.entry;
  }

  // Activation checkpointing: each call's outermost checkpointed module, and
  // where its recompute stops (the region's last matmul).
  void find_checkpoint_regions() {
    region_.assign(tree_.num_modules(), -1);
    for (const CheckpointedModule& c : plan_.activations.checkpointed)
      for (ModuleId m : tree_.preorder(c.module)) region_[static_cast<size_t>(m)] = c.module;
    region_forward_.assign(tree_.num_modules(), {});
    last_matmul_.assign(tree_.num_modules(), -1);
    for (NodeId n = 0; n < graph_.num_nodes(); ++n) {
      const ModuleId r = region_[static_cast<size_t>(graph_.node(n).module)];
      if (r >= 0 && is_matmul(graph_.op_name(graph_.node(n).op))) last_matmul_[static_cast<size_t>(r)] = n;
    }
  }

  // Styles whose collectives sit at their module's edge (tp/module_edge.h).
  // transformers' MoeExpertsParallel (tensor_parallel.py): each rank runs its
  // share of every expert on the whole batch; the forward all-reduces the
  // experts' output (_AllReduceForward), the backward the gradients of their
  // hidden states and routing weights (_AllReduceBackward). torch's
  // PrepareModuleInput (style.py: _prepare_input_arg): each input given a
  // layout is redistributed to its desired one as the module is entered.
  void find_module_edges() {
    edges_.assign(tree_.num_modules(), ModuleEdge{});
    edge_at_first_.assign(static_cast<size_t>(graph_.num_nodes()), -1);
    edge_at_last_.assign(static_cast<size_t>(graph_.num_nodes()), -1);
    prepared_by_.assign(tree_.num_modules(), -1);  // the PrepareModuleInput with DTensor inputs above
    for (const TpModule& m : tpp_.modules) {
      const TpStyleSpec& spec = policy_tp_.plan[static_cast<size_t>(m.entry)].second;
      const bool prep = spec.style == TpStyle::PrepareModuleInput && !spec.prepare_layouts.empty();
      if (spec.style != TpStyle::MoeExperts && !prep) continue;
      ModuleEdge& e = edges_[static_cast<size_t>(m.module)];
      e = module_edge(graph_, tree_, m.module, grad_);
      if (e.first < 0) continue;
      if (prep) {
        size_t given = 0;
        for (const auto& l : spec.prepare_layouts) given += l.has_value();
        if (given != e.inputs.size()) continue;  // not matched: listed in not_modelled
        if (!spec.use_local_output.value_or(false))  // its children get DTensors
          for (ModuleId c : tree_.preorder(m.module)) prepared_by_[static_cast<size_t>(c)] = m.module;
      }
      edge_at_first_[static_cast<size_t>(e.first)] = m.module;
      edge_at_last_[static_cast<size_t>(e.last)] = m.module;
    }
  }

  // Forward, node by node: the edge styles' collectives, the gradient
  // all-reduce hooks, and each styled linear / embedding call's
  // redistributions; the backward's are kept, in forward order, for later.
  void walk_forward() {
    for (NodeId n = 0; n < graph_.num_nodes(); ++n) {
      const GraphNode& node = graph_.node(n);
      edge_collectives(n);
      const int e = entry_of_[static_cast<size_t>(node.module)];
      if (e < 0) continue;
      const TpStyleSpec& spec = policy_tp_.plan[static_cast<size_t>(e)].second;
      if (spec.style == TpStyle::GradAllReduce) {
        grad_all_reduces(n, node.module);
        continue;
      }
      if (colwise_like(spec.style) || rowwise_like(spec.style)) linear_collectives(n, spec);
    }
  }

  // A sequence_parallel module's Replicate parameters get Partial gradients
  // (its input is sharded on the sequence: a norm's weight gradient sums the
  // rank's tokens only). FSDP2's post-backward makes each Replicate before
  // its reduce-scatter (torch/distributed/fsdp/_fully_shard/_fsdp_param.py:
  // FSDPParam._get_grad_inner_tensor: grad.redistribute, an all-reduce on
  // the tp group), parameter by parameter in the unit's order, in the
  // gradient's dtype (the unsharded parameter's: param_dtype under mixed
  // precision). The post-backward runs when backward leaves the unit: after
  // the backward of its first forward op that carries a gradient, whose
  // module CommDebugMode names for it (the last module backward entered).
  void find_post_backward_all_reduces() {
    unit_first_.assign(plan_.units.size(), graph_.num_nodes());
    for (NodeId n = graph_.num_nodes(); n-- > 0;) {
      bool carries = false;
      for (ValueId v : graph_.outputs(n))
        if (v >= 0 && grad_[static_cast<size_t>(v)]) carries = true;
      if (!carries) continue;
      for (int u = owner_[static_cast<size_t>(graph_.node(n).module)]; u >= 0;
           u = plan_.units[static_cast<size_t>(u)].parent)
        unit_first_[static_cast<size_t>(u)] = n;
    }
    std::vector<bool> runs(tree_.num_modules(), false);  // a module some graph node ran in (or below)
    for (NodeId n = 0; n < graph_.num_nodes(); ++n)
      for (ModuleId m = graph_.node(n).module; m >= 0 && !runs[static_cast<size_t>(m)]; m = tree_.module(m).parent)
        runs[static_cast<size_t>(m)] = true;
    post_backward_.assign(plan_.units.size(), {});
    for (size_t u = 0; u < plan_.units.size(); ++u) {
      const Unit& unit = plan_.units[u];
      for (const Owned& o : unit.params) {
        const int e = entry_of_[static_cast<size_t>(o.module)];
        if (e < 0 || policy_tp_.plan[static_cast<size_t>(e)].second.style != TpStyle::SequenceParallel) continue;
        const TensorInfo& info = tree_.tensor(o.tensor);
        if (!info.requires_grad || !runs[static_cast<size_t>(o.module)] || unit_first_[u] >= graph_.num_nodes()) continue;
        if (tpp_.placement[static_cast<size_t>(o.tensor)].kind != TpPlacement::Kind::Replicate) continue;
        const std::string dtype = cast_dtype(unit, info.dtype);
        Collective c = collective(CollectiveKind::AllReduce, StepPhase::Backward, static_cast<int>(u),
                                  tree_.numel(o.tensor), dtype, "param_grad", graph_.node(unit_first_[u]).module);
        c.bytes = c.numel * (dtype_itemsize(dtype) > 0 ? dtype_itemsize(dtype) : info.itemsize);
        post_backward_[u].push_back(c);
      }
    }
    // Units in the order their post-backwards run: the later first op first, an inner unit before its parent.
    for (size_t u = 0; u < plan_.units.size(); ++u)
      if (!post_backward_[u].empty()) by_exit_.push_back(static_cast<int>(u));
    std::stable_sort(by_exit_.begin(), by_exit_.end(), [&](int a, int b) {
      const NodeId fa = unit_first_[static_cast<size_t>(a)], fb = unit_first_[static_cast<size_t>(b)];
      return fa != fb ? fa > fb : plan_.units[static_cast<size_t>(a)].depth > plan_.units[static_cast<size_t>(b)].depth;
    });
  }

  // Backward, with each checkpointed region's recompute first when backward
  // reaches it: its forward runs again, collectives included, but
  // non-reentrant checkpointing stops at the last op that saves a tensor
  // (torch/utils/checkpoint.py: _StopRecomputationError); the region's last
  // matmul stands for that op here (counted on HF's Llama: o_proj's
  // all-reduce recurs, down_proj's, after the last matmul, does not; on
  // Mixtral the experts' grouped matmuls come after the router's linear, and
  // their output's all-reduce does not recur). The recompute starts at the
  // first saved tensor backward unpacks, the last matmul's: what backward
  // does before it (a gradient's redistribution after that matmul, as a
  // rowwise output_grad all-gather) comes first (counted on sp_decoder.py:
  // down's all-gather, then the recompute).
  void walk_backward() {
    recomputed_.assign(tree_.num_modules(), false);
    for (size_t k = backward_.size(); k-- > 0;) {
      const NodeId n = backward_node_[k];
      leave_units_after(n);
      const ModuleId r = region_[static_cast<size_t>(backward_[k].module)];
      if (r >= 0) {
        const NodeId stop = last_matmul_[static_cast<size_t>(r)];
        if (n < stop || (n == stop && std::string(backward_[k].cause) != "output_grad")) recompute(r);
      }
      out_.collectives.push_back(backward_[k]);
    }
    for (const CheckpointedModule& c : plan_.activations.checkpointed) recompute(c.module);
    leave_units_after(-1);
  }

  // Styles this count does not follow: PrepareModuleOutput, a
  // PrepareModuleInput whose layouts do not match the activations it takes,
  // a sequence_parallel module whose input or output DTensor meets what is
  // not followed above, and a styled module the graph shows no linear /
  // embedding call for.
  void list_not_modelled() {
    std::optional<DTensorFlow> flow;
    for (const TpModule& m : tpp_.modules) {
      const TpStyle s = policy_tp_.plan[static_cast<size_t>(m.entry)].second.style;
      if (s == TpStyle::Replicate) continue;
      std::string why;
      if (s == TpStyle::SequenceParallel) {
        if (!flow) flow.emplace(tree_, graph_, policy_tp_, entry_of_);
        why = sequence_parallel_unfollowed(tree_, graph_, *flow, entry_of_, m.module);
        if (why.empty()) continue;
      } else if ((colwise_like(s) || rowwise_like(s) || s == TpStyle::MoeExperts || s == TpStyle::GradAllReduce) &&
                 seen_[static_cast<size_t>(m.module)]) {
        continue;
      } else if (s == TpStyle::PrepareModuleInput) {
        const TpStyleSpec& spec = policy_tp_.plan[static_cast<size_t>(m.entry)].second;
        if (spec.prepare_layouts.empty() || seen_[static_cast<size_t>(m.module)]) continue;  // no layouts: a no-op
        why = "its layouts do not match the " + std::to_string(edges_[static_cast<size_t>(m.module)].inputs.size()) +
              " activation(s) the graph shows it takes";
      }
      out_.not_modelled.push_back(path_or_root(tree_.path(m.module)) + " (" + tp_style_names().name(s) +
                                  (why.empty() ? "" : ": " + why) + ")");
    }
  }

 private:
  struct Forward {
    NodeId node;
    Collective c;
  };

  // FSDP2's MixedPrecisionPolicy: parameters gathered (and forward inputs cast) in param_dtype.
  std::string cast_dtype(const Unit& u, std::string dtype) const {
    const auto& mp = plan_.policy.mixed_precision;
    if (mp && mp->param_dtype && u.mixed_precision.value_or(false)) return *mp->param_dtype;
    return dtype;
  }

  // A collective on the tp group; bytes at `dtype`'s itemsize (4 if unknown).
  Collective collective(CollectiveKind kind, StepPhase phase, int unit, int64_t numel, const std::string& dtype,
                        const char* cause, ModuleId module) const {
    Collective c;
    c.kind = kind;
    c.phase = phase;
    c.unit = unit;
    c.numel = numel;
    c.bytes = numel * (dtype_itemsize(dtype) > 0 ? dtype_itemsize(dtype) : 4);
    c.dtype = dtype;
    c.group = out_.group;
    c.cause = cause;
    c.module = module;
    return c;
  }

  // The backward collectives issued at forward node n, given in the order backward issues them.
  void add_backward(const std::vector<Collective>& bwd_here, NodeId n) {
    // Backward runs the calls in reverse: keep each call's own order by pushing it reversed.
    for (size_t k = bwd_here.size(); k-- > 0;) {
      backward_.push_back(bwd_here[k]);
      backward_node_.push_back(n);
    }
  }

  // The forward collectives out_.collectives[first..] of node n in module m,
  // remembered for m's checkpointed region's recompute.
  void note_for_recompute(ModuleId m, NodeId n, size_t first) {
    if (const ModuleId r = region_[static_cast<size_t>(m)]; r >= 0) {
      auto& f = region_forward_[static_cast<size_t>(r)];
      for (size_t k = first; k < out_.collectives.size(); ++k) f.push_back({n, out_.collectives[k]});
    }
  }

  // The collectives of the edge styles whose module's first or last node is n.
  void edge_collectives(NodeId n) {
    const ModuleId at_first = edge_at_first_[static_cast<size_t>(n)], at_last = edge_at_last_[static_cast<size_t>(n)];
    for (const ModuleId m : {at_first, at_last == at_first ? ModuleId{-1} : at_last}) {
      if (m < 0) continue;
      seen_[static_cast<size_t>(m)] = true;
      const TpStyleSpec& spec = policy_tp_.plan[static_cast<size_t>(entry_of_[static_cast<size_t>(m)])].second;
      if (spec.style == TpStyle::MoeExperts)
        moe_experts_edge(n, m);
      else if (n == edges_[static_cast<size_t>(m)].first)
        prepare_module_input_edge(n, m, spec);
    }
  }

  // A collective of value v at module m's edge, in v's dtype (param_dtype
  // under mixed precision), named in backward as CommDebugMode does.
  Collective edge_collective(ModuleId m, CollectiveKind kind, ValueId v, StepPhase phase, const char* cause) const {
    const int unit = owner_[static_cast<size_t>(m)];
    const DtypeInfo* dt = dtype_from_export_code(graph_.tensor(v).dtype);
    const std::string dtype = cast_dtype(plan_.units[static_cast<size_t>(unit)], dt ? dt->name : "float32");
    return collective(kind, phase, unit, dims_.numel(v), dtype, cause,
                      phase == StepPhase::Backward ? edges_[static_cast<size_t>(m)].named_in_backward : m);
  }
  void edge_forward(ModuleId m, NodeId n, const Collective& c) {
    out_.collectives.push_back(c);
    note_for_recompute(m, n, out_.collectives.size() - 1);
  }
  // Issued when backward leaves the module (from the list's end).
  void edge_backward(ModuleId m, const Collective& c) {
    backward_.push_back(c);
    backward_node_.push_back(edges_[static_cast<size_t>(m)].first);
  }

  // MoeExpertsParallel wraps the hidden states first, and autograd runs the
  // later-made node first: the smaller routing weights' all-reduce, then the
  // hidden states' (counted under CommDebugMode on Mixtral).
  void moe_experts_edge(NodeId n, ModuleId m) {
    const ModuleEdge& e = edges_[static_cast<size_t>(m)];
    if (n == e.first) {
      std::vector<std::pair<int64_t, ValueId>> ins;
      for (ValueId v : e.inputs)
        if (grad_[static_cast<size_t>(v)]) ins.emplace_back(dims_.numel(v), v);
      std::sort(ins.begin(), ins.end(), std::greater<>());
      for (const auto& in : ins)
        edge_backward(m, edge_collective(m, CollectiveKind::AllReduce, in.second, StepPhase::Backward, "input_grad"));
    }
    if (n == e.last)
      for (ValueId v : e.outputs)
        edge_forward(m, n, edge_collective(m, CollectiveKind::AllReduce, v, StepPhase::Forward, "output"));
  }

  // PrepareModuleInput: the inputs given a layout, in order; Shard to
  // Replicate all-gathers (the gradient reduce-scattered back), Replicate to
  // Shard takes a local chunk (the gradient all-gathered).
  void prepare_module_input_edge(NodeId n, ModuleId m, const TpStyleSpec& spec) {
    const ModuleEdge& e = edges_[static_cast<size_t>(m)];
    size_t k = 0;
    for (size_t i = 0; i < spec.prepare_layouts.size(); ++i) {
      if (!spec.prepare_layouts[i]) continue;
      const ValueId v = e.inputs[k++];
      const auto& have = spec.prepare_layouts[i];
      const auto& want = spec.prepare_desired[i];
      if (!want || *want == *have) continue;
      if (is_shard(have) && !is_shard(want)) {
        edge_forward(m, n, edge_collective(m, CollectiveKind::AllGather, v, StepPhase::Forward, "input"));
        if (grad_[static_cast<size_t>(v)])
          edge_backward(m, edge_collective(m, CollectiveKind::ReduceScatter, v, StepPhase::Backward, "input_grad"));
      } else if (!is_shard(have) && is_shard(want) && grad_[static_cast<size_t>(v)]) {
        edge_backward(m, edge_collective(m, CollectiveKind::AllGather, v, StepPhase::Backward, "input_grad"));
      }
    }
  }

  // transformers' ReplicatedWithGradAllReduce (Qwen3's per-head q / k norms):
  // a post-accumulate-grad hook all-reduces each parameter's gradient as
  // autograd makes it, which is when backward passes the module's first op
  // (counted under CommDebugMode on Qwen3-MoE: between the next and the
  // previous linear's input-gradient all-reduces), in the unsharded
  // parameter's dtype.
  void grad_all_reduces(NodeId n, ModuleId m) {
    if (seen_[static_cast<size_t>(m)]) return;
    seen_[static_cast<size_t>(m)] = true;
    const int unit = owner_[static_cast<size_t>(m)];
    for (const auto& slot : tree_.module(m).params) {
      const TensorInfo& info = tree_.tensor(slot.tensor);
      if (!info.requires_grad) continue;
      const std::string dtype = cast_dtype(plan_.units[static_cast<size_t>(unit)], info.dtype);
      Collective c = collective(CollectiveKind::AllReduce, StepPhase::Backward, unit, tree_.numel(slot.tensor), dtype,
                                "param_grad", m);
      c.bytes = c.numel * (dtype_itemsize(dtype) > 0 ? dtype_itemsize(dtype) : info.itemsize);
      backward_.push_back(c);
      backward_node_.push_back(n);
    }
  }

  // A colwise / rowwise style's linear or embedding call at node n: its
  // input's and output's redistributions (style.py: ColwiseParallel,
  // RowwiseParallel: _prepare_input_fn, _prepare_output_fn).
  void linear_collectives(NodeId n, const TpStyleSpec& spec) {
    const GraphNode& node = graph_.node(n);
    const std::string& op = graph_.op_name(node.op);
    const bool is_linear = op == "aten.linear.default", is_embedding = op == "aten.embedding.default";
    if (!is_linear && !is_embedding) return;
    seen_[static_cast<size_t>(node.module)] = true;
    const ValueId x = graph_.tensor_arg(n, is_linear ? "input" : "indices");
    const ValueId w = graph_.tensor_arg(n, "weight");
    const Span<ValueId> outs = graph_.outputs(n);
    if (x < 0 || w < 0 || outs.empty() || outs[0] < 0) return;
    const ValueId y = outs[0];
    // Tokens: every element of an embedding's indices; a linear's input rows.
    const int64_t tokens = is_linear ? dims_.numel(x) / std::max<int64_t>(dims_.size(x, -1), 1) : dims_.numel(x);
    const int64_t in_features = is_linear ? dims_.size(x, -1) : 0;
    const int64_t out_features = dims_.size(y, -1);  // the full width: the graph is the unsharded model's
    const DtypeInfo* dt = dtype_from_export_code(graph_.tensor(y).dtype);
    std::string dtype = dt ? dt->name : "float32";
    const int unit = owner_[static_cast<size_t>(node.module)];
    if (dtype_itemsize(dtype) > 0) dtype = cast_dtype(plan_.units[static_cast<size_t>(unit)], dtype);
    const int64_t item = dtype_itemsize(dtype) > 0 ? dtype_itemsize(dtype) : (dt ? dt->itemsize : 4);
    auto make = [&](CollectiveKind kind, StepPhase phase, int64_t numel, const char* cause) {
      Collective c = collective(kind, phase, unit, numel, dtype, cause, node.module);
      c.bytes = numel * item;
      return c;
    };
    const int64_t in_numel = tokens * in_features, out_numel = tokens * out_features;
    const bool input_grad = is_linear && grad_[static_cast<size_t>(x)];
    std::vector<Collective> bwd_here;  // this call's backward collectives, in the order backward issues them
    const size_t first_forward = out_.collectives.size();
    if (spec.style == TpStyle::Colwise) {
      // _prepare_input_fn: the input made Replicate (default input_layouts
      // Replicate: a no-op; Shard(1) under sequence parallelism: all-gathered).
      // Backward: Replicate's gradient from the sharded weight is Partial, so
      // from_local's backward all-reduces it, or reduce-scatters it back to Shard.
      if (is_shard(spec.input_layouts) && is_linear)
        out_.collectives.push_back(make(CollectiveKind::AllGather, StepPhase::Forward, in_numel, "input"));
      // _prepare_output_fn: Shard(-1) to output_layouts (default Shard(-1):
      // nothing; Replicate: all-gathered, its gradient a local chunk).
      if (spec.output_layouts && !is_shard(spec.output_layouts))
        out_.collectives.push_back(make(CollectiveKind::AllGather, StepPhase::Forward, out_numel, "output"));
      // Inside a PrepareModuleInput that hands on DTensors the input already is
      // one (no from_local): its Partial gradient goes back to that module's
      // redistribution, counted there.
      if (input_grad && prepared_by_[static_cast<size_t>(node.module)] < 0)
        bwd_here.push_back(make(is_shard(spec.input_layouts) ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce,
                                StepPhase::Backward, in_numel, "input_grad"));
    } else {
      // RowwiseParallel: input Shard(-1) (a local tensor: nothing; given as
      // Replicate it is chunked, and its gradient all-gathered in backward).
      // Output Partial to output_layouts: Replicate (default) all-reduced;
      // Shard(1) (sequence parallelism) reduce-scattered, its gradient all-gathered.
      const bool out_shard = is_shard(spec.output_layouts);
      out_.collectives.push_back(make(out_shard ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce,
                                      StepPhase::Forward, out_numel, "output"));
      if (out_shard) bwd_here.push_back(make(CollectiveKind::AllGather, StepPhase::Backward, out_numel, "output_grad"));
      if (input_grad && spec.input_layouts && !is_shard(spec.input_layouts))
        bwd_here.push_back(make(CollectiveKind::AllGather, StepPhase::Backward, in_numel, "input_grad"));
    }
    add_backward(bwd_here, n);
    note_for_recompute(node.module, n, first_forward);
  }

  // The post-backwards of the units backward left before node n.
  void leave_units_after(NodeId n) {
    for (; exited_ < by_exit_.size() && unit_first_[static_cast<size_t>(by_exit_[exited_])] > n; ++exited_)
      for (const Collective& c : post_backward_[static_cast<size_t>(by_exit_[exited_])]) out_.collectives.push_back(c);
  }

  // Region r's forward collectives again, up to where the recompute stops.
  void recompute(ModuleId r) {
    if (r < 0 || recomputed_[static_cast<size_t>(r)]) return;
    recomputed_[static_cast<size_t>(r)] = true;
    for (const Forward& f : region_forward_[static_cast<size_t>(r)]) {
      const NodeId stop = last_matmul_[static_cast<size_t>(r)];
      if (f.node > stop || (f.node == stop && std::string(f.c.cause) != "input")) continue;
      Collective c = f.c;
      c.phase = StepPhase::Backward;
      c.cause = "recompute";
      out_.collectives.push_back(c);
    }
  }

  const Plan& plan_;
  const TensorParallelPlan& tpp_;
  const TensorParallel& policy_tp_;
  const ModuleTree& tree_;
  const Graph& graph_;
  TpComm& out_;
  const DimValues dims_;
  const std::vector<int> owner_;       // each module's unit
  const std::vector<bool> grad_;       // values_with_grad
  std::vector<int> entry_of_;          // each module's policy entry, -1: none
  std::vector<bool> seen_;             // styled modules whose collectives were counted
  std::vector<Collective> backward_;   // in forward order; issued reversed
  std::vector<NodeId> backward_node_;  // the graph node each one belongs to
  std::vector<int> region_;            // each module's outermost checkpointed module, -1: none
  std::vector<std::vector<Forward>> region_forward_;  // a region's forward TP collectives
  std::vector<NodeId> last_matmul_;
  std::vector<ModuleEdge> edges_;
  std::vector<ModuleId> edge_at_first_, edge_at_last_, prepared_by_;
  std::vector<NodeId> unit_first_;  // each unit's first forward node that carries a gradient
  std::vector<std::vector<Collective>> post_backward_;
  std::vector<int> by_exit_;
  size_t exited_ = 0;
  std::vector<bool> recomputed_;
};

// The tp group: the innermost mesh dimension, contiguous ranks.
RankGroup tp_group(const TensorParallelPlan& tpp) { return RankGroup{tpp.mesh.tp, 1}; }

}  // namespace

TpComm tp_comm(const Plan& plan) {
  TpComm out;
  if (!plan.tensor_parallel) return out;
  out.planned = true;
  out.group = tp_group(*plan.tensor_parallel);
  const Graph* graph = plan.tree->graph().get();
  if (!graph) {
    out.unknown_reason = "the model file records no activation shapes (a TorchScript file): tensor parallelism's "
                         "collectives carry the activations (tokens x features), so their sizes are unknown; a "
                         ".pt2 (fsdp-plan-export) gives them";
    return out;
  }
  out.sizes_known = true;
  if (out.group.size <= 1) return out;
  TpCommWalk walk(plan, *graph, out);
  walk.find_checkpoint_regions();
  walk.find_module_edges();
  walk.walk_forward();
  walk.find_post_backward_all_reduces();
  walk.walk_backward();
  walk.list_not_modelled();
  return out;
}

}  // namespace fsdp_plan
