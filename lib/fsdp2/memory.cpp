#include "fsdp2/memory.h"

#include <algorithm>
#include <stdexcept>

#include "activations/schedule.h"
#include "model/dtype.h"
#include "plan/optimizer_step.h"
#include "plan/plan.h"
#include "plan/unused_params.h"

namespace fsdp_plan {
namespace {

// A parameter's numel and dim 0 after parallelize_module (rank 0's local tensor).
void local_size(const TensorParallelPlan& tp, TensorId t, int64_t& numel, int64_t& d0) {
  const auto& shape = tp.local_shape[static_cast<size_t>(t)];
  numel = 1;
  for (int64_t d : shape) numel *= d;
  d0 = shape.empty() ? 1 : shape[0];
}

}  // namespace

std::vector<int64_t> fsdp2_sharded_shape(const std::vector<int64_t>& shape, int64_t shard) {
  if (shape.empty()) return {1};
  std::vector<int64_t> out = shape;
  out[0] = ceil_div(shape[0], shard);
  return out;
}

Fsdp2Memory::Fsdp2Memory(const Plan& plan) : activations_(plan.activations) {
  for (const auto& u : plan.units) parents_.push_back(u.parent);
  GradParams grad_params(plan.units.size());
  add_units(plan, grad_params);
  add_late_gradients(plan, grad_params);
  // fully_shard's mesh is the (dp_replicate,) dp_shard sub-mesh.
  if (plan.tensor_parallel) tp_mesh_ = plan.mesh;
  if (plan.expert_parallel) expert_parallel_ = plan.policy.expert_parallel;
  context_parallel_ = plan.policy.context_parallel;
  order_hooks(plan);
  add_unowned_params(plan);
}

// Each unit's parameters as fully_shard sees them (dim 0, row size, dtypes),
// its buffers, and the trainable parameters in the optimizer's order.
void Fsdp2Memory::add_units(const Plan& plan, GradParams& grad_params) {
  const ModuleTree& tree = *plan.tree;
  const auto& mp = plan.policy.mixed_precision;
  units_.resize(plan.units.size());
  size_t total = 0;
  for (const auto& u : plan.units) total += u.params.size();
  params_.reserve(total);
  std::vector<std::pair<TensorId, size_t>> trainable_order;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const Unit& u = plan.units[i];
    UnitParams& up = units_[i];
    up.begin = params_.size();
    up.parent = u.parent;
    up.reshard_after_forward = u.reshard_after_forward.value_or(ReshardAfterForward{});
    for (const auto& o : u.params) {
      const TensorInfo& t = tree.tensor(o.tensor);
      int64_t numel = tree.numel(o.tensor), d0 = tree.dim0(o.tensor);
      // With tensor parallelism, fully_shard shards the TP-local tensor (_fsdp_param.py:
      // FSDPParam._init_sharding_spec_tp: DTensor.to_local(), then chunks on dim 0).
      if (plan.tensor_parallel) local_size(*plan.tensor_parallel, o.tensor, numel, d0);
      // With expert parallelism, rank 0's experts (DTensor Shard(0) on ep, then fully_shard on efsdp).
      const bool expert = plan.expert_parallel && plan.expert_parallel->is_expert(o.tensor);
      if (expert) numel = plan.expert_parallel->local_numel(o.tensor);
      if (expert && numel == 0) continue;  // an expert module another rank holds: not on this one
      const int64_t orig = t.itemsize;
      // MixedPrecisionPolicy: param_dtype applies to floating parameters of another dtype
      // (the float8 kinds, whose size this model does not know, are left as they are).
      int64_t pe = orig;
      if (mp && mp->param_dtype && dtype_itemsize(t.dtype) > 0 && *mp->param_dtype != t.dtype)
        pe = dtype_itemsize(*mp->param_dtype);
      const int64_t rd = mp && mp->reduce_dtype ? dtype_itemsize(*mp->reduce_dtype) : pe;
      up.compute_itemsize = pe;
      const bool graded = receives_gradient(plan, o.tensor);
      if (graded) {
        up.grads_unsharded += numel * pe;
        grad_params[i].emplace_back(o.tensor, numel * pe);
        trainable_order.emplace_back(o.tensor, params_.size());
        up.rs_output_is_grad = up.rs_output_is_grad && rd == orig;
      }
      Param p{d0, d0 == 0 ? 0 : numel / d0, static_cast<int32_t>(orig), static_cast<int32_t>(pe),
              static_cast<int32_t>(rd), graded};
      if (expert) expert_param(*plan.expert_parallel, o.tensor, p);
      params_.push_back(p);
    }
    up.end = params_.size();
    for (const auto& o : u.buffers) buffers_bytes_ += tree.bytes(o.tensor);
  }
  std::sort(trainable_order.begin(), trainable_order.end());
  for (const auto& [t, k] : trainable_order) optim_order_.push_back(k);
}

// Per unit, the enclosing groups' gradients live in its backward (LateGradients).
void Fsdp2Memory::add_late_gradients(const Plan& plan, const GradParams& grad_params) {
  std::vector<ModuleId> unit_module;
  for (const auto& u : plan.units) unit_module.push_back(u.module);
  const size_t n = plan.units.size();
  const LateGradients late(*plan.tree, parents_, unit_module, grad_params);
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

// The hooks' order: forward in unit order, each group's post-forward when
// the next unit is outside it (post-order); backward in reverse post-order,
// each group's post-backward when the next one is outside it
// (_fsdp_state.py: FSDPState._pre_forward / _post_forward, _pre_backward / post_backward).
void Fsdp2Memory::order_hooks(const Plan& plan) {
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
}

// Ignored parameters: whole on every rank, with whole gradients and state.
void Fsdp2Memory::add_unowned_params(const Plan& plan) {
  const ModuleTree& tree = *plan.tree;
  std::vector<bool> owned(tree.num_tensors(), false);
  for (const auto& u : plan.units)
    for (const auto& o : u.params) owned[static_cast<size_t>(o.tensor)] = true;
  for (TensorId t = 0; t < static_cast<TensorId>(tree.num_tensors()); ++t) {
    if (!tree.is_param(t) || owned[static_cast<size_t>(t)]) continue;
    int64_t bytes = tree.bytes(t);
    if (plan.tensor_parallel) {
      int64_t numel = 0, d0 = 0;
      local_size(*plan.tensor_parallel, t, numel, d0);
      bytes = numel * tree.tensor(t).itemsize;
    }
    unowned_bytes_ += bytes;
    if (!receives_gradient(plan, t)) continue;
    unowned_trainable_bytes_ += bytes;
    unowned_largest_trainable_ = std::max(unowned_largest_trainable_, bytes);
  }
}

MemoryPlan estimate_memory_fsdp2(const Plan& plan, const FsdpSettings& settings, bool timeline) {
  return Fsdp2Memory(plan).estimate(settings, timeline);
}

// A routed expert's EP-local tensor, as fully_shard shards it on efsdp
// (torchtitan's shard_placement_fn: Shard(0), or Shard(1) for fused experts
// where efsdp x ep > num_experts; size_group picks).
void Fsdp2Memory::expert_param(const ExpertParallelPlan& ep, TensorId t, Param& p) {
  const ExpertModule& x = ep.modules[static_cast<size_t>(ep.expert_of[static_cast<size_t>(t)])];
  const std::vector<int64_t>& shape = ep.local_shape[static_cast<size_t>(t)];
  const int64_t numel = ep.local_numel(t);
  p.expert = true;
  p.dim0 = shape.empty() ? 1 : shape[0];
  p.row = p.dim0 == 0 ? 0 : numel / p.dim0;
  if (x.fused && shape.size() >= 2 && shape[1] > 0) {
    p.experts = x.num_experts;
    p.dim1 = shape[1];
    p.row1 = numel / shape[1];
  }
}

// One estimate(): each group's bytes at this shard size, what a rank holds
// between steps, then a training step, event by event, in the categories
// FSDPMemTracker uses (torch/distributed/_tools/fsdp2_mem_tracker.py).
class Fsdp2Memory::Estimate {
 public:
  Estimate(const Fsdp2Memory& model, const FsdpSettings& settings, const DeviceMesh& mesh, bool timeline,
           MemoryPlan& mem);
  void size_groups();
  void steady_state();
  void forward();
  void backward();
  void optimizer_step();
  void peak_categories();

 private:
  // What one group holds and moves, in bytes (torch/distributed/fsdp/_fully_shard/_fsdp_param.py:
  // FSDPParam's sharded and padded dim-0 shards; _fsdp_collectives.py: the all-gather and reduce-scatter buffers).
  struct Group {
    int64_t sharded = 0;          // padded shards, original dtype
    int64_t unsharded = 0;        // padded x S, in param_dtype
    int64_t all_gather = 0;       // the all-gathers' outputs: unsharded, less what a group of one rank copies
    int64_t kept_after_forward = 0;
    int64_t grads_unsharded = 0;  // autograd's gradients: unpadded, param_dtype
    int64_t rs_input = 0;         // padded x S, reduce dtype
    int64_t rs_output = 0;        // padded, reduce dtype
    bool rs_output_is_grad = true;  // reduce dtype == original dtype: the sharded grads are views of it
    int64_t grads_sharded = 0;    // padded, original dtype
    int64_t optimizer = 0;        // real rank-0 shard (= padded on rank 0), plus Adam's steps
  };
  // What is live now besides the resident state.
  struct Live {
    int64_t unsharded = 0, all_gather = 0, reduce_scatter = 0, grads_sharded = 0, grads_unsharded = 0;
    int64_t optimizer_temp = 0;
  };
  Group size_group(size_t i, UnitMemory& um) const;
  // A parameter's padded shard (elements) and the size of the group it is sharded over.
  std::pair<int64_t, int64_t> shard_of(const Param& p) const;
  std::vector<std::pair<std::string, int64_t>> categories(const Live& l, int64_t grads, int64_t opt) const;
  MemoryStep make_step(const char* phase, int unit_index, const Live& l, int64_t grads, int64_t opt) const;
  void consider(const char* phase, size_t unit);
  void set_held(size_t j, int64_t bytes);
  void gather(size_t j);
  void post_forward(size_t j);
  void resume_forward(const std::vector<size_t>& active, int next);
  void pre_backward(size_t k, std::vector<int64_t>& prefetched);
  void post_backward(size_t j);
  void resume_backward(const std::vector<size_t>& open, int next);

  const Fsdp2Memory& m_;
  const FsdpSettings& settings_;
  const int64_t S;
  const int64_t Se, EP;  // efsdp and ep: the routed experts' shard group and split (1 without expert parallelism)
  const bool timeline_;
  MemoryPlan& mem_;
  RankMemory& r_;
  const size_t n_;
  const int states_;
  std::vector<Group> groups_;
  int64_t resident_params_ = 0, resident_opt_ = 0;
  Live live_;
  std::vector<int64_t> held_;  // unsharded bytes each group holds
  // The groups with held_ > 0, sorted: a new peak copies it, not a scan of all.
  // Groups gather and free mostly at its end (forward in order, backward in reverse).
  std::vector<int> holding_;
  // The peak's categories are built once, at the end, from what was live then.
  Live peak_live_;
  int64_t peak_grads_ = 0, peak_opt_ = 0, peak_act_ = 0;
  // Activations live at each point (activations/schedule.h): set before each consider().
  ActivationSchedule acts_;
  const bool acts_known_;
  int64_t act_ = 0;
  // Enclosing groups' gradients already made at this point of the backward
  // (late_outer_, late_in_). Counted with activations only: FSDPMemTracker
  // files autograd's gradients as Temp until post_backward, so a plan without
  // activations stays the tracker's non-activation peak (tests/differential/test_fsdp2.py).
  int64_t late_ = 0;
  const bool count_late_;
  int64_t rs_retained_ = 0;  // the reduce-scatter input kept until the next one
};

Fsdp2Memory::Estimate::Estimate(const Fsdp2Memory& model, const FsdpSettings& settings, const DeviceMesh& mesh,
                                bool timeline, MemoryPlan& mem)
    : m_(model),
      settings_(settings),
      S(mesh.fsdp_shard_size()),
      Se(mesh.size(MeshDim::Efsdp)),
      EP(mesh.size(MeshDim::Ep)),
      timeline_(timeline),
      mem_(mem),
      r_(mem.per_rank),
      n_(model.units_.size()),
      states_(optimizer_states(settings.optimizer)),
      held_(n_, 0),
      acts_(model.activations_, model.parents_),
      acts_known_(acts_.known()),
      count_late_(acts_known_) {
  r_.peak_bytes = -1;  // the first event is a peak
}

// Per group, from its parameters' padded shards at this shard size.
void Fsdp2Memory::Estimate::size_groups() {
  groups_.resize(n_);
  mem_.units.reserve(n_);
  for (size_t i = 0; i < n_; ++i) {
    UnitMemory um;
    const Group& g = groups_[i] = size_group(i, um);
    // At world size 1 too: wait_for_unshard copies the sharded parameters into
    // unsharded ones and post_forward frees them (_fsdp_param_group.py:
    // FSDPParamGroup.unshard / wait_for_unshard, world_size == 1); FSDPMemTracker
    // shows no unsharded parameter after the forward (refs/peak_small.json, w1).
    r_.params_bytes += g.sharded;
    r_.grads_bytes += g.grads_sharded;
    r_.optimizer_bytes += g.optimizer;
    mem_.units.push_back(um);
  }
}

std::pair<int64_t, int64_t> Fsdp2Memory::Estimate::shard_of(const Param& p) const {
  // The product of fsdp2_sharded_shape(shape, S): ceil(d0 / S) rows of numel / d0.
  if (!p.expert) return {ceil_div(p.dim0, S) * p.row, S};
  if (p.experts > 0 && Se * EP > p.experts) return {ceil_div(p.dim1, Se) * p.row1, Se};
  return {ceil_div(p.dim0, Se) * p.row, Se};
}

// With expert parallelism a group's expert and dense parameters are two
// FSDPParamGroups of one fully_shard call (_fsdp_init.py _init_param_group,
// one per process group), gathered and reduced together: summed here.
Fsdp2Memory::Estimate::Group Fsdp2Memory::Estimate::size_group(size_t i, UnitMemory& um) const {
  const UnitParams& up = m_.units_[i];
  Group g;
  int64_t padded_numel = 0, flat_numel = 0, reduced = 0, trainable_sharded = 0, trainable = 0;
  for (size_t k = up.begin; k < up.end; ++k) {
    const Param& p = m_.params_[k];
    const auto [padded, group] = shard_of(p);
    padded_numel += padded;
    flat_numel += padded * group;
    g.sharded += padded * p.orig;
    g.unsharded += padded * group * p.pe;
    if (group > 1) g.all_gather += padded * group * p.pe;
    if (!p.trainable) continue;
    reduced += padded * p.rd;
    g.rs_input += padded * group * p.rd;
    trainable_sharded += padded * p.orig;
    ++trainable;
  }
  g.grads_unsharded = up.grads_unsharded;
  g.rs_output = reduced;
  g.rs_output_is_grad = up.rs_output_is_grad;
  g.grads_sharded = trainable_sharded;
  // Rank 0's real shard is ceil(d0/S) rows: its whole padded shard.
  g.optimizer = states_ * trainable_sharded + (is_adam(settings_.optimizer) ? 4 * trainable : 0);
  um.sharded_numel = padded_numel;
  um.flat_numel = flat_numel;
  um.compute_itemsize = up.compute_itemsize;
  um.sharded_bytes = g.sharded;
  um.unsharded_bytes = g.unsharded;
  const ReshardAfterForward raf = up.reshard_after_forward;
  g.kept_after_forward = raf.kind == ReshardAfterForward::Kind::False ? g.unsharded
                         : raf.kind == ReshardAfterForward::Kind::Ranks && raf.ranks < S
                             ? (raf.ranks == 1 ? g.unsharded : g.unsharded / raf.ranks)
                             : 0;
  return g;
}

// What a rank holds between steps: the groups' shards, gradients and state,
// the buffers and the ignored parameters; on the host with CPU offload.
void Fsdp2Memory::Estimate::steady_state() {
  r_.buffers_bytes = m_.buffers_bytes_;
  r_.params_bytes += m_.unowned_bytes_;
  r_.grads_bytes += m_.unowned_trainable_bytes_;
  r_.optimizer_bytes += states_ * m_.unowned_trainable_bytes_;
  r_.steady_bytes = r_.params_bytes + r_.grads_bytes + r_.optimizer_bytes + r_.buffers_bytes;
  if (settings_.cpu_offload) r_.host_bytes = r_.params_bytes + r_.grads_bytes + r_.optimizer_bytes;
  resident_params_ = settings_.cpu_offload ? 0 : r_.params_bytes;
  resident_opt_ = settings_.cpu_offload ? 0 : r_.optimizer_bytes;
}

void Fsdp2Memory::Estimate::set_held(size_t j, int64_t bytes) {
  if ((held_[j] > 0) != (bytes > 0)) {
    auto at = std::lower_bound(holding_.begin(), holding_.end(), static_cast<int>(j));
    if (bytes > 0)
      holding_.insert(at, static_cast<int>(j));
    else
      holding_.erase(at);
  }
  held_[j] = bytes;
}

std::vector<std::pair<std::string, int64_t>> Fsdp2Memory::Estimate::categories(const Live& l, int64_t grads,
                                                                               int64_t opt) const {
  return {{"sharded_params", resident_params_}, {"unsharded_params", l.unsharded},
          {"all_gather", l.all_gather},        {"reduce_scatter", l.reduce_scatter},
          {"sharded_grads", grads},            {"unsharded_grads", l.grads_unsharded},
          {"optimizer_state", opt},            {"buffers", r_.buffers_bytes}};
}

MemoryStep Fsdp2Memory::Estimate::make_step(const char* phase, int unit_index, const Live& l, int64_t grads,
                                            int64_t opt) const {
  MemoryStep s;
  s.phase = phase;
  s.unit = unit_index;
  s.params_bytes = resident_params_;
  s.optimizer_bytes = opt;
  s.buffers_bytes = r_.buffers_bytes;
  s.gathered_bytes = l.unsharded + l.all_gather;
  s.unsharded_grads_bytes = l.grads_unsharded + l.reduce_scatter;
  s.grads_bytes = grads;
  s.activation_bytes = act_;
  s.categories = categories(l, grads, opt);
  if (acts_known_) s.categories.emplace_back("activations", act_);
  return s;
}

// Each event is a point of the timeline; consecutive events of one phase
// and unit make one step, holding its largest point (so the peak is a step).
// A step is only built when the timeline or a new peak needs it.
void Fsdp2Memory::Estimate::consider(const char* phase, size_t unit) {
  const int64_t grads = settings_.cpu_offload ? 0 : live_.grads_sharded;
  const int64_t opt = resident_opt_ + (settings_.cpu_offload ? 0 : live_.optimizer_temp);
  const int unit_index = unit < n_ ? static_cast<int>(unit) : -1;
  Live l = live_;
  if (count_late_) l.grads_unsharded += late_;
  const int64_t total = resident_params_ + opt + r_.buffers_bytes + l.unsharded + l.all_gather +
                        l.grads_unsharded + l.reduce_scatter + grads + act_;  // make_step().total_bytes()
  if (timeline_) {
    auto& tl = mem_.timeline;
    if (tl.empty() || tl.back().phase != phase || tl.back().unit != unit_index)
      tl.push_back(make_step(phase, unit_index, l, grads, opt));
    else if (total > tl.back().total_bytes())
      tl.back() = make_step(phase, unit_index, l, grads, opt);
  }
  if (total <= r_.peak_bytes) return;
  r_.peak_bytes = total;
  r_.peak_phase = phase;
  r_.peak_unit = unit_index;
  peak_live_ = l;
  peak_grads_ = grads;
  peak_opt_ = opt;
  peak_act_ = act_;
  r_.peak_gathered.assign(holding_.begin(), holding_.end());
}

void Fsdp2Memory::Estimate::gather(size_t j) {  // unshard + copy-out of a group not prefetched
  if (held_[j] == groups_[j].unsharded) return;
  live_.unsharded += groups_[j].unsharded - held_[j];
  set_held(j, groups_[j].unsharded);
}

void Fsdp2Memory::Estimate::post_forward(size_t j) {
  live_.unsharded -= held_[j] - groups_[j].kept_after_forward;
  set_held(j, groups_[j].kept_after_forward);
}

// A group that runs again after a child ended (the root's head and loss after the layers).
void Fsdp2Memory::Estimate::resume_forward(const std::vector<size_t>& active, int next) {
  if (active.empty()) return;
  if (auto peak = acts_.forward_resume(static_cast<int>(active.back()), next)) {
    act_ = *peak;
    consider("forward", active.back());
    act_ = acts_.held();
  }
}

// Forward, in unit order: the previous group's all-gather output lives
// through this group's copy-out (implicit prefetch): wait_for_unshard drops
// comm_ctx.all_gather_state before the copy-out, but its local
// `prev_all_gather_state` still holds the result until the function returns
// (_fsdp_param_group.py: FSDPParamGroup.wait_for_unshard; FSDPMemTracker
// shows both all-gathers beside the first layer's unsharded parameters,
// refs/peak_small.json llama_lora_b1s16/fsdp2/w8/fp32/ac). At world size 1 there is none.
void Fsdp2Memory::Estimate::forward() {
  int64_t ag_prev = 0;
  std::vector<size_t> active;
  for (size_t j = 0; j < n_; ++j) {
    for (int c = m_.forward_closes_[j]; c > 0; --c) {
      post_forward(active.back());
      active.pop_back();
      resume_forward(active, static_cast<int>(j));
    }
    const int64_t ag = groups_[j].all_gather;
    live_.all_gather += ag;
    act_ = acts_.forward_before(static_cast<int>(j));
    consider("forward", j);
    gather(j);
    consider("forward", j);
    live_.all_gather -= ag_prev;
    act_ = acts_.forward_enter(static_cast<int>(j));
    consider("forward", j);
    act_ = acts_.held();
    ag_prev = ag;
    active.push_back(j);
  }
  while (!active.empty()) {
    post_forward(active.back());
    active.pop_back();
    resume_forward(active, -1);
  }
  live_.all_gather -= ag_prev;  // the root's post-forward frees the last one
  act_ = acts_.after_forward();
}

// The k-th group of the reversed post-order gathered: copied out of the
// all-gather the previous pre-backward prefetched, or gathered now; then the
// next group's all-gather prefetched.
void Fsdp2Memory::Estimate::pre_backward(size_t k, std::vector<int64_t>& prefetched) {
  const std::vector<size_t>& post_order = m_.post_order_;
  const size_t j = post_order[k];
  if (prefetched[j] > 0) {  // copy out the prefetched all-gather, then free it
    gather(j);
    consider("backward", j);
    live_.all_gather -= prefetched[j];
    prefetched[j] = 0;
  } else if (held_[j] < groups_[j].unsharded) {
    const int64_t ag = groups_[j].all_gather;
    live_.all_gather += ag;
    gather(j);
    consider("backward", j);
    live_.all_gather -= ag;
  }
  if (k > 0) {
    const size_t next = post_order[k - 1];
    if (held_[next] < groups_[next].unsharded && groups_[next].all_gather > 0) {
      prefetched[next] = groups_[next].all_gather;
      live_.all_gather += prefetched[next];
    }
  }
}

// A group's post-backward: its gradients made, its parameters freed, the
// reduce-scatter (_fsdp_param_group.py: FSDPParamGroup.post_backward;
// _fsdp_collectives.py: foreach_reduce).
void Fsdp2Memory::Estimate::post_backward(size_t j) {
  const Group& g = groups_[j];
  late_ = m_.late_outer_[j];
  live_.grads_unsharded += g.grads_unsharded;
  consider("backward", j);
  live_.unsharded -= held_[j];
  set_held(j, 0);
  if (g.grads_unsharded == 0) return;
  live_.reduce_scatter -= rs_retained_;
  live_.reduce_scatter += g.rs_input;
  consider("backward", j);
  live_.grads_unsharded -= g.grads_unsharded;
  live_.reduce_scatter += g.rs_output;
  if (!g.rs_output_is_grad) {
    live_.grads_sharded += g.grads_sharded;
    consider("backward", j);
    live_.reduce_scatter -= g.rs_output;
  } else {
    live_.reduce_scatter -= g.rs_output;
    live_.grads_sharded += g.grads_sharded;
    // foreach_reduce frees the unsharded gradients after the copy-in, then
    // allocates the output beside the input (_fsdp_collectives.py): at world
    // size 1 the output is the input's size, more than the bf16 gradients
    // freed (an H200 run, bench/gpu_check.py, showed the plan 2 GiB low).
    consider("backward", j);
  }
  rs_retained_ = g.rs_input;
}

void Fsdp2Memory::Estimate::resume_backward(const std::vector<size_t>& open, int next) {
  if (open.empty()) return;
  late_ = next >= 0 ? m_.late_outer_[static_cast<size_t>(next)] : m_.late_in_[open.back()];
  if (auto peak = acts_.backward_resume(static_cast<int>(open.back()), next)) {
    // The runs' peak counts the gradients they make themselves; after a
    // child (next >= 0) late_outer_ counts those parameters too.
    const int64_t all = late_;
    if (next >= 0) late_ = std::max<int64_t>(0, late_ - acts_.resumed_grads());
    act_ = *peak;
    consider("backward", open.back());
    act_ = acts_.held();
    late_ = all;
  }
}

// Backward: pre-backward hooks in reverse post-forward order, each
// prefetching the group that finished forward just before it;
// post-backward hooks when a group's subtree is done. One reduce-scatter
// input is retained until the next group's reduce-scatter. Ignored
// parameters' gradients are counted whole from the start of backward (an
// upper bound).
void Fsdp2Memory::Estimate::backward() {
  const std::vector<size_t>& post_order = m_.post_order_;
  live_.grads_unsharded += m_.unowned_trainable_bytes_;
  std::vector<int64_t> prefetched(n_, 0);
  std::vector<size_t> open;
  for (size_t k = post_order.size(); k-- > 0;) {
    const size_t j = post_order[k];
    for (int c = m_.backward_closes_[k]; c > 0; --c) {
      post_backward(open.back());
      open.pop_back();
      resume_backward(open, static_cast<int>(j));
    }
    late_ = m_.late_outer_[j];
    pre_backward(k, prefetched);
    act_ = acts_.backward_enter(static_cast<int>(j));
    consider("backward", j);
    act_ = acts_.held();
    open.push_back(j);
  }
  while (!open.empty()) {
    post_backward(open.back());
    open.pop_back();
    resume_backward(open, -1);
  }
  act_ = acts_.batch();  // the backward freed every saved tensor; the batch stays
  late_ = 0;
}

// The optimizer step: sharded gradients and state, nothing gathered, and
// Adam's temporaries (adam_step_temp_bytes).
void Fsdp2Memory::Estimate::optimizer_step() {
  live_.reduce_scatter = 0;
  live_.grads_unsharded = 0;
  live_.grads_sharded += m_.unowned_trainable_bytes_;
  if (is_adam(settings_.optimizer)) {
    std::vector<int64_t> state;  // each trainable parameter's local state tensor, in the optimizer's order
    for (size_t k : m_.optim_order_) {
      const Param& p = m_.params_[k];
      state.push_back(shard_of(p).first * p.orig);
    }
    const OptimizerImpl impl = settings_.optimizer_impl.value_or(OptimizerImpl::ForLoop);
    live_.optimizer_temp = adam_step_temp_bytes(state, impl);
    // Ignored parameters, whole on every rank: the largest one's two temporaries
    // stand for them in the for-loop; in foreach each has its own.
    if (impl == OptimizerImpl::ForLoop)
      live_.optimizer_temp = std::max(live_.optimizer_temp, 2 * m_.unowned_largest_trainable_);
    if (impl == OptimizerImpl::Foreach) live_.optimizer_temp += m_.unowned_trainable_bytes_;
  }
  consider("optimizer step", n_);
}

void Fsdp2Memory::Estimate::peak_categories() {
  r_.peak_categories = categories(peak_live_, peak_grads_, peak_opt_);
  if (acts_known_) r_.peak_categories.emplace_back("activations", peak_act_);
  r_.activation_bytes = peak_act_;
}

namespace {

void check_fsdp2_settings(const FsdpSettings& settings, const std::optional<ExpertParallel>& ep,
                          const std::optional<ContextParallel>& cp) {
  if (std::string why = device_mesh_error(settings, nullptr, ep ? &*ep : nullptr, cp ? &*cp : nullptr); !why.empty())
    throw std::invalid_argument(why);
  if (settings.strategy == ShardingStrategy::ShardGradOp || settings.strategy == ShardingStrategy::NoShard)
    throw std::invalid_argument("FSDP2 has no sharding strategy " + std::string(strategy_name(settings.strategy)));
}

// fully_shard's mesh: the TP plan's (its dp sub-mesh), or the settings'
// (dp_shard) or (dp_replicate, dp_shard), with cp (dp_shard x cp) (mesh/device_mesh.h).
DeviceMesh fsdp2_group_sizes(const std::optional<DeviceMesh>& tp_mesh, const std::optional<ExpertParallel>& ep,
                             const std::optional<ContextParallel>& cp, const FsdpSettings& settings,
                             MemoryPlan& mem) {
  const DeviceMesh mesh =
      tp_mesh ? *tp_mesh : device_mesh(settings, nullptr, ep ? &*ep : nullptr, cp ? &*cp : nullptr);
  mem.shard_group_size = mesh.fsdp_shard_size();
  mem.replicate_size = mesh.size(MeshDim::DpReplicate);
  return mesh;
}

void add_fsdp2_notes(const DeviceMesh& mesh, const FsdpSettings& settings, const ActivationPlan& activations,
                     MemoryPlan& mem) {
  mem.notes.push_back("FSDP2 (fully_shard): mesh " +
                      (mesh.size(MeshDim::DpReplicate) > 1
                           ? "(" + std::to_string(mesh.size(MeshDim::DpReplicate)) + " replicate, "
                           : std::string("(")) +
                      std::to_string(mesh.fsdp_shard_size()) +
                      (mesh.context_parallel() ? " shard: dp_shard " + std::to_string(mesh.size(MeshDim::DpShard)) +
                                                     " x cp " + std::to_string(mesh.size(MeshDim::Cp))
                                               : std::string(" shard")) +
                      "), rank 0 (the largest shards)");
  if (mesh.expert_parallel())
    mem.notes.push_back("expert parallelism: rank 0 holds its experts (split over ep " +
                        std::to_string(mesh.size(MeshDim::Ep)) + "), sharded over efsdp " +
                        std::to_string(mesh.size(MeshDim::Efsdp)) +
                        " by their own FSDPParamGroup (torchtitan's shard_placement_fn)");
  if (settings.cpu_offload)
    mem.notes.push_back("CPU offload: sharded parameters, gradients and optimizer state on the host (host_bytes)");
  mem.notes.push_back(activation_note(activations));
  mem.notes.push_back("module order stands for execution order");
}

}  // namespace

MemoryPlan Fsdp2Memory::estimate(const FsdpSettings& settings, bool timeline) const {
  check_fsdp2_settings(settings, expert_parallel_, context_parallel_);
  MemoryPlan mem;
  mem.settings = settings;
  mem.effective_strategy = settings.strategy;
  const DeviceMesh mesh = fsdp2_group_sizes(tp_mesh_, expert_parallel_, context_parallel_, settings, mem);
  Estimate step(*this, settings, mesh, timeline, mem);
  step.size_groups();
  step.steady_state();
  step.forward();
  step.backward();
  step.optimizer_step();
  step.peak_categories();
  add_fsdp2_notes(mesh, settings, activations_, mem);
  return mem;
}

}  // namespace fsdp_plan
