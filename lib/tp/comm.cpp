#include "tp/comm.h"

#include "model/dtype.h"
#include "model/graph.h"
#include "plan/plan.h"
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

}  // namespace

TpComm tp_comm(const Plan& plan) {
  TpComm out;
  if (!plan.tensor_parallel) return out;
  out.planned = true;
  const TensorParallelPlan& tpp = *plan.tensor_parallel;
  const TensorParallel& policy_tp = *plan.policy.tensor_parallel;
  const int64_t T = tpp.mesh.tp;
  out.group = RankGroup{T, 1};  // the innermost mesh dimension: contiguous ranks
  const ModuleTree& tree = *plan.tree;
  const Graph* graph = tree.graph().get();
  if (!graph) {
    out.unknown_reason = "the model file records no activation shapes (a TorchScript file): tensor parallelism's "
                         "collectives carry the activations (tokens x features), so their sizes are unknown; a "
                         ".pt2 (fsdp-plan-export) gives them";
    return out;
  }
  out.sizes_known = true;
  if (T <= 1) return out;
  const DimValues dims = DimValues::hints(*graph, plan.policy.activations.dims);
  const std::vector<int> owner = unit_of_modules(plan);
  const std::vector<bool> grad = values_with_grad(*graph);
  // The style of each module parallelize_module applied one to (Linear and Embedding only carry collectives).
  std::vector<int> entry_of(tree.num_modules(), -1);
  for (const TpModule& m : tpp.modules) entry_of[static_cast<size_t>(m.module)] = m.entry;
  const auto& mp = plan.policy.mixed_precision;
  std::vector<bool> seen(tree.num_modules(), false);

  std::vector<Collective> backward;  // in forward order; issued reversed
  // Activation checkpointing: each call's outermost checkpointed module (-1: none).
  std::vector<int> region(tree.num_modules(), -1);
  for (const CheckpointedModule& c : plan.activations.checkpointed)
    for (ModuleId m : tree.preorder(c.module)) region[static_cast<size_t>(m)] = c.module;
  struct Forward {
    NodeId node;
    Collective c;
  };
  std::vector<std::vector<Forward>> region_forward(tree.num_modules());  // a region's forward TP collectives
  std::vector<NodeId> last_linear(tree.num_modules(), -1);
  for (NodeId n = 0; n < graph->num_nodes(); ++n) {
    const ModuleId r = region[static_cast<size_t>(graph->node(n).module)];
    if (r >= 0 && graph->op_name(graph->node(n).op) == "aten.linear.default") last_linear[static_cast<size_t>(r)] = n;
  }
  const std::string linear = "aten.linear.default", embedding = "aten.embedding.default";
  for (NodeId n = 0; n < graph->num_nodes(); ++n) {
    const GraphNode& node = graph->node(n);
    const int e = entry_of[static_cast<size_t>(node.module)];
    if (e < 0) continue;
    const TpStyleSpec& spec = policy_tp.plan[static_cast<size_t>(e)].second;
    if (spec.style != TpStyle::Colwise && spec.style != TpStyle::Rowwise) continue;
    const std::string& op = graph->op_name(node.op);
    const bool is_linear = op == linear, is_embedding = op == embedding;
    if (!is_linear && !is_embedding) continue;
    seen[static_cast<size_t>(node.module)] = true;
    const ValueId x = graph->tensor_arg(n, is_linear ? "input" : "indices");
    const ValueId w = graph->tensor_arg(n, "weight");
    const Span<ValueId> outs = graph->outputs(n);
    if (x < 0 || w < 0 || outs.empty() || outs[0] < 0) continue;
    const ValueId y = outs[0];
    // Tokens: every element of an embedding's indices; a linear's input rows.
    const int64_t tokens = is_linear ? dims.numel(x) / std::max<int64_t>(dims.size(x, -1), 1) : dims.numel(x);
    const int64_t in_features = is_linear ? dims.size(x, -1) : 0;
    const int64_t out_features = dims.size(y, -1);  // the full width: the graph is the unsharded model's
    const DtypeInfo* dt = dtype_from_export_code(graph->tensor(y).dtype);
    std::string dtype = dt ? dt->name : "float32";
    // FSDP2's MixedPrecisionPolicy: parameters gathered (and forward inputs cast) in param_dtype.
    const int unit = owner[static_cast<size_t>(node.module)];
    const Unit& u = plan.units[static_cast<size_t>(unit)];
    if (mp && mp->param_dtype && u.mixed_precision.value_or(false) && dtype_itemsize(dtype) > 0) dtype = *mp->param_dtype;
    const int64_t item = dtype_itemsize(dtype) > 0 ? dtype_itemsize(dtype) : (dt ? dt->itemsize : 4);
    auto make = [&](CollectiveKind kind, StepPhase phase, int64_t numel, const char* cause) {
      Collective c;
      c.kind = kind;
      c.phase = phase;
      c.unit = unit;
      c.numel = numel;
      c.bytes = numel * item;
      c.dtype = dtype;
      c.group = out.group;
      c.cause = cause;
      c.module = node.module;
      return c;
    };
    const int64_t in_numel = tokens * in_features, out_numel = tokens * out_features;
    const bool input_grad = is_linear && grad[static_cast<size_t>(x)];
    std::vector<Collective> bwd_here;  // this call's backward collectives, in the order backward issues them
    const size_t first_forward = out.collectives.size();
    if (spec.style == TpStyle::Colwise) {
      // _prepare_input_fn: the input made Replicate (default input_layouts
      // Replicate: a no-op; Shard(1) under sequence parallelism: all-gathered).
      // Backward: Replicate's gradient from the sharded weight is Partial, so
      // from_local's backward all-reduces it, or reduce-scatters it back to Shard.
      if (is_shard(spec.input_layouts) && is_linear)
        out.collectives.push_back(make(CollectiveKind::AllGather, StepPhase::Forward, in_numel, "input"));
      // _prepare_output_fn: Shard(-1) to output_layouts (default Shard(-1):
      // nothing; Replicate: all-gathered, its gradient a local chunk).
      if (spec.output_layouts && !is_shard(spec.output_layouts))
        out.collectives.push_back(make(CollectiveKind::AllGather, StepPhase::Forward, out_numel, "output"));
      if (input_grad)
        bwd_here.push_back(make(is_shard(spec.input_layouts) ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce,
                                StepPhase::Backward, in_numel, "input_grad"));
    } else {
      // RowwiseParallel: input Shard(-1) (a local tensor: nothing; given as
      // Replicate it is chunked, and its gradient all-gathered in backward).
      // Output Partial to output_layouts: Replicate (default) all-reduced;
      // Shard(1) (sequence parallelism) reduce-scattered, its gradient all-gathered.
      const bool out_shard = is_shard(spec.output_layouts);
      out.collectives.push_back(make(out_shard ? CollectiveKind::ReduceScatter : CollectiveKind::AllReduce,
                                     StepPhase::Forward, out_numel, "output"));
      if (out_shard) bwd_here.push_back(make(CollectiveKind::AllGather, StepPhase::Backward, out_numel, "output_grad"));
      if (input_grad && spec.input_layouts && !is_shard(spec.input_layouts))
        bwd_here.push_back(make(CollectiveKind::AllGather, StepPhase::Backward, in_numel, "input_grad"));
    }
    // Backward runs the calls in reverse: keep each call's own order by pushing it reversed.
    for (size_t k = bwd_here.size(); k-- > 0;) backward.push_back(bwd_here[k]);
    if (const ModuleId r = region[static_cast<size_t>(node.module)]; r >= 0) {
      auto& f = region_forward[static_cast<size_t>(r)];
      for (size_t k = first_forward; k < out.collectives.size(); ++k) f.push_back({n, out.collectives[k]});
    }
  }
  // Backward, with each checkpointed region's recompute first when backward
  // reaches it: its forward runs again, collectives included, but
  // non-reentrant checkpointing stops at the last op that saves a tensor
  // (torch/utils/checkpoint.py: _StopRecomputationError); the region's last
  // linear stands for that op here (counted on HF's Llama: o_proj's
  // all-reduce recurs, down_proj's, after the last matmul, does not).
  std::vector<bool> recomputed(tree.num_modules(), false);
  auto recompute = [&](ModuleId r) {
    if (r < 0 || recomputed[static_cast<size_t>(r)]) return;
    recomputed[static_cast<size_t>(r)] = true;
    for (const Forward& f : region_forward[static_cast<size_t>(r)]) {
      const NodeId stop = last_linear[static_cast<size_t>(r)];
      if (f.node > stop || (f.node == stop && std::string(f.c.cause) != "input")) continue;
      Collective c = f.c;
      c.phase = StepPhase::Backward;
      c.cause = "recompute";
      out.collectives.push_back(c);
    }
  };
  for (size_t k = backward.size(); k-- > 0;) {
    recompute(region[static_cast<size_t>(backward[k].module)]);
    out.collectives.push_back(backward[k]);
  }
  for (const CheckpointedModule& c : plan.activations.checkpointed) recompute(c.module);
  // Styles this count does not follow: sequence_parallel's norms and the
  // Prepare* hooks redistribute activations too, and a styled module the
  // graph shows no linear / embedding call for.
  for (const TpModule& m : tpp.modules) {
    const TpStyle s = policy_tp.plan[static_cast<size_t>(m.entry)].second.style;
    const bool counted = (s == TpStyle::Colwise || s == TpStyle::Rowwise) && seen[static_cast<size_t>(m.module)];
    if (!counted && s != TpStyle::Replicate)
      out.not_modelled.push_back(path_or_root(tree.path(m.module)) + " (" + tp_style_names().name(s) + ")");
  }
  return out;
}

}  // namespace fsdp_plan
