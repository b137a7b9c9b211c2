#include "activations/walk_rules.h"

#include <algorithm>

#include "activations/ring_attention.h"
#include "activations/walk.h"

namespace fsdp_plan {
namespace {

// Backward temporaries beyond the input gradients, for composite operators
// whose backward runs several kernels: their intermediate gradient lives
// next to the one they return. cross_entropy_loss's backward is
// nll_loss_backward (a [N, C] gradient of the log-probabilities) then
// _log_softmax_backward_data (the [N, C] gradient of the logits), both in
// self's dtype (aten/src/ATen/native/LossNLL.cpp, SoftMax.cpp): at the loss of
// a vocabulary-sized head this is the step's largest temporary
// (tests/activations/refs/headline_8b_noac.json: Temp 3.91 GiB = 2 x [4096, 128256] fp32).
// pow's backward makes two temporaries of self's size (below).
// The math SDPA's backward holds the gradients of the probabilities and of
// the scores, both [B, H, L, S] (attention.cpp: _scaled_dot_product_attention_math);
// with dropout, one: the dropped probabilities and the noise are saved beside
// the probabilities, and each gradient goes as the next is made (the tracker
// at BERT's checkpointed attention: softmax's output, the noise, the dropped
// probabilities and the first bmm's gradient, four [B, H, L, S] at once).
int64_t backward_temporaries(std::string_view op, const char* case_name, const CallArgs& args) {
  auto bytes_of = [&](std::string_view name) -> int64_t {
    const ArgValue* a = args.find(name);
    return a && a->kind == ArgValue::Kind::Tensor && a->tensor ? a->tensor->numel() * a->tensor->dtype->itemsize : 0;
  };
  if (op == "aten.cross_entropy_loss.default") return bytes_of("self");
  // pow_backward (torch/csrc/autograd/FunctionsManual.cpp): grad * (exponent *
  // self.pow(exponent - 1)): self.pow(exponent - 1) and its product with the
  // exponent live beside the gradient it returns, each self's size
  // (torch.square is pow(self, 2); exponent 0 is zeros_like alone). Seen by the
  // tracker at a relu^2 MLP's backward under checkpointing (Arcee, docs/fidelity.md).
  if (op == "aten.pow.Tensor_Scalar" || op == "aten.square.default") {
    const ArgValue* e = args.find("exponent");
    const bool zero =
        e && ((e->kind == ArgValue::Kind::Int && e->i == 0) || (e->kind == ArgValue::Kind::Float && e->f == 0));
    return zero ? 0 : 2 * bytes_of("self");
  }
  if (op == "aten.scaled_dot_product_attention.default" && case_name &&
      std::string_view(case_name).find("math") != std::string_view::npos) {
    const ArgValue* q = args.find("query");
    const ArgValue* k = args.find("key");
    if (!q || !k || !q->tensor || !k->tensor || q->tensor->sizes.size() < 2) return 0;
    int64_t probs = k->tensor->sizes[k->tensor->sizes.size() - 2];
    for (size_t d = 0; d + 1 < q->tensor->sizes.size(); ++d) probs *= q->tensor->sizes[d];
    const int64_t itemsize = q->tensor->dtype && q->tensor->dtype->itemsize == 2 ? 4 : q->tensor->dtype->itemsize;
    const ArgValue* p = args.find("dropout_p");
    const bool dropout =
        p && ((p->kind == ArgValue::Kind::Float && p->f > 0) || (p->kind == ArgValue::Kind::Int && p->i > 0));
    return (dropout ? 1 : 2) * probs * itemsize;
  }
  return 0;
}

// Row-major dense (size-1 dimensions have any stride), as torch's is_contiguous.
bool dense(const OpTensor& t) {
  int64_t expect = 1;
  for (size_t d = t.sizes.size(); d-- > 0;) {
    if (t.sizes[d] == 1) continue;
    if (d >= t.strides.size() || t.strides[d] != expect) return false;
    expect *= t.sizes[d];
  }
  return true;
}

constexpr std::string_view kSdpa = "aten.scaled_dot_product_attention.default";

// The SDPA call's ring beyond the plain call's outputs (forward) and input gradients (backward).
NodeExtra ring_attention_extra(const RingAttention& ring, std::string_view op, const CallArgs& args) {
  NodeExtra out;
  if (ring.cp <= 1 || op != kSdpa) return out;
  const ArgValue* q = args.find("query");
  const ArgValue* k = args.find("key");
  const ArgValue* v = args.find("value");
  if (!q || !k || !v || !q->tensor || !k->tensor || !v->tensor || !k->tensor->dtype || q->tensor->sizes.empty())
    return out;
  RingCall call;
  call.cp = ring.cp;
  call.head_tail = ring.head_tail;
  call.all_gather = ring.all_gather;
  call.q_numel = q->tensor->numel();
  call.kv_numel = k->tensor->numel();
  call.head_dim = std::max<int64_t>(1, q->tensor->sizes.back());
  call.itemsize = k->tensor->dtype->itemsize;
  call.kv_contiguous = dense(*k->tensor) && dense(*v->tensor);
  call.q_contiguous = dense(*q->tensor);
  // Beyond what the walk counts for the call itself: its outputs (forward), its input gradients (backward).
  const RingMemory f = ring_forward_memory(call), b = ring_backward_memory(call);
  out.forward = std::max<int64_t>(0, f.peak - f.exit);
  out.backward = std::max<int64_t>(0, b.peak - b.exit);
  return out;
}

}  // namespace

NodeExtra node_extra(std::string_view op, const char* case_name, const CallArgs& args, const RingAttention& ring) {
  NodeExtra out = ring_attention_extra(ring, op, args);
  out.backward += backward_temporaries(op, case_name, args);
  return out;
}

std::optional<std::vector<int64_t>> kernel_output_strides(std::string_view op, const OpCase& c, const CallArgs& args,
                                                          const std::vector<const OpTensor*>& outs,
                                                          const SaveEnv& env, const RingAttention& ring) {
  if (ring.cp > 1 && ring.head_tail && op == kSdpa && !outs.empty() && outs[0]) {
    std::vector<int64_t> st(outs[0]->sizes.size(), 1);
    for (size_t d = st.size(); d-- > 1;) st[d - 1] = st[d] * std::max<int64_t>(1, outs[0]->sizes[d]);
    return st;
  }
  return op_output_strides(c, args, outs, env);
}

// The view's strides from its input's, where the input's were corrected
// (graph_walk.py: _view_strides); nullopt when not derivable.
std::optional<std::vector<int64_t>> view_strides(std::string_view name, const OpTensor& t, const OpTensor& o,
                                                 const CallArgs& args) {
  const int64_t n = static_cast<int64_t>(t.sizes.size());
  auto get = [&](std::string_view k, int64_t fallback) {
    const ArgValue* a = args.find(k);
    return a && a->kind == ArgValue::Kind::Int ? a->i : fallback;
  };
  auto mod = [](int64_t a, int64_t m) { return m == 0 ? 0 : ((a % m) + m) % m; };
  std::vector<int64_t> st = t.strides;
  if (name == "alias" || name == "split" || name == "chunk" || name == "contiguous" || name == "to" ||
      name == "expand_as" || name == "detach")
    return st;
  if (name == "transpose") {
    const int64_t d0 = mod(get("dim0", 0), n), d1 = mod(get("dim1", 0), n);
    std::swap(st[static_cast<size_t>(d0)], st[static_cast<size_t>(d1)]);
    return st;
  }
  if (name == "t") {
    std::reverse(st.begin(), st.end());
    return st;
  }
  if (name == "permute") {
    const ArgValue* dims = args.find("dims");
    if (!dims || dims->kind != ArgValue::Kind::Ints) return std::nullopt;
    std::vector<int64_t> out;
    for (int64_t d : dims->ints) out.push_back(st[static_cast<size_t>(mod(d, n))]);
    return out;
  }
  if (name == "view" || name == "reshape" || name == "_unsafe_view" || name == "flatten")
    return compute_view_strides(t.sizes, t.strides, o.sizes);
  if (name == "unsqueeze") {
    const int64_t d = mod(get("dim", 0), n + 1);
    const int64_t added = d < n ? st[static_cast<size_t>(d)] * t.sizes[static_cast<size_t>(d)] : 1;
    st.insert(st.begin() + d, added);
    return st;
  }
  if (name == "squeeze") {
    if (n == 0) return st;
    const int64_t d = mod(get("dim", 0), n);
    if (t.sizes[static_cast<size_t>(d)] == 1) st.erase(st.begin() + d);
    return st;
  }
  if (name == "select") {
    st.erase(st.begin() + mod(get("dim", 0), n));
    return st;
  }
  if (name == "slice") {
    st[static_cast<size_t>(mod(get("dim", 0), n))] *= get("step", 1);
    return st;
  }
  if (name == "expand") {
    const int64_t k = static_cast<int64_t>(o.sizes.size()) - n;
    if (k < 0) return std::nullopt;
    std::vector<int64_t> out(static_cast<size_t>(k), 0);
    for (int64_t i = 0; i < n; ++i)
      out.push_back(t.sizes[static_cast<size_t>(i)] == 1 && o.sizes[static_cast<size_t>(k + i)] != 1
                        ? 0
                        : st[static_cast<size_t>(i)]);
    return out;
  }
  return std::nullopt;
}

// Operators whose backward returns the output's gradient itself to an input
// of the same size (derivatives.yaml add.Tensor: self: grad, other: grad (alpha 1); clone: grad).
bool passes_gradient(std::string_view op) {
  return op == "aten.add.Tensor" || op == "aten.clone.default" ||
         op == "aten.lift_fresh_copy.default";
}

// "aten.transpose.int" -> "transpose"
std::string_view aten_op_base(std::string_view op) {
  const size_t a = op.find('.');
  if (a == std::string_view::npos) return op;
  const size_t b = op.find('.', a + 1);
  return op.substr(a + 1, b == std::string_view::npos ? std::string_view::npos : b - a - 1);
}

std::vector<NodeRun> module_calls(const WalkGraph& g, const ModuleTree& tree, const std::vector<ModuleId>& modules,
                                     std::vector<int32_t>& node_call) {
  const size_t nm = tree.num_modules();
  std::vector<ModuleId> call_module(nm, -1);
  for (ModuleId m : modules) call_module[static_cast<size_t>(m)] = m;
  for (ModuleId m : tree.preorder()) {
    const ModuleId parent = tree.module(m).parent;
    if (call_module[static_cast<size_t>(m)] < 0 && parent >= 0)
      call_module[static_cast<size_t>(m)] = call_module[static_cast<size_t>(parent)];
  }
  std::vector<NodeRun> calls;
  node_call.assign(g.nodes.size(), -1);
  ModuleId prev = -1;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ModuleId mod = g.nodes[i].module;
    ModuleId r = mod >= 0 && static_cast<size_t>(mod) < nm ? call_module[static_cast<size_t>(mod)] : -1;
    if (mod < 0 && i > 0 && node_call[i - 1] >= 0 && i + 1 < g.nodes.size()) r = prev;
    if (r < 0) {
      prev = -1;
      continue;
    }
    if (r != prev || calls.empty()) calls.push_back({r, static_cast<int32_t>(i), static_cast<int32_t>(i)});
    calls.back().last = static_cast<int32_t>(i);
    node_call[i] = static_cast<int32_t>(calls.size()) - 1;
    prev = r;
  }
  return calls;
}

}  // namespace fsdp_plan
