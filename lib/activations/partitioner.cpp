#include "activations/partitioner.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string_view>

#include "activations/walk_rules.h"
#include "util/max_flow.h"

namespace fsdp_plan {
namespace {

#include "activations/recomputable_ops.inc"

// Pre-dispatch composite ops the export keeps whole, which inductor's
// decompositions (torch/_inductor/decomposition.py, torch/_decomp) turn into
// ops of the allowlist: softmax into amax, sub, exp, sum and div; the norms
// into var_mean / mean, rsqrt and pointwise ops; the copies and reshapes into
// clone and views.
constexpr std::string_view kRecomputableComposites[] = {
    "_log_softmax", "_softmax", "_to_copy", "contiguous", "expand_as", "flatten", "layer_norm", "log_softmax",
    "movedim", "native_layer_norm", "repeat", "reshape", "rms_norm", "softmax", "transpose", "unflatten", "view_as"};

bool listed(std::string_view base) {
  return std::binary_search(std::begin(kRecomputableOps), std::end(kRecomputableOps), base) ||
         std::find(std::begin(kRecomputableComposites), std::end(kRecomputableComposites), base) !=
             std::end(kRecomputableComposites);
}

// dropout decomposes to native_dropout when it drops (p > 0 in training),
// else to a clone (torch/_decomp/decompositions.py: dropout).
bool drops(const WalkNode& node) {
  for (const WalkArg& a : node.args)
    if (a.name == "p" && (a.value.kind == ArgValue::Kind::Float || a.value.kind == ArgValue::Kind::Int))
      return (a.value.kind == ArgValue::Kind::Float ? a.value.f : static_cast<double>(a.value.i)) > 0;
  return true;
}

bool random_node(const WalkNode& node) {
  const std::string_view base = aten_op_base(node.op);
  if (base == "dropout" || base == "feature_dropout" || base == "alpha_dropout") return drops(node);
  return std::find(std::begin(kRandomOps), std::end(kRandomOps), base) != std::end(kRandomOps) || base == "bernoulli";
}

// get_node_weight: _size_of x 1.1^max(min(dist, 100), 1), doubled where not materialized.
int64_t node_weight(const CutValue& v, int64_t dist) {
  if (v.free) return 0;
  const double scale = std::pow(1.1, static_cast<double>(std::max<int64_t>(std::min<int64_t>(dist, 100), 1)));
  const int64_t weight = static_cast<int64_t>(static_cast<double>(v.bytes) * scale);
  return v.input || v.materialized ? weight : 2 * weight;
}

}  // namespace

// dropout's output is recomputable from its input and its mask (the mask, the
// random part, is the node's extra tensor: banned).
bool recomputable_node(const WalkNode& node) {
  const std::string_view base = aten_op_base(node.op);
  if (base == "dropout" || base == "feature_dropout" || base == "alpha_dropout") return true;
  return listed(base);
}

bool fusible_node(const WalkNode& node) { return recomputable_node(node) || random_node(node); }

std::vector<bool> partitioner_saves(const std::vector<CutValue>& values) {
  const int32_t n = static_cast<int32_t>(values.size());
  // dist_from_bw: 1 for a value the backward reads, else one more than its
  // nearest user's (values are in forward order: users come later).
  constexpr int64_t kFar = 1000000000;
  std::vector<int64_t> dist(values.size(), kFar);
  for (int32_t k = n - 1; k >= 0; --k) {
    const CutValue& v = values[static_cast<size_t>(k)];
    int64_t d = v.needed ? 1 : kFar;
    for (int32_t u : v.users) d = std::min(d, dist[static_cast<size_t>(u)] + 1);
    dist[static_cast<size_t>(k)] = d;
  }
  // Node k is split into k_in (2k) and k_out (2k + 1).
  const int32_t source = 2 * n, sink = 2 * n + 1;
  MaxFlow flow(2 * n + 2);
  for (int32_t k = 0; k < n; ++k) {
    const CutValue& v = values[static_cast<size_t>(k)];
    flow.add_edge(2 * k, 2 * k + 1, node_weight(v, dist[static_cast<size_t>(k)]));
    if (v.input || v.banned) flow.add_edge(source, 2 * k, MaxFlow::kInfinite);
    if (v.needed) flow.add_edge(2 * k + 1, sink, MaxFlow::kInfinite);
    for (int32_t u : v.users) flow.add_edge(2 * k + 1, 2 * u, MaxFlow::kInfinite);
  }
  flow.run(source, sink);
  const std::vector<bool> side = flow.source_side(source);
  std::vector<bool> saved(values.size(), false);
  for (int32_t k = 0; k < n; ++k)
    saved[static_cast<size_t>(k)] = side[static_cast<size_t>(2 * k)] && !side[static_cast<size_t>(2 * k + 1)];
  return saved;
}

}  // namespace fsdp_plan
