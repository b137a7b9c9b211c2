#include "fsdp2/memory.h"

#include <algorithm>
#include <stdexcept>

#include "activations/schedule.h"
#include "model/dtype.h"
#include "plan/optimizer_step.h"
#include "plan/plan.h"

namespace fsdp_plan {
namespace {

// What one group holds and moves, in bytes (torch/distributed/fsdp/_fully_shard/_fsdp_param.py:
// FSDPParam's sharded and padded dim-0 shards; _fsdp_collectives.py: the all-gather and reduce-scatter buffers).
struct Group {
  int64_t sharded = 0;          // padded shards, original dtype
  int64_t unsharded = 0;        // padded x S, in param_dtype
  int64_t kept_after_forward = 0;
  int64_t grads_unsharded = 0;  // autograd's gradients: unpadded, param_dtype
  int64_t rs_input = 0;         // padded x S, reduce dtype
  int64_t rs_output = 0;        // padded, reduce dtype
  bool rs_output_is_grad = true;  // reduce dtype == original dtype: the sharded grads are views of it
  int64_t grads_sharded = 0;    // padded, original dtype
  int64_t optimizer = 0;        // real rank-0 shard (= padded on rank 0), plus Adam's steps
};

// A parameter's numel and dim 0 after parallelize_module (rank 0's local tensor).
void local_size(const TensorParallelPlan& tp, TensorId t, int64_t& numel, int64_t& d0) {
  const auto& shape = tp.local_shape[static_cast<size_t>(t)];
  numel = 1;
  for (int64_t d : shape) numel *= d;
  d0 = shape.empty() ? 1 : shape[0];
}

}  // namespace

Fsdp2Mesh fsdp2_mesh(const FsdpSettings& s) {
  Fsdp2Mesh mesh;
  mesh.shard = s.world_size;
  if (s.strategy == ShardingStrategy::HybridShard) {
    mesh.shard = hybrid_group_size(s);
    mesh.replicate = s.world_size / mesh.shard;
  }
  return mesh;
}

std::vector<int64_t> fsdp2_sharded_shape(const std::vector<int64_t>& shape, int64_t shard) {
  if (shape.empty()) return {1};
  std::vector<int64_t> out = shape;
  out[0] = ceil_div(shape[0], shard);
  return out;
}

Fsdp2Memory::Fsdp2Memory(const Plan& plan) : activations_(plan.activations) {
  const ModuleTree& tree = *plan.tree;
  for (const auto& u : plan.units) parents_.push_back(u.parent);
  const auto& mp = plan.policy.mixed_precision;
  units_.resize(plan.units.size());
  size_t total = 0;
  for (const auto& u : plan.units) total += u.params.size();
  params_.reserve(total);
  std::vector<bool> owned(tree.num_tensors(), false);
  std::vector<std::vector<std::pair<TensorId, int64_t>>> grad_params(plan.units.size());
  std::vector<std::pair<TensorId, size_t>> trainable_order;
  std::vector<ModuleId> unit_module;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const Unit& u = plan.units[i];
    UnitParams& up = units_[i];
    up.begin = params_.size();
    up.parent = u.parent;
    up.reshard_after_forward = u.reshard_after_forward.value_or(ReshardAfterForward{});
    for (const auto& o : u.params) {
      owned[static_cast<size_t>(o.tensor)] = true;
      const TensorInfo& t = tree.tensor(o.tensor);
      int64_t numel = tree.numel(o.tensor), d0 = tree.dim0(o.tensor);
      // With tensor parallelism, fully_shard shards the TP-local tensor (_fsdp_param.py:
      // FSDPParam._init_sharding_spec_tp: DTensor.to_local(), then chunks on dim 0).
      if (plan.tensor_parallel) local_size(*plan.tensor_parallel, o.tensor, numel, d0);
      const int64_t orig = t.itemsize;
      // MixedPrecisionPolicy: param_dtype applies to floating parameters of another dtype
      // (the float8 kinds, whose size this model does not know, are left as they are).
      int64_t pe = orig;
      if (mp && mp->param_dtype && dtype_itemsize(t.dtype) > 0 && *mp->param_dtype != t.dtype)
        pe = dtype_itemsize(*mp->param_dtype);
      const int64_t rd = mp && mp->reduce_dtype ? dtype_itemsize(*mp->reduce_dtype) : pe;
      up.compute_itemsize = pe;
      if (t.requires_grad) {
        up.grads_unsharded += numel * pe;
        grad_params[i].emplace_back(o.tensor, numel * pe);
        trainable_order.emplace_back(o.tensor, params_.size());
        up.rs_output_is_grad = up.rs_output_is_grad && rd == orig;
      }
      params_.push_back({d0, d0 == 0 ? 0 : numel / d0, static_cast<int32_t>(orig), static_cast<int32_t>(pe),
                         static_cast<int32_t>(rd), t.requires_grad});
    }
    up.end = params_.size();
    unit_module.push_back(u.module);
    for (const auto& o : u.buffers) buffers_bytes_ += tree.bytes(o.tensor);
  }
  std::sort(trainable_order.begin(), trainable_order.end());
  for (const auto& [t, k] : trainable_order) optim_order_.push_back(k);
  {
    const size_t n = plan.units.size();
    const LateGradients late(tree, parents_, unit_module, grad_params);
    std::vector<int> last(n);  // the last unit of each unit's subtree (units are in pre-order)
    for (size_t j = 0; j < n; ++j) last[j] = static_cast<int>(j);
    for (size_t j = n; j-- > 1;) {
      const auto p = static_cast<size_t>(parents_[j]);
      last[p] = std::max(last[p], last[j]);
    }
    late_outer_.resize(n);
    late_in_.resize(n);
    for (size_t j = 0; j < n; ++j) {
      late_outer_[j] = late.after(parents_[j], static_cast<int>(j));
      late_in_[j] = last[j] == static_cast<int>(j) ? late_outer_[j] : late.after(static_cast<int>(j), last[j]);
    }
  }
  // fully_shard's mesh is the (dp_replicate,) dp_shard sub-mesh.
  if (plan.tensor_parallel) tp_mesh_ = Fsdp2Mesh{plan.tensor_parallel->mesh.dp_replicate, plan.tensor_parallel->mesh.dp_shard};
  // The hooks' order: forward in unit order, each group's post-forward when
  // the next unit is outside it (post-order); backward in reverse post-order,
  // each group's post-backward when the next one is outside it.
  auto is_ancestor = [&](size_t a, size_t j) {
    for (int p = units_[j].parent; p >= 0; p = units_[static_cast<size_t>(p)].parent)
      if (static_cast<size_t>(p) == a) return true;
    return false;
  };
  const size_t n = units_.size();
  forward_closes_.assign(n, 0);
  std::vector<size_t> stack;
  for (size_t j = 0; j < n; ++j) {
    for (; !stack.empty() && !is_ancestor(stack.back(), j); stack.pop_back()) ++forward_closes_[j];
    stack.push_back(j);
  }
  stack.clear();
  for (int u : unit_postorder(plan.units)) post_order_.push_back(static_cast<size_t>(u));
  backward_closes_.assign(n, 0);
  for (size_t k = n; k-- > 0;) {
    const size_t j = post_order_[k];
    for (; !stack.empty() && !is_ancestor(stack.back(), j); stack.pop_back()) ++backward_closes_[k];
    stack.push_back(j);
  }
  // Ignored parameters: whole on every rank, with whole gradients and state.
  for (TensorId t = 0; t < static_cast<TensorId>(tree.num_tensors()); ++t) {
    if (!tree.is_param(t) || owned[static_cast<size_t>(t)]) continue;
    int64_t bytes = tree.bytes(t);
    if (plan.tensor_parallel) {
      int64_t numel = 0, d0 = 0;
      local_size(*plan.tensor_parallel, t, numel, d0);
      bytes = numel * tree.tensor(t).itemsize;
    }
    unowned_bytes_ += bytes;
    if (!tree.tensor(t).requires_grad) continue;
    unowned_trainable_bytes_ += bytes;
    unowned_largest_trainable_ = std::max(unowned_largest_trainable_, bytes);
  }
}

MemoryPlan estimate_memory_fsdp2(const Plan& plan, const FsdpSettings& settings, bool timeline) {
  return Fsdp2Memory(plan).estimate(settings, timeline);
}

MemoryPlan Fsdp2Memory::estimate(const FsdpSettings& settings, bool timeline) const {
  if (std::string why = settings_error(settings); !why.empty()) throw std::invalid_argument(why);
  if (settings.strategy == ShardingStrategy::ShardGradOp || settings.strategy == ShardingStrategy::NoShard)
    throw std::invalid_argument("FSDP2 has no sharding strategy " + std::string(strategy_name(settings.strategy)));
  MemoryPlan mem;
  mem.settings = settings;
  mem.effective_strategy = settings.strategy;
  const Fsdp2Mesh mesh = tp_mesh_ ? *tp_mesh_ : fsdp2_mesh(settings);
  const int64_t S = mesh.shard;
  mem.shard_group_size = S;
  mem.replicate_size = mesh.replicate;
  const int states = optimizer_states(settings.optimizer);
  const size_t n = units_.size();

  // Per group, from its parameters' padded shards at this shard size.
  std::vector<Group> groups(n);
  mem.units.reserve(n);
  RankMemory& r = mem.per_rank;
  for (size_t i = 0; i < n; ++i) {
    const UnitParams& up = units_[i];
    Group& g = groups[i];
    int64_t padded_numel = 0, gathered = 0, reduced = 0, trainable_sharded = 0, trainable = 0;
    for (size_t k = up.begin; k < up.end; ++k) {
      const Param& p = params_[k];
      // The product of fsdp2_sharded_shape(shape, S): ceil(d0 / S) rows of numel / d0.
      const int64_t padded = ceil_div(p.dim0, S) * p.row;
      padded_numel += padded;
      g.sharded += padded * p.orig;
      gathered += padded * p.pe;
      if (!p.trainable) continue;
      reduced += padded * p.rd;
      trainable_sharded += padded * p.orig;
      ++trainable;
    }
    g.unsharded = gathered * S;
    g.grads_unsharded = up.grads_unsharded;
    g.rs_input = reduced * S;
    g.rs_output = reduced;
    g.rs_output_is_grad = up.rs_output_is_grad;
    g.grads_sharded = trainable_sharded;
    // Rank 0's real shard is ceil(d0/S) rows: its whole padded shard.
    g.optimizer = states * trainable_sharded + (is_adam(settings.optimizer) ? 4 * trainable : 0);
    UnitMemory um;
    um.sharded_numel = padded_numel;
    um.flat_numel = padded_numel * S;
    um.compute_itemsize = up.compute_itemsize;
    um.sharded_bytes = g.sharded;
    um.unsharded_bytes = g.unsharded;
    const ReshardAfterForward raf = up.reshard_after_forward;
    g.kept_after_forward = raf.kind == ReshardAfterForward::Kind::False ? g.unsharded
                           : raf.kind == ReshardAfterForward::Kind::Ranks && raf.ranks < S
                               ? (raf.ranks == 1 ? g.unsharded : g.unsharded / raf.ranks)
                               : 0;
    // At world size 1 too: wait_for_unshard copies the sharded parameters into
    // unsharded ones and post_forward frees them (_fsdp_param_group.py:
    // FSDPParamGroup.unshard / wait_for_unshard, world_size == 1); FSDPMemTracker
    // shows no unsharded parameter after the forward (refs/peak_small.json, w1).
    r.params_bytes += g.sharded;
    r.grads_bytes += g.grads_sharded;
    r.optimizer_bytes += g.optimizer;
    mem.units.push_back(um);
  }
  r.buffers_bytes = buffers_bytes_;
  r.params_bytes += unowned_bytes_;
  r.grads_bytes += unowned_trainable_bytes_;
  r.optimizer_bytes += states * unowned_trainable_bytes_;
  r.steady_bytes = r.params_bytes + r.grads_bytes + r.optimizer_bytes + r.buffers_bytes;
  if (settings.cpu_offload) r.host_bytes = r.params_bytes + r.grads_bytes + r.optimizer_bytes;

  // A training step, event by event, in the categories FSDPMemTracker uses.
  // Gradients were freed by zero_grad; ignored parameters' gradients are
  // counted whole from the start of backward (an upper bound).
  const int64_t ignored_grads = unowned_trainable_bytes_;
  struct Live {
    int64_t unsharded = 0, all_gather = 0, reduce_scatter = 0, grads_sharded = 0, grads_unsharded = 0;
    int64_t optimizer_temp = 0;
  } live;
  const int64_t resident_params = settings.cpu_offload ? 0 : r.params_bytes;
  const int64_t resident_opt = settings.cpu_offload ? 0 : r.optimizer_bytes;
  r.peak_bytes = -1;
  std::vector<int64_t> held(n, 0);  // unsharded bytes each group holds
  // The groups with held > 0, sorted: a new peak copies it, not a scan of all.
  // Groups gather and free mostly at its end (forward in order, backward in reverse).
  std::vector<int> holding;
  auto set_held = [&](size_t j, int64_t bytes) {
    if ((held[j] > 0) != (bytes > 0)) {
      auto at = std::lower_bound(holding.begin(), holding.end(), static_cast<int>(j));
      if (bytes > 0)
        holding.insert(at, static_cast<int>(j));
      else
        holding.erase(at);
    }
    held[j] = bytes;
  };
  auto categories = [&](const Live& l, int64_t grads, int64_t opt) -> std::vector<std::pair<std::string, int64_t>> {
    return {{"sharded_params", resident_params}, {"unsharded_params", l.unsharded},
            {"all_gather", l.all_gather},       {"reduce_scatter", l.reduce_scatter},
            {"sharded_grads", grads},           {"unsharded_grads", l.grads_unsharded},
            {"optimizer_state", opt},           {"buffers", r.buffers_bytes}};
  };
  // The peak's categories are built once, at the end, from what was live then.
  Live peak_live;
  int64_t peak_grads = 0, peak_opt = 0, peak_act = 0;
  // Activations live at each point (activations/schedule.h): set before each consider().
  ActivationSchedule acts(activations_, parents_);
  const bool acts_known = acts.known();
  int64_t act = 0;
  // Enclosing groups' gradients already made at this point of the backward
  // (late_outer_, late_in_). Counted with activations only: FSDPMemTracker
  // files autograd's gradients as Temp until post_backward, so a plan without
  // activations stays the tracker's non-activation peak (tests/differential/test_fsdp2.py).
  int64_t late = 0;
  const bool count_late = acts_known;
  // Each event is a point of the timeline; consecutive events of one phase
  // and unit make one step, holding its largest point (so the peak is a step).
  // A step is only built when the timeline or a new peak needs it.
  auto consider = [&](const char* phase, size_t unit) {
    const int64_t grads = settings.cpu_offload ? 0 : live.grads_sharded;
    const int64_t opt = resident_opt + (settings.cpu_offload ? 0 : live.optimizer_temp);
    const int unit_index = unit < n ? static_cast<int>(unit) : -1;
    Live l = live;
    if (count_late) l.grads_unsharded += late;
    auto step = [&] {
      MemoryStep s;
      s.phase = phase;
      s.unit = unit_index;
      s.params_bytes = resident_params;
      s.optimizer_bytes = opt;
      s.buffers_bytes = r.buffers_bytes;
      s.gathered_bytes = l.unsharded + l.all_gather;
      s.unsharded_grads_bytes = l.grads_unsharded + l.reduce_scatter;
      s.grads_bytes = grads;
      s.activation_bytes = act;
      s.categories = categories(l, grads, opt);
      if (acts_known) s.categories.emplace_back("activations", act);
      return s;
    };
    const int64_t total = resident_params + opt + r.buffers_bytes + l.unsharded + l.all_gather +
                          l.grads_unsharded + l.reduce_scatter + grads + act;  // step().total_bytes()
    if (timeline) {
      auto& tl = mem.timeline;
      if (tl.empty() || tl.back().phase != phase || tl.back().unit != unit_index)
        tl.push_back(step());
      else if (total > tl.back().total_bytes())
        tl.back() = step();
    }
    if (total <= r.peak_bytes) return;
    r.peak_bytes = total;
    r.peak_phase = phase;
    r.peak_unit = unit_index;
    peak_live = l;
    peak_grads = grads;
    peak_opt = opt;
    peak_act = act;
    r.peak_gathered.assign(holding.begin(), holding.end());
  };
  auto gather = [&](size_t j) {  // unshard + copy-out of a group not prefetched
    if (held[j] == groups[j].unsharded) return;
    live.unsharded += groups[j].unsharded - held[j];
    set_held(j, groups[j].unsharded);
  };

  // Forward, in unit order: the previous group's all-gather output lives
  // through this group's copy-out (implicit prefetch): wait_for_unshard drops
  // comm_ctx.all_gather_state before the copy-out, but its local
  // `prev_all_gather_state` still holds the result until the function returns
  // (_fsdp_param_group.py: FSDPParamGroup.wait_for_unshard; FSDPMemTracker
  // shows both all-gathers beside the first layer's unsharded parameters,
  // refs/peak_small.json llama_lora_b1s16/fsdp2/w8/fp32/ac). At world size 1 there is none.
  int64_t ag_prev = 0;
  std::vector<size_t> active;
  auto post_forward = [&](size_t j) {
    live.unsharded -= held[j] - groups[j].kept_after_forward;
    set_held(j, groups[j].kept_after_forward);
  };
  // A group that runs again after a child ended (the root's head and loss after the layers).
  auto resume_forward = [&](int next) {
    if (active.empty()) return;
    if (auto peak = acts.forward_resume(static_cast<int>(active.back()), next)) {
      act = *peak;
      consider("forward", active.back());
      act = acts.held();
    }
  };
  for (size_t j = 0; j < n; ++j) {
    for (int c = forward_closes_[j]; c > 0; --c) {
      post_forward(active.back());
      active.pop_back();
      resume_forward(static_cast<int>(j));
    }
    const int64_t ag = S > 1 ? groups[j].unsharded : 0;
    live.all_gather += ag;
    act = acts.forward_before(static_cast<int>(j));
    consider("forward", j);
    gather(j);
    consider("forward", j);
    live.all_gather -= ag_prev;
    act = acts.forward_enter(static_cast<int>(j));
    consider("forward", j);
    act = acts.held();
    ag_prev = ag;
    active.push_back(j);
  }
  while (!active.empty()) {
    post_forward(active.back());
    active.pop_back();
    resume_forward(-1);
  }
  live.all_gather -= ag_prev;  // the root's post-forward frees the last one
  act = acts.after_forward();

  // Backward: pre-backward hooks in reverse post-forward order, each
  // prefetching the group that finished forward just before it;
  // post-backward hooks when a group's subtree is done. One reduce-scatter
  // input is retained until the next group's reduce-scatter.
  const std::vector<size_t>& post_order = post_order_;
  live.grads_unsharded += ignored_grads;
  std::vector<int64_t> prefetched(n, 0);
  int64_t rs_retained = 0;
  std::vector<size_t> open;
  auto post_backward = [&](size_t j) {
    const Group& g = groups[j];
    late = late_outer_[j];
    live.grads_unsharded += g.grads_unsharded;
    consider("backward", j);
    live.unsharded -= held[j];
    set_held(j, 0);
    if (g.grads_unsharded == 0) return;
    live.reduce_scatter -= rs_retained;
    live.reduce_scatter += g.rs_input;
    consider("backward", j);
    live.grads_unsharded -= g.grads_unsharded;
    live.reduce_scatter += g.rs_output;
    if (!g.rs_output_is_grad) {
      live.grads_sharded += g.grads_sharded;
      consider("backward", j);
      live.reduce_scatter -= g.rs_output;
    } else {
      live.reduce_scatter -= g.rs_output;
      live.grads_sharded += g.grads_sharded;
      // foreach_reduce frees the unsharded gradients after the copy-in, then
      // allocates the output beside the input (_fsdp_collectives.py): at world
      // size 1 the output is the input's size, more than the bf16 gradients
      // freed (an H200 run, bench/gpu_check.py, showed the plan 2 GiB low).
      consider("backward", j);
    }
    rs_retained = g.rs_input;
  };
  auto resume_backward = [&](int next) {
    if (open.empty()) return;
    late = next >= 0 ? late_outer_[static_cast<size_t>(next)] : late_in_[open.back()];
    if (auto peak = acts.backward_resume(static_cast<int>(open.back()), next)) {
      // The runs' peak counts the gradients they make themselves; after a
      // child (next >= 0) late_outer_ counts those parameters too.
      const int64_t all = late;
      if (next >= 0) late = std::max<int64_t>(0, late - acts.resumed_grads());
      act = *peak;
      consider("backward", open.back());
      act = acts.held();
      late = all;
    }
  };
  for (size_t k = post_order.size(); k-- > 0;) {
    const size_t j = post_order[k];
    for (int c = backward_closes_[k]; c > 0; --c) {
      post_backward(open.back());
      open.pop_back();
      resume_backward(static_cast<int>(j));
    }
    late = late_outer_[j];
    if (prefetched[j] > 0) {  // copy out the prefetched all-gather, then free it
      gather(j);
      consider("backward", j);
      live.all_gather -= prefetched[j];
      prefetched[j] = 0;
    } else if (held[j] < groups[j].unsharded) {
      const int64_t ag = S > 1 ? groups[j].unsharded : 0;
      live.all_gather += ag;
      gather(j);
      consider("backward", j);
      live.all_gather -= ag;
    }
    if (k > 0) {
      const size_t next = post_order[k - 1];
      if (held[next] < groups[next].unsharded && S > 1) {
        prefetched[next] = groups[next].unsharded;
        live.all_gather += prefetched[next];
      }
    }
    act = acts.backward_enter(static_cast<int>(j));
    consider("backward", j);
    act = acts.held();
    open.push_back(j);
  }
  while (!open.empty()) {
    post_backward(open.back());
    open.pop_back();
    resume_backward(-1);
  }
  act = acts.batch();  // the backward freed every saved tensor; the batch stays
  late = 0;
  // The optimizer step: sharded gradients and state, nothing gathered, and
  // Adam's temporaries (adam_step_temp_bytes).
  live.reduce_scatter = 0;
  live.grads_unsharded = 0;
  live.grads_sharded += ignored_grads;
  if (is_adam(settings.optimizer)) {
    std::vector<int64_t> state;  // each trainable parameter's local state tensor, in the optimizer's order
    for (size_t k : optim_order_) {
      const Param& p = params_[k];
      state.push_back(ceil_div(p.dim0, S) * p.row * p.orig);
    }
    const OptimizerImpl impl = settings.optimizer_impl.value_or(OptimizerImpl::ForLoop);
    live.optimizer_temp = adam_step_temp_bytes(state, impl);
    // Ignored parameters, whole on every rank: the largest one's two temporaries
    // stand for them in the for-loop; in foreach each has its own.
    if (impl == OptimizerImpl::ForLoop) live.optimizer_temp = std::max(live.optimizer_temp, 2 * unowned_largest_trainable_);
    if (impl == OptimizerImpl::Foreach) live.optimizer_temp += unowned_trainable_bytes_;
  }
  consider("optimizer step", n);
  r.peak_categories = categories(peak_live, peak_grads, peak_opt);
  if (acts_known) r.peak_categories.emplace_back("activations", peak_act);
  r.activation_bytes = peak_act;

  mem.notes.push_back("FSDP2 (fully_shard): mesh " +
                      (mesh.replicate > 1 ? "(" + std::to_string(mesh.replicate) + " replicate, " : std::string("(")) +
                      std::to_string(S) + " shard), rank 0 (the largest shards)");
  if (settings.cpu_offload)
    mem.notes.push_back("CPU offload: sharded parameters, gradients and optimizer state on the host (host_bytes)");
  mem.notes.push_back(activation_note(activations_));
  mem.notes.push_back("module order stands for execution order");
  return mem;
}

}  // namespace fsdp_plan
