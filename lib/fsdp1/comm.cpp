#include "fsdp1/comm.h"

#include "mesh/device_mesh.h"
#include "model/dtype.h"
#include "plan/plan.h"

namespace fsdp_plan {
namespace {

// The unit's parameter dtype: FSDP1 flattens one dtype per flat parameter
// (the largest stands for all when a model mixes them, as the memory model does).
const TensorInfo* widest_param(const Plan& plan, const Unit& u) {
  const TensorInfo* out = nullptr;
  for (const auto& o : u.params) {
    const TensorInfo& t = plan.tree->tensor(o.tensor);
    if (!out || t.itemsize > out->itemsize) out = &t;
  }
  return out;
}

}  // namespace

CommPlan fsdp1_comm(const Plan& plan) {
  const MemoryPlan& mem = plan.memory;
  const ShardingStrategy strategy = mem.effective_strategy;
  const bool sharded = strategy != ShardingStrategy::NoShard;
  const int64_t S = mem.shard_group_size;
  const RankGroup shard_group = plan.mesh.group(MeshDim::DpShard);   // HYBRID_SHARD's _intra_node_pg
  const RankGroup replicas = plan.mesh.group(MeshDim::DpReplicate);  // HYBRID_SHARD's _inter_node_pg
  const RankGroup world = plan.mesh.group({MeshDim::DpReplicate, MeshDim::DpShard});  // NO_SHARD's
  const auto& mp = plan.policy.mixed_precision;
  const size_t n = plan.units.size();

  CommPlan comm;
  comm.computed = true;
  struct UnitComms {
    bool any = false;
    Collective gather, reduce, all_reduce;
    bool reduces = false, hybrid = false;
  };
  std::vector<UnitComms> per(n);
  std::vector<bool> regathered(n, false);
  std::vector<int> parent(n);
  for (size_t i = 0; i < n; ++i) {
    const Unit& u = plan.units[i];
    const UnitMemory& um = mem.units[i];
    parent[i] = u.parent;
    const TensorInfo* t = widest_param(plan, u);
    if (!t || um.flat_numel == 0) continue;  // no FlatParamHandle: nothing to communicate
    UnitComms& c = per[i];
    c.any = true;
    const bool mp_on = u.mixed_precision.value_or(false) && mp;
    // _use_low_precision_shard: the shard is cast to param_dtype before the all-gather.
    std::string gather_dtype = t->dtype;
    if (mp_on && mp->param_dtype && um.compute_itemsize != t->itemsize) gather_dtype = *mp->param_dtype;
    // _post_backward_hook casts the gradient to reduce_dtype (param_dtype when
    // reduce_dtype is None) before reducing it.
    std::string reduce_dtype = t->dtype;
    if (mp_on && mp->reduce_dtype)
      reduce_dtype = *mp->reduce_dtype;
    else if (mp_on && mp->param_dtype)
      reduce_dtype = *mp->param_dtype;
    const int64_t reduce_itemsize = dtype_itemsize(reduce_dtype) > 0 ? dtype_itemsize(reduce_dtype) : t->itemsize;
    const int64_t padded = um.sharded_numel * S;  // W * ceil(N / W)
    if (sharded) {
      // _all_gather_flat_param: this rank's padded shard in, the padded flat parameter out.
      c.gather = {CollectiveKind::AllGather, StepPhase::Forward, static_cast<int>(i), padded,
                  padded * um.compute_itemsize, gather_dtype, shard_group, "unshard", 0};
      // _post_forward_reshard: FULL_SHARD / HYBRID_SHARD units other than the
      // root reshard after forward and gather again in backward.
      regathered[i] = i != 0 && (strategy == ShardingStrategy::FullShard || strategy == ShardingStrategy::HybridShard);
    }
    // A flat parameter that needs no gradient registers no post-backward hook
    // (_register_post_backward_hook): no reduction at all.
    if (u.trainable_numel == 0) continue;
    c.reduces = true;
    if (sharded) {
      // _reduce_grad: the padded flat gradient reduce-scattered to one padded shard;
      // HYBRID_SHARD then all-reduces that shard over the replicas.
      c.reduce = {CollectiveKind::ReduceScatter, StepPhase::Backward, static_cast<int>(i), padded,
                  padded * reduce_itemsize, reduce_dtype, shard_group, "reduce", 0};
      if (strategy == ShardingStrategy::HybridShard) {
        c.hybrid = true;
        c.all_reduce = {CollectiveKind::AllReduce, StepPhase::Backward, static_cast<int>(i), um.sharded_numel,
                        um.sharded_numel * reduce_itemsize, reduce_dtype, replicas, "reduce", 0};
      }
    } else {
      // _reduce_grad_no_shard: the whole flat gradient, no padding for sharding.
      c.reduce = {CollectiveKind::AllReduce, StepPhase::Backward, static_cast<int>(i), um.flat_numel,
                  um.flat_numel * reduce_itemsize, reduce_dtype, world, "reduce", 0};
    }
  }
  size_t calls = 0;  // gathers (twice when regathered), reductions, HSDP's all-reduces
  for (size_t i = 0; i < n; ++i)
    calls += static_cast<size_t>((per[i].any && sharded ? 1 + regathered[i] : 0) + per[i].reduces + per[i].hybrid);
  comm.collectives.reserve(calls);
  // Forward: each unit's pre-forward unshards it, in forward (module) order.
  for (size_t i = 0; i < n; ++i)
    if (per[i].any && sharded) comm.collectives.push_back(per[i].gather);
  backward_hook_order(
      parent, regathered,
      [&](size_t i, const char* cause) {
        Collective c = per[i].gather;
        c.phase = StepPhase::Backward;
        c.cause = cause;
        comm.collectives.push_back(c);
      },
      [&](size_t i) {
        if (!per[i].reduces) return;
        comm.collectives.push_back(per[i].reduce);
        if (per[i].hybrid) comm.collectives.push_back(per[i].all_reduce);
      });
  summarize_comm(comm, n);
  for (size_t i = 0; i < n; ++i)
    comm.units[i].trainable_shard_numel = plan.units[i].trainable_numel > 0 ? mem.units[i].sharded_numel : 0;
  comm.notes.push_back("FSDP1 with backward_prefetch=BACKWARD_PRE (the default); module order stands for "
                       "execution order");
  return comm;
}

}  // namespace fsdp_plan
