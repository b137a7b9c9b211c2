#include "fsdp2/comm.h"

#include "fsdp2/memory.h"
#include "model/dtype.h"
#include "plan/plan.h"

namespace fsdp_plan {

CommPlan fsdp2_comm(const Plan& plan) {
  const ModuleTree& tree = *plan.tree;
  const FsdpSettings& s = plan.memory.settings;
  // A 2-D / 3-D mesh: fully_shard on the dp sub-mesh, whose groups stride over
  // the tp ranks (init_device_mesh's row-major layout puts tp innermost).
  const TensorParallelPlan* tp = plan.tensor_parallel ? &*plan.tensor_parallel : nullptr;
  const RankGroup shard_group = plan.mesh.group(MeshDim::DpShard);
  const RankGroup replicate_group = plan.mesh.group(MeshDim::DpReplicate);
  const int64_t S = shard_group.size;
  const auto& mp = plan.policy.mixed_precision;
  const size_t n = plan.units.size();

  CommPlan comm;
  comm.computed = true;
  struct GroupComms {
    bool gathers = false, reduces = false, all_reduces = false;
    Collective gather, reduce, all_reduce;
    RankGroup backward_group;
  };
  std::vector<GroupComms> per(n);
  std::vector<bool> regathered(n, false);
  std::vector<int> parent(n);
  comm.units.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Unit& u = plan.units[i];
    parent[i] = u.parent;
    if (u.params.empty()) continue;  // no FSDPParamGroup
    GroupComms& g = per[i];
    int64_t gathered = 0, gathered_numel = 0, sharded_bytes = 0, reduced = 0, reduced_numel = 0, grad_bytes = 0;
    std::string gather_dtype, reduce_dtype;
    bool mixed = false, trainable = false;
    for (const auto& o : u.params) {
      const TensorInfo& t = tree.tensor(o.tensor);
      int64_t d0 = tree.dim0(o.tensor), numel = tree.numel(o.tensor);
      if (tp) {  // FSDPParam._init_sharding_spec_tp: the TP-local tensor is what FSDP shards
        const auto& local = tp->local_shape[static_cast<size_t>(o.tensor)];
        numel = 1;
        for (int64_t d : local) numel *= d;
        d0 = local.empty() ? 1 : local[0];
      }
      // _init_sharded_param: ceil(d0 / S) rows on every rank, padded.
      const int64_t padded = d0 == 0 ? 0 : ceil_div(d0, S) * (numel / d0);
      // MixedPrecisionPolicy.param_dtype applies to floating parameters of another dtype.
      std::string pe = t.dtype;
      if (mp && mp->param_dtype && dtype_itemsize(t.dtype) > 0 && *mp->param_dtype != t.dtype) pe = *mp->param_dtype;
      const int64_t pe_size = pe == t.dtype ? t.itemsize : dtype_itemsize(pe);
      if (!gather_dtype.empty() && gather_dtype != pe) mixed = true;
      gather_dtype = pe;
      gathered += padded * pe_size;
      gathered_numel += padded;
      sharded_bytes += padded * t.itemsize;
      if (!t.requires_grad) continue;
      // foreach_reduce: only parameters with a gradient, in reduce_dtype
      // (default: the gradient's, i.e. param_dtype).
      trainable = true;
      reduce_dtype = mp && mp->reduce_dtype ? *mp->reduce_dtype : pe;
      const int64_t rd_size = mp && mp->reduce_dtype ? dtype_itemsize(*mp->reduce_dtype) : pe_size;
      reduced += padded * rd_size;
      reduced_numel += padded;
      comm.units[i].trainable_shard_numel += padded;
      grad_bytes += padded * t.itemsize;
    }
    // _get_all_gather_input_metadatas: inputs of different dtypes go as bytes.
    if (mixed) {
      gather_dtype = "uint8";
      gathered_numel = gathered;
    }
    const int idx = static_cast<int>(i);
    const int64_t offload_in = s.cpu_offload ? sharded_bytes : 0;
    // FSDPParamGroup.unshard: a 1-rank shard group gathers nothing.
    if (S > 1) {
      g.gathers = true;
      g.gather = {CollectiveKind::AllGather, StepPhase::Forward, idx, gathered_numel * S, gathered * S,
                  gather_dtype, shard_group, "unshard", offload_in};
      // reshard_after_forward (the root's None is False): True gathers again
      // over the shard group, k < S over k ranks (_fsdp_param_group.py
      // post_forward_mesh_info); k = 1 keeps the whole, like False.
      const ReshardAfterForward raf = u.reshard_after_forward.value_or(ReshardAfterForward{});
      if (raf.kind == ReshardAfterForward::Kind::True ||
          (raf.kind == ReshardAfterForward::Kind::Ranks && raf.ranks > 1)) {
        regathered[i] = true;
        g.backward_group = RankGroup{raf.kind == ReshardAfterForward::Kind::Ranks && raf.ranks < S ? raf.ranks : S,
                                      shard_group.stride};
      }
    }
    if (!trainable) continue;  // foreach_reduce returns before any collective
    const int64_t offload_out = s.cpu_offload ? grad_bytes : 0;
    if (S > 1) {
      g.reduces = true;
      g.reduce = {CollectiveKind::ReduceScatter, StepPhase::Backward, idx, reduced_numel * S, reduced * S,
                  reduce_dtype, shard_group, "reduce", replicate_group.size > 1 ? 0 : offload_out};
    }
    // HSDP: the reduce-scatter's output (or, on a 1-rank shard group, the
    // whole gradient) all-reduced over the replicate group.
    if (replicate_group.size > 1) {
      g.all_reduces = true;
      g.all_reduce = {CollectiveKind::AllReduce, StepPhase::Backward, idx, reduced_numel, reduced,
                      reduce_dtype, replicate_group, "reduce", offload_out};
    }
  }
  size_t calls = 0;  // gathers (twice when regathered), reduce-scatters, HSDP's all-reduces
  for (size_t i = 0; i < n; ++i)
    calls += static_cast<size_t>((per[i].gathers ? 1 + regathered[i] : 0) + per[i].reduces + per[i].all_reduces);
  comm.collectives.reserve(calls);
  // Forward: each group's pre-forward unshards it, in forward order.
  for (size_t i = 0; i < n; ++i)
    if (per[i].gathers) comm.collectives.push_back(per[i].gather);
  backward_hook_order(
      parent, regathered,
      [&](size_t i, const char* cause) {
        Collective c = per[i].gather;
        c.phase = StepPhase::Backward;
        c.cause = cause;
        c.group = per[i].backward_group;
        comm.collectives.push_back(c);
      },
      [&](size_t i) {
        if (per[i].reduces) comm.collectives.push_back(per[i].reduce);
        if (per[i].all_reduces) comm.collectives.push_back(per[i].all_reduce);
      });
  summarize_comm(comm, n);
  comm.notes.push_back("FSDP2: implicit forward prefetch, one group prefetched in backward (the defaults); module "
                       "order stands for execution order");
  return comm;
}

}  // namespace fsdp_plan
