// Per-rank memory of a plan under FSDP's rules: flat parameters padded for
// sharding, gathered units in the order FSDP gathers and frees them, sharded
// gradients and optimizer state. docs/memory-model.md gives every formula and
// the FSDP behaviour it follows. Activations are out of scope.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp_plan {

struct Plan;

enum class ShardingStrategy { FullShard, ShardGradOp, NoShard, HybridShard };
enum class Optimizer { Adam, Sgd, SgdMomentum, None };

const char* strategy_name(ShardingStrategy s);
std::optional<ShardingStrategy> parse_strategy(const std::string& name);
const char* optimizer_name(Optimizer o);
std::optional<Optimizer> parse_optimizer(const std::string& name);
// Bytes per element of a floating dtype name ("bfloat16" -> 2); 0 if unknown.
int64_t dtype_itemsize(const std::string& dtype);
// Full-size optimizer states per trainable element: Adam's exp_avg and
// exp_avg_sq, SGD's momentum buffer. (Adam's 0-dim step is not counted here.)
int optimizer_states(Optimizer o);
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// torch.is_floating_point by dtype name: float16/32/64, bfloat16, the float8 kinds.
bool is_floating_dtype(const std::string& dtype);

// Far beyond any real job; keeps every byte count well inside int64.
constexpr int64_t kMaxWorldSize = int64_t{1} << 24;

// fully_shard's reshard_after_forward: true, false, or an int k (reshard to
// k ranks after forward; k must divide the shard size).
struct ReshardAfterForward {
  enum class Kind { True, False, Ranks };
  Kind kind = Kind::True;
  int64_t ranks = 0;  // Kind::Ranks only
  bool operator==(const ReshardAfterForward& o) const { return kind == o.kind && ranks == o.ranks; }
};

struct MemorySettings {
  int fsdp_version = 1;  // 1: FullyShardedDataParallel, 2: fully_shard (policy "fsdp.version")
  int64_t world_size = 1;
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  int64_t shard_group_size = 0;  // HYBRID_SHARD only; 0: one node, see hybrid_group_size
  bool use_orig_params = false;
  Optimizer optimizer = Optimizer::Adam;
  // FSDP2 only: the default for non-root calls (the root's is None -> False),
  // and CPUOffloadPolicy.
  ReshardAfterForward reshard_after_forward;
  bool cpu_offload = false;
};

struct UnitMemory {
  int64_t flat_numel = 0;     // the flat parameter, alignment padding included
  int64_t sharded_numel = 0;  // per rank: ceil(flat_numel / shard group size)
  int64_t sharded_bytes = 0;  // in the parameters' own dtype
  int64_t unsharded_bytes = 0;  // gathered, padded, in the dtype it is gathered in
  int64_t compute_itemsize = 0;
};

struct RankMemory {
  int64_t params_bytes = 0;     // sharded flat parameters + ignored parameters
  int64_t grads_bytes = 0;      // sharded gradients (+ ignored parameters' gradients)
  int64_t optimizer_bytes = 0;  // optimizer state of what this rank holds
  int64_t buffers_bytes = 0;    // buffers are replicated, never sharded
  int64_t steady_bytes = 0;
  int64_t peak_bytes = 0;
  std::string peak_phase;  // "forward", "backward" or "optimizer step"
  int peak_unit = -1;      // the unit being computed at the peak
  std::vector<int> peak_gathered;  // units gathered at the peak
  // FSDP2: the device bytes at the peak by category (sharded_params,
  // unsharded_params, all_gather, reduce_scatter, sharded_grads,
  // unsharded_grads, optimizer_state, buffers), and with CPU offload what
  // lives on the host (sharded parameters, gradients, optimizer state).
  std::vector<std::pair<std::string, int64_t>> peak_categories;
  int64_t host_bytes = 0;
};

// What a rank holds at one point of a training step: while `unit` runs its
// forward or backward, or in the optimizer step (unit -1). The series walks
// forward unit by unit, backward in reverse, then the optimizer step; the peak
// (RankMemory) is its largest total.
struct MemoryStep {
  std::string phase;  // "forward", "backward" or "optimizer step"
  int unit = -1;
  int64_t params_bytes = 0;     // sharded parameters (+ ignored ones), always held
  int64_t optimizer_bytes = 0;  // always held
  int64_t buffers_bytes = 0;    // always held
  int64_t gathered_bytes = 0;   // unsharded parameters gathered now, prefetch included
  int64_t unsharded_grads_bytes = 0;  // gradients before their reduce-scatter
  int64_t grads_bytes = 0;      // sharded gradients left so far (+ ignored parameters' gradients)
  // FSDP2: the same bytes in FSDPMemTracker's categories (as RankMemory::peak_categories).
  std::vector<std::pair<std::string, int64_t>> categories;
  int64_t total_bytes() const {
    return params_bytes + optimizer_bytes + buffers_bytes + gathered_bytes + unsharded_grads_bytes + grads_bytes;
  }
};

struct MemoryPlan {
  MemorySettings settings;
  ShardingStrategy effective_strategy = ShardingStrategy::FullShard;
  int64_t shard_group_size = 1;  // ranks a flat parameter (FSDP2: each parameter) is sharded over
  int64_t replicate_size = 1;    // FSDP2 HSDP: the mesh's replicate dimension
  std::vector<UnitMemory> units;  // parallel to Plan::units
  RankMemory per_rank;
  std::vector<MemoryStep> timeline;  // one training step, in order
  std::vector<std::string> notes;
};

// HYBRID_SHARD's shard group: as set, or one node: the largest divisor of
// the world size up to 8 (FSDP1 uses the node's device count, which must divide it).
int64_t hybrid_group_size(const MemorySettings& settings);
// Why FSDP would reject these settings (a hybrid shard group that does not
// divide the world size, say), or "" if it would not.
std::string settings_error(const MemorySettings& settings);

// Throws std::invalid_argument when settings_error() has something to say.
// Without `timeline`, MemoryPlan::timeline stays empty (the peak is the same):
// suggest's searches ask only for the peak, hundreds of times.
MemoryPlan estimate_memory(const Plan& plan, const MemorySettings& settings, bool timeline = true);

}  // namespace fsdp_plan
