#include "activations/compiled_call.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "activations/partitioner.h"

namespace fsdp_plan {
namespace {

class CompiledCall {
 public:
  CompiledCall(const WalkGraph& g, WalkState& w) : g_(g), w_(w) {}

  void run(const NodeRun& call, double memory_budget) {
    CallValues cv;
    for (int32_t i = call.first; i <= call.last; ++i) call_node_values(cv, call, i);
    const CutResult cut = partitioner_cut(cv.values, memory_budget);
    const std::vector<bool>& saved = cut.saved;
    for (size_t v = 0; v < cut.recomputed.size(); ++v) {
      const int32_t node = cv.values[v].node;
      if (cut.recomputed[v] && node >= 0 && (w_.recomputed.empty() || w_.recomputed.back() != node))
        w_.recomputed.push_back(node);
    }
    for (int32_t i = call.first; i <= call.last; ++i) w_.node_saves[static_cast<size_t>(i)].clear();
    for (size_t v = 0; v < saved.size(); ++v) {
      if (saved[v]) {
        // Let go at the backward of its first reader in the call (else its maker's).
        const int32_t made = w_.storages[static_cast<size_t>(cv.storage[v])].created;
        w_.node_saves[static_cast<size_t>(cv.holder[v] >= 0 ? cv.holder[v] : made)].push_back(cv.storage[v]);
      }
    }
  }

 private:
  // The cut's graph for one call: a value per storage it reads or makes.
  struct CallValues {
    std::vector<CutValue> values;
    std::vector<int32_t> storage;             // value -> storage
    std::unordered_map<int32_t, int32_t> of;  // storage -> value
    std::vector<int32_t> holder;              // value -> the call's node whose backward lets it go
    std::unordered_map<int32_t, int32_t> copies;  // tensor -> its traced copy's value (traced_copy)
  };

  int32_t call_value(CallValues& cv, int32_t sid, const NodeRun& call) {
    auto [it, fresh] = cv.of.emplace(sid, static_cast<int32_t>(cv.values.size()));
    if (!fresh) return it->second;
    Storage& st = w_.storages[static_cast<size_t>(sid)];
    CutValue v;
    // Traced, dropout is native_dropout's decomposition: a bool mask
    // (torch/_decomp/decompositions.py: native_dropout), no float noise.
    if (st.mask_bytes > 0) st.bytes = st.mask_bytes;
    v.bytes = st.bytes;
    v.input = st.created < call.first;
    v.free = st.kind == StorageKind::Param;
    v.materialized = st.last_use > call.last || st.output;  // read after the call
    cv.values.push_back(v);
    cv.storage.push_back(sid);
    cv.holder.push_back(-1);
    return it->second;
  }

  // Node i's part of the cut's graph: what it reads (and so holds first), what it makes, what its backward reads.
  void call_node_values(CallValues& cv, const NodeRun& call, int32_t i) {
    const WalkNode& node = g_.nodes[static_cast<size_t>(i)];
    const bool fusible = fusible_node(node), recomputable = recomputable_node(node);
    std::vector<int32_t> ins;
    int64_t in_bytes = 0, out_bytes = 0;
    std::vector<std::pair<int32_t, int32_t>> read_copies;  // storage -> the traced copy's value read in its place
    for (const WalkArg& a : node.args)
      for (int32_t t : a.tensors) {
        if (!w_.valid(t)) continue;
        const int32_t sid = w_.meta[static_cast<size_t>(t)].storage;
        auto copy = cv.copies.find(t);
        const int32_t v = copy != cv.copies.end() ? copy->second : call_value(cv, sid, call);
        if (copy != cv.copies.end()) read_copies.emplace_back(sid, v);
        if (std::find(ins.begin(), ins.end(), v) == ins.end()) ins.push_back(v);
        in_bytes += w_.tensor_bytes(t);
        if (!fusible) cv.values[static_cast<size_t>(v)].materialized = true;
        if (cv.holder[static_cast<size_t>(v)] < 0) cv.holder[static_cast<size_t>(v)] = i;
      }
    for (int32_t o : node.outputs)
      if (w_.valid(o)) out_bytes += w_.tensor_bytes(o);
    std::vector<int32_t> made;
    const int32_t first = w_.node_storages[static_cast<size_t>(i)], end = w_.node_storages[static_cast<size_t>(i) + 1];
    for (int32_t sid = first; sid < end; ++sid) made.push_back(sid);
    const bool compute = compute_or_random_node(node, w_.node_case[static_cast<size_t>(i)]);
    const double flops = node_flops(node);
    for (int32_t sid : made) {
      CutValue& v = cv.values[static_cast<size_t>(call_value(cv, sid, call))];
      // should_ban_recomputation's reasons: off the allowlist, compute-intensive
      // or random, a reduction to a quarter of its inputs or less. A kernel's
      // extra outputs go with it; a decomposed norm's statistics and dropout's
      // mask are reductions and random ops of their own.
      v.off_allowlist = !recomputable;
      // dropout's output is recomputed from its input and its mask, the random part.
      v.compute = compute && !(recomputable && node_output(node, sid));
      v.reduction = out_bytes * 4 < in_bytes || (recomputable && !node_output(node, sid));
      v.node = i;
      v.flops = flops;
      for (int32_t in : ins) cv.values[static_cast<size_t>(in)].users.push_back(cv.of.at(sid));
    }
    // The outputs are computed from the node's own extra tensors (dropout's from its mask).
    for (int32_t sid : made)
      if (!node_output(node, sid))
        for (int32_t out : made)
          if (node_output(node, out)) cv.values[static_cast<size_t>(cv.of.at(sid))].users.push_back(cv.of.at(out));
    // A matmul's or attention's backward cannot fuse with what it reads, which
    // so is never recomputed (is_materialized_backwards).
    const bool relu = aten_op_base(node.op) == "relu" || aten_op_base(node.op) == "relu_";
    for (int32_t& sid : w_.node_saves[static_cast<size_t>(i)]) {
      if (relu && node_output(node, sid)) sid = relu_mask(cv, call, i, sid);
      int32_t value = -1;
      for (const auto& [storage, copy] : read_copies)
        if (storage == sid) value = copy;
      CutValue& v = cv.values[static_cast<size_t>(value >= 0 ? value : call_value(cv, sid, call))];
      v.needed = true;
      if (!fusible) v.materialized_bw = true;
    }
    traced_copy(cv, i, ins);
  }

  // The traced graph keeps the layout the export recorded for a fused
  // attention kernel's output (the math path's), so a `contiguous` or
  // `reshape` after its transpose, an alias in the eager run (walk.h rule 2),
  // is a clone there: a node of the cut of its own, which the partitioner
  // may save beside the kernel's output and counts in the sizes its memory
  // budget weighs. In memory the two are one storage (measured: saved-tensor
  // hooks see one), where the saves go.
  void traced_copy(CallValues& cv, int32_t i, const std::vector<int32_t>& ins) {
    const WalkNode& node = g_.nodes[static_cast<size_t>(i)];
    const std::string_view base = aten_op_base(node.op);
    const bool reshape = base == "contiguous" || base == "reshape";
    if (!w_.node_view[static_cast<size_t>(i)] || !reshape || node.outputs.size() != 1) return;
    const int32_t o = node.outputs[0];
    if (!w_.valid(o) || !w_.restrided[static_cast<size_t>(o)]) return;
    if (!is_contiguous(w_.meta[static_cast<size_t>(o)])) return;
    CutValue v;
    v.bytes = w_.tensor_bytes(o);
    v.node = i;
    v.materialized = true;
    const int32_t index = static_cast<int32_t>(cv.values.size());
    for (int32_t in : ins) cv.values[static_cast<size_t>(in)].users.push_back(index);
    cv.values.push_back(v);
    cv.storage.push_back(w_.meta[static_cast<size_t>(o)].storage);
    cv.holder.push_back(-1);
    cv.copies.emplace(o, index);
  }

  // estimate_runtime's "flops" (torch/utils/flop_counter.py): a matmul's
  // 2 x output x K, SDPA's two bmms; 1 for the rest (a knapsack item's weight).
  double node_flops(const WalkNode& node) const {
    const std::string_view base = aten_op_base(node.op);
    const OpTensor* a = nullptr;  // the left operand
    const OpTensor* k = nullptr;  // SDPA's key
    for (const WalkArg& arg : node.args) {
      if (arg.tensors.size() != 1 || !w_.valid(arg.tensors[0])) continue;
      const OpTensor* t = &w_.meta[static_cast<size_t>(arg.tensors[0])];
      if (arg.name == "mat1") a = t;  // addmm's: its self is the bias
      else if ((arg.name == "input" || arg.name == "self" || arg.name == "query") && !a) a = t;
      if (arg.name == "key") k = t;
    }
    if (node.outputs.empty() || !w_.valid(node.outputs[0]) || !a || a->sizes.empty()) return 1;
    const double out = static_cast<double>(w_.meta[static_cast<size_t>(node.outputs[0])].numel());
    if (base == "linear" || base == "mm" || base == "addmm" || base == "bmm" || base == "matmul")
      return 2 * out * static_cast<double>(a->sizes.back());
    if (base == "scaled_dot_product_attention" && k && k->sizes.size() >= 2) {
      const double s = static_cast<double>(k->sizes[k->sizes.size() - 2]);
      const double dv = static_cast<double>(w_.meta[static_cast<size_t>(node.outputs[0])].sizes.back());
      return 2 * out * s + 2 * (out / dv) * s * static_cast<double>(a->sizes.back());
    }
    return 1;
  }

  // relu's backward reads only where its output is positive: traced,
  // threshold_backward's decomposition reads the bool `result <= 0`, which the
  // cut saves in place of the output (a quarter of its bytes in fp32).
  int32_t relu_mask(CallValues& cv, const NodeRun& call, int32_t i, int32_t out) {
    const int32_t o = g_.nodes[static_cast<size_t>(i)].outputs[0];
    const int32_t mask = w_.new_storage(w_.meta[static_cast<size_t>(o)].numel(), StorageKind::Activation, i);
    const int32_t v = call_value(cv, mask, call);
    cv.values[static_cast<size_t>(cv.of.at(out))].users.push_back(v);
    return mask;
  }

  bool node_output(const WalkNode& node, int32_t sid) const {
    return std::any_of(node.outputs.begin(), node.outputs.end(),
                       [&](int32_t o) { return w_.valid(o) && w_.meta[static_cast<size_t>(o)].storage == sid; });
  }

  const WalkGraph& g_;
  WalkState& w_;
};

}  // namespace

void partition_compiled_call(const WalkGraph& g, WalkState& w, const NodeRun& call, double memory_budget) {
  CompiledCall(g, w).run(call, memory_budget);
}

}  // namespace fsdp_plan
