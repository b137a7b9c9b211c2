#include "time/flops.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "activations/activations.h"
#include "activations/graph_input.h"
#include "model/dtype.h"
#include "model/graph.h"
#include "plan/plan.h"
#include "tp/local.h"
#include "util/errors.h"

namespace fsdp_plan {
namespace {

using Sizes = std::vector<int64_t>;

// A count past int64 (a damaged or absurd graph): plan_graph_flops reports it as an input error.
struct FlopOverflow {};

int64_t mul(int64_t a, int64_t b) {
  int64_t r;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &r)) throw FlopOverflow{};
  return r;
}
int64_t add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw FlopOverflow{};
  return r;
}

int64_t prod(const Sizes& s, size_t from = 0, size_t to = SIZE_MAX) {
  int64_t p = 1;
  for (size_t i = from; i < std::min(to, s.size()); ++i) p = mul(p, s[i]);
  return p;
}

// torch/utils/flop_counter.py: mm_flop (m * n * 2 * k: "should be 2 * k - 1 technically").
int64_t mm(int64_t m, int64_t k, int64_t n) { return mul(mul(mul(2, m), k), n); }

// torch.matmul(a, b) as (batch, M, K, N): 1-D operands get M or N = 1, the
// leading dimensions broadcast (aten/src/ATen/native/LinearAlgebra.cpp:
// _matmul_impl folds them into the mm / bmm FlopCounterMode then counts,
// flop_counter.py: mm_flop, bmm_flop).
int64_t matmul_flops(Sizes a, Sizes b) {
  if (a.empty() || b.empty()) return 0;
  if (a.size() == 1) a.insert(a.begin(), 1);
  if (b.size() == 1) b.push_back(1);
  const size_t na = a.size() - 2, nb = b.size() - 2, nbatch = std::max(na, nb);
  int64_t batch = 1;
  for (size_t i = 0; i < nbatch; ++i) {
    const int64_t x = i < nbatch - na ? 1 : a[i - (nbatch - na)];
    const int64_t y = i < nbatch - nb ? 1 : b[i - (nbatch - nb)];
    batch = mul(batch, std::max(x, y));  // broadcast: equal, or one of them is 1
  }
  return mul(batch, mm(a[a.size() - 2], a.back(), b.back()));
}

// What autograd saves for an op, for the recompute's early stop
// (tools/autograd/derivatives.yaml): saved before the op computes (its
// inputs: mm, linear), after it (its output: softmax, the SDPA kernels' out
// and logsumexp, dropout's mask, layer_norm's mean / rstd), or nothing (add,
// views, casts). Any op not listed saves its inputs. tests/timing/graph_flops.py:
// SAVES, checked against FlopCounterMode's recompute on every AC case.
enum class Saves : uint8_t { Input, Output, Nothing };

Saves saves_of(std::string_view op) {
  static const std::unordered_map<std::string_view, Saves> table = [] {
    std::unordered_map<std::string_view, Saves> t;
    for (const char* op :
         {"aten.add.Tensor", "aten.sub.Tensor", "aten.add.Scalar", "aten.neg.default", "aten.view.default",
          "aten.reshape.default", "aten.transpose.int", "aten.permute.default", "aten.expand.default",
          "aten.unsqueeze.default", "aten.squeeze.dim", "aten.slice.Tensor", "aten.select.int", "aten.cat.default",
          "aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default", "aten.contiguous.default",
          "aten.clone.default", "aten.alias.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
          "aten.t.default", "aten.mean.dim", "aten.sum.dim_IntList", "aten.flatten.using_ints",
          "aten.unflatten.int", "aten.zeros_like.default", "aten.detach.default", "aten.mul.Scalar",
          "aten.div.Scalar", "aten._assert_tensor_metadata.default"})
      t.emplace(op, Saves::Nothing);
    for (const char* op :
         {"aten.softmax.int", "aten._softmax.default", "aten.log_softmax.int", "aten.tanh.default",
          "aten.sigmoid.default", "aten.rsqrt.default", "aten.exp.default", "aten.dropout.default",
          "aten.native_dropout.default", "aten.layer_norm.default", "aten.native_layer_norm.default",
          "aten.scaled_dot_product_attention.default"})
      t.emplace(op, Saves::Output);
    return t;
  }();
  auto it = table.find(op);
  return it == table.end() ? Saves::Input : it->second;
}

// Outputs that never need a gradient whatever their inputs (graph_flops.py: NO_GRAD_OPS).
bool never_grad(std::string_view op) {
  static const std::unordered_set<std::string_view> ops = {
      "aten.detach.default",        "aten.zeros_like.default", "aten.ones_like.default",
      "aten.empty_like.default",    "aten.full_like.default",  "aten.rand_like.default",
      "aten.randn_like.default",    "aten.new_ones.default",   "aten.new_zeros.default",
      "aten.new_empty.default",     "aten.new_full.default",   "aten.arange.start",
      "aten.arange.default",        "aten.arange.start_step",  "aten._assert_tensor_metadata.default"};
  return ops.count(op) > 0;
}

// Words of an op name that suggest FLOPs FlopCounterMode would count, for ops
// this table has no formula for: noted, counted 0.
bool looks_like_matmul(std::string_view op) {
  for (const char* w : {"mm", "matmul", "linear", "attention", "conv", "einsum", "bilinear", "tensordot"})
    if (op.find(w) != std::string_view::npos) return true;
  return false;
}

struct Ctx {
  const WalkGraph& g;
  const std::vector<bool>& grad;  // per tensor id
  const WalkNode& n;
  const WalkArg* arg(std::string_view name) const {
    for (const WalkArg& a : n.args)
      if (a.name == name) return &a;
    return nullptr;
  }
  int32_t tensor(std::string_view name) const {
    const WalkArg* a = arg(name);
    return a && a->value.kind == ArgValue::Kind::Tensor && !a->tensors.empty() ? a->tensors[0] : -1;
  }
  const Sizes* sizes(int32_t t) const { return t >= 0 ? &g.tensors[static_cast<size_t>(t)].sizes : nullptr; }
  int needs(int32_t t) const { return t >= 0 && grad[static_cast<size_t>(t)] ? 1 : 0; }
};

}  // namespace

NodeFlops node_flops(const WalkGraph& g, const WalkNode& n, const std::vector<bool>& grad) {
  const Ctx c{g, grad, n};
  // A view: each comparison below then checks the length first (a
  // std::string against a C string measures and compares the text).
  const std::string_view op = n.op;
  NodeFlops out;
  auto two_operands = [&](int32_t a, int32_t b, int64_t f) {
    out.forward = f;
    out.backward = mul(f, c.needs(a) + c.needs(b));  // one product per operand's gradient
    out.counted = true;
  };
  if (op == "aten.linear.default") {
    // Decomposes to mm / addmm (flop_counter.py: mm_flop, addmm_flop) over the flattened tokens;
    // the bias's gradient is a sum, 0 FLOPs.
    const int32_t x = c.tensor("input"), w = c.tensor("weight");
    const Sizes *xs = c.sizes(x), *ws = c.sizes(w);
    if (!xs || !ws || ws->size() != 2 || xs->empty() || xs->back() == 0) return out;
    two_operands(x, w, mm(prod(*xs) / xs->back(), xs->back(), (*ws)[0]));
    return out;
  }
  if (op == "aten.mm.default" || op == "aten.bmm.default" || op == "aten.matmul.default") {
    // flop_counter.py: mm_flop, bmm_flop (matmul after its decomposition).
    const int32_t a = c.tensor("self"), b = c.tensor(op == "aten.matmul.default" ? "other" : "mat2");
    if (!c.sizes(a) || !c.sizes(b)) return out;
    two_operands(a, b, matmul_flops(*c.sizes(a), *c.sizes(b)));
    return out;
  }
  if (op == "aten.addmm.default" || op == "aten.baddbmm.default") {
    // flop_counter.py: addmm_flop, baddbmm_flop (the added term: 0).
    const bool bmm = op == "aten.baddbmm.default";
    const int32_t a = c.tensor(bmm ? "batch1" : "mat1"), b = c.tensor(bmm ? "batch2" : "mat2");
    if (!c.sizes(a) || !c.sizes(b)) return out;
    two_operands(a, b, matmul_flops(*c.sizes(a), *c.sizes(b)));
    return out;
  }
  if (op == "aten._grouped_mm.default" || op == "transformers.grouped_mm_fallback.default") {
    // A mixture-of-experts layer's matmuls (transformers/integrations/moe.py: torch._grouped_mm,
    // or its fallback's torch.mm per expert). torch 2.13's flop_counter.py has no formula for
    // either (FlopCounterMode counts 0): each group's 2*M*K*N, as the mm it runs
    // (graph_flops.py grouped_mm_flops); backward, one such product per operand's gradient.
    const bool fallback = op.front() == 't';
    const int32_t a = c.tensor(fallback ? "input" : "self"), b = c.tensor(fallback ? "weight" : "mat2");
    const Sizes *as = c.sizes(a), *bs = c.sizes(b);
    if (!as || !bs || as->size() < 2 || as->size() > 3 || bs->size() < 2 || bs->size() > 3) return out;
    const int64_t groups = as->size() == 3 && bs->size() == 3 ? (*as)[0] : 1;
    two_operands(a, b, mul(groups, mm((*as)[as->size() - 2], as->back(), bs->back())));
    out.beyond_counter = true;
    return out;
  }
  if (op == "aten.scaled_dot_product_attention.default") {
    // flop_counter.py: sdpa_flop_count (q @ k^T, then scores @ v, over the query heads) and
    // sdpa_backward_flop_count (the fused kernels' five bmm: scores again, grad of v and of the
    // scores, grad of q and k). A causal mask changes nothing: sdpa_flop "NB: We aren't accounting
    // for causal attention here".
    const int32_t q = c.tensor("query"), k = c.tensor("key"), v = c.tensor("value");
    const Sizes *qs = c.sizes(q), *ks = c.sizes(k), *vs = c.sizes(v);
    if (!qs || !ks || !vs || qs->size() < 2 || ks->size() < 2 || vs->empty()) return out;
    const int64_t bh = prod(*qs, 0, qs->size() - 2), sq = (*qs)[qs->size() - 2], dq = qs->back();
    const int64_t sk = (*ks)[ks->size() - 2], dv = vs->back();
    out.counted = true;
    out.forward = add(mm(mul(bh, sq), dq, sk), mm(mul(bh, sq), sk, dv));
    if (c.needs(q) || c.needs(k) || c.needs(v))
      out.backward = mul(mul(mul(mul(2, bh), sq), sk), add(mul(3, dq), mul(2, dv)));
    return out;
  }
  if (op == "aten.convolution.default" || op == "aten.conv1d.default" || op == "aten.conv2d.default" ||
      op == "aten.conv3d.default") {
    // flop_counter.py: conv_flop_count (batch * numel(w) * prod(output spatial) * 2; the input's
    // spatial sizes when transposed) and conv_backward_flop (grad of input, of weight: the same each).
    const int32_t x = c.tensor("input"), w = c.tensor("weight");
    const Sizes *xs = c.sizes(x), *ws = c.sizes(w);
    const int32_t y = n.outputs.empty() ? -1 : n.outputs[0];
    const Sizes* ys = c.sizes(y);
    if (!xs || !ws || !ys || ys->empty()) return out;
    bool transposed = false;
    if (const WalkArg* t = c.arg("transposed"); t && t->value.kind == ArgValue::Kind::Bool) transposed = t->value.b;
    const Sizes& spatial = transposed ? *xs : *ys;
    two_operands(x, w, mul(mul(mul((*ys)[0], prod(*ws)), prod(spatial, 2)), 2));
    return out;
  }
  return out;
}

namespace {

// Activation checkpointing: each call of a checkpointed module (a maximal
// run of consecutive nodes in its subtree, as the activation walk finds
// them) runs its forward again in backward. Non-reentrant checkpointing
// stops as soon as the last tensor the call saved is re-created
// (torch/utils/checkpoint.py: _checkpoint_hook's unpack raises
// _StopRecomputationError, early stop on by default): inputs are saved
// before an op runs, outputs after, so ops past the last saving op, and
// that op itself when it saves only its inputs, are not recomputed.
void add_checkpoint_recompute(const WalkGraph& g, const ModuleTree& tree, const GraphFlopOptions& opt,
                              const std::vector<int64_t>& fwd, const std::vector<bool>& out_grad, FlopProfile& out) {
  const size_t nm = tree.num_modules(), nn = g.nodes.size();
  auto module_of = [&](const WalkNode& n) -> ModuleId {
    return n.module >= 0 && static_cast<size_t>(n.module) < nm ? n.module : 0;
  };
  std::vector<ModuleId> region_of(nm, -1);
  for (ModuleId m : opt.checkpointed) region_of[static_cast<size_t>(m)] = m;
  for (ModuleId m : tree.preorder()) {
    const ModuleId parent = tree.module(m).parent;
    if (region_of[static_cast<size_t>(m)] < 0 && parent >= 0)
      region_of[static_cast<size_t>(m)] = region_of[static_cast<size_t>(parent)];
  }
  struct Run {
    ModuleId module;
    size_t first, last;
  };
  std::vector<Run> runs;
  ModuleId prev = -1;
  for (size_t i = 0; i < nn; ++i) {
    const ModuleId mod = g.nodes[i].module;
    ModuleId r = mod >= 0 && static_cast<size_t>(mod) < nm ? region_of[static_cast<size_t>(mod)] : -1;
    if (mod < 0 && prev >= 0 && i + 1 < nn) r = prev;  // a node with no module (sym_size) stays in its call
    if (r < 0) {
      prev = -1;
      continue;
    }
    if (r != prev) runs.push_back({r, i, i});
    runs.back().last = i;
    prev = r;
  }
  std::vector<bool> cached(nn, false);
  for (int32_t i : opt.sac_saved_nodes)
    if (i >= 0 && static_cast<size_t>(i) < nn) cached[static_cast<size_t>(i)] = true;
  for (const Run& run : runs) {
    if (opt.selective) {
      for (size_t i = run.first; i <= run.last; ++i)
        if (!cached[i])
          out.own[static_cast<size_t>(module_of(g.nodes[i]))].recompute =
              add(out.own[static_cast<size_t>(module_of(g.nodes[i]))].recompute, fwd[i]);
      continue;
    }
    size_t stop = run.first;
    bool found = false, output = false;
    for (size_t i = run.first; i <= run.last; ++i) {
      const Saves s = saves_of(g.nodes[i].op);
      if (s != Saves::Nothing && out_grad[i]) {
        stop = i;
        found = true;
        output = s == Saves::Output;
      }
    }
    if (!found) continue;
    for (size_t i = run.first; i <= run.last; ++i)
      if (i < stop || (i == stop && output))
        out.own[static_cast<size_t>(module_of(g.nodes[i]))].recompute =
            add(out.own[static_cast<size_t>(module_of(g.nodes[i]))].recompute, fwd[i]);
  }

}

}  // namespace

FlopProfile count_graph_flops(const WalkGraph& g, const ModuleTree& tree, const GraphFlopOptions& opt) {
  const size_t nm = tree.num_modules();
  FlopProfile out;
  out.own.assign(nm, ModuleFlops{});
  // Which tensors need a gradient: trainable parameters, then every floating
  // output of an op with such an input (autograd records the call).
  std::vector<bool> grad(g.tensors.size(), false);
  for (const WalkPlaceholder& p : g.placeholders) {
    if (p.kind != WalkInput::Parameter || p.tensor < 0) continue;
    bool rg = g.tensors[static_cast<size_t>(p.tensor)].requires_grad;
    if (!opt.trainable_params.empty() && p.param >= 0 && static_cast<size_t>(p.param) < opt.trainable_params.size())
      rg = opt.trainable_params[static_cast<size_t>(p.param)];
    grad[static_cast<size_t>(p.tensor)] = rg;
  }
  auto floating = [&](int32_t t) {
    const DtypeInfo* d = g.tensors[static_cast<size_t>(t)].dtype;
    return d && is_floating_dtype(d->name);
  };
  const size_t nn = g.nodes.size();
  std::vector<int64_t> fwd(nn, 0);
  std::vector<bool> out_grad(nn, false);
  std::map<std::string, int64_t> unknown, beyond;
  auto module_of = [&](const WalkNode& n) -> ModuleId {
    return n.module >= 0 && static_cast<size_t>(n.module) < nm ? n.module : 0;
  };
  for (size_t i = 0; i < nn; ++i) {
    const WalkNode& n = g.nodes[i];
    NodeFlops f = node_flops(g, n, grad);
    if (opt.tp > 1 && f.counted) {  // a tensor-parallel rank's share of the op
      bool share = false;
      for (const WalkArg& a : n.args)
        for (int32_t t : a.tensors)
          if (t >= 0 && static_cast<size_t>(t) < opt.tp_local.size() && opt.tp_local[static_cast<size_t>(t)])
            share = true;
      if (share) f.forward /= opt.tp, f.backward /= opt.tp;
    }
    if (opt.cp > 1 && f.counted && n.op == "aten.scaled_dot_product_attention.default")
      f.forward = mul(f.forward, opt.cp), f.backward = mul(f.backward, opt.cp);
    if (!f.counted && looks_like_matmul(n.op)) ++unknown[n.op];
    if (f.beyond_counter) ++beyond[n.op];
    ModuleFlops& m = out.own[static_cast<size_t>(module_of(n))];
    m.forward = add(m.forward, f.forward);
    m.backward = add(m.backward, f.backward);
    fwd[i] = f.forward;
    if (f.forward > 0) {
      const ModuleId mod = module_of(n);
      if (!out.forward_order.empty() && out.forward_order.back().first == mod)
        out.forward_order.back().second = add(out.forward_order.back().second, f.forward);
      else
        out.forward_order.emplace_back(mod, f.forward);
    }
    bool any = false;
    if (!never_grad(n.op))
      for (const WalkArg& a : n.args)
        for (int32_t t : a.tensors)
          if (t >= 0 && grad[static_cast<size_t>(t)]) any = true;
    for (int32_t t : n.outputs)
      if (t >= 0 && any && floating(t)) {
        grad[static_cast<size_t>(t)] = true;
        out_grad[i] = true;
      }
  }
  if (!opt.checkpointed.empty()) add_checkpoint_recompute(g, tree, opt, fwd, out_grad, out);
  // A compiled call's backward runs the nodes the partitioner recomputes.
  for (int32_t i : opt.compiled_recomputed)
    if (i >= 0 && static_cast<size_t>(i) < g.nodes.size()) {
      const WalkNode& n = g.nodes[static_cast<size_t>(i)];
      ModuleFlops& own = out.own[static_cast<size_t>(n.module >= 0 && static_cast<size_t>(n.module) < nm ? n.module : 0)];
      own.recompute = add(own.recompute, fwd[static_cast<size_t>(i)]);
    }
  for (const auto& [op, count] : unknown)
    out.notes.push_back(op + " (" + std::to_string(count) + (count == 1 ? " node" : " nodes") +
                        ") counted as 0 FLOPs: FlopCounterMode's formulas here do not cover it");
  for (const auto& [op, count] : beyond)
    out.notes.push_back(op + " (" + std::to_string(count) + (count == 1 ? " node" : " nodes") +
                        ") counted as the matmuls it runs, 2 x M x K x N per group: FlopCounterMode has no formula "
                        "for it and counts 0");
  return out;
}

namespace {

bool same_options(const GraphFlopOptions& a, const GraphFlopOptions& b) {
  return a.checkpointed == b.checkpointed && a.selective == b.selective && a.sac_saved_nodes == b.sac_saved_nodes &&
         a.compiled_recomputed == b.compiled_recomputed &&
         a.trainable_params == b.trainable_params && a.tp_local == b.tp_local && a.tp == b.tp && a.cp == b.cp;
}

// count_graph_flops of a shared walk input, kept for the next calls: suggest
// plans many wrappings at one checkpointing and one mesh, and their FLOPs are
// the same (the count was 15% of a DeepSeek-V3 suggest, perf). An entry holds
// its input, so another input made at a freed one's address cannot match; a
// tree at the same address over the same input is that graph's tree. Entries
// are of one input, the latest (shared_walk_input's): no more graphs stay alive.
FlopProfile cached_graph_flops(const std::shared_ptr<const WalkGraph>& input, const ModuleTree& tree,
                               const GraphFlopOptions& opt) {
  struct Entry {
    std::shared_ptr<const WalkGraph> input;
    const ModuleTree* tree;
    GraphFlopOptions opt;
    FlopProfile profile;
  };
  constexpr size_t kEntries = 8;
  static thread_local std::deque<Entry> entries;
  if (!entries.empty() && entries.front().input != input) entries.clear();
  for (const Entry& e : entries)
    if (e.input == input && e.tree == &tree && same_options(e.opt, opt)) return e.profile;
  FlopProfile profile = count_graph_flops(*input, tree, opt);
  if (entries.size() == kEntries) entries.pop_front();
  entries.push_back(Entry{input, &tree, opt, profile});
  return profile;
}

// Skewed routing (expert_parallel.imbalance): the busiest rank's experts compute
// on imbalance x the routed rows, and their FLOPs are linear in the rows.
void scale_expert_flops(const Plan& plan, FlopProfile& out) {
  if (!plan.expert_parallel || plan.expert_parallel->imbalance == 1.0) return;
  const double f = plan.expert_parallel->imbalance;
  const auto scaled = [f](int64_t v) { return static_cast<int64_t>(std::ceil(f * static_cast<double>(v))); };
  std::vector<bool> expert(out.own.size(), false);
  for (const ExpertModule& x : plan.expert_parallel->modules)
    for (size_t m = 0; m < out.own.size(); ++m)
      if (plan.tree->within(static_cast<ModuleId>(m), x.module)) expert[m] = true;
  for (size_t m = 0; m < out.own.size(); ++m) {
    if (!expert[m]) continue;
    ModuleFlops& own = out.own[m];
    own = ModuleFlops{scaled(own.forward), scaled(own.backward), scaled(own.recompute)};
  }
  for (auto& [m, forward] : out.forward_order)
    if (m >= 0 && static_cast<size_t>(m) < expert.size() && expert[static_cast<size_t>(m)]) forward = scaled(forward);
}

}  // namespace

FlopProfile plan_graph_flops(const Plan& plan, const Graph& graph) {
  // One rank's dimensions (context parallelism splits the sequence), as the activations' walk.
  const std::vector<std::pair<std::string, int64_t>> given = rank_walk_dims(plan, graph);
  const DimValues dims = DimValues::hints(graph, given);
  // The activations' walk input, when the plan's graph is this one (planner.cpp: after plan_activations).
  const std::shared_ptr<const Graph>& shared = plan.tree->graph();
  std::optional<WalkGraph> own;
  std::shared_ptr<const WalkGraph> walked;
  if (shared.get() == &graph) walked = shared_walk_input(shared, given, dims);
  else own.emplace(walk_input(graph, dims));
  const WalkGraph& input = walked ? *walked : *own;
  GraphFlopOptions opt;
  for (const CheckpointedModule& c : plan.activations.checkpointed) {
    opt.checkpointed.push_back(c.module);
    opt.selective = opt.selective || c.selective;
  }
  opt.sac_saved_nodes = plan.activations.sac_saved_nodes;
  opt.compiled_recomputed = plan.activations.compiled_recomputed_nodes;
  opt.trainable_params = plan_trainable_params(plan);
  opt.tp_local = tp_local_tensors(input, plan);
  if (!opt.tp_local.empty()) opt.tp = plan.mesh.size(MeshDim::Tp);
  opt.cp = plan.mesh.size(MeshDim::Cp);
  FlopProfile out;
  try {
    out = walked ? cached_graph_flops(walked, *plan.tree, opt) : count_graph_flops(input, *plan.tree, opt);
  } catch (const FlopOverflow&) {
    throw InputError(graph.file(), "the graph's FLOPs do not fit in 64 bits at these dimensions (sizes too large)");
  }
  scale_expert_flops(plan, out);
  out.source = "graph";
  for (const DimSetting& d : dims.settings()) {
    if (d.name == "batch") out.batch = d.value;
    if (d.name == "seq") out.seq = d.value;
  }
  return out;
}

}  // namespace fsdp_plan
