#include "tp/local.h"

#include "plan/plan.h"

namespace fsdp_plan {

std::vector<bool> tp_local_tensors(const WalkGraph& g, const Plan& plan) {
  if (!plan.tensor_parallel || plan.mesh.size(MeshDim::Tp) <= 1 || !plan.policy.tensor_parallel) return {};
  const TensorParallelPlan& tpp = *plan.tensor_parallel;
  const TensorParallel& tp = *plan.policy.tensor_parallel;
  std::vector<bool> local(g.tensors.size(), false);
  for (const WalkPlaceholder& p : g.placeholders)
    if (p.kind == WalkInput::Parameter && p.tensor >= 0 && p.param >= 0 &&
        static_cast<size_t>(p.param) < tpp.placement.size() &&
        tpp.placement[static_cast<size_t>(p.param)].kind == TpPlacement::Kind::Shard)
      local[static_cast<size_t>(p.tensor)] = true;
  std::vector<int> entry(plan.tree->num_modules(), -1);
  for (const TpModule& m : tpp.modules) entry[static_cast<size_t>(m.module)] = m.entry;
  // transformers' moe_tp_experts: the experts run on local weight shards, and
  // their output leaves the module all-reduced, whole (MoeExpertsParallel).
  std::vector<ModuleId> moe(plan.tree->num_modules(), -1);
  for (const TpModule& m : tpp.modules)
    if (tp.plan[static_cast<size_t>(m.entry)].second.style == TpStyle::MoeExperts)
      for (ModuleId c : plan.tree->preorder(m.module)) moe[static_cast<size_t>(c)] = m.module;
  auto moe_at = [&](ModuleId m) { return m >= 0 && static_cast<size_t>(m) < moe.size() ? moe[static_cast<size_t>(m)] : -1; };
  std::vector<ModuleId> made_in(g.tensors.size(), -1);  // the experts module a tensor was computed in
  for (const WalkNode& n : g.nodes) {
    bool out_local = false;
    const int e = n.module >= 0 && static_cast<size_t>(n.module) < entry.size() ? entry[static_cast<size_t>(n.module)] : -1;
    const bool styled_call = e >= 0 && (n.op == "aten.linear.default" || n.op == "aten.embedding.default");
    const TpStyleSpec* spec = styled_call ? &tp.plan[static_cast<size_t>(e)].second : nullptr;
    const bool shard_out = spec && spec->output_layouts && spec->output_layouts->rfind("shard", 0) == 0;
    if (spec && spec->style == TpStyle::Colwise) {
      out_local = !spec->output_layouts || shard_out;  // Shard(-1) kept, unless gathered to Replicate
    } else if (spec && rowwise_like(spec->style)) {
      out_local = shard_out;  // Partial reduced: all-reduced whole, or reduce-scattered to a share
    } else {
      for (const WalkArg& a : n.args)
        for (int32_t t : a.tensors)
          if (t >= 0 && local[static_cast<size_t>(t)] &&
              (made_in[static_cast<size_t>(t)] < 0 || made_in[static_cast<size_t>(t)] == moe_at(n.module)))
            out_local = true;
    }
    if (const ModuleId m = moe_at(n.module); m >= 0)
      for (int32_t t : n.outputs)
        if (t >= 0) made_in[static_cast<size_t>(t)] = m;
    if (out_local)
      for (int32_t t : n.outputs)
        if (t >= 0) local[static_cast<size_t>(t)] = true;
  }
  return local;
}

}  // namespace fsdp_plan
