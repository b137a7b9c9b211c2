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

  void run(const NodeRun& call) {
    CallValues cv;
    for (int32_t i = call.first; i <= call.last; ++i) call_node_values(cv, call, i);
    const std::vector<bool> saved = partitioner_saves(cv.values);
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
  };

  int32_t call_value(CallValues& cv, int32_t sid, const NodeRun& call) {
    auto [it, fresh] = cv.of.emplace(sid, static_cast<int32_t>(cv.values.size()));
    if (!fresh) return it->second;
    Storage& st = w_.storages[static_cast<size_t>(sid)];
    CutValue v;
    // Traced, dropout is native_dropout's decomposition: a bool mask
    // (torch/_decomp/decompositions.py: native_dropout), no float noise.
    if (st.mask_bytes > 0) w_.storages[static_cast<size_t>(sid)].bytes = st.mask_bytes;
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
    for (const WalkArg& a : node.args)
      for (int32_t t : a.tensors) {
        if (!w_.valid(t)) continue;
        const int32_t v = call_value(cv, w_.meta[static_cast<size_t>(t)].storage, call);
        if (std::find(ins.begin(), ins.end(), v) == ins.end()) ins.push_back(v);
        in_bytes += w_.tensor_bytes(t);
        if (!fusible) cv.values[static_cast<size_t>(v)].materialized = true;
        if (cv.holder[static_cast<size_t>(v)] < 0) cv.holder[static_cast<size_t>(v)] = i;
      }
    for (int32_t o : node.outputs)
      if (w_.valid(o)) out_bytes += w_.tensor_bytes(o);
    std::vector<int32_t> made;
    for (int32_t sid = w_.node_storages[static_cast<size_t>(i)]; sid < w_.node_storages[static_cast<size_t>(i) + 1]; ++sid)
      made.push_back(sid);
    for (int32_t sid : made) {
      const int32_t v = call_value(cv, sid, call);
      // should_ban_recomputation: off the allowlist, or a reduction to a
      // quarter of its inputs or less; a kernel's extra outputs with it.
      cv.values[static_cast<size_t>(v)].banned =
          !recomputable || out_bytes * 4 < in_bytes || !node_output(node, sid);
      for (int32_t in : ins) cv.values[static_cast<size_t>(in)].users.push_back(v);
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
      CutValue& v = cv.values[static_cast<size_t>(call_value(cv, sid, call))];
      v.needed = true;
      if (!fusible) v.banned = true;
    }
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

void partition_compiled_call(const WalkGraph& g, WalkState& w, const NodeRun& call) { CompiledCall(g, w).run(call); }

}  // namespace fsdp_plan
