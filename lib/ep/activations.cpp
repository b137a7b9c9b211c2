#include "ep/activations.h"

#include <algorithm>

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

}  // namespace

WalkGraph ep_local_walk_graph(const WalkGraph& graph, const Plan& plan) {
  const ExpertParallelPlan& ep = *plan.expert_parallel;
  WalkGraph out = graph;
  // Per tensor: the dim 0 it has in the export and the one rank 0 holds, where they differ.
  std::vector<std::pair<int64_t, int64_t>> shrunk(out.tensors.size(), {-1, -1});
  for (const WalkPlaceholder& ph : out.placeholders) {
    if (ph.kind != WalkInput::Parameter || ph.param < 0 || ph.tensor < 0 || !ep.is_expert(ph.param)) continue;
    WalkTensor& t = out.tensors[static_cast<size_t>(ph.tensor)];
    const std::vector<int64_t>& local = ep.local_shape[static_cast<size_t>(ph.param)];
    if (t.sizes.empty() || local.empty() || local[0] == t.sizes[0]) continue;
    shrunk[static_cast<size_t>(ph.tensor)] = {t.sizes[0], local[0]};
    t.sizes[0] = local[0];
  }
  for (const WalkNode& n : out.nodes) {
    if (!weight_view(n.op) || n.args.empty() || n.args[0].tensors.empty()) continue;
    const int32_t in = n.args[0].tensors[0];
    if (in < 0 || shrunk[static_cast<size_t>(in)].first < 0) continue;
    const auto [whole, local] = shrunk[static_cast<size_t>(in)];
    for (int32_t o : n.outputs) {
      if (o < 0) continue;
      WalkTensor& t = out.tensors[static_cast<size_t>(o)];
      if (t.sizes.empty() || t.sizes[0] != whole) continue;
      t.sizes[0] = local;
      shrunk[static_cast<size_t>(o)] = {whole, local};
    }
  }
  return out;
}

LocalWalkGraph ep_local_graph(const Plan& plan) {
  if (!plan.expert_parallel || plan.mesh.size(MeshDim::Ep) <= 1) return {};
  return [&plan](const WalkGraph& g) { return ep_local_walk_graph(g, plan); };
}

}  // namespace fsdp_plan
