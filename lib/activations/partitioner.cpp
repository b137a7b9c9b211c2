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

constexpr int64_t kFar = 1000000000;

// dist_from_bw: 1 for a value the backward reads, else one more than its
// nearest user's (values are in forward order: users come later).
std::vector<int64_t> distances(const std::vector<CutValue>& values) {
  std::vector<int64_t> dist(values.size(), kFar);
  for (size_t k = values.size(); k-- > 0;) {
    int64_t d = values[k].needed ? 1 : kFar;
    for (int32_t u : values[k].users) d = std::min(d, dist[static_cast<size_t>(u)] + 1);
    dist[k] = d;
  }
  return dist;
}

// MinCutOptions as choose_saved_values_set relaxes them, and its knapsack's
// dont_ban (by node).
struct CutOptions {
  bool ban_materialized = true;
  bool ban_off_allowlist = true;
  const std::vector<bool>* dont_ban = nullptr;
};

bool banned(const CutValue& v, const CutOptions& o) {
  if (v.input) return true;  // a primal
  const size_t node = static_cast<size_t>(v.node);
  if (o.dont_ban && v.node >= 0 && node < o.dont_ban->size() && (*o.dont_ban)[node]) return false;
  return v.compute || v.reduction || (o.ban_off_allowlist && v.off_allowlist) ||
         (o.ban_materialized && v.materialized_bw);
}

// solve_min_cut: node k is split into k_in (2k) and k_out (2k + 1).
CutResult min_cut(const std::vector<CutValue>& values, const std::vector<int64_t>& dist, const CutOptions& o) {
  const int32_t n = static_cast<int32_t>(values.size());
  const int32_t source = 2 * n, sink = 2 * n + 1;
  MaxFlow flow(2 * n + 2);
  for (int32_t k = 0; k < n; ++k) {
    const CutValue& v = values[static_cast<size_t>(k)];
    flow.add_edge(2 * k, 2 * k + 1, node_weight(v, dist[static_cast<size_t>(k)]));
    if (banned(v, o)) flow.add_edge(source, 2 * k, MaxFlow::kInfinite);
    if (v.needed) flow.add_edge(2 * k + 1, sink, MaxFlow::kInfinite);
    for (int32_t u : v.users) flow.add_edge(2 * k + 1, 2 * u, MaxFlow::kInfinite);
  }
  flow.run(source, sink);
  const std::vector<bool> side = flow.source_side(source);
  CutResult r{std::vector<bool>(values.size(), false), std::vector<bool>(values.size(), false)};
  for (int32_t k = 0; k < n; ++k) {
    r.saved[static_cast<size_t>(k)] = side[static_cast<size_t>(2 * k)] && !side[static_cast<size_t>(2 * k + 1)];
    // Behind the cut and on a path to what the backward reads.
    r.recomputed[static_cast<size_t>(k)] = !side[static_cast<size_t>(2 * k)] && !values[static_cast<size_t>(k)].input &&
                                           dist[static_cast<size_t>(k)] < kFar;
  }
  return r;
}

int64_t saved_size(const std::vector<CutValue>& values, const std::vector<bool>& saved) {
  int64_t bytes = 0;
  for (size_t k = 0; k < values.size(); ++k)
    if (saved[k]) bytes += values[k].bytes;
  return bytes;
}

// node_info.inputs: the backward computes again whatever leads to what it reads.
CutResult inputs_only(const std::vector<CutValue>& values, const std::vector<int64_t>& dist) {
  CutResult r{std::vector<bool>(values.size(), false), std::vector<bool>(values.size(), false)};
  for (size_t k = 0; k < values.size(); ++k) {
    r.saved[k] = values[k].input;
    r.recomputed[k] = !values[k].input && dist[k] < kFar;
  }
  return r;
}

// dp_knapsack (torch/_functorch/_activation_checkpointing/knapsack.py): the
// items to keep (saved) within `budget`, memories quantized by 10,000, the
// table in float32 as torch's; returns whether each item is recomputed.
std::vector<bool> dp_knapsack(const std::vector<double>& memory, const std::vector<double>& runtime, double budget) {
  constexpr double kScale = 10000;
  const size_t n = memory.size();
  const int64_t cap = std::llround(budget * kScale);
  std::vector<int64_t> q(n);
  for (size_t i = 0; i < n; ++i) q[i] = std::llround(memory[i] * kScale);
  std::vector<std::vector<float>> dp(n + 1, std::vector<float>(static_cast<size_t>(cap) + 1, 0.0f));
  for (size_t i = 1; i <= n; ++i) {
    const float r = static_cast<float>(runtime[i - 1]);
    for (int64_t j = 0; j <= cap; ++j) {
      float best = dp[i - 1][static_cast<size_t>(j)];
      if (q[i - 1] == 0)
        best = dp[i - 1][static_cast<size_t>(j)] + r;
      else if (j >= q[i - 1])
        best = std::max(best, dp[i - 1][static_cast<size_t>(j - q[i - 1])] + r);
      dp[i][static_cast<size_t>(j)] = best;
    }
  }
  std::vector<bool> recompute(n, false);
  int64_t j = cap;
  for (size_t i = n; i > 0; --i) {
    if (dp[i][static_cast<size_t>(j)] != dp[i - 1][static_cast<size_t>(j)])
      j -= q[i - 1];
    else
      recompute[i - 1] = true;
  }
  return recompute;
}

// The knapsack's last resort: the banned nodes that may be recomputed (not
// inputs, on a path to the backward), largest first, each kept or recomputed
// for its FLOPs; the aggressive cut again with those recomputed unbanned.
CutResult knapsack_saves(const std::vector<CutValue>& values, const std::vector<int64_t>& dist,
                                 const CutOptions& aggressive, double budget, int64_t min_bytes, int64_t max_bytes) {
  int32_t nodes = 0;
  for (const CutValue& v : values) nodes = std::max(nodes, v.node + 1);
  std::vector<int64_t> node_bytes(static_cast<size_t>(nodes), 0);
  std::vector<double> node_flops(static_cast<size_t>(nodes), 1);
  std::vector<bool> item(static_cast<size_t>(nodes), false);
  for (size_t k = 0; k < values.size(); ++k) {
    const CutValue& v = values[k];
    if (v.node < 0 || v.input) continue;
    node_bytes[static_cast<size_t>(v.node)] += v.bytes;
    node_flops[static_cast<size_t>(v.node)] = std::max(1.0, v.flops);
    if (banned(v, aggressive) && dist[k] < kFar) item[static_cast<size_t>(v.node)] = true;
  }
  std::vector<int32_t> order;
  for (int32_t nd = 0; nd < nodes; ++nd)
    if (item[static_cast<size_t>(nd)]) order.push_back(nd);
  if (order.empty()) return inputs_only(values, dist);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return node_bytes[static_cast<size_t>(a)] > node_bytes[static_cast<size_t>(b)];
  });
  std::vector<double> memory, runtime;
  const double range = static_cast<double>(max_bytes - min_bytes);
  for (int32_t nd : order) {
    memory.push_back(static_cast<double>(node_bytes[static_cast<size_t>(nd)]) / range);
    runtime.push_back(node_flops[static_cast<size_t>(nd)]);
  }
  const std::vector<bool> recompute = dp_knapsack(memory, runtime, std::max(budget, 0.0));
  std::vector<bool> dont_ban(static_cast<size_t>(nodes), false);
  for (size_t i = 0; i < order.size(); ++i)
    if (recompute[i]) dont_ban[static_cast<size_t>(order[i])] = true;
  CutOptions o = aggressive;
  o.dont_ban = &dont_ban;
  return min_cut(values, dist, o);
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

bool compute_or_random_node(const WalkNode& node, const char* case_name) {
  // get_default_op_list's compute_intensive_ops, with the composites that
  // decompose into them (linear, matmul) and SDPA by its kernel.
  static constexpr std::string_view kCompute[] = {
      "_convolution", "_efficient_attention_forward", "_flash_attention_forward",
      "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention", "_scaled_mm", "addmm", "bmm",
      "conv1d", "conv2d", "conv3d", "convolution", "linear", "matmul", "mm", "upsample_bilinear2d"};
  const std::string_view base = aten_op_base(node.op);
  if (std::find(std::begin(kCompute), std::end(kCompute), base) != std::end(kCompute)) return true;
  if (base == "scaled_dot_product_attention" && case_name) {
    // The CUDA flash and memory-efficient kernels are on the list; the CPU's
    // flash kernel and cuDNN's are not; the math path is its bmms.
    const std::string_view c(case_name);
    return c.find("CPU") == std::string_view::npos && c.find("cudnn") == std::string_view::npos;
  }
  return random_node(node);
}

CutResult partitioner_cut(const std::vector<CutValue>& values, double memory_budget) {
  const std::vector<int64_t> dist = distances(values);
  if (memory_budget <= 0) return inputs_only(values, dist);
  CutResult runtime_optimized = min_cut(values, dist, CutOptions{});
  if (memory_budget >= 1) return runtime_optimized;
  // choose_saved_values_set: sizes normalised between the inputs' and the default cut's.
  int64_t min_bytes = 0;
  for (const CutValue& v : values) min_bytes += v.input ? v.bytes : 0;
  const int64_t max_bytes = saved_size(values, runtime_optimized.saved);
  if (max_bytes <= min_bytes) return runtime_optimized;
  const auto under = [&](const CutResult& r) {
    return static_cast<double>(saved_size(values, r.saved) - min_bytes) / static_cast<double>(max_bytes - min_bytes) <
           memory_budget;
  };
  CutOptions more_aggressive;
  more_aggressive.ban_materialized = false;
  CutResult r = min_cut(values, dist, more_aggressive);
  if (under(r)) return r;
  CutOptions aggressive = more_aggressive;
  aggressive.ban_off_allowlist = false;
  r = min_cut(values, dist, aggressive);
  if (under(r)) return r;
  return knapsack_saves(values, dist, aggressive, memory_budget, min_bytes, max_bytes);
}

}  // namespace fsdp_plan
