#include "activations/walk.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_map>

#include "activations/compiled_call.h"
#include "activations/retype.h"
#include "activations/walk_rules.h"
#include "activations/walk_state.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

// One call of a checkpointed module: a maximal run of consecutive nodes in its subtree.
struct Region : NodeRun {
  explicit Region(const NodeRun& c) : NodeRun(c) {}
  int64_t inputs = 0, recompute = 0;
  int64_t cached = 0, recompute_peak = 0;  // selective checkpointing
};

class Walker {
 public:
  Walker(const WalkGraph& g, const ModuleTree& tree, size_t num_units, const WalkOptions& opt, ActivationPlan& out,
         std::vector<Warning>* warnings)
      : g_(g), tree_(tree), num_units_(num_units), opt_(opt), out_(out), warnings_(warnings),
        retype_(opt.compute_dtype, opt.export_dtype) {}

  const WalkTensor& tensor(int32_t t) const { return rank_tensor(g_, opt_.local_tensors, t); }

  void run() {
    w_.meta.resize(g_.tensors.size());
    w_.restrided.assign(g_.tensors.size(), false);
    regions();
    placeholders();
    const int32_t n = static_cast<int32_t>(g_.nodes.size());
    recorded_.assign(static_cast<size_t>(n), false);
    w_.node_saves.assign(static_cast<size_t>(n), {});
    node_extra_.assign(static_cast<size_t>(n), NodeExtra{});
    node_diff_.assign(static_cast<size_t>(n), {});
    w_.node_view.assign(static_cast<size_t>(n), false);
    w_.node_case.assign(static_cast<size_t>(n), nullptr);
    w_.node_storages.assign(static_cast<size_t>(n) + 1, 0);
    for (int32_t i = 0; i < n; ++i) {
      w_.node_storages[static_cast<size_t>(i)] = static_cast<int32_t>(w_.storages.size());
      node(i);
    }
    w_.node_storages[static_cast<size_t>(n)] = static_cast<int32_t>(w_.storages.size());
    for (int32_t t : g_.outputs) {
      if (t < 0 || static_cast<size_t>(t) >= w_.meta.size() || w_.meta[static_cast<size_t>(t)].storage < 0) continue;
      const int32_t storage = w_.meta[static_cast<size_t>(t)].storage;
      Storage& s = w_.storages[static_cast<size_t>(storage)];
      s.output = true;
      s.last_use = std::max(s.last_use, n - 1);
      // A retyped upcast returned as an output: in the fp32 export `logits.float()`
      // was a no-op, so the graph returns the upcast; the bf16 run returns the
      // bf16 logits and frees the upcast after the loss (transformers'
      // ForCausalLMLoss). Hold the source to the end too (an H200 run,
      // bench/gpu_check.py: the forward's peak was one bf16 logits low).
      if (auto it = retype_.upcasts().find(storage); it != retype_.upcasts().end()) {
        const int32_t source = w_.meta[static_cast<size_t>(it->second)].storage;
        if (source >= 0) {
          Storage& src = w_.storages[static_cast<size_t>(source)];
          src.output = true;
          src.last_use = std::max(src.last_use, n - 1);
        }
      }
    }
    compiled_saves();
    find_loss();
    sac_recompute_peaks();
    summarise();
    timeline();
  }

 private:
  // ------------------------------------------------------------------ setup
  int32_t new_storage(int64_t bytes, StorageKind kind, int32_t created) { return w_.new_storage(bytes, kind, created); }

  void fill_meta(int32_t t, int32_t storage, int64_t storage_bytes, bool rg, const DtypeInfo* dtype = nullptr) {
    const WalkTensor& w = tensor(t);
    OpTensor& m = w_.meta[static_cast<size_t>(t)];
    m.sizes = w.sizes;
    m.strides = w.strides;
    m.offset = w.offset;
    m.dtype = dtype ? dtype : w.dtype;
    m.storage = storage;
    m.storage_bytes = storage_bytes;
    m.requires_grad = rg;
  }

  int64_t span_of(int32_t t, const DtypeInfo* dtype = nullptr) const {
    const WalkTensor& w = tensor(t);
    if (!dtype) dtype = w.dtype;
    return span_bytes(w.sizes, w.strides, dtype ? dtype->itemsize : 4, w.offset);
  }

  bool retype() const { return retype_.active(); }
  const DtypeInfo* run_dtype(const CallArgs& args, int32_t o) const { return retype_.run_dtype(args, tensor(o).dtype); }

  void placeholders() {
    for (const WalkPlaceholder& p : g_.placeholders) {
      if (p.tensor < 0 || static_cast<size_t>(p.tensor) >= g_.tensors.size()) continue;
      const WalkTensor& w = tensor(p.tensor);
      bool rg = false;
      StorageKind kind = StorageKind::Param;
      if (p.kind == WalkInput::Parameter) {
        rg = w.requires_grad;
        if (p.param >= 0 && static_cast<size_t>(p.param) < opt_.trainable_params.size())
          rg = opt_.trainable_params[static_cast<size_t>(p.param)];
      } else if (p.kind == WalkInput::UserInput) {
        kind = StorageKind::Input;
      }
      // Parameters run in param_dtype under mixed precision (retype); buffers keep theirs.
      const DtypeInfo* dtype = p.kind == WalkInput::Parameter && retype() && w.dtype == opt_.export_dtype
                                   ? opt_.compute_dtype
                                   : w.dtype;
      const int64_t bytes = span_of(p.tensor, dtype);
      if (kind == StorageKind::Input) out_.input_bytes += bytes;
      int32_t s = new_storage(bytes, kind, -1);
      if (p.kind == WalkInput::Parameter && p.param >= 0 && static_cast<size_t>(p.param) < opt_.unit_of_param.size())
        w_.storages[static_cast<size_t>(s)].owner = opt_.unit_of_param[static_cast<size_t>(p.param)];
      fill_meta(p.tensor, s, bytes, rg && w.dtype && is_floating_dtype(w.dtype->name), dtype);
      // FSDP's cast of a floating input under mixed precision is a copy made
      // in the forward (the root's pre-forward): an activation where it is saved.
      if (kind == StorageKind::Input && opt_.input_cast && w.dtype && is_floating_dtype(w.dtype->name) &&
          w.dtype != opt_.input_cast) {
        OpTensor& m = w_.meta[static_cast<size_t>(p.tensor)];
        m.dtype = opt_.input_cast;
        m.storage_bytes = m.numel() * opt_.input_cast->itemsize;
        w_.storages[static_cast<size_t>(s)].kind = StorageKind::Activation;
        w_.storages[static_cast<size_t>(s)].bytes = m.storage_bytes;
      }
    }
  }

  // Checkpointed calls, and compiled ones (torch.compile'd modules).
  void regions() {
    for (const NodeRun& c : module_calls(g_, tree_, opt_.checkpointed, node_region_)) regions_.emplace_back(c);
    compiled_calls_ = module_calls(g_, tree_, opt_.compiled, node_compiled_);
  }

  // ------------------------------------------------------------------ forward
  CallArgs bind(const WalkNode& node) {
    CallArgs args;
    args.items.reserve(node.args.size() + 4);
    for (const WalkArg& a : node.args) {
      if (a.value.kind == ArgValue::Kind::Tensor) {
        const int32_t t = a.tensors.empty() ? -1 : a.tensors[0];
        args.items.emplace_back(a.name, ArgValue::of_tensor(valid(t) ? &w_.meta[static_cast<size_t>(t)] : nullptr));
      } else if (a.value.kind == ArgValue::Kind::Tensors) {
        std::vector<const OpTensor*> ts;
        for (int32_t t : a.tensors) ts.push_back(valid(t) ? &w_.meta[static_cast<size_t>(t)] : nullptr);
        args.items.emplace_back(a.name, ArgValue::of_tensors(std::move(ts)));
      } else {
        args.items.emplace_back(a.name, a.value);
      }
    }
    return args;
  }

  bool valid(int32_t t) const { return w_.valid(t); }

  void missing(const std::string& op, const std::string& why) {
    auto it = std::find_if(missing_.begin(), missing_.end(), [&](const auto& e) { return e.first == op; });
    if (it == missing_.end()) {
      missing_.emplace_back(op, 1);
      missing_why_.push_back(why);
    } else {
      ++it->second;
    }
  }

  void save(int32_t storage, int32_t node, ModuleId module) {
    if (storage < 0) return;
    Storage& s = w_.storages[static_cast<size_t>(storage)];
    if (s.first_saver < 0) {
      s.first_saver = node;
      s.saved_module = module;
    }
    if (node_region_[static_cast<size_t>(node)] < 0) s.saved_outside = true;
    w_.node_saves[static_cast<size_t>(node)].push_back(storage);
  }

  void node(int32_t i) {
    node_forward(i);
    if (opt_.sac) sac_node(i);
  }

  void node_forward(int32_t i) {
    const WalkNode& node = g_.nodes[static_cast<size_t>(i)];
    CallArgs args = bind(node);
    // Uses: liveness, and the inputs of a checkpointed call (made outside it).
    const int32_t region = node_region_[static_cast<size_t>(i)];
    for (const WalkArg& a : node.args)
      for (int32_t t : a.tensors) {
        if (!valid(t)) continue;
        const int32_t sid = w_.meta[static_cast<size_t>(t)].storage;
        Storage& s = w_.storages[static_cast<size_t>(sid)];
        s.last_use = std::max(s.last_use, i);
        if (region >= 0 && s.kind == StorageKind::Activation && s.region_input < 0 &&
            (s.created < regions_[static_cast<size_t>(region)].first)) {
          s.region_input = region;
          regions_[static_cast<size_t>(region)].inputs += s.bytes;
        }
      }
    const OpRow* row = node.row_found ? node.row : find_op_row(node.op);
    if (row) {
      try {
        walk_row(i, node, *row, args);
        return;
      } catch (const TableExprError& e) {
        missing(node.op, std::string("its row cannot be evaluated on this call: ") + e.what());
      }
    } else {
      missing(node.op, "no row");
    }
    // Conservative: every tensor argument saved, outputs new storages.
    bool rg = false;
    for (const auto& [name, v] : args.items) v.for_each_tensor([&](const OpTensor& t) { rg = rg || t.requires_grad; });
    for (int32_t o : node.outputs) {
      if (o < 0 || static_cast<size_t>(o) >= g_.tensors.size()) continue;
      const DtypeInfo* dtype = run_dtype(args, o);
      const int64_t bytes = span_of(o, dtype);
      fill_meta(o, new_storage(bytes, StorageKind::Activation, i), bytes, rg && dtype && is_floating_dtype(dtype->name),
                dtype);
    }
    if (!rg) return;
    recorded_[static_cast<size_t>(i)] = true;
    for (const WalkArg& a : node.args)
      for (int32_t t : a.tensors)
        if (valid(t)) {
          save(w_.meta[static_cast<size_t>(t)].storage, i, node.module);
          node_diff_[static_cast<size_t>(i)].push_back(t);
        }
  }

  void walk_row(int32_t i, const WalkNode& node, const OpRow& row, CallArgs& args) {
    add_op_defaults(row, args);
    retype_.cast(node, args);
    std::vector<OpTensor> subs;
    retype_.same_dtype_operands(node, args, subs, w_.meta);
    const bool recorded = op_records(row, args);
    // Outputs as recorded, for alias_when and case conditions that read them
    // (in scratch kept from node to node: their lists keep their capacity).
    const size_t num_outs = node.outputs.size();
    if (recorded_outs_.size() < num_outs) recorded_outs_.resize(num_outs);
    std::vector<const OpTensor*>& outs_view = outs_view_;
    outs_view.clear();
    for (size_t k = 0; k < num_outs; ++k) {
      const int32_t o = node.outputs[k];
      OpTensor& m = recorded_outs_[k];
      m.offset = 0;
      m.storage = -1;
      m.storage_bytes = 0;
      m.requires_grad = false;
      if (o >= 0 && static_cast<size_t>(o) < g_.tensors.size()) {
        const WalkTensor& w = tensor(o);
        m.sizes.assign(w.sizes.begin(), w.sizes.end());
        m.strides.assign(w.strides.begin(), w.strides.end());
        m.dtype = run_dtype(args, o);
      } else {
        m.sizes.clear();
        m.strides.clear();
        m.dtype = nullptr;
      }
      outs_view.push_back(&m);
    }
    const char* row_alias = op_row_alias(row);
    const std::string_view base = aten_op_base(node.op);
    std::vector<const OpTensor*>& outs = outs_;
    outs.assign(num_outs, nullptr);
    for (size_t k = 0; k < node.outputs.size(); ++k) {
      const int32_t o = node.outputs[k];
      if (o < 0 || static_cast<size_t>(o) >= g_.tensors.size()) continue;
      const DtypeInfo* dtype = run_dtype(args, o);
      const bool rg = recorded && dtype && is_floating_dtype(dtype->name);
      std::optional<std::string> alias = op_output_alias(row, k, args, outs_view, opt_.env);
      const ArgValue* src = alias ? args.find(*alias) : nullptr;
      if (src && src->kind == ArgValue::Kind::Tensor && src->tensor) {
        // A view has its base's dtype (view.dtype aside, which no row aliases).
        fill_meta(o, src->tensor->storage, src->tensor->storage_bytes, rg, src->tensor->dtype);
        // In place: `self` is the output, and needs a gradient when it does.
        if (row_alias && std::string_view(row_alias) == "self" && !base.empty() && base.back() == '_' && rg)
          const_cast<OpTensor*>(src->tensor)->requires_grad = true;
        w_.node_view[static_cast<size_t>(i)] = true;
      } else {
        const int64_t bytes = span_of(o, dtype);
        fill_meta(o, new_storage(bytes, StorageKind::Activation, i), bytes, rg, dtype);
        // A new storage made from a parameter or input alone is still an activation
        // (a dtype copy of a weight is not: FSDP's gathered copy is the memory model's).
      }
      outs[k] = &w_.meta[static_cast<size_t>(o)];
    }
    retype_.note_upcast(node, base, w_.meta);
    const OpCase& c = select_op_case(row, args, outs, opt_.env);
    restride(node, base, c, args, outs);
    w_.node_case[static_cast<size_t>(i)] = op_case_name(c);
    if (!recorded) return;
    recorded_[static_cast<size_t>(i)] = true;
    if (const char* name = op_case_name(c); name && node.op == "aten.scaled_dot_product_attention.default") {
      if (std::find(sdpa_cases_.begin(), sdpa_cases_.end(), name) == sdpa_cases_.end()) sdpa_cases_.emplace_back(name);
    }
    std::vector<int32_t> slots;  // new tensors' storages by slot
    for (const SavedTensor& s : op_saves(row, c, args, outs, opt_.env)) {
      int32_t sid = s.storage;
      if (sid < 0 && s.new_slot >= 0) {
        if (static_cast<size_t>(s.new_slot) >= slots.size()) slots.resize(static_cast<size_t>(s.new_slot) + 1, -1);
        int32_t& slot = slots[static_cast<size_t>(s.new_slot)];
        if (slot < 0) slot = new_storage(s.bytes, StorageKind::Activation, i);
        sid = slot;
        // Dropout's noise, a bool mask where the dropout is traced (compiled calls).
        if ((s.what == "noise" || s.what == "dropout_noise") && s.dtype)
          w_.storages[static_cast<size_t>(sid)].mask_bytes = s.bytes / s.dtype->itemsize;
      }
      save(sid, i, node.module);
    }
    node_extra_[static_cast<size_t>(i)] = node_extra(node.op, op_case_name(c), args, opt_.ring);
    for (const std::string_view name : op_differentiable(row)) {
      const WalkArg* a = nullptr;
      for (const WalkArg& x : node.args)
        if (x.name == name) a = &x;
      if (!a) continue;
      for (int32_t t : a->tensors)
        if (valid(t)) node_diff_[static_cast<size_t>(i)].push_back(t);
    }
  }

  // The fused attention kernels' outputs take the row's layout (a meta-device
  // export records the math path's); views after them are derived again.
  void restride(const WalkNode& node, std::string_view base, const OpCase& c, const CallArgs& args,
                const std::vector<const OpTensor*>& outs) {
    if (std::optional<std::vector<int64_t>> st = kernel_output_strides(node.op, c, args, outs, opt_.env, opt_.ring)) {
      const int32_t o = node.outputs.empty() ? -1 : node.outputs[0];
      if (valid(o) && st->size() == w_.meta[static_cast<size_t>(o)].sizes.size()) {
        w_.meta[static_cast<size_t>(o)].strides = *st;
        w_.restrided[static_cast<size_t>(o)] = true;
      }
      return;
    }
    const WalkArg* self = nullptr;
    for (const WalkArg& a : node.args)
      if (a.name == "self") self = &a;
    if (!self || self->tensors.size() != 1 || !valid(self->tensors[0])) return;
    if (!w_.restrided[static_cast<size_t>(self->tensors[0])]) return;
    const OpTensor& t = w_.meta[static_cast<size_t>(self->tensors[0])];
    for (int32_t o : node.outputs) {
      if (!valid(o)) continue;
      OpTensor& m = w_.meta[static_cast<size_t>(o)];
      if (m.storage != t.storage) continue;  // a copy: dense, as recorded
      if (auto st = view_strides(base, t, m, args)) {
        m.strides = *st;
        w_.restrided[static_cast<size_t>(o)] = true;
      }
    }
  }

  // ------------------------------------------------------------------ selective checkpointing
  // The ops of a checkpointed call whose outputs the policy caches
  // (selective.h); each call has its own policy (and mm count).
  void sac_node(int32_t i) {
    const int32_t r = node_region_[static_cast<size_t>(i)];
    if (r < 0) return;
    while (sac_calls_.size() <= static_cast<size_t>(r)) sac_calls_.emplace_back(*opt_.sac);
    const WalkNode& node = g_.nodes[static_cast<size_t>(i)];
    bool saved = false;
    for (const SacStep& step : sac_dispatch(node.op, w_.node_case[static_cast<size_t>(i)])) {
      if (!sac_calls_[static_cast<size_t>(r)].saves(step.op, mm_rhs(node, step.op))) continue;
      saved = true;
      if (step.product == SacProduct::Outputs) {
        sac_cache_outputs(i, r, step.op.find("attention") != std::string_view::npos);
        continue;
      }
      sac_cache_attention(i, r, step.product);
    }
    if (saved) out_.sac_saved_nodes.push_back(i);
  }

  // The shape (in, out) of an mm's second argument, as torchtitan reads
  // args[1].shape: for linear's mm, weight.t().
  std::optional<std::pair<int64_t, int64_t>> mm_rhs(const WalkNode& node, std::string_view op) const {
    if (op != "aten.mm.default") return std::nullopt;
    const bool linear = node.op == "aten.linear.default";
    for (const WalkArg& a : node.args) {
      if (a.tensors.size() != 1 || !valid(a.tensors[0])) continue;
      if (a.name != (linear ? "weight" : node.op == "aten.matmul.default" ? "other" : "mat2")) continue;
      const std::vector<int64_t>& sz = w_.meta[static_cast<size_t>(a.tensors[0])].sizes;
      if (sz.size() != 2) return std::nullopt;
      return linear ? std::make_pair(sz[1], sz[0]) : std::make_pair(sz[0], sz[1]);
    }
    return std::nullopt;
  }

  void sac_cache(int32_t storage, int32_t region) {
    Storage& s = w_.storages[static_cast<size_t>(storage)];
    if (s.kind != StorageKind::Activation || s.cached_in >= 0) return;
    s.cached_in = region;
    regions_[static_cast<size_t>(region)].cached += s.bytes;
  }

  // The op's outputs (new storages; a view's is its base's, made earlier and
  // not the op's); a fused attention kernel's extra outputs (logsumexp, the
  // RNG state), which the op table makes as new storages of the node, too.
  void sac_cache_outputs(int32_t i, int32_t r, bool kernel_extras) {
    const int32_t first = w_.node_storages[static_cast<size_t>(i)];  // the first storage node i made
    for (int32_t o : g_.nodes[static_cast<size_t>(i)].outputs)
      if (valid(o)) {
        const int32_t sid = w_.meta[static_cast<size_t>(o)].storage;
        if (sid >= first) sac_cache(sid, r);
      }
    if (kernel_extras)
      for (int32_t sid = first; sid < static_cast<int32_t>(w_.storages.size()); ++sid) sac_cache(sid, r);
  }

  // The math SDPA's bmm outputs (selective.h: sac_attention_bytes).
  void sac_cache_attention(int32_t i, int32_t r, SacProduct product) {
    const OpTensor *q = nullptr, *k = nullptr, *v = nullptr;
    for (const WalkArg& a : g_.nodes[static_cast<size_t>(i)].args)
      if (a.tensors.size() == 1 && valid(a.tensors[0])) {
        const OpTensor* t = &w_.meta[static_cast<size_t>(a.tensors[0])];
        if (a.name == "query") q = t;
        if (a.name == "key") k = t;
        if (a.name == "value") v = t;
      }
    const int64_t bytes = sac_attention_bytes(q, k, v, product);
    if (bytes < 0) sac_cache_outputs(i, r, false);
    if (bytes > 0) sac_cache(new_storage(bytes, StorageKind::Activation, i), r);
  }

  // Each selective call's recompute working set: replayed in the backward, it
  // makes again what autograd saves in it (held from there), and everything
  // else it computes lives until its last use in the call (or the call's
  // end); the cache hands back what it holds (already live).
  void sac_recompute_peaks() {
    if (!opt_.sac) return;
    for (Region& r : regions_) {
      const size_t len = static_cast<size_t>(r.last - r.first) + 1;
      std::vector<int64_t> born(len + 1, 0), dies_after(len + 1, 0);
      const int32_t index = static_cast<int32_t>(&r - regions_.data());
      for (const Storage& s : w_.storages) {
        if (s.kind != StorageKind::Activation || s.created < r.first || s.created > r.last || s.cached_in >= 0)
          continue;
        born[static_cast<size_t>(s.created - r.first)] += s.bytes;
        if (recomputed_in(s) == index) continue;  // saved again: held past the recompute
        const int32_t end = std::min(std::max(s.last_use, s.created), r.last);
        dies_after[static_cast<size_t>(end - r.first)] += s.bytes;
      }
      int64_t level = 0;
      for (size_t k = 0; k < len; ++k) {
        level += born[k];
        r.recompute_peak = std::max(r.recompute_peak, level);
        level -= dies_after[k];
      }
    }
  }

  // ------------------------------------------------------------------ compiled calls
  // Each compiled call saves what the partitioner's cut saves (partitioner.h)
  // in place of its ops' own saves; a call inside a checkpointed one keeps
  // checkpointing's (its inputs; the recompute as eager).
  void compiled_saves() {
    if (compiled_calls_.empty()) return;
    for (const NodeRun& call : compiled_calls_) {
      CompiledModule& c = compiled_entry(call.module);
      c.unit = unit_of(call.module);
      ++c.calls;
      if (node_region_[static_cast<size_t>(call.first)] >= 0) {
        ++c.checkpointed_calls;  // checkpointing's saves stand
        continue;
      }
      c.eager_saved_bytes += call_saved_bytes(call);
      partition_compiled_call(g_, w_, call, opt_.compile_memory_budget);
      c.saved_bytes += call_saved_bytes(call);
    }
    out_.compiled_recomputed_nodes = w_.recomputed;
    std::sort(out_.compiled_recomputed_nodes.begin(), out_.compiled_recomputed_nodes.end());
    out_.compiled_recomputed_nodes.erase(
        std::unique(out_.compiled_recomputed_nodes.begin(), out_.compiled_recomputed_nodes.end()),
        out_.compiled_recomputed_nodes.end());
    // Who saves each storage first, from the saves as they now stand.
    for (Storage& st : w_.storages) {
      st.first_saver = -1;
      st.saved_module = -1;
      st.saved_outside = false;
    }
    for (int32_t i = 0; i < static_cast<int32_t>(g_.nodes.size()); ++i) {
      std::vector<int32_t> saves;
      saves.swap(w_.node_saves[static_cast<size_t>(i)]);
      for (int32_t sid : saves) save(sid, i, g_.nodes[static_cast<size_t>(i)].module);
    }
  }

  // The activation storages a call's nodes save (each once).
  int64_t call_saved_bytes(const NodeRun& call) const {
    std::set<int32_t> seen;
    int64_t bytes = 0;
    for (int32_t i = call.first; i <= call.last; ++i)
      for (int32_t sid : w_.node_saves[static_cast<size_t>(i)])
        if (w_.storages[static_cast<size_t>(sid)].kind == StorageKind::Activation && seen.insert(sid).second)
          bytes += w_.storages[static_cast<size_t>(sid)].bytes;
    return bytes;
  }

  CompiledModule& compiled_entry(ModuleId m) {
    auto it = std::find_if(out_.compiled.begin(), out_.compiled.end(), [&](const auto& c) { return c.module == m; });
    if (it != out_.compiled.end()) return *it;
    out_.compiled.push_back({m});
    return out_.compiled.back();
  }

  void find_loss() {
    // HF returns (loss, logits): the loss is the 0-dim floating output that requires grad.
    for (int32_t t : g_.outputs) {
      if (!valid(t)) continue;
      const OpTensor& m = w_.meta[static_cast<size_t>(t)];
      if (m.sizes.empty() && m.requires_grad && m.is_float()) {
        loss_tensor_ = t;
        break;
      }
    }
    if (loss_tensor_ < 0) {
      // No loss in the export: the backward starts from the first output that needs a gradient.
      for (int32_t t : g_.outputs)
        if (valid(t) && w_.meta[static_cast<size_t>(t)].requires_grad) {
          start_tensor_ = t;
          break;
        }
    } else {
      start_tensor_ = loss_tensor_;
      w_.storages[static_cast<size_t>(w_.meta[static_cast<size_t>(loss_tensor_)].storage)].loss = true;
      // The node that made the loss names it.
      for (size_t i = 0; i < g_.nodes.size(); ++i)
        for (int32_t o : g_.nodes[i].outputs)
          if (o == loss_tensor_) out_.loss = g_.nodes[i].op;
    }
  }

  // ------------------------------------------------------------------ results
  // Held from the forward to the backward: saved (outside every checkpointed
  // call, under AC), an input a checkpointed call keeps, or the loss.
  bool held(const Storage& s) const {
    if (s.kind != StorageKind::Activation) return false;
    if (s.loss || s.cached_in >= 0) return true;
    if (!regions_.empty() && s.region_input >= 0) return true;
    if (s.first_saver < 0) return false;
    return regions_.empty() || s.saved_outside;
  }
  // Saved inside a checkpointed call only: its recompute saves it again.
  int32_t recomputed_in(const Storage& s) const {
    if (s.kind != StorageKind::Activation || s.first_saver < 0 || held(s)) return -1;
    return node_region_[static_cast<size_t>(s.first_saver)];
  }

  int unit_of(ModuleId m) const {
    if (m < 0 || static_cast<size_t>(m) >= opt_.unit_of_module.size()) return root_unit();
    return opt_.unit_of_module[static_cast<size_t>(m)];
  }
  int root_unit() const { return opt_.unit_of_module.empty() ? 0 : opt_.unit_of_module[0]; }

  void summarise() {
    out_.nodes = static_cast<int64_t>(g_.nodes.size());
    out_.unit_bytes.assign(num_units_, 0);
    std::vector<int64_t> self(tree_.num_modules(), 0);
    for (const Storage& s : w_.storages) {
      if (s.first_saver < 0) continue;
      if (s.kind == StorageKind::Param) {
        out_.param_saved_bytes += s.bytes;
        continue;
      }
      if (s.kind == StorageKind::Input) {
        out_.input_saved_bytes += s.bytes;
        continue;
      }
      out_.saved_bytes += s.bytes;
      if (s.saved_module >= 0 && static_cast<size_t>(s.saved_module) < self.size())
        self[static_cast<size_t>(s.saved_module)] += s.bytes;
      else
        self[0] += s.bytes;
    }
    // What stays saved after the forward, by the unit that holds it.
    for (const Storage& s : w_.storages) {
      if (!held(s) || s.loss) continue;
      out_.held_bytes += s.bytes;
      ModuleId holder = s.saved_module;
      if (!regions_.empty() && !s.saved_outside && s.region_input >= 0)
        holder = regions_[static_cast<size_t>(s.region_input)].module;
      if (s.cached_in >= 0) holder = regions_[static_cast<size_t>(s.cached_in)].module;
      const int u = unit_of(holder);
      if (u >= 0 && static_cast<size_t>(u) < out_.unit_bytes.size()) out_.unit_bytes[static_cast<size_t>(u)] += s.bytes;
    }
    // Per module: its own and its subtree's, in pre-order.
    std::vector<int64_t> total = self;
    const std::vector<ModuleId> post = tree_.postorder();
    for (ModuleId m : post) {
      const ModuleId p = tree_.module(m).parent;
      if (p >= 0) total[static_cast<size_t>(p)] += total[static_cast<size_t>(m)];
    }
    for (ModuleId m : tree_.preorder())
      if (total[static_cast<size_t>(m)] > 0)
        out_.modules.push_back({m, self[static_cast<size_t>(m)], total[static_cast<size_t>(m)]});
    // Checkpointed calls: what their recompute saves again.
    for (const Storage& s : w_.storages)
      if (const int32_t r = recomputed_in(s); r >= 0) regions_[static_cast<size_t>(r)].recompute += s.bytes;
    std::map<ModuleId, size_t> at;
    for (CheckpointedModule& c : out_.checkpointed) at[c.module] = static_cast<size_t>(&c - out_.checkpointed.data());
    for (const Region& r : regions_) {
      auto it = at.find(r.module);
      if (it == at.end()) {
        CheckpointedModule c;
        c.module = r.module;
        out_.checkpointed.push_back(c);
        it = at.emplace(r.module, out_.checkpointed.size() - 1).first;
      }
      CheckpointedModule& c = out_.checkpointed[it->second];
      c.unit = unit_of(r.module);
      c.kept_bytes += r.inputs;
      c.recompute_bytes += r.recompute;
      if (opt_.sac) {
        c.selective = true;
        c.cached_bytes += r.cached;
        c.recompute_peak_bytes = std::max(c.recompute_peak_bytes, r.recompute_peak);
      }
    }
    out_.missing_ops = missing_;
    out_.sdpa_kernels = sdpa_cases_;
    if (warnings_ && !missing_.empty()) {
      std::vector<std::string> parts;
      for (size_t k = 0; k < missing_.size(); ++k)
        parts.push_back(missing_[k].first + " (" + std::to_string(missing_[k].second) + " node" +
                        (missing_[k].second == 1 ? "" : "s") + ", " + missing_why_[k] + ")");
      warnings_->push_back(make_warning(
          "activation_op_unknown",
          "the activation table (lib/activations/saved_ops.yaml) lacks " + std::to_string(missing_.size()) +
              " operator" + (missing_.size() == 1 ? "" : "s") + ": " + join(parts, "; ") +
              "; each such call is counted as saving all its tensor arguments (an upper bound)"));
    }
  }

  // ------------------------------------------------------------------ the step's levels
  void timeline() {
    std::vector<int64_t> during, after;
    const int64_t level0 = forward_levels(during, after);
    const std::vector<int32_t> run_of = forward_runs(level0, during, after);
    if (out_.runs.empty()) return;
    // Between forward and backward the graph's other outputs (logits) are dropped.
    int64_t held_now = 0;
    for (const Storage& s : w_.storages)
      if (held(s)) held_now += s.bytes;
    out_.runs.back().forward_end = held_now;
    backward(held_now, run_of);
  }

  // Forward: a storage lives from the node that makes it; a transient one
  // (not held) until its last use; held ones through the forward. Fills the
  // level during and after each node; returns the level before the first.
  int64_t forward_levels(std::vector<int64_t>& during, std::vector<int64_t>& after) const {
    const int32_t n = static_cast<int32_t>(g_.nodes.size());
    std::vector<int64_t> born(static_cast<size_t>(n) + 1, 0), dies_after(static_cast<size_t>(n) + 1, 0);
    int64_t level0 = 0;
    for (const Storage& s : w_.storages) {
      if (s.kind != StorageKind::Activation) continue;
      if (s.created < 0)
        level0 += s.bytes;
      else
        born[static_cast<size_t>(s.created)] += s.bytes;
      if (!held(s)) {
        const int32_t last = std::max(s.last_use, s.created);
        if (last >= 0) dies_after[static_cast<size_t>(last)] += s.bytes;
        else level0 -= s.bytes;  // an input no node reads
      }
    }
    during.assign(static_cast<size_t>(n), 0);
    after.assign(static_cast<size_t>(n), 0);
    int64_t level = level0;
    for (int32_t i = 0; i < n; ++i) {
      level += born[static_cast<size_t>(i)];
      during[static_cast<size_t>(i)] = level + node_extra_[static_cast<size_t>(i)].forward;
      level -= dies_after[static_cast<size_t>(i)];
      after[static_cast<size_t>(i)] = level;
    }
    return level0;
  }

  // Runs: consecutive nodes in one unit (a node with no module stays in the
  // run around it), with their forward levels. Returns each node's run.
  std::vector<int32_t> forward_runs(int64_t level0, const std::vector<int64_t>& during,
                                    const std::vector<int64_t>& after) {
    const int32_t n = static_cast<int32_t>(g_.nodes.size());
    std::vector<int> node_unit(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      const ModuleId m = g_.nodes[static_cast<size_t>(i)].module;
      node_unit[static_cast<size_t>(i)] = m >= 0 ? unit_of(m) : (i > 0 ? node_unit[static_cast<size_t>(i - 1)] : root_unit());
    }
    std::vector<int32_t> run_of(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      if (i == 0 || node_unit[static_cast<size_t>(i)] != node_unit[static_cast<size_t>(i - 1)]) {
        ActivationRun r;
        r.unit = node_unit[static_cast<size_t>(i)];
        r.forward_start = i == 0 ? level0 : after[static_cast<size_t>(i - 1)];
        r.forward_peak = r.forward_start;
        out_.runs.push_back(r);
      }
      ActivationRun& r = out_.runs.back();
      r.forward_peak = std::max(r.forward_peak, during[static_cast<size_t>(i)]);
      r.forward_end = after[static_cast<size_t>(i)];
      run_of[static_cast<size_t>(i)] = static_cast<int32_t>(out_.runs.size()) - 1;
    }
    return run_of;
  }

  // The backward's state, from the loss: gradients per tensor, in buffers (a
  // view's backward (and add's) hands its output's gradient on as the
  // input's, so one buffer may serve several tensors until the last lets go),
  // and what each node's backward frees.
  struct GradBuf {
    int64_t bytes;
    int refs;
  };
  struct BackwardState {
    std::vector<GradBuf> bufs;
    std::vector<int32_t> grad_of;                       // tensor -> buffer
    std::vector<std::vector<int32_t>> frees;            // per node: held storages its backward frees
    std::vector<int64_t> recompute_at;                  // per node: recomputed saves made at its backward
    std::vector<std::vector<int32_t>> recompute_frees;  // per node: recomputed saves its backward frees
    std::vector<bool> param_grad;                       // per storage: a parameter whose gradient exists
    std::vector<int64_t> recompute_peak;                // selective: per node, its call's recompute working set
    int64_t live = 0;
    int64_t run_grads = 0;  // the current run's own parameters' gradients made so far
  };

  // Saves freed after the backward of the first node that saved them;
  // checkpointed calls recomputed when their backward starts.
  void backward_frees(BackwardState& b) const {
    const size_t n = g_.nodes.size();
    b.frees.assign(n, {});
    for (size_t s = 0; s < w_.storages.size(); ++s) {
      const Storage& st = w_.storages[s];
      if (!held(st) || st.loss) continue;
      // A kept checkpoint input goes with its call's backward; a save with its first saver's.
      int32_t at = st.first_saver;
      if (!regions_.empty() && !st.saved_outside && st.region_input >= 0)
        at = regions_[static_cast<size_t>(st.region_input)].first;
      // A cached output: its call's recompute takes it from the cache, then
      // autograd's saves there hold it (no later holder outlives those).
      if (st.cached_in >= 0)
        at = st.first_saver >= 0 && node_region_[static_cast<size_t>(st.first_saver)] == st.cached_in
                 ? st.first_saver
                 : regions_[static_cast<size_t>(st.cached_in)].last;
      if (at >= 0) b.frees[static_cast<size_t>(at)].push_back(static_cast<int32_t>(s));
    }
    // Recomputed saves: made at the call's last node (its backward's start), freed with their first saver.
    b.recompute_at.assign(n, 0);
    b.recompute_frees.assign(n, {});
    for (size_t s = 0; s < w_.storages.size(); ++s) {
      const int32_t r = recomputed_in(w_.storages[s]);
      if (r < 0) continue;
      b.recompute_at[static_cast<size_t>(regions_[static_cast<size_t>(r)].last)] += w_.storages[s].bytes;
      b.recompute_frees[static_cast<size_t>(w_.storages[s].first_saver)].push_back(static_cast<int32_t>(s));
    }
    if (!opt_.sac) return;
    b.recompute_peak.assign(n, 0);
    for (const Region& r : regions_) b.recompute_peak[static_cast<size_t>(r.last)] = r.recompute_peak;
  }

  int64_t tensor_bytes(int32_t t) const { return w_.tensor_bytes(t); }

  bool activation_tensor(int32_t t) const {
    return valid(t) &&
           w_.storages[static_cast<size_t>(w_.meta[static_cast<size_t>(t)].storage)].kind == StorageKind::Activation;
  }

  static void release(BackwardState& b, int32_t t) {
    const int32_t buf = b.grad_of[static_cast<size_t>(t)];
    if (buf < 0) return;
    b.grad_of[static_cast<size_t>(t)] = -1;
    if (--b.bufs[static_cast<size_t>(buf)].refs == 0) b.live -= b.bufs[static_cast<size_t>(buf)].bytes;
  }

  void backward(int64_t held_now, const std::vector<int32_t>& run_of) {
    const int32_t n = static_cast<int32_t>(g_.nodes.size());
    BackwardState b;
    b.grad_of.assign(w_.meta.size(), -1);
    backward_frees(b);
    b.live = held_now;
    if (start_tensor_ >= 0) {
      b.bufs.push_back({tensor_bytes(start_tensor_), 1});
      b.grad_of[static_cast<size_t>(start_tensor_)] = 0;
      b.live += b.bufs[0].bytes;
    }
    b.param_grad.assign(w_.storages.size(), false);
    for (int32_t i = n - 1; i >= 0; --i) {
      ActivationRun& run = out_.runs[static_cast<size_t>(run_of[static_cast<size_t>(i)])];
      const bool last_of_run = i == n - 1 || run_of[static_cast<size_t>(i + 1)] != run_of[static_cast<size_t>(i)];
      if (last_of_run) {
        run.backward_start = b.live;
        run.backward_peak = b.live;
        b.run_grads = 0;
      }
      // A checkpointed call's backward starts by running it again.
      if (!b.recompute_peak.empty())
        run.backward_peak =
            std::max(run.backward_peak, b.live + b.recompute_peak[static_cast<size_t>(i)] + b.run_grads);
      b.live += b.recompute_at[static_cast<size_t>(i)];
      run.backward_peak = std::max(run.backward_peak, b.live + b.run_grads);
      node_backward(b, i, run);
      for (int32_t s : b.frees[static_cast<size_t>(i)]) b.live -= w_.storages[static_cast<size_t>(s)].bytes;
      for (int32_t s : b.recompute_frees[static_cast<size_t>(i)]) b.live -= w_.storages[static_cast<size_t>(s)].bytes;
      const bool first_of_run = i == 0 || run_of[static_cast<size_t>(i - 1)] != run_of[static_cast<size_t>(i)];
      if (first_of_run) run.backward_end = b.live;
    }
  }

  // Node i's backward, where a gradient reaches it: the gradients it makes
  // for its inputs that need them appear, its outputs' gradients go.
  // Parameters' gradients: AccumulateGrad makes one at the first backward
  // that reaches the parameter (its last use in the forward) and later uses
  // add into it (torch/csrc/autograd/functions/accumulate_grad.h:
  // AccumulateGrad::accumulateGrad). FSDP2 keeps them until the group's
  // post-backward reduce-scatter (_fsdp_param_group.py:
  // FSDPParamGroup.post_backward), FSDP1 the views' until
  // SplitWithSizesBackward concatenates them (_flat_param.py:
  // FlatParamHandle._use_unsharded_views): so inside a unit's backward its
  // gradients made so far sit beside its activations and their gradients.
  void node_backward(BackwardState& b, int32_t i, ActivationRun& run) {
    const WalkNode& node = g_.nodes[static_cast<size_t>(i)];
    int32_t out_buf = -1;  // the first output's gradient, which a view hands on
    bool reached = false;
    for (int32_t o : node.outputs)
      if (o >= 0 && static_cast<size_t>(o) < b.grad_of.size() && b.grad_of[static_cast<size_t>(o)] >= 0) {
        reached = true;
        if (out_buf < 0) out_buf = b.grad_of[static_cast<size_t>(o)];
      }
    if (!reached || !recorded_[static_cast<size_t>(i)]) return;
    int64_t made = 0, made_params = 0;
    const bool passthrough = w_.node_view[static_cast<size_t>(i)] || passes_gradient(node.op);
    for (int32_t t : node_diff_[static_cast<size_t>(i)]) {
      if (!valid(t) || !w_.meta[static_cast<size_t>(t)].requires_grad) continue;
      if (const int32_t sid = w_.meta[static_cast<size_t>(t)].storage;
          w_.storages[static_cast<size_t>(sid)].kind == StorageKind::Param) {
        // A view of a parameter (t, expand) hands its gradient on to the parameter's.
        const Storage& st = w_.storages[static_cast<size_t>(sid)];
        if (!b.param_grad[static_cast<size_t>(sid)] && st.owner >= 0 && st.owner == run.unit) {
          run.backward_grads += st.bytes;
          made_params += st.bytes;
        }
        b.param_grad[static_cast<size_t>(sid)] = true;
        continue;
      }
      if (!activation_tensor(t)) continue;
      if (b.grad_of[static_cast<size_t>(t)] >= 0) continue;  // accumulated into the gradient it has
      const int64_t bytes = tensor_bytes(t);
      if (passthrough && out_buf >= 0 && bytes <= b.bufs[static_cast<size_t>(out_buf)].bytes) {
        b.grad_of[static_cast<size_t>(t)] = out_buf;
        ++b.bufs[static_cast<size_t>(out_buf)].refs;
        continue;
      }
      b.bufs.push_back({bytes, 1});
      b.grad_of[static_cast<size_t>(t)] = static_cast<int32_t>(b.bufs.size()) - 1;
      made += bytes;
    }
    b.run_grads += made_params;
    run.backward_peak = std::max(run.backward_peak, b.live + b.run_grads + made + node_extra_[static_cast<size_t>(i)].backward);
    b.live += made;
    for (int32_t o : node.outputs)
      if (o >= 0 && static_cast<size_t>(o) < b.grad_of.size()) release(b, o);
  }

  const WalkGraph& g_;
  const ModuleTree& tree_;
  size_t num_units_;
  const WalkOptions& opt_;
  ActivationPlan& out_;
  std::vector<Warning>* warnings_;

  std::vector<OpTensor> recorded_outs_;              // walk_row's scratch
  std::vector<const OpTensor*> outs_view_, outs_;  // walk_row's scratch
  Retype retype_;
  WalkState w_;  // the storages, the tensors' metadata, the nodes' saves (walk_state.h)
  std::vector<int32_t> node_region_;
  std::vector<Region> regions_;
  std::vector<int32_t> node_compiled_;  // per node: its compiled call, -1: none
  std::vector<NodeRun> compiled_calls_;
  std::vector<bool> recorded_;
  std::vector<NodeExtra> node_extra_;
  std::vector<std::vector<int32_t>> node_diff_;  // tensors a gradient may flow to
  std::vector<SacCallPolicy> sac_calls_;  // selective: per checkpointed call, its policy
  std::vector<std::pair<std::string, int64_t>> missing_;
  std::vector<std::string> missing_why_;
  std::vector<std::string> sdpa_cases_;
  int32_t loss_tensor_ = -1, start_tensor_ = -1;
};

}  // namespace

void walk_graph(const WalkGraph& graph, const ModuleTree& tree, size_t num_units, const WalkOptions& options,
                ActivationPlan& out, std::vector<Warning>* warnings) {
  Walker(graph, tree, num_units, options, out, warnings).run();
}

}  // namespace fsdp_plan
