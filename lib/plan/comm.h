// What one training step communicates, per rank (rank 0), per FSDP unit:
// every all-gather, reduce-scatter and all-reduce FSDP issues, in the order
// it issues them. Filled by fsdp1/comm.h or fsdp2/comm.h after the memory
// model; read by the step-time model (time/) and the writers.
// tests/timing/COMM.md says what each collective carries, counted on torch 2.13.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mesh/device_mesh.h"

namespace fsdp_plan {

enum class CollectiveKind { AllGather, ReduceScatter, AllReduce, AllToAll };
enum class StepPhase { Forward, Backward };

// "all_gather", "reduce_scatter", "all_reduce", "all_to_all" (the names nccl-tests and the oracle use).
const char* collective_name(CollectiveKind kind);
const char* phase_name(StepPhase phase);

struct Collective {
  CollectiveKind kind = CollectiveKind::AllGather;
  StepPhase phase = StepPhase::Forward;
  int unit = -1;         // index into Plan::units
  // The message as nccl-tests sizes it: the unsharded buffer (an all-gather's
  // output, a reduce-scatter's input, an all-reduce's tensor), padding included.
  int64_t numel = 0;
  int64_t bytes = 0;
  std::string dtype;     // what it carries; "uint8" when FSDP2 gathers mixed dtypes as bytes
  RankGroup group;       // made by the plan's DeviceMesh (mesh/device_mesh.h)
  // Why FSDP issues it: "unshard" (the unit's own pre-forward / pre-backward),
  // "prefetch" (the backward prefetch of the unit that runs before it), "reduce".
  const char* cause = "unshard";
  // CPU offload: the host-to-device copy of the sharded parameters before an
  // all-gather, the device-to-host copy of the sharded gradient after the
  // reduction; bytes in the parameters' own dtype.
  int64_t host_copy_bytes = 0;
  // An all-to-all whose whole buffer goes to one peer (functional
  // collectives' permute_tensor: context parallelism's ring), not (n-1)/n of it.
  bool permute = false;
  // An all-to-all's output on this rank, where it is not `bytes` (expert
  // parallelism's busiest rank under skewed routing); 0: the same. Its time
  // is the larger's.
  int64_t recv_bytes = 0;
  // Tensor parallelism's collectives only (CommPlan::tp): the module whose
  // input or output DTensor redistributes (for "param_grad", the module
  // backward entered last in the unit); -1 for FSDP's.
  int module = -1;
};

// A unit's collectives per step, summed by kind and phase.
struct UnitComm {
  int64_t all_gather_forward_bytes = 0;
  int64_t all_gather_backward_bytes = 0;
  int64_t reduce_scatter_bytes = 0;
  int64_t all_reduce_bytes = 0;
  int64_t host_to_device_bytes = 0;
  int64_t device_to_host_bytes = 0;
  int calls = 0;
  // Not communication, but version-specific like it: the trainable elements
  // of this rank's shard the optimizer steps (padded, as FSDP allocates them;
  // FSDP1 the whole flat shard when any parameter trains).
  int64_t trainable_shard_numel = 0;
  int64_t total_bytes() const {
    return all_gather_forward_bytes + all_gather_backward_bytes + reduce_scatter_bytes + all_reduce_bytes;
  }
};

// Tensor parallelism's collectives of one step (tp/comm.h): the activations'
// redistributions at the styled modules' inputs and outputs, on the tp group.
// Their sizes follow from activation shapes, known only from a .pt2 graph.
struct TpComm {
  bool planned = false;      // the plan has a tensor_parallel section
  bool sizes_known = false;  // with the graph: `collectives` is the step's
  std::string unknown_reason;
  RankGroup group;                       // the tp group (contiguous ranks)
  std::vector<Collective> collectives;   // in issue order; cause "output", "input", "input_grad", "output_grad",
                                         // "recompute" (activation checkpointing's forward again),
                                         // "param_grad" (a Partial parameter gradient made Replicate)
  std::vector<std::string> not_modelled;  // styled modules whose activations' collectives are not counted
};

// Expert parallelism's all-to-alls of one step (ep/comm.h): per MoE layer,
// the dispatch and combine in forward, their gradients' in backward, and the
// forward's again where full checkpointing recomputes the layer; on the ep group.
struct EpComm {
  bool planned = false;      // the plan has an expert_parallel section
  bool sizes_known = false;  // every expert module's rows are known (the graph, or top_k)
  std::string unknown_reason;
  RankGroup group;                      // the ep group (contiguous ranks)
  std::vector<Collective> collectives;  // in issue order; cause "dispatch", "combine" (forward and recompute,
                                        // cause "recompute_dispatch" / "recompute_combine"), "dispatch_grad",
                                        // "combine_grad"; module: the experts' module
};

// Context parallelism's collectives of one step (cp/comm.h): per attention
// call, the ring's K/V exchange in forward, again in backward with the
// gradients' ring, and the forward's again where full checkpointing
// recomputes the call; on the cp group.
struct CpComm {
  bool planned = false;  // the plan has a context_parallel section
  RankGroup group;       // the cp group
  std::vector<Collective> collectives;  // in issue order; cause "kv" (forward), "recompute_kv", "backward_kv",
                                        // "dkv" (the gradients' ring); module: the attention call's
};

struct CommPlan {
  bool computed = false;
  std::vector<Collective> collectives;  // in issue order
  std::vector<UnitComm> units;          // parallel to Plan::units
  std::vector<std::string> notes;       // what the counts assume
  TpComm tp;
  EpComm ep;
  CpComm cp;
};

// Fills `comm.units`' byte counts from `comm.collectives` (their
// trainable_shard_numel is the caller's).
void summarize_comm(CommPlan& comm, size_t num_units);

// The order of FSDP's backward hooks, the same in FSDP1 (BACKWARD_PRE) and
// FSDP2: pre-backward hooks in reverse post-forward order, each unsharding its
// unit if it was resharded and not prefetched, then prefetching the unit that
// finished forward just before it (FSDP1 _exec_order_utils.py
// get_handle_to_backward_prefetch, FSDP2 _fsdp_param_group.py
// _backward_prefetch: both index the post-forward order); a unit's
// post-backward (its reduction) when backward leaves its subtree.
// `parent[i]`: the enclosing unit of unit i (units in pre-order, -1 for the root).
// Calls unshard(i, cause) and reduce(i) in issue order.
template <class Unshard, class Reduce>
void backward_hook_order(const std::vector<int>& parent, const std::vector<bool>& regathered, Unshard unshard,
                         Reduce reduce);

// ---------------------------------------------------------------- inline

template <class Unshard, class Reduce>
void backward_hook_order(const std::vector<int>& parent, const std::vector<bool>& regathered, Unshard unshard,
                         Reduce reduce) {
  const size_t n = parent.size();
  auto is_ancestor = [&](size_t a, size_t j) {
    for (int p = parent[j]; p >= 0; p = parent[static_cast<size_t>(p)])
      if (static_cast<size_t>(p) == a) return true;
    return false;
  };
  // Post-order: a unit's post-forward runs when forward leaves its subtree.
  std::vector<size_t> post, stack;
  post.reserve(n);
  for (size_t j = 0; j < n; ++j) {
    while (!stack.empty() && !is_ancestor(stack.back(), j)) {
      post.push_back(stack.back());
      stack.pop_back();
    }
    stack.push_back(j);
  }
  for (; !stack.empty(); stack.pop_back()) post.push_back(stack.back());
  std::vector<bool> gathered(n, false);
  for (size_t k = post.size(); k-- > 0;) {
    const size_t j = post[k];
    for (; !stack.empty() && !is_ancestor(stack.back(), j); stack.pop_back()) reduce(stack.back());
    if (regathered[j] && !gathered[j]) unshard(j, "unshard");
    gathered[j] = true;
    if (k > 0) {
      const size_t target = post[k - 1];
      if (regathered[target] && !gathered[target]) {
        unshard(target, "prefetch");
        gathered[target] = true;
      }
    }
    stack.push_back(j);
  }
  for (; !stack.empty(); stack.pop_back()) reduce(stack.back());
}

}  // namespace fsdp_plan
