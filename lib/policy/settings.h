// The settings vocabulary: the FSDP version, strategy, optimizer and
// reshard_after_forward a policy, the command line and the writers all name,
// each spelled in one table (settings.cpp), and the "fsdp" settings object.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp_plan {

// FullyShardedDataParallel (FSDP1) or fully_shard (FSDP2); policy "fsdp.version",
// --fsdp-version, Accelerate's fsdp_version.
enum class FsdpVersion { V1 = 1, V2 = 2 };
enum class ShardingStrategy { FullShard, ShardGradOp, NoShard, HybridShard };
// AdamW keeps Adam's state (its decoupled weight decay is one more in-place op); kept apart so it is echoed as given.
enum class Optimizer { Adam, AdamW, Sgd, SgdMomentum, None };
inline bool is_adam(Optimizer o) { return o == Optimizer::Adam || o == Optimizer::AdamW; }
// How torch.optim runs Adam's step (its foreach / fused arguments): what the
// step's temporaries are. Default: PyTorch's choice (default_optimizer_impl).
enum class OptimizerImpl { ForLoop, Foreach, Fused };
// The activation walk (issue 30): the device whose kernels run the step
// (--device), and the attention kernel SDPA takes (--sdpa; "default": what
// that device picks). They decide what autograd saves.
enum class ComputeDevice { Cuda, Cpu };
enum class SdpaKernel { Default, Flash, Efficient, Cudnn, Math };
// The GPU the step-time estimate assumes (time/hardware.h holds each one's figures).
enum class HardwarePreset { H100, H200, A100 };

// One enum's names: the first row of a value is how it is written, later rows
// are other spellings read as it ("adamw" is Adam: the same state).
template <class E>
class NameTable {
 public:
  NameTable(std::vector<std::pair<const char*, E>> rows) : rows_(std::move(rows)) {}
  const char* name(E value) const {
    for (const auto& [n, v] : rows_)
      if (v == value) return n;
    return rows_.front().first;
  }
  std::optional<E> parse(const std::string& text) const {
    for (const auto& [n, v] : rows_)
      if (text == n) return v;
    return std::nullopt;
  }
  // Every spelling, in table order: what a command line or a policy accepts.
  std::vector<std::string> names() const {
    std::vector<std::string> out;
    for (const auto& row : rows_) out.push_back(row.first);
    return out;
  }

 private:
  std::vector<std::pair<const char*, E>> rows_;
};

const NameTable<ShardingStrategy>& strategy_names();  // FULL_SHARD, ... (PyTorch's ShardingStrategy)
const NameTable<Optimizer>& optimizer_names();        // adam, adamw, sgd, sgd-momentum, none
const NameTable<OptimizerImpl>& optimizer_impl_names();  // for-loop, foreach, fused
const NameTable<ComputeDevice>& device_names();      // cuda, cpu
const NameTable<SdpaKernel>& sdpa_names();           // default, flash, efficient, cudnn, math
const NameTable<HardwarePreset>& hardware_names();    // h100, h200, a100
inline const char* strategy_name(ShardingStrategy s) { return strategy_names().name(s); }
inline const char* device_name(ComputeDevice d) { return device_names().name(d); }
inline const char* sdpa_name(SdpaKernel k) { return sdpa_names().name(k); }
inline const char* optimizer_name(Optimizer o) { return optimizer_names().name(o); }
inline const char* optimizer_impl_name(OptimizerImpl i) { return optimizer_impl_names().name(i); }
inline int version_number(FsdpVersion v) { return static_cast<int>(v); }
std::optional<FsdpVersion> parse_version(int64_t number);

// Full-size optimizer states per trainable element: Adam's exp_avg and
// exp_avg_sq, SGD's momentum buffer. (Adam's 0-dim step is not counted here.)
int optimizer_states(Optimizer o);

// Far beyond any real job; keeps every byte count well inside int64.
constexpr int64_t kMaxWorldSize = int64_t{1} << 24;
constexpr int64_t kMaxAccumulationSteps = int64_t{1} << 20;  // fsdp.gradient_accumulation_steps

// fully_shard's reshard_after_forward: true, false, or an int k (reshard to
// k ranks after forward; k must divide the shard size).
struct ReshardAfterForward {
  enum class Kind { True, False, Ranks };
  Kind kind = Kind::True;
  int64_t ranks = 0;  // Kind::Ranks only
  bool operator==(const ReshardAfterForward& o) const { return kind == o.kind && ranks == o.ranks; }
};

// The policy's "fsdp" object: how FSDP is run, which the memory model and the
// writers read (the wrapping itself is the rest of the Policy).
struct FsdpSettings {
  FsdpVersion version = FsdpVersion::V1;
  int64_t world_size = 1;
  // Whether anything set it (--world-size, fsdp.world_size, num_processes): the text plan says when 1 is assumed.
  bool world_size_given = false;
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  int64_t shard_group_size = 0;  // HYBRID_SHARD only; 0: one node, see mesh/device_mesh.h hybrid_group_size
  bool use_orig_params = false;
  Optimizer optimizer = Optimizer::Adam;
  // fsdp.optimizer_impl, --optimizer-impl; nullopt: PyTorch's default (default_optimizer_impl).
  std::optional<OptimizerImpl> optimizer_impl;
  // FSDP2 only: the default for non-root calls (the root's is None -> False),
  // and CPUOffloadPolicy.
  ReshardAfterForward reshard_after_forward;
  bool cpu_offload = false;
  // fsdp.fp32_master_weights: trainable parameters not in float32 are cast to
  // float32 before sharding, as Accelerate does under mixed_precision bf16,
  // fp16 or fp8 (plan/master_weights.h says exactly which, per FSDP version);
  // MixedPrecision's param_dtype is then what the all-gathers carry.
  bool fp32_master_weights = false;
  // fsdp.gradient_accumulation_steps: micro-steps (forward and backward) per
  // optimizer step; fsdp.no_sync: all but the last skip the gradient
  // reduction (FSDP1's no_sync(), FSDP2's set_requires_gradient_sync(False)),
  // keeping every unsharded gradient (plan/grad_accumulation.h).
  int64_t gradient_accumulation_steps = 1;
  bool no_sync = false;

  bool v2() const { return version == FsdpVersion::V2; }
};

// The policy's "hardware" object and --hardware, --gpus-per-node, ...: the
// preset the step-time estimate (time/) starts from and the figures that
// override it. nullopt: the preset's figure, or the model's default factor.
struct HardwareSettings {
  HardwarePreset preset = HardwarePreset::H100;
  bool preset_given = false;
  std::optional<int64_t> gpus_per_node;
  // Peak link bandwidth per GPU per direction, GB/s (1e9 bytes): NVLink
  // inside a node, the GPU's share of the network across nodes.
  std::optional<double> intra_node_gbps, inter_node_gbps;
  // Achieved / peak: matmul FLOP/s, bus bandwidth, HBM bandwidth.
  std::optional<double> compute_efficiency, comm_efficiency, memory_efficiency;
  bool any_given() const {
    return preset_given || gpus_per_node || intra_node_gbps || inter_node_gbps || compute_efficiency ||
           comm_efficiency || memory_efficiency;
  }
};
// The hardware figures and factors, one row each: the policy's "hardware"
// key, the command-line option, the field, and whether it is a fraction of
// the peak. The policy parser, policy_file_json and the CLI read this table.
struct HardwareField {
  const char* key;     // "intra_node_bandwidth"
  const char* option;  // "--intra-node-bandwidth"
  std::optional<double> HardwareSettings::*field;
  bool efficiency;     // in (0, 1]; otherwise > 0 (GB/s)
  const char* help;
};
const std::vector<HardwareField>& hardware_fields();

// The range each figure must be in, or "": bandwidths finite and > 0,
// efficiencies in (0, 1], GPUs per node from 1 to kMaxWorldSize. `where`
// names the setting ("--efficiency", "hardware.compute_efficiency").
std::string hardware_value_error(const std::string& where, double value, bool efficiency);

// torch.optim's default when neither foreach nor fused is given
// (torch/optim/optimizer.py: _default_to_fused_or_foreach): foreach when every
// parameter is on a CUDA device and of a type in _foreach_supported_types,
// which is exactly Tensor, Parameter and (torch/distributed/tensor/__init__.py)
// DTensor. FSDP2's DTensors qualify; FSDP1's FlatParameter, a Parameter
// subclass, does not (the for-loop), unless use_orig_params hands the optimizer
// the original Parameters. On the CPU (--device cpu, or CPU offload's sharded
// parameters), the for-loop.
OptimizerImpl default_optimizer_impl(const FsdpSettings& settings, ComputeDevice device);
inline OptimizerImpl optimizer_impl(const FsdpSettings& settings, ComputeDevice device) {
  return settings.optimizer_impl ? *settings.optimizer_impl : default_optimizer_impl(settings, device);
}


}  // namespace fsdp_plan
