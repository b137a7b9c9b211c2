#include "fsdp2/comm.h"

#include "fsdp2/memory.h"
#include "model/dtype.h"
#include "plan/plan.h"
#include "plan/unused_params.h"

namespace fsdp_plan {
namespace {

// The process groups FSDP2's collectives run on: the plan's mesh's dp_shard
// and dp_replicate groups (mesh/device_mesh.h). On a 2-D / 3-D mesh fully_shard
// runs on the dp sub-mesh, whose groups stride over the tp ranks
// (init_device_mesh's row-major layout puts tp innermost).
struct Fsdp2CommGroups {
  RankGroup shard, replicate;
};

// Which of a unit's parameters an FSDPParamGroup holds: with expert
// parallelism one fully_shard call makes one group per process group
// (_fsdp_init.py _init_param_group): the dense parameters on dp_shard, the
// routed experts on efsdp.
enum class ParamSet { All, Dense, Experts };

// What one FSDPParamGroup gathers and reduces, summed over its parameters.
struct Fsdp2GroupSizes {
  int64_t gathered = 0, gathered_numel = 0, sharded_bytes = 0, reduced = 0, reduced_numel = 0, grad_bytes = 0;
  std::string gather_dtype, reduce_dtype;
  bool trainable = false;
};

// A parameter's numel and the size of the dim fully_shard shards, as FSDP sees
// it: TP-local (FSDPParam._init_sharding_spec_tp: the TP-local tensor is what
// FSDP shards), or EP-local on its placement's dim (torchtitan: Shard(1) for
// fused experts where efsdp x ep > num_experts).
void fsdp_local_size(const Plan& plan, TensorId t, int64_t& numel, int64_t& dim) {
  const ModuleTree& tree = *plan.tree;
  numel = tree.numel(t);
  dim = tree.dim0(t);
  const std::vector<int64_t>* local = nullptr;
  int shard_dim = 0;
  if (plan.tensor_parallel) local = &plan.tensor_parallel->local_shape[static_cast<size_t>(t)];
  if (plan.expert_parallel && plan.expert_parallel->is_expert(t)) {
    const ExpertParallelPlan& ep = *plan.expert_parallel;
    local = &ep.local_shape[static_cast<size_t>(t)];
    shard_dim = ep.modules[static_cast<size_t>(ep.expert_of[static_cast<size_t>(t)])].shard_dim;
  }
  if (!local) return;
  numel = 1;
  for (int64_t d : *local) numel *= d;
  dim = local->empty() ? 1 : (*local)[static_cast<size_t>(shard_dim)];
}

// The padded shards unit u's group gathers (in param_dtype) and reduces (in
// reduce_dtype, the trainable parameters only).
Fsdp2GroupSizes fsdp2_group_sizes(const Plan& plan, const Unit& u, int64_t S, ParamSet set) {
  const ModuleTree& tree = *plan.tree;
  const auto& mp = plan.policy.mixed_precision;
  Fsdp2GroupSizes z;
  bool mixed = false;
  for (const auto& o : u.params) {
    if (set != ParamSet::All && plan.expert_parallel->is_expert(o.tensor) != (set == ParamSet::Experts)) continue;
    const TensorInfo& t = tree.tensor(o.tensor);
    int64_t d0 = 0, numel = 0;
    fsdp_local_size(plan, o.tensor, numel, d0);
    // _init_sharded_param: ceil(d0 / S) rows on every rank, padded.
    const int64_t padded = d0 == 0 ? 0 : ceil_div(d0, S) * (numel / d0);
    // MixedPrecisionPolicy.param_dtype applies to floating parameters of another dtype.
    std::string pe = t.dtype;
    if (mp && mp->param_dtype && dtype_itemsize(t.dtype) > 0 && *mp->param_dtype != t.dtype) pe = *mp->param_dtype;
    const int64_t pe_size = pe == t.dtype ? t.itemsize : dtype_itemsize(pe);
    if (!z.gather_dtype.empty() && z.gather_dtype != pe) mixed = true;
    z.gather_dtype = pe;
    z.gathered += padded * pe_size;
    z.gathered_numel += padded;
    z.sharded_bytes += padded * t.itemsize;
    if (!receives_gradient(plan, o.tensor)) continue;
    // foreach_reduce: only parameters with a gradient, in reduce_dtype
    // (default: the gradient's, i.e. param_dtype).
    z.trainable = true;
    z.reduce_dtype = mp && mp->reduce_dtype ? *mp->reduce_dtype : pe;
    const int64_t rd_size = mp && mp->reduce_dtype ? dtype_itemsize(*mp->reduce_dtype) : pe_size;
    z.reduced += padded * rd_size;
    z.reduced_numel += padded;
    z.grad_bytes += padded * t.itemsize;
  }
  // _get_all_gather_input_metadatas: inputs of different dtypes go as bytes.
  if (mixed) {
    z.gather_dtype = "uint8";
    z.gathered_numel = z.gathered;
  }
  return z;
}

// One FSDPParamGroup's collectives: its unshard (and the regather in
// backward), its reduce-scatter and HSDP's all-reduce.
struct Fsdp2GroupComms {
  bool gathers = false, reduces = false, all_reduces = false, regathered = false;
  Collective gather, reduce, all_reduce;
  RankGroup backward_group;
};

Fsdp2GroupComms fsdp2_group_comms(const Unit& u, int idx, const Fsdp2GroupSizes& z, const Fsdp2CommGroups& groups,
                                  bool cpu_offload) {
  const int64_t S = groups.shard.size;
  Fsdp2GroupComms g;
  const int64_t offload_in = cpu_offload ? z.sharded_bytes : 0;
  // FSDPParamGroup.unshard: a 1-rank shard group gathers nothing.
  if (S > 1) {
    g.gathers = true;
    g.gather = {CollectiveKind::AllGather, StepPhase::Forward, idx, z.gathered_numel * S, z.gathered * S,
                z.gather_dtype, groups.shard, "unshard", offload_in};
    // reshard_after_forward (the root's None is False): True gathers again
    // over the shard group, k < S over k ranks (_fsdp_param_group.py
    // post_forward_mesh_info); k = 1 keeps the whole, like False.
    const ReshardAfterForward raf = u.reshard_after_forward.value_or(ReshardAfterForward{});
    if (raf.kind == ReshardAfterForward::Kind::True ||
        (raf.kind == ReshardAfterForward::Kind::Ranks && raf.ranks > 1)) {
      g.regathered = true;
      g.backward_group = RankGroup{raf.kind == ReshardAfterForward::Kind::Ranks && raf.ranks < S ? raf.ranks : S,
                                   groups.shard.stride};
    }
  }
  if (!z.trainable) return g;  // foreach_reduce returns before any collective
  const int64_t offload_out = cpu_offload ? z.grad_bytes : 0;
  if (S > 1) {
    g.reduces = true;
    g.reduce = {CollectiveKind::ReduceScatter, StepPhase::Backward, idx, z.reduced_numel * S, z.reduced * S,
                z.reduce_dtype, groups.shard, "reduce", groups.replicate.size > 1 ? 0 : offload_out};
  }
  // HSDP: the reduce-scatter's output (or, on a 1-rank shard group, the
  // whole gradient) all-reduced over the replicate group.
  if (groups.replicate.size > 1) {
    g.all_reduces = true;
    g.all_reduce = {CollectiveKind::AllReduce, StepPhase::Backward, idx, z.reduced_numel, z.reduced,
                    z.reduce_dtype, groups.replicate, "reduce", offload_out};
  }
  return g;
}

// The collectives in issue order: forward, each unit's pre-forward unshards
// its groups, in forward order; backward, as the hooks run
// (backward_hook_order). A unit's groups act in the order fully_shard made
// them (its first parameter's group first).
void issue_fsdp2_collectives(const std::vector<std::vector<Fsdp2GroupComms>>& per, const std::vector<int>& parent,
                             CommPlan& comm) {
  const size_t n = per.size();
  std::vector<bool> regathered(n, false);
  size_t calls = 0;  // gathers (twice when regathered), reduce-scatters, HSDP's all-reduces
  for (size_t i = 0; i < n; ++i)
    for (const Fsdp2GroupComms& g : per[i]) {
      regathered[i] = regathered[i] || g.regathered;
      calls += static_cast<size_t>((g.gathers ? 1 + g.regathered : 0) + g.reduces + g.all_reduces);
    }
  comm.collectives.reserve(calls);
  for (size_t i = 0; i < n; ++i)
    for (const Fsdp2GroupComms& g : per[i])
      if (g.gathers) comm.collectives.push_back(g.gather);
  backward_hook_order(
      parent, regathered,
      [&](size_t i, const char* cause) {
        for (const Fsdp2GroupComms& g : per[i]) {
          if (!g.regathered) continue;
          Collective c = g.gather;
          c.phase = StepPhase::Backward;
          c.cause = cause;
          c.group = g.backward_group;
          comm.collectives.push_back(c);
        }
      },
      [&](size_t i) {
        for (const Fsdp2GroupComms& g : per[i]) {
          if (g.reduces) comm.collectives.push_back(g.reduce);
          if (g.all_reduces) comm.collectives.push_back(g.all_reduce);
        }
      });
}

// Unit u's FSDPParamGroups: one, or with expert parallelism the dense one and the experts' on efsdp.
std::vector<Fsdp2GroupComms> unit_groups(const Plan& plan, const Unit& u, int idx, const Fsdp2CommGroups& dense,
                                         Fsdp2CommGroups experts, UnitComm& uc) {
  std::vector<ParamSet> sets{ParamSet::All};
  if (plan.expert_parallel) {
    bool any_expert = false, any_dense = false;
    for (const auto& o : u.params) (plan.expert_parallel->is_expert(o.tensor) ? any_expert : any_dense) = true;
    sets.clear();
    if (any_dense) sets.push_back(ParamSet::Dense);
    if (any_expert) sets.push_back(ParamSet::Experts);
    // The unit's first parameter's group first (pg_to_group keeps insertion order).
    if (sets.size() == 2 && plan.expert_parallel->is_expert(u.params.front().tensor)) std::swap(sets[0], sets[1]);
  }
  std::vector<Fsdp2GroupComms> out;
  for (ParamSet set : sets) {
    const Fsdp2CommGroups& groups = set == ParamSet::Experts ? experts : dense;
    const Fsdp2GroupSizes z = fsdp2_group_sizes(plan, u, groups.shard.size, set);
    uc.trainable_shard_numel += z.reduced_numel;
    out.push_back(fsdp2_group_comms(u, idx, z, groups, plan.memory.settings.cpu_offload));
  }
  return out;
}

}  // namespace

CommPlan fsdp2_comm(const Plan& plan) {
  const Fsdp2CommGroups groups{plan.mesh.fsdp_shard_group(), plan.mesh.group(MeshDim::DpReplicate)};
  // torchtitan's edp mesh: (dp_replicate, efsdp); its replicate group is the dense one's.
  const Fsdp2CommGroups experts = plan.mesh.expert_parallel()
                                      ? Fsdp2CommGroups{plan.mesh.group(MeshDim::Efsdp), groups.replicate}
                                      : groups;
  const size_t n = plan.units.size();
  CommPlan comm;
  comm.computed = true;
  comm.units.resize(n);
  std::vector<std::vector<Fsdp2GroupComms>> per(n);
  std::vector<int> parent(n);
  for (size_t i = 0; i < n; ++i) {
    const Unit& u = plan.units[i];
    parent[i] = u.parent;
    if (u.params.empty()) continue;  // no FSDPParamGroup
    per[i] = unit_groups(plan, u, static_cast<int>(i), groups, experts, comm.units[i]);
  }
  issue_fsdp2_collectives(per, parent, comm);
  summarize_comm(comm, n);
  comm.notes.push_back("FSDP2: implicit forward prefetch, one group prefetched in backward (the defaults); module "
                       "order stands for execution order");
  return comm;
}

}  // namespace fsdp_plan
