#include "fsdp1/memory.h"

#include <algorithm>
#include <stdexcept>

#include "activations/schedule.h"
#include "mesh/device_mesh.h"
#include "model/dtype.h"
#include "plan/optimizer_step.h"
#include "plan/plan.h"

namespace fsdp_plan {
namespace {

// Bytes per element the unit's parameters have; FSDP requires one dtype per
// flat parameter, so the largest stands for all when a model mixes them.
int64_t param_itemsize(const Plan& plan, const Unit& u) {
  int64_t size = 0;
  for (const auto& o : u.params) size = std::max(size, plan.tree->tensor(o.tensor).itemsize);
  return size == 0 ? 4 : size;
}

// FlatParamHandle with use_orig_params (align_addresses): each parameter
// starts at a multiple of 16 bytes, and the whole is padded to a multiple of
// the shard group size. Without it, only sharding pads (see sharded_numel).
int64_t flat_numel(const Plan& plan, const Unit& u, int64_t itemsize, bool align, int64_t group) {
  int64_t total = 0;
  const int64_t aligned = std::max<int64_t>(1, 16 / itemsize);
  for (const auto& o : u.params) {
    if (align && total % aligned != 0) total += aligned - total % aligned;
    total += plan.tree->numel(o.tensor);
  }
  if (align && total % group != 0) total += group - total % group;
  return total;
}

// Trainable elements of the unit's flat parameter that fall in rank 0's
// shard, laid out as flat_numel lays them out. A unit mixing frozen and
// trainable parameters gets a gradient for its whole flat parameter, but an
// optimizer over the original parameters (use_orig_params) keeps state only
// for the trainable ones' local views.
int64_t trainable_in_first_shard(const Plan& plan, const Unit& u, int64_t itemsize, bool align, int64_t shard) {
  int64_t offset = 0, trainable = 0;
  const int64_t aligned = std::max<int64_t>(1, 16 / itemsize);
  for (const auto& o : u.params) {
    if (align && offset % aligned != 0) offset += aligned - offset % aligned;
    const int64_t numel = plan.tree->numel(o.tensor);
    if (plan.tree->tensor(o.tensor).requires_grad) trainable += std::max<int64_t>(0, std::min(offset + numel, shard) - offset);
    offset += numel;
  }
  return trainable;
}

// The shard group (_init_utils.py: _init_core_state switches a world of one
// to NO_SHARD; _init_intra_and_inter_node_groups shards HYBRID_SHARD within a
// node of torch.cuda.device_count() GPUs): the device mesh's dp_shard dimension.
void choose_shard_group(const FsdpSettings& settings, MemoryPlan& mem) {
  mem.effective_strategy = settings.strategy;
  if (settings.world_size == 1 && settings.strategy != ShardingStrategy::NoShard) {
    mem.effective_strategy = ShardingStrategy::NoShard;
    mem.notes.push_back(std::string("world size 1: FSDP switches ") + strategy_name(settings.strategy) +
                        " to NO_SHARD");
  }
  // The dp_shard dimension: the world (FULL_SHARD, SHARD_GRAD_OP), a node (HYBRID_SHARD), 1 (NO_SHARD, one rank).
  mem.shard_group_size = device_mesh(settings).size(MeshDim::DpShard);
  if (mem.effective_strategy == ShardingStrategy::HybridShard && settings.shard_group_size == 0)
    mem.notes.push_back("HYBRID_SHARD shards within a node (FSDP uses torch.cuda.device_count()); assumed " +
                        std::to_string(mem.shard_group_size) +
                        " GPUs per node, the largest divisor of the world size up to 8: set --shard-group-size "
                        "to your GPUs per node");
}

// What one unit holds for good, and what it adds while gathered, in bytes.
struct Fsdp1UnitBytes {
  int64_t gathered = 0;      // the unsharded flat parameter (0: computed in place)
  int64_t grad_sharded = 0;  // the gradient it leaves after reduce-scatter
  int64_t grad_kept = 0;     // the sharded gradient as held until the optimizer step
  int64_t view_grads = 0;    // the original parameters' (views') gradients
  // The flat gradient SplitWithSizesBackward concatenates, and what the
  // post-backward hook adds beside it (_runtime_utils.py: _post_backward_hook,
  // _reduce_grad, _get_reduce_scatter_tensors): a copy in the reduce dtype,
  // the padded copy, the new sharded gradient.
  int64_t cat_grad = 0, post_grad = 0;
};

// Per-unit sizes and the steady state (what a rank holds between steps), from
// the flat parameters FSDP builds (flat_param.py: FlatParamHandle).
class Fsdp1Sizes {
 public:
  Fsdp1Sizes(const Plan& plan, const FsdpSettings& settings, MemoryPlan& mem);
  void add_unit(size_t i);
  void add_ignored_params();

  const Plan& plan;
  const FsdpSettings& settings;
  MemoryPlan& mem;
  const bool sharded;
  const int64_t group;
  std::vector<Fsdp1UnitBytes> units;
  // Per unit, its parameters' gradients in the compute dtype (the views'), for LateGradients.
  std::vector<std::vector<std::pair<TensorId, int64_t>>> view_params;
  // The optimizer's parameters in order (the flat parameters in pre-order; with
  // use_orig_params the original ones' local shards), in bytes of their state.
  std::vector<int64_t> optim_params;
  int64_t ignored = 0;          // ignored parameters that train: whole gradients
  bool kept_low_grads = false;  // some unit's gradient is kept in a smaller dtype

 private:
  int64_t gradients(size_t i, int64_t itemsize, const UnitMemory& um);
  void rank_state(size_t i, int64_t itemsize, int64_t kept_itemsize, const UnitMemory& um);

  int64_t mp_param_ = 0, mp_buffer_ = 0, mp_reduce_ = 0;
  bool keep_low_grads_ = false;
  int states_ = 0;
};

Fsdp1Sizes::Fsdp1Sizes(const Plan& plan_in, const FsdpSettings& settings_in, MemoryPlan& mem_in)
    : plan(plan_in),
      settings(settings_in),
      mem(mem_in),
      sharded(mem_in.effective_strategy != ShardingStrategy::NoShard),
      group(mem_in.shard_group_size) {
  const auto& mp = plan.policy.mixed_precision;
  mp_param_ = mp && mp->param_dtype ? dtype_itemsize(*mp->param_dtype) : 0;
  mp_buffer_ = mp && mp->buffer_dtype ? dtype_itemsize(*mp->buffer_dtype) : 0;
  mp_reduce_ = mp && mp->reduce_dtype ? dtype_itemsize(*mp->reduce_dtype) : 0;
  keep_low_grads_ = mp && mp->keep_low_grads();
  states_ = optimizer_states(settings.optimizer);
  const size_t n = plan.units.size();
  units.resize(n);
  view_params.resize(n);
}

// Unit i's flat parameter, shard and gathered copy, then its gradients and its
// share of the steady state.
void Fsdp1Sizes::add_unit(size_t i) {
  const Unit& u = plan.units[i];
  Fsdp1UnitBytes& b = units[i];
  UnitMemory um;
  const int64_t itemsize = param_itemsize(plan, u);
  const bool low = u.mixed_precision.value_or(false) && mp_param_ > 0 && mp_param_ != itemsize;
  um.compute_itemsize = low ? mp_param_ : itemsize;
  um.flat_numel = flat_numel(plan, u, itemsize, settings.use_orig_params, group);
  um.sharded_numel = ceil_div(um.flat_numel, group);
  um.sharded_bytes = um.sharded_numel * itemsize;
  um.unsharded_bytes = um.sharded_numel * group * um.compute_itemsize;
  // Sharded strategies gather into a separate padded buffer and compute the
  // gradient there before reduce-scatter; NO_SHARD computes in place unless
  // mixed precision needs a low-precision copy.
  b.gathered = sharded || low ? um.unsharded_bytes : 0;
  const int64_t kept_itemsize = gradients(i, itemsize, um);
  rank_state(i, itemsize, kept_itemsize, um);
  mem.units.push_back(um);
}

// The unit's gradients; returns the itemsize its sharded gradient is kept in.
int64_t Fsdp1Sizes::gradients(size_t i, int64_t itemsize, const UnitMemory& um) {
  const Unit& u = plan.units[i];
  Fsdp1UnitBytes& b = units[i];
  // A wholly frozen unit's flat parameter has requires_grad=False: no
  // gradient, no optimizer state. Any trainable parameter makes it True.
  const bool trains = u.trainable_numel > 0;
  b.grad_sharded = trains ? um.sharded_bytes : 0;
  // keep_low_precision_grads, on units that run in mixed precision: sharded
  // strategies still cast the reduce-scattered gradient to the parameter
  // dtype and hold it so through backward (_accumulate_sharded_grad), then
  // cast it to param_dtype for the optimizer (prepare_gradient_for_optim);
  // NO_SHARD skips the cast and keeps the gradient in the reduce dtype.
  int64_t kept_itemsize = itemsize;
  if (trains && keep_low_grads_ && u.mixed_precision.value_or(false)) {
    const int64_t reduce = mp_reduce_ > 0 ? mp_reduce_ : mp_param_ > 0 ? mp_param_ : itemsize;
    kept_itemsize = sharded ? um.compute_itemsize : reduce;
    kept_low_grads |= kept_itemsize != itemsize;
  }
  b.grad_kept = trains ? um.sharded_numel * kept_itemsize : 0;
  if (!sharded) b.grad_sharded = b.grad_kept;
  // The original parameters are views of the flat one: in the unit's
  // backward, autograd holds each one's gradient until it concatenates them
  // into the flat gradient (SplitWithSizesBackward), so for that moment the
  // unit's gradient exists twice.
  b.view_grads = trains ? u.param_numel * um.compute_itemsize : 0;
  if (trains) {
    for (const auto& o : u.params)
      view_params[i].emplace_back(o.tensor, plan.tree->numel(o.tensor) * um.compute_itemsize);
    const int64_t rd = mp_reduce_ > 0 && u.mixed_precision.value_or(false) ? mp_reduce_ : um.compute_itemsize;
    const int64_t padded = um.sharded_numel * group;
    b.cat_grad = um.flat_numel * um.compute_itemsize;
    b.post_grad = (rd != um.compute_itemsize ? um.flat_numel * rd : 0) +
                  (sharded ? (um.flat_numel < padded ? padded * rd : 0) + um.sharded_numel * rd : 0);
  }
  return kept_itemsize;
}

// The unit's share of what a rank holds between steps: its shard, kept
// gradient, optimizer state and buffers.
void Fsdp1Sizes::rank_state(size_t i, int64_t itemsize, int64_t kept_itemsize, const UnitMemory& um) {
  const Unit& u = plan.units[i];
  RankMemory& r = mem.per_rank;
  const bool trains = u.trainable_numel > 0;
  r.params_bytes += um.sharded_bytes;
  r.grads_bytes += units[i].grad_kept;
  int64_t state_numel = trains ? um.sharded_numel : 0;
  if (trains && u.frozen_numel > 0 && settings.use_orig_params)
    state_numel = trainable_in_first_shard(plan, u, itemsize, true, um.sharded_numel);
  // SGD's momentum buffer is a clone of the first gradient, so in its dtype.
  const int64_t state_itemsize = settings.optimizer == Optimizer::SgdMomentum ? kept_itemsize : itemsize;
  r.optimizer_bytes += states_ * state_numel * state_itemsize;
  // Adam's step counter: a 4-byte tensor per parameter it steps (optim/adam.py: _init_group).
  if (trains && is_adam(settings.optimizer)) {
    if (u.frozen_numel > 0 && settings.use_orig_params) {
      int64_t offset = 0;
      const int64_t aligned = std::max<int64_t>(1, 16 / itemsize);
      for (const auto& o : u.params) {
        if (offset % aligned != 0) offset += aligned - offset % aligned;
        const int64_t numel = plan.tree->numel(o.tensor);
        const int64_t local = std::max<int64_t>(0, std::min(offset + numel, um.sharded_numel) - offset);
        if (plan.tree->tensor(o.tensor).requires_grad && local > 0) optim_params.push_back(local * itemsize);
        offset += numel;
      }
    } else {
      optim_params.push_back(um.sharded_numel * itemsize);
    }
  }
  for (const auto& o : u.buffers) {
    const TensorInfo& t = plan.tree->tensor(o.tensor);
    // FSDP casts floating-point buffers only (_cast_buffers_to_dtype_and_device).
    const bool cast = u.mixed_precision.value_or(false) && mp_buffer_ > 0 && is_floating_dtype(t.dtype);
    r.buffers_bytes += plan.tree->numel(o.tensor) * (cast ? mp_buffer_ : t.itemsize);
  }
}

// Ignored parameters stay whole on every rank, with whole gradients and
// state when they train. Then the steady state's total.
void Fsdp1Sizes::add_ignored_params() {
  RankMemory& r = mem.per_rank;
  std::vector<bool> owned(plan.tree->num_tensors(), false);
  for (const auto& u : plan.units)
    for (const auto& o : u.params) owned[static_cast<size_t>(o.tensor)] = true;
  int64_t ignored_all = 0;
  for (TensorId t = 0; t < static_cast<TensorId>(plan.tree->num_tensors()); ++t) {
    if (!plan.tree->is_param(t) || owned[static_cast<size_t>(t)]) continue;
    const int64_t bytes = plan.tree->bytes(t);
    ignored_all += bytes;
    if (plan.tree->tensor(t).requires_grad) ignored += bytes;
  }
  r.params_bytes += ignored_all;
  r.grads_bytes += ignored;
  r.optimizer_bytes += states_ * ignored;
  if (is_adam(settings.optimizer)) r.optimizer_bytes += 4 * static_cast<int64_t>(optim_params.size());
  r.steady_bytes = r.params_bytes + r.grads_bytes + r.optimizer_bytes + r.buffers_bytes;
}

std::vector<int> unit_parents(const Plan& plan) {
  std::vector<int> parents;
  for (const auto& u : plan.units) parents.push_back(u.parent);
  return parents;
}

std::vector<ModuleId> unit_modules(const Plan& plan) {
  std::vector<ModuleId> modules;
  for (const auto& u : plan.units) modules.push_back(u.module);
  return modules;
}

// A training step, point by point: forward unit by unit, backward in reverse,
// the optimizer step. Gradients were freed by zero_grad before forward;
// sharded gradients reappear unit by unit in backward.
class Fsdp1Walk {
 public:
  Fsdp1Walk(const Fsdp1Sizes& sizes, bool timeline);
  void forward();
  void backward();
  void optimizer_step();
  void list_peak_gathered();

 private:
  void record(const char* phase, size_t unit, int64_t gathered_now, int64_t unsharded_grads, int64_t grads);
  void resume_forward(int a, int next);
  void resume_backward(int a, int next);
  int64_t gathered(size_t j) const { return z_.units[j].gathered; }
  // Gradients of enclosing units' parameters used after unit `after` in the
  // forward (LateGradients): their views' gradients exist from their backward on.
  int64_t late_after(int unit, int after) const { return unit < 0 ? int64_t{0} : late_.after(unit, after); }
  // In pre-order, the unit before j is one of j's ancestors only if it is its parent.
  bool parent_is_previous(size_t j) const { return j > 0 && plan_.units[j].parent == static_cast<int>(j - 1); }

  const Fsdp1Sizes& z_;
  const Plan& plan_;
  MemoryPlan& mem_;
  RankMemory& r_;
  const bool timeline_;
  const size_t n_;
  const bool keep_after_forward_;  // SHARD_GRAD_OP
  std::vector<int64_t> ancestors_gathered_;
  // The units that continue between unit j - 1 and unit j (j == n: after
  // the last), innermost first: each unit on the path from j - 1 up to j's
  // parent, the ones that end there included (a block's MLP after its wrapped
  // attention). Forward resumes them in this order, backward in reverse.
  std::vector<std::vector<int>> continuing_;
  const std::vector<int> parents_;
  // Activations live at each point (activations/schedule.h), set before each record().
  ActivationSchedule acts_;
  const LateGradients late_;
  int64_t act_ = 0;
  int64_t prefix_ = 0;  // sum of gathered(k) for k < j
  int64_t sharded_grads_done_ = 0;
};

Fsdp1Walk::Fsdp1Walk(const Fsdp1Sizes& sizes, bool timeline)
    : z_(sizes),
      plan_(sizes.plan),
      mem_(sizes.mem),
      r_(sizes.mem.per_rank),
      timeline_(timeline),
      n_(sizes.plan.units.size()),
      keep_after_forward_(sizes.mem.effective_strategy == ShardingStrategy::ShardGradOp),
      ancestors_gathered_(n_, 0),
      continuing_(n_ + 1),
      parents_(unit_parents(sizes.plan)),
      acts_(sizes.plan.activations, parents_),
      late_(*sizes.plan.tree, parents_, unit_modules(sizes.plan), sizes.view_params) {
  for (size_t i = 1; i < n_; ++i) {
    const auto p = static_cast<size_t>(plan_.units[i].parent);
    ancestors_gathered_[i] = ancestors_gathered_[p] + gathered(p);
  }
  r_.peak_bytes = r_.steady_bytes;
  r_.peak_phase = "optimizer step";
  if (timeline_) mem_.timeline.reserve(2 * n_ + 1);
  // Pre-order makes `continuing_` a stack walk: linear, whatever the depth.
  std::vector<int> path;
  for (size_t j = 0; j <= n_; ++j) {
    const int parent = j < n_ ? plan_.units[j].parent : -1;
    while (!path.empty() && path.back() != parent) {
      continuing_[j].push_back(path.back());
      path.pop_back();
    }
    if (!path.empty()) continuing_[j].push_back(path.back());
    if (j < n_) path.push_back(static_cast<int>(j));
  }
}

// One step of the series; the peak is the first step above the steady
// state. Consecutive points of one phase and unit make one step, holding
// the largest.
void Fsdp1Walk::record(const char* phase, size_t unit, int64_t gathered_now, int64_t unsharded_grads,
                       int64_t grads) {
  const int unit_index = unit < n_ ? static_cast<int>(unit) : -1;
  if (timeline_ && !mem_.timeline.empty() && mem_.timeline.back().phase == phase &&
      mem_.timeline.back().unit == unit_index) {
    const int64_t total = r_.params_bytes + r_.optimizer_bytes + r_.buffers_bytes + gathered_now + unsharded_grads +
                          grads + act_;
    if (total <= mem_.timeline.back().total_bytes()) return;  // nor above the peak
    mem_.timeline.pop_back();
  }
  MemoryStep s;
  s.phase = phase;
  s.unit = static_cast<int>(unit);
  s.params_bytes = r_.params_bytes;
  s.optimizer_bytes = r_.optimizer_bytes;
  s.buffers_bytes = r_.buffers_bytes;
  s.gathered_bytes = gathered_now;
  s.unsharded_grads_bytes = unsharded_grads;
  s.grads_bytes = grads;
  s.activation_bytes = act_;
  const int64_t bytes = s.total_bytes();
  if (timeline_) mem_.timeline.push_back(std::move(s));
  if (bytes <= r_.peak_bytes) return;
  r_.peak_bytes = bytes;
  r_.peak_phase = phase;
  r_.peak_unit = static_cast<int>(unit);
  r_.activation_bytes = act_;
}

// An enclosing unit may run between its children (the root's head and loss
// after the layers): a point of its own, before unit `next` is gathered.
void Fsdp1Walk::resume_forward(int a, int next) {
  if (auto peak = acts_.forward_resume(a, next)) {
    act_ = *peak;
    const size_t k = static_cast<size_t>(a);
    const int64_t live = keep_after_forward_ ? prefix_ : ancestors_gathered_[k] + gathered(k);
    record("forward", k, live + (next >= 0 ? gathered(static_cast<size_t>(next)) : 0), 0, 0);
    act_ = acts_.held();
  }
}

// Forward: unit j runs inside its ancestors' forwards, so they are gathered
// too; the next unit's all-gather may already be in flight (FSDP's rate
// limiter allows two). SHARD_GRAD_OP keeps every unit gathered after forward.
void Fsdp1Walk::forward() {
  for (size_t j = 0; j < n_; ++j) {
    for (int a : continuing_[j]) resume_forward(a, static_cast<int>(j));
    const int64_t next = j + 1 < n_ ? gathered(j + 1) : 0;
    const int64_t live = keep_after_forward_ ? prefix_ + gathered(j) : ancestors_gathered_[j] + gathered(j);
    act_ = acts_.forward_enter(static_cast<int>(j));
    record("forward", j, live + next, 0, 0);
    act_ = acts_.held();
    prefix_ += gathered(j);
  }
  for (int a : continuing_[n_]) resume_forward(a, -1);
  act_ = acts_.after_forward();
}

// An enclosing unit's backward between its children's (the root's loss and
// head before the last layer's backward): a point of its own.
void Fsdp1Walk::resume_backward(int a, int next) {
  if (auto peak = acts_.backward_resume(a, next)) {
    act_ = *peak;
    const size_t k = static_cast<size_t>(a);
    // Unit `next`, whose backward follows, is already gathered: the last
    // pre-backward hook prefetched it (BACKWARD_PRE, _runtime_utils.py:
    // _pre_backward_hook -> _prefetch_handle), the root's own at the start
    // of backward (refs/peak_small.json llama_b2s32/fsdp1/w8: the last
    // layer's parameters beside the loss's backward).
    const int64_t prefetched =
        !keep_after_forward_ && next >= 0 && next != a ? gathered(static_cast<size_t>(next)) : 0;
    const int64_t live =
        (keep_after_forward_ ? prefix_ + gathered(k) : ancestors_gathered_[k] + gathered(k)) + prefetched;
    // The runs' peak counts the gradients they make themselves (ActivationRun::backward_grads),
    // which late_after counts too: they are used after `next`.
    const int64_t made_before = std::max<int64_t>(
        0, late_after(a, next >= 0 ? next : static_cast<int>(n_) - 1) - acts_.resumed_grads());
    record("backward", k, live, made_before, z_.ignored + sharded_grads_done_);
    act_ = acts_.held();
  }
}

// Backward, in reverse: unit j and its ancestors are gathered (the root was
// never freed), with BACKWARD_PRE prefetch of the unit before it; their
// unsharded gradients exist until reduce-scatter; every unit after j has
// already left its sharded gradient.
void Fsdp1Walk::backward() {
  for (size_t j = n_; j-- > 0;) {
    prefix_ -= gathered(j);  // now the sum for k < j
    // What continued after j in forward runs before it in backward, outermost first.
    const auto& after = continuing_[j + 1];
    for (auto it = after.rbegin(); it != after.rend(); ++it) resume_backward(*it, static_cast<int>(j));
    int64_t live;
    if (keep_after_forward_) {
      live = prefix_ + gathered(j);
    } else {
      const bool prefetch = j > 0 && !parent_is_previous(j);
      live = ancestors_gathered_[j] + gathered(j) + (prefetch ? gathered(j - 1) : 0);
    }
    // Ignored parameters' gradients are whole and counted from the start of backward.
    const int64_t grads = z_.ignored + sharded_grads_done_;
    const int64_t outer = late_after(plan_.units[j].parent, static_cast<int>(j));
    const Fsdp1UnitBytes& b = z_.units[j];
    // Its backward: the activations' peak, while few of its own parameters' gradients exist yet.
    act_ = acts_.backward_enter(static_cast<int>(j));
    record("backward", j, live, outer, grads);
    act_ = acts_.held();
    // Its end: every view's gradient and the flat gradient concatenated from them
    // (flat_param.py: FlatParamHandle._use_unsharded_views makes the views,
    // autograd's SplitWithSizesBackward the flat gradient).
    record("backward", j, live, outer + b.view_grads + b.cat_grad, grads);
    // The post-backward hook: the views' gradients freed, the unit's unsharded
    // parameter freed first (_post_backward_reshard): under a sharded
    // strategy the padded unsharded flat parameter; under NO_SHARD the
    // low-precision copy mixed precision made, which is its only gathered
    // bytes (_flat_param.py: FlatParamHandle.post_reshard frees _mp_shard;
    // refs/peak_small.json llama_lora_b1s16/fsdp1/w1/bf16: the bf16 copy is
    // gone when the fp32 gradient is made); then the reduce-scatter's tensors
    // beside the flat gradient.
    record("backward", j, live - gathered(j), outer + b.cat_grad + b.post_grad, grads);
    sharded_grads_done_ += b.grad_sharded;
  }
  act_ = acts_.batch();  // the backward freed every saved tensor; the batch stays
}

// The optimizer step: the steady state, nothing gathered, and Adam's
// temporaries (adam_step_temp_bytes).
void Fsdp1Walk::optimizer_step() {
  const FsdpSettings& settings = z_.settings;
  int64_t optimizer_temp = 0;
  if (is_adam(settings.optimizer))
    optimizer_temp = adam_step_temp_bytes(z_.optim_params, settings.optimizer_impl.value_or(OptimizerImpl::ForLoop));
  MemoryStep step;
  step.phase = "optimizer step";
  step.params_bytes = r_.params_bytes;
  step.optimizer_bytes = r_.optimizer_bytes + optimizer_temp;
  step.buffers_bytes = r_.buffers_bytes;
  step.grads_bytes = r_.grads_bytes;
  step.activation_bytes = act_;
  if (step.total_bytes() > r_.peak_bytes) {
    r_.peak_bytes = step.total_bytes();
    r_.peak_phase = "optimizer step";
    r_.peak_unit = -1;
    r_.activation_bytes = act_;
  }
  if (timeline_) mem_.timeline.push_back(std::move(step));
}

// The units gathered at the peak, by the rules forward() and backward() apply.
void Fsdp1Walk::list_peak_gathered() {
  if (r_.peak_unit < 0) return;
  const size_t j = static_cast<size_t>(r_.peak_unit);
  std::vector<bool> ancestor(n_, false);
  for (int cur = plan_.units[j].parent; cur >= 0; cur = plan_.units[static_cast<size_t>(cur)].parent)
    ancestor[static_cast<size_t>(cur)] = true;
  for (size_t k = 0; k < n_; ++k) {
    bool live = k == j || ancestor[k] ||
                (keep_after_forward_ && k < j) ||
                (r_.peak_phase == "forward" && k == j + 1) ||
                (r_.peak_phase == "backward" && !keep_after_forward_ && k + 1 == j);
    if (live && gathered(k) > 0) r_.peak_gathered.push_back(static_cast<int>(k));
  }
}

void add_fsdp1_notes(const Plan& plan, const Fsdp1Sizes& sizes, MemoryPlan& mem) {
  if (sizes.kept_low_grads && is_adam(sizes.settings.optimizer))
    mem.notes.push_back("keep_low_precision_grads: torch.optim.Adam and AdamW raise on low-precision gradients of "
                        "full-precision parameters (\"expected dtype float for `end`\"); the optimizer figures assume "
                        "one that accepts them and keeps its state in the parameters' dtype");
  mem.notes.push_back(activation_note(plan.activations));
  mem.notes.push_back("module order stands for execution order, as FSDP assumes before its first step");
}

}  // namespace

MemoryPlan estimate_memory(const Plan& plan, const FsdpSettings& settings, bool timeline) {
  if (std::string why = device_mesh_error(settings); !why.empty()) throw std::invalid_argument(why);
  MemoryPlan mem;
  mem.settings = settings;
  choose_shard_group(settings, mem);
  Fsdp1Sizes sizes(plan, settings, mem);
  for (size_t i = 0; i < plan.units.size(); ++i) sizes.add_unit(i);
  sizes.add_ignored_params();
  Fsdp1Walk walk(sizes, timeline);
  walk.forward();
  walk.backward();
  walk.optimizer_step();
  walk.list_peak_gathered();
  add_fsdp1_notes(plan, sizes, mem);
  return mem;
}

}  // namespace fsdp_plan
