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
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

LocalWalkTensors ep_local_tensors(const Plan& plan) {
  if (!plan.expert_parallel || plan.mesh.size(MeshDim::Ep) <= 1) return {};
  return [&plan](const WalkGraph& g) { return ep_local_tensors(g, plan); };
}

}  // namespace fsdp_plan
