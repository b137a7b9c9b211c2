#include "fsdp1/memory.h"

#include <algorithm>
#include <stdexcept>

#include "activations/schedule.h"
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

}  // namespace

MemoryPlan estimate_memory(const Plan& plan, const FsdpSettings& settings, bool timeline) {
  if (std::string why = settings_error(settings); !why.empty()) throw std::invalid_argument(why);
  MemoryPlan mem;
  mem.settings = settings;
  mem.effective_strategy = settings.strategy;
  if (settings.world_size == 1 && settings.strategy != ShardingStrategy::NoShard) {
    mem.effective_strategy = ShardingStrategy::NoShard;
    mem.notes.push_back(std::string("world size 1: FSDP switches ") + strategy_name(settings.strategy) +
                        " to NO_SHARD");
  }
  switch (mem.effective_strategy) {
    case ShardingStrategy::NoShard: mem.shard_group_size = 1; break;
    case ShardingStrategy::HybridShard:
      mem.shard_group_size = hybrid_group_size(settings);
      if (settings.shard_group_size == 0)
        mem.notes.push_back("HYBRID_SHARD shards within a node (FSDP uses torch.cuda.device_count()); assumed " +
                            std::to_string(mem.shard_group_size) +
                            " GPUs per node, the largest divisor of the world size up to 8: set --shard-group-size "
                            "to your GPUs per node");
      break;
    default: mem.shard_group_size = settings.world_size;
  }
  const bool sharded = mem.effective_strategy != ShardingStrategy::NoShard;
  const int64_t group = mem.shard_group_size;
  const auto& mp = plan.policy.mixed_precision;
  const int64_t mp_param = mp && mp->param_dtype ? dtype_itemsize(*mp->param_dtype) : 0;
  const int64_t mp_buffer = mp && mp->buffer_dtype ? dtype_itemsize(*mp->buffer_dtype) : 0;
  const int64_t mp_reduce = mp && mp->reduce_dtype ? dtype_itemsize(*mp->reduce_dtype) : 0;
  const bool keep_low_grads = mp && mp->keep_low_grads();
  bool kept_low_grads = false;  // some unit's gradient is kept in a smaller dtype
  const int states = optimizer_states(settings.optimizer);

  // Per unit: what it holds for good, and what it adds while gathered.
  const size_t n = plan.units.size();
  std::vector<int64_t> gathered(n), grad_unsharded(n), grad_sharded(n), grad_kept(n), view_grads(n);
  // The flat gradient SplitWithSizesBackward concatenates, and what the
  // post-backward hook adds beside it (_runtime_utils.py: _post_backward_hook,
  // _reduce_grad, _get_reduce_scatter_tensors): a copy in the reduce dtype,
  // the padded copy, the new sharded gradient.
  std::vector<int64_t> cat_grad(n), post_grad(n);
  // Per unit, its parameters' gradients in the compute dtype (the views'), for LateGradients.
  std::vector<std::vector<std::pair<TensorId, int64_t>>> view_params(n);
  // The optimizer's parameters in order (the flat parameters in pre-order; with
  // use_orig_params the original ones' local shards), in bytes of their state.
  std::vector<int64_t> optim_params;
  RankMemory& r = mem.per_rank;
  for (size_t i = 0; i < n; ++i) {
    const Unit& u = plan.units[i];
    UnitMemory um;
    const int64_t itemsize = param_itemsize(plan, u);
    const bool low = u.mixed_precision.value_or(false) && mp_param > 0 && mp_param != itemsize;
    um.compute_itemsize = low ? mp_param : itemsize;
    um.flat_numel = flat_numel(plan, u, itemsize, settings.use_orig_params, group);
    um.sharded_numel = ceil_div(um.flat_numel, group);
    um.sharded_bytes = um.sharded_numel * itemsize;
    um.unsharded_bytes = um.sharded_numel * group * um.compute_itemsize;
    // Sharded strategies gather into a separate padded buffer and compute the
    // gradient there before reduce-scatter; NO_SHARD computes in place unless
    // mixed precision needs a low-precision copy.
    gathered[i] = sharded || low ? um.unsharded_bytes : 0;
    // A wholly frozen unit's flat parameter has requires_grad=False: no
    // gradient, no optimizer state. Any trainable parameter makes it True.
    const bool trains = u.trainable_numel > 0;
    grad_unsharded[i] = trains ? gathered[i] : 0;
    grad_sharded[i] = trains ? um.sharded_bytes : 0;
    // keep_low_precision_grads, on units that run in mixed precision: sharded
    // strategies still cast the reduce-scattered gradient to the parameter
    // dtype and hold it so through backward (_accumulate_sharded_grad), then
    // cast it to param_dtype for the optimizer (prepare_gradient_for_optim);
    // NO_SHARD skips the cast and keeps the gradient in the reduce dtype.
    int64_t kept_itemsize = itemsize;
    if (trains && keep_low_grads && u.mixed_precision.value_or(false)) {
      const int64_t reduce = mp_reduce > 0 ? mp_reduce : mp_param > 0 ? mp_param : itemsize;
      kept_itemsize = sharded ? um.compute_itemsize : reduce;
      kept_low_grads |= kept_itemsize != itemsize;
    }
    grad_kept[i] = trains ? um.sharded_numel * kept_itemsize : 0;
    if (!sharded) grad_sharded[i] = grad_kept[i];
    // The original parameters are views of the flat one: in the unit's
    // backward, autograd holds each one's gradient until it concatenates them
    // into the flat gradient (SplitWithSizesBackward), so for that moment the
    // unit's gradient exists twice.
    view_grads[i] = trains ? u.param_numel * um.compute_itemsize : 0;
    if (trains) {
      for (const auto& o : u.params)
        view_params[i].emplace_back(o.tensor, plan.tree->numel(o.tensor) * um.compute_itemsize);
      const int64_t rd = mp_reduce > 0 && u.mixed_precision.value_or(false) ? mp_reduce : um.compute_itemsize;
      const int64_t padded = um.sharded_numel * group;
      cat_grad[i] = um.flat_numel * um.compute_itemsize;
      post_grad[i] = (rd != um.compute_itemsize ? um.flat_numel * rd : 0) +
                     (sharded ? (um.flat_numel < padded ? padded * rd : 0) + um.sharded_numel * rd : 0);
    }
    r.params_bytes += um.sharded_bytes;
    r.grads_bytes += grad_kept[i];
    int64_t state_numel = trains ? um.sharded_numel : 0;
    if (trains && u.frozen_numel > 0 && settings.use_orig_params)
      state_numel = trainable_in_first_shard(plan, u, itemsize, true, um.sharded_numel);
    // SGD's momentum buffer is a clone of the first gradient, so in its dtype.
    const int64_t state_itemsize = settings.optimizer == Optimizer::SgdMomentum ? kept_itemsize : itemsize;
    r.optimizer_bytes += states * state_numel * state_itemsize;
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
      const bool cast = u.mixed_precision.value_or(false) && mp_buffer > 0 && is_floating_dtype(t.dtype);
      r.buffers_bytes += plan.tree->numel(o.tensor) * (cast ? mp_buffer : t.itemsize);
    }
    mem.units.push_back(um);
  }
  // Ignored parameters stay whole on every rank, with whole gradients and
  // state when they train.
  std::vector<bool> owned(plan.tree->num_tensors(), false);
  for (const auto& u : plan.units)
    for (const auto& o : u.params) owned[static_cast<size_t>(o.tensor)] = true;
  int64_t ignored_all = 0, ignored = 0;  // ignored: the trainable part
  for (TensorId t = 0; t < static_cast<TensorId>(plan.tree->num_tensors()); ++t) {
    if (!plan.tree->is_param(t) || owned[static_cast<size_t>(t)]) continue;
    const int64_t bytes = plan.tree->bytes(t);
    ignored_all += bytes;
    if (plan.tree->tensor(t).requires_grad) ignored += bytes;
  }
  r.params_bytes += ignored_all;
  r.grads_bytes += ignored;
  r.optimizer_bytes += states * ignored;
  if (is_adam(settings.optimizer)) r.optimizer_bytes += 4 * static_cast<int64_t>(optim_params.size());
  r.steady_bytes = r.params_bytes + r.grads_bytes + r.optimizer_bytes + r.buffers_bytes;

  // Walk a training step. Gradients were freed by zero_grad before forward;
  // sharded gradients reappear unit by unit in backward.
  std::vector<int64_t> ancestors_gathered(n, 0);
  for (size_t i = 1; i < n; ++i) {
    const auto p = static_cast<size_t>(plan.units[i].parent);
    ancestors_gathered[i] = ancestors_gathered[p] + gathered[p];
  }
  // In pre-order, the unit before j is one of j's ancestors only if it is its parent.
  auto parent_is_previous = [&](size_t j) { return j > 0 && plan.units[j].parent == static_cast<int>(j - 1); };
  const bool keep_after_forward = mem.effective_strategy == ShardingStrategy::ShardGradOp;
  r.peak_bytes = r.steady_bytes;
  r.peak_phase = "optimizer step";
  if (timeline) mem.timeline.reserve(2 * n + 1);
  // Activations live at each point (activations/schedule.h), set before each record().
  std::vector<int> parents;
  std::vector<ModuleId> unit_module;
  for (const auto& u : plan.units) {
    parents.push_back(u.parent);
    unit_module.push_back(u.module);
  }
  ActivationSchedule acts(plan.activations, parents);
  const LateGradients late(*plan.tree, parents, unit_module, view_params);
  int64_t act = 0;
  // One step of the series; the peak is the first step above the steady
  // state. Consecutive points of one phase and unit make one step, holding
  // the largest.
  auto record = [&](const char* phase, size_t unit, int64_t gathered_now, int64_t unsharded_grads,
                    int64_t grads) {
    const int unit_index = unit < n ? static_cast<int>(unit) : -1;
    if (timeline && !mem.timeline.empty() && mem.timeline.back().phase == phase &&
        mem.timeline.back().unit == unit_index) {
      const int64_t total = r.params_bytes + r.optimizer_bytes + r.buffers_bytes + gathered_now + unsharded_grads +
                            grads + act;
      if (total <= mem.timeline.back().total_bytes()) return;  // nor above the peak
      mem.timeline.pop_back();
    }
    MemoryStep s;
    s.phase = phase;
    s.unit = static_cast<int>(unit);
    s.params_bytes = r.params_bytes;
    s.optimizer_bytes = r.optimizer_bytes;
    s.buffers_bytes = r.buffers_bytes;
    s.gathered_bytes = gathered_now;
    s.unsharded_grads_bytes = unsharded_grads;
    s.grads_bytes = grads;
    s.activation_bytes = act;
    const int64_t bytes = s.total_bytes();
    if (timeline) mem.timeline.push_back(std::move(s));
    if (bytes <= r.peak_bytes) return;
    r.peak_bytes = bytes;
    r.peak_phase = phase;
    r.peak_unit = static_cast<int>(unit);
    r.activation_bytes = act;
  };
  // The units that continue between unit j - 1 and unit j (j == n: after
  // the last), innermost first: each unit on the path from j - 1 up to j's
  // parent, the ones that end there included (a block's MLP after its wrapped
  // attention). Forward resumes them in this order, backward in reverse.
  // Pre-order makes it a stack walk: linear, whatever the depth.
  std::vector<std::vector<int>> continuing(n + 1);
  {
    std::vector<int> path;
    for (size_t j = 0; j <= n; ++j) {
      const int parent = j < n ? plan.units[j].parent : -1;
      while (!path.empty() && path.back() != parent) {
        continuing[j].push_back(path.back());
        path.pop_back();
      }
      if (!path.empty()) continuing[j].push_back(path.back());
      if (j < n) path.push_back(static_cast<int>(j));
    }
  }

  // Forward: unit j runs inside its ancestors' forwards, so they are gathered
  // too; the next unit's all-gather may already be in flight (FSDP's rate
  // limiter allows two). SHARD_GRAD_OP keeps every unit gathered after forward.
  // An enclosing unit may run between its children (the root's head and loss
  // after the layers): a point of its own, before unit `next` is gathered.
  int64_t prefix = 0;  // sum of gathered[k] for k < j
  auto resume_forward = [&](int a, int next) {
    if (auto peak = acts.forward_resume(a, next)) {
      act = *peak;
      const size_t k = static_cast<size_t>(a);
      const int64_t live = keep_after_forward ? prefix : ancestors_gathered[k] + gathered[k];
      record("forward", k, live + (next >= 0 ? gathered[static_cast<size_t>(next)] : 0), 0, 0);
      act = acts.held();
    }
  };
  for (size_t j = 0; j < n; ++j) {
    for (int a : continuing[j]) resume_forward(a, static_cast<int>(j));
    const int64_t next = j + 1 < n ? gathered[j + 1] : 0;
    const int64_t live = keep_after_forward ? prefix + gathered[j] : ancestors_gathered[j] + gathered[j];
    act = acts.forward_enter(static_cast<int>(j));
    record("forward", j, live + next, 0, 0);
    act = acts.held();
    prefix += gathered[j];
  }
  for (int a : continuing[n]) resume_forward(a, -1);
  act = acts.after_forward();
  // Backward, in reverse: unit j and its ancestors are gathered (the root was
  // never freed), with BACKWARD_PRE prefetch of the unit before it; their
  // unsharded gradients exist until reduce-scatter; every unit after j has
  // already left its sharded gradient.
  int64_t sharded_grads_done = 0;
  // Gradients of enclosing units' parameters used after unit `after` in the
  // forward (LateGradients): their views' gradients exist from their backward on.
  auto late_after = [&](int unit, int after) { return unit < 0 ? int64_t{0} : late.after(unit, after); };
  // An enclosing unit's backward between its children's (the root's loss and
  // head before the last layer's backward): a point of its own.
  auto resume_backward = [&](int a, int next) {
    if (auto peak = acts.backward_resume(a, next)) {
      act = *peak;
      const size_t k = static_cast<size_t>(a);
      // Unit `next`, whose backward follows, is already gathered: the last
      // pre-backward hook prefetched it (BACKWARD_PRE, _runtime_utils.py:
      // _pre_backward_hook -> _prefetch_handle), the root's own at the start
      // of backward (refs/peak_small.json llama_b2s32/fsdp1/w8: the last
      // layer's parameters beside the loss's backward).
      const int64_t prefetched = !keep_after_forward && next >= 0 && next != a ? gathered[static_cast<size_t>(next)] : 0;
      const int64_t live =
          (keep_after_forward ? prefix + gathered[k] : ancestors_gathered[k] + gathered[k]) + prefetched;
      // The runs' peak counts the gradients they make themselves (ActivationRun::backward_grads),
      // which late_after counts too: they are used after `next`.
      const int64_t made_before = std::max<int64_t>(
          0, late_after(a, next >= 0 ? next : static_cast<int>(n) - 1) - acts.resumed_grads());
      record("backward", k, live, made_before, ignored + sharded_grads_done);
      act = acts.held();
    }
  };
  for (size_t j = n; j-- > 0;) {
    prefix -= gathered[j];  // now the sum for k < j
    // What continued after j in forward runs before it in backward, outermost first.
    const auto& after = continuing[j + 1];
    for (auto it = after.rbegin(); it != after.rend(); ++it) resume_backward(*it, static_cast<int>(j));
    int64_t live;
    if (keep_after_forward) {
      live = prefix + gathered[j];
    } else {
      const bool prefetch = j > 0 && !parent_is_previous(j);
      live = ancestors_gathered[j] + gathered[j] + (prefetch ? gathered[j - 1] : 0);
    }
    // Ignored parameters' gradients are whole and counted from the start of backward.
    const int64_t grads = ignored + sharded_grads_done;
    const int64_t outer = late_after(plan.units[j].parent, static_cast<int>(j));
    // Its backward: the activations' peak, while few of its own parameters' gradients exist yet.
    act = acts.backward_enter(static_cast<int>(j));
    record("backward", j, live, outer, grads);
    act = acts.held();
    // Its end: every view's gradient and the flat gradient concatenated from them
    // (flat_param.py: FlatParamHandle._use_unsharded_views makes the views,
    // autograd's SplitWithSizesBackward the flat gradient).
    record("backward", j, live, outer + view_grads[j] + cat_grad[j], grads);
    // The post-backward hook: the views' gradients freed, the unit's unsharded
    // parameter freed first (_post_backward_reshard): under a sharded
    // strategy the padded unsharded flat parameter; under NO_SHARD the
    // low-precision copy mixed precision made, which is its only gathered
    // bytes (_flat_param.py: FlatParamHandle.post_reshard frees _mp_shard;
    // refs/peak_small.json llama_lora_b1s16/fsdp1/w1/bf16: the bf16 copy is
    // gone when the fp32 gradient is made); then the reduce-scatter's tensors
    // beside the flat gradient.
    record("backward", j, live - gathered[j], outer + cat_grad[j] + post_grad[j], grads);
    sharded_grads_done += grad_sharded[j];
  }
  act = acts.batch();  // the backward freed every saved tensor; the batch stays
  // The optimizer step: the steady state, nothing gathered, and Adam's
  // temporaries (adam_step_temp_bytes).
  int64_t optimizer_temp = 0;
  if (is_adam(settings.optimizer))
    optimizer_temp = adam_step_temp_bytes(optim_params, settings.optimizer_impl.value_or(OptimizerImpl::ForLoop));
  MemoryStep step;
  step.phase = "optimizer step";
  step.params_bytes = r.params_bytes;
  step.optimizer_bytes = r.optimizer_bytes + optimizer_temp;
  step.buffers_bytes = r.buffers_bytes;
  step.grads_bytes = r.grads_bytes;
  step.activation_bytes = act;
  if (step.total_bytes() > r.peak_bytes) {
    r.peak_bytes = step.total_bytes();
    r.peak_phase = "optimizer step";
    r.peak_unit = -1;
    r.activation_bytes = act;
  }
  if (timeline) mem.timeline.push_back(std::move(step));
  if (r.peak_unit >= 0) {
    const size_t j = static_cast<size_t>(r.peak_unit);
    std::vector<bool> ancestor(n, false);
    for (int cur = plan.units[j].parent; cur >= 0; cur = plan.units[static_cast<size_t>(cur)].parent)
      ancestor[static_cast<size_t>(cur)] = true;
    for (size_t k = 0; k < n; ++k) {
      bool live = k == j || ancestor[k] ||
                  (keep_after_forward && k < j) ||
                  (r.peak_phase == "forward" && k == j + 1) ||
                  (r.peak_phase == "backward" && !keep_after_forward && k + 1 == j);
      if (live && gathered[k] > 0) r.peak_gathered.push_back(static_cast<int>(k));
    }
  }
  if (kept_low_grads && is_adam(settings.optimizer))
    mem.notes.push_back("keep_low_precision_grads: torch.optim.Adam and AdamW raise on low-precision gradients of "
                        "full-precision parameters (\"expected dtype float for `end`\"); the optimizer figures assume "
                        "one that accepts them and keeps its state in the parameters' dtype");
  mem.notes.push_back(activation_note(plan.activations));
  mem.notes.push_back("module order stands for execution order, as FSDP assumes before its first step");
  return mem;
}

}  // namespace fsdp_plan
