#include "tp/activations.h"

#include <map>
#include <string_view>

#include "plan/plan.h"

namespace fsdp_plan {
namespace {
namespace tp_act {  // the unity build puts comm.cpp's and walk.cpp's helpers of the same names beside these

// A style's layout as the policy writes it: "replicate" or "shard(d)".
bool is_shard(const std::optional<std::string>& layout) { return layout && layout->rfind("shard", 0) == 0; }
int64_t shard_dim(const std::string& layout) {
  const size_t open = layout.find('(');
  return open == std::string::npos ? 0 : std::stoll(layout.substr(open + 1));
}

// "aten.transpose.int" -> "transpose"
std::string_view op_base(std::string_view op) {
  const size_t a = op.find('.');
  if (a == std::string_view::npos) return op;
  const size_t b = op.find('.', a + 1);
  return op.substr(a + 1, b == std::string_view::npos ? std::string_view::npos : b - a - 1);
}

const WalkArg* arg(const WalkNode& n, std::string_view name) {
  for (const WalkArg& a : n.args)
    if (a.name == name) return &a;
  return nullptr;
}
int64_t int_arg(const WalkNode& n, std::string_view name, int64_t fallback) {
  const WalkArg* a = arg(n, name);
  return a && a->value.kind == ArgValue::Kind::Int ? a->value.i : fallback;
}
int64_t wrap(int64_t d, int64_t rank) { return rank <= 0 ? 0 : ((d % rank) + rank) % rank; }
bool is_view(std::string_view b) {
  return b == "transpose" || b == "t" || b == "permute" || b == "swapaxes" || b == "view" || b == "reshape" ||
         b == "_unsafe_view" || b == "unsqueeze" || b == "select" || b == "alias";
}

class Localizer {
 public:
  Localizer(const WalkGraph& g, const Plan& plan)
      : g_(g), plan_(plan), tpp_(*plan.tensor_parallel), tp_(*plan.policy.tensor_parallel), T_(plan.mesh.size(MeshDim::Tp)) {}

  WalkGraph run() {
    out_.tensors = g_.tensors;
    out_.placeholders = g_.placeholders;
    shard_.assign(g_.tensors.size(), -1);
    remap_.resize(g_.tensors.size());
    for (size_t t = 0; t < remap_.size(); ++t) remap_[t] = static_cast<int32_t>(t);
    entry_.assign(plan_.tree->num_modules(), -1);
    for (const TpModule& m : tpp_.modules) entry_[static_cast<size_t>(m.module)] = m.entry;
    // PrepareModuleInput modules that gather a sharded input (style.py:
    // _prepare_input_arg, Shard to Replicate): each module below one reads
    // the one gathered copy made as it is entered.
    prep_.assign(plan_.tree->num_modules(), -1);
    for (const TpModule& m : tpp_.modules) {
      const TpStyleSpec& s = tp_.plan[static_cast<size_t>(m.entry)].second;
      if (s.style != TpStyle::PrepareModuleInput) continue;
      bool gathers = false;
      for (size_t i = 0; i < s.prepare_layouts.size(); ++i)
        gathers = gathers || (is_shard(s.prepare_layouts[i]) && s.prepare_desired[i] && !is_shard(s.prepare_desired[i]));
      if (gathers)
        for (ModuleId c : plan_.tree->preorder(m.module)) prep_[static_cast<size_t>(c)] = m.module;
    }
    made_in_.assign(g_.tensors.size(), -1);
    // Split parameters: the local shard the style made (TensorParallelPlan::placement).
    for (const WalkPlaceholder& p : g_.placeholders)
      if (p.kind == WalkInput::Parameter && p.tensor >= 0 && p.param >= 0 &&
          static_cast<size_t>(p.param) < tpp_.placement.size() &&
          tpp_.placement[static_cast<size_t>(p.param)].kind == TpPlacement::Kind::Shard)
        shard_[static_cast<size_t>(p.tensor)] = tpp_.placement[static_cast<size_t>(p.param)].dim;
    for (const WalkNode& n : g_.nodes) node(n);
    for (int32_t t : g_.outputs) out_.outputs.push_back(t >= 0 ? remap_[static_cast<size_t>(t)] : t);
    for (size_t t = 0; t < out_.tensors.size(); ++t) localize(static_cast<int32_t>(t));
    return std::move(out_);
  }

 private:
  int64_t shard_of(int32_t t) const { return t >= 0 ? shard_[static_cast<size_t>(t)] : -1; }
  const std::vector<int64_t>& sizes(int32_t t) const { return out_.tensors[static_cast<size_t>(t)].sizes; }
  int64_t rank(int32_t t) const { return static_cast<int64_t>(sizes(t).size()); }

  // A copy of `t` made by a collective (all-gather, or the chunk of a
  // Replicate input): a new tensor of t's global shape, sharded on `dim`.
  int32_t copy(int32_t t, int64_t dim, ModuleId module) {
    WalkTensor w = out_.tensors[static_cast<size_t>(t)];
    // Dense, as a collective's output is.
    int64_t stride = 1;
    for (size_t k = w.sizes.size(); k-- > 0;) {
      w.strides[k] = stride;
      stride *= w.sizes[k];
    }
    w.offset = 0;
    w.requires_grad = false;
    out_.tensors.push_back(w);
    shard_.push_back(dim);
    const int32_t id = static_cast<int32_t>(out_.tensors.size()) - 1;
    WalkNode n;
    n.op = "aten.clone.default";
    WalkArg self;
    self.name = "self";
    self.value.kind = ArgValue::Kind::Tensor;
    self.tensors = {t};
    n.args.push_back(std::move(self));
    n.outputs = {id};
    n.module = module;
    out_.nodes.push_back(std::move(n));
    return id;
  }

  const TpStyleSpec* styled_call(const WalkNode& n) const {
    if (n.module < 0 || static_cast<size_t>(n.module) >= entry_.size()) return nullptr;
    const int e = entry_[static_cast<size_t>(n.module)];
    if (e < 0 || (n.op != "aten.linear.default" && n.op != "aten.embedding.default")) return nullptr;
    const TpStyleSpec* s = &tp_.plan[static_cast<size_t>(e)].second;
    return colwise_like(s->style) || rowwise_like(s->style) ? s : nullptr;
  }

  void node(const WalkNode& in) {
    WalkNode n = in;
    const ModuleId p = n.module >= 0 && static_cast<size_t>(n.module) < prep_.size() ? prep_[static_cast<size_t>(n.module)] : -1;
    for (WalkArg& a : n.args)
      for (int32_t& t : a.tensors) {
        if (t < 0) continue;
        t = remap_[static_cast<size_t>(t)];
        // A sharded activation entering a gathering PrepareModuleInput: its copy.
        if (p >= 0 && shard_of(t) >= 0 && !is_param(t) && !inside_prep(t, p)) {
          auto it = gathered_.find({p, t});
          if (it == gathered_.end()) it = gathered_.emplace(std::make_pair(p, t), copy(t, -1, p)).first;
          t = it->second;
        }
      }
    for (int32_t o : n.outputs)
      if (o >= 0 && static_cast<size_t>(o) < made_in_.size()) made_in_[static_cast<size_t>(o)] = n.module;
    const int32_t y = n.outputs.empty() ? -1 : n.outputs[0];
    if (const TpStyleSpec* spec = styled_call(n); spec && y >= 0) {
      const bool linear = n.op == "aten.linear.default";
      WalkArg* x = nullptr;
      for (WalkArg& a : n.args)
        if (a.name == (linear ? "input" : "indices") && a.tensors.size() == 1 && a.tensors[0] >= 0) x = &a;
      if (spec->style == TpStyle::Colwise) {
        // _prepare_input_fn: the input made Replicate; a sequence-sharded input is all-gathered first.
        if (x && linear && shard_of(x->tensors[0]) >= 0) x->tensors[0] = copy(x->tensors[0], -1, n.module);
        shard_[static_cast<size_t>(y)] = rank(y) - 1;  // Shard(-1), kept local
        out_.nodes.push_back(std::move(n));
        // _prepare_output_fn: Shard(-1) to output_layouts; Replicate: all-gathered whole.
        if (spec->output_layouts && !is_shard(spec->output_layouts))
          remap_[static_cast<size_t>(y)] = copy(y, -1, in.module);
        return;
      }
      // RowwiseParallel: a Replicate input (rowwise_split_input) is chunked on its last dimension.
      if (x && linear && spec->input_layouts && !is_shard(spec->input_layouts) && shard_of(x->tensors[0]) < 0)
        x->tensors[0] = copy(x->tensors[0], rank(x->tensors[0]) - 1, n.module);
      // The Partial output all-reduced (Replicate) or reduce-scattered (Shard(d)).
      shard_[static_cast<size_t>(y)] =
          is_shard(spec->output_layouts) ? wrap(shard_dim(*spec->output_layouts), rank(y)) : -1;
      out_.nodes.push_back(std::move(n));
      return;
    }
    // Any other op: its outputs follow the first sharded tensor argument. A
    // split parameter only through a view of it (transformers' MoE experts
    // transpose their 3-D weights for grouped_mm): a styled module's own
    // linear / embedding is the rule above.
    int32_t src = -1;
    const bool view = is_view(op_base(n.op));
    for (const WalkArg& a : n.args) {
      for (int32_t t : a.tensors)
        if (t >= 0 && shard_of(t) >= 0 && (view || !is_param(t))) {
          src = t;
          break;
        }
      if (src >= 0) break;
    }
    if (src >= 0)
      for (int32_t o : n.outputs)
        if (o >= 0) shard_[static_cast<size_t>(o)] = follow(n, src, o);
    out_.nodes.push_back(std::move(n));
  }

  // Whether tensor t was made inside module p's subtree (a copy made at p counts).
  bool inside_prep(int32_t t, ModuleId p) const {
    ModuleId m = static_cast<size_t>(t) < made_in_.size() ? made_in_[static_cast<size_t>(t)] : p;
    for (; m >= 0; m = plan_.tree->module(m).parent)
      if (m == p) return true;
    return false;
  }

  bool is_param(int32_t t) const {
    if (param_.empty()) {
      param_.assign(g_.tensors.size(), false);
      for (const WalkPlaceholder& p : g_.placeholders)
        if (p.kind == WalkInput::Parameter && p.tensor >= 0) param_[static_cast<size_t>(p.tensor)] = true;
    }
    return static_cast<size_t>(t) < param_.size() && param_[static_cast<size_t>(t)];
  }

  // The dimension of output `o` that holds input `t`'s sharded dimension, -1 if none.
  int64_t follow(const WalkNode& n, int32_t t, int32_t o) const {
    const int64_t d = shard_of(t), ri = rank(t), ro = rank(o);
    const std::vector<int64_t>& si = sizes(t);
    const std::vector<int64_t>& so = sizes(o);
    const std::string_view base = op_base(n.op);
    auto check = [&](int64_t od) { return od >= 0 && od < ro ? od : -1; };
    if (base == "transpose" || base == "swapaxes") {
      const int64_t a = wrap(int_arg(n, "dim0", 0), ri), b = wrap(int_arg(n, "dim1", 0), ri);
      return check(d == a ? b : d == b ? a : d);
    }
    if (base == "t") return check(ri == 2 ? 1 - d : d);
    // Pieces of a split tensor keep its dimensions: each piece of the local
    // tensor is the local piece (transformers' packed gate/up halves).
    if (base == "chunk" || base == "split" || base == "split_with_sizes" || base == "unsafe_chunk" ||
        base == "unsafe_split" || base == "tensor_split")
      return check(ri == ro ? d : -1);
    if (base == "permute") {
      const WalkArg* dims = arg(n, "dims");
      if (!dims || dims->value.kind != ArgValue::Kind::Ints) return -1;
      for (size_t k = 0; k < dims->value.ints.size(); ++k)
        if (wrap(dims->value.ints[k], ri) == d) return check(static_cast<int64_t>(k));
      return -1;
    }
    if (base == "unsqueeze") {
      const int64_t at = wrap(int_arg(n, "dim", 0), ri + 1);
      return check(at <= d ? d + 1 : d);
    }
    if (base == "select" || base == "unbind") {
      const int64_t at = wrap(int_arg(n, "dim", 0), ri);
      return at == d ? -1 : check(at < d ? d - 1 : d);
    }
    if (base == "view" || base == "reshape" || base == "_unsafe_view" || base == "flatten" || base == "unflatten" ||
        base == "squeeze" || base == "view_as" || base == "reshape_as") {
      // The output dimension whose extent holds the sharded one's start: the
      // elements before it (the product of the outer sizes) fall inside it.
      int64_t outer = 1;
      for (int64_t k = 0; k < d; ++k) outer *= si[static_cast<size_t>(k)];
      int64_t before = 1;
      for (int64_t j = 0; j < ro; ++j) {
        const int64_t after = before * so[static_cast<size_t>(j)];
        if (before <= outer && outer < after) return j;
        before = after;
      }
      return -1;
    }
    // A matmul contracts its first operand's last dimension and its second's
    // one before last: a split there leaves a Partial, whole-sized output
    // (the MoE experts' down projection on the local intermediate columns),
    // whatever the sizes say; the second operand's last one is the output's.
    if (base == "mm" || base == "bmm" || base == "matmul" || base == "linear" || base == "grouped_mm_fallback" ||
        base == "_grouped_mm" || base == "grouped_mm") {
      int operand = -1, k = 0;  // which of the first two tensor arguments t is
      for (const WalkArg& a : n.args)
        for (int32_t x : a.tensors)
          if (x >= 0 && k < 2) {
            if (x == t && operand < 0) operand = k;
            ++k;
          }
      if (operand == 0 && d == ri - 1) return -1;
      if (operand == 1 && base != "linear" && ri >= 2 && d == ri - 2) return -1;
      if (operand == 1 && base != "linear" && d == ri - 1) return check(ro - 1);
    }
    // Elementwise, broadcasting, reductions, matmul: the dimension of the same
    // size aligned from the right (broadcasting's rule), else from the left.
    const int64_t right = d + (ro - ri);
    if (right >= 0 && right < ro && so[static_cast<size_t>(right)] == si[static_cast<size_t>(d)]) return right;
    if (d < ro && so[static_cast<size_t>(d)] == si[static_cast<size_t>(d)]) return d;
    return -1;
  }

  // Rank 0's local sizes (torch.chunk: ceil(n / tp)), and strides to match:
  // a stride outside the sharded dimension's (a dense layout's outer
  // dimensions) shrinks with it.
  void localize(int32_t t) {
    const int64_t d = shard_[static_cast<size_t>(t)];
    WalkTensor& w = out_.tensors[static_cast<size_t>(t)];
    if (d < 0 || d >= static_cast<int64_t>(w.sizes.size())) return;
    const int64_t n = w.sizes[static_cast<size_t>(d)];
    const int64_t local = (n + T_ - 1) / T_;
    if (n <= 0 || local == n) return;
    const int64_t inner = w.strides.size() == w.sizes.size() ? w.strides[static_cast<size_t>(d)] : 0;
    if (w.strides.size() == w.sizes.size() && inner > 0)
      for (size_t k = 0; k < w.strides.size(); ++k)
        if (w.strides[k] > inner && w.strides[k] % (inner * n) == 0) w.strides[k] = w.strides[k] / n * local;
    w.sizes[static_cast<size_t>(d)] = local;
  }

  const WalkGraph& g_;
  const Plan& plan_;
  const TensorParallelPlan& tpp_;
  const TensorParallel& tp_;
  const int64_t T_;
  WalkGraph out_;
  std::vector<int64_t> shard_;   // per tensor: its sharded dimension, -1: whole
  std::vector<int32_t> remap_;   // per original tensor: the tensor later nodes read (a gathered copy)
  std::vector<int> entry_;       // per module: its plan entry, -1: none
  std::vector<ModuleId> prep_;   // per module: the gathering PrepareModuleInput at or above it, -1: none
  std::vector<ModuleId> made_in_;  // per original tensor: the module of the node that made it, -1: an input
  std::map<std::pair<ModuleId, int32_t>, int32_t> gathered_;  // (PrepareModuleInput, tensor) -> its gathered copy
  mutable std::vector<bool> param_;
};

}  // namespace tp_act
}  // namespace

WalkGraph tp_local_walk_graph(const WalkGraph& graph, const Plan& plan) { return tp_act::Localizer(graph, plan).run(); }

LocalWalkGraph tp_local_graph(const Plan& plan) {
  if (!plan.tensor_parallel || !plan.policy.tensor_parallel || plan.mesh.size(MeshDim::Tp) <= 1) return {};
  return [&plan](const WalkGraph& g) { return tp_local_walk_graph(g, plan); };
}

}  // namespace fsdp_plan
