#include "policy/settings.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace fsdp_plan {
namespace {

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

const NameTable<ShardingStrategy>& strategy_names() {
  static const NameTable<ShardingStrategy> table({{"FULL_SHARD", ShardingStrategy::FullShard},
                                                  {"SHARD_GRAD_OP", ShardingStrategy::ShardGradOp},
                                                  {"NO_SHARD", ShardingStrategy::NoShard},
                                                  {"HYBRID_SHARD", ShardingStrategy::HybridShard}});
  return table;
}

const NameTable<Optimizer>& optimizer_names() {
  static const NameTable<Optimizer> table({{"adam", Optimizer::Adam},
                                           {"adamw", Optimizer::AdamW},
                                           {"sgd", Optimizer::Sgd},
                                           {"sgd-momentum", Optimizer::SgdMomentum},
                                           {"none", Optimizer::None}});
  return table;
}

const NameTable<OptimizerImpl>& optimizer_impl_names() {
  static const NameTable<OptimizerImpl> table(
      {{"for-loop", OptimizerImpl::ForLoop}, {"foreach", OptimizerImpl::Foreach}, {"fused", OptimizerImpl::Fused}});
  return table;
}

OptimizerImpl default_optimizer_impl(const FsdpSettings& settings, ComputeDevice device) {
  // CPU offload: the optimizer steps the sharded parameters on the host.
  if (device != ComputeDevice::Cuda || settings.cpu_offload) return OptimizerImpl::ForLoop;
  return settings.v2() || settings.use_orig_params ? OptimizerImpl::Foreach : OptimizerImpl::ForLoop;
}

const NameTable<ComputeDevice>& device_names() {
  static const NameTable<ComputeDevice> table({{"cuda", ComputeDevice::Cuda}, {"cpu", ComputeDevice::Cpu}});
  return table;
}

const NameTable<SdpaKernel>& sdpa_names() {
  static const NameTable<SdpaKernel> table({{"default", SdpaKernel::Default},
                                            {"flash", SdpaKernel::Flash},
                                            {"efficient", SdpaKernel::Efficient},
                                            {"cudnn", SdpaKernel::Cudnn},
                                            {"math", SdpaKernel::Math}});
  return table;
}

const NameTable<HardwarePreset>& hardware_names() {
  static const NameTable<HardwarePreset> table(
      {{"h100", HardwarePreset::H100}, {"h200", HardwarePreset::H200}, {"a100", HardwarePreset::A100}});
  return table;
}

const std::vector<HardwareField>& hardware_fields() {
  static const std::vector<HardwareField> table = {
      {"intra_node_bandwidth", "--intra-node-bandwidth", &HardwareSettings::intra_node_gbps, false,
       "GB/s per GPU per direction inside a node, peak (default: the preset's NVLink)"},
      {"inter_node_bandwidth", "--inter-node-bandwidth", &HardwareSettings::inter_node_gbps, false,
       "GB/s per GPU per direction across nodes, peak (default: the preset's network, one NIC per GPU)"},
      {"compute_efficiency", "--efficiency", &HardwareSettings::compute_efficiency, true,
       "achieved / peak matmul FLOP/s (default 0.5)"},
      {"comm_efficiency", "--comm-efficiency", &HardwareSettings::comm_efficiency, true,
       "achieved / peak link bandwidth for collectives (default 0.8)"},
      {"memory_efficiency", "--memory-efficiency", &HardwareSettings::memory_efficiency, true,
       "achieved / peak HBM bandwidth in the optimizer step (default 0.8)"},
  };
  return table;
}

namespace {
constexpr double kMinHardwareFigure = 0.001;  // docs/limits.md
}  // namespace

std::string hardware_value_error(const std::string& where, double value, bool efficiency) {
  // NaN fails every comparison: it is refused with the infinities.
  if (!std::isfinite(value)) return where + " must be a finite number, not " + format_number(value);
  // Bounded below, not only above 0: a denormal efficiency or bandwidth made an
  // infinite step time (issue 39). 0.001 is 0.1% of the peak, or 1 MB/s.
  if (efficiency && !(value >= kMinHardwareFigure && value <= 1))
    return where + " is a fraction of the peak: from 0.001 to 1, not " + format_number(value);
  if (!efficiency && !(value >= kMinHardwareFigure))
    return where + " must be at least 0.001 (GB/s), not " + format_number(value);
  return "";
}

std::optional<FsdpVersion> parse_version(int64_t number) {
  if (number == 1) return FsdpVersion::V1;
  if (number == 2) return FsdpVersion::V2;
  return std::nullopt;
}

int optimizer_states(Optimizer o) {
  switch (o) {
    case Optimizer::Adam:
    case Optimizer::AdamW: return 2;  // exp_avg, exp_avg_sq
    case Optimizer::SgdMomentum: return 1;  // momentum_buffer
    case Optimizer::Sgd:
    case Optimizer::None: return 0;
  }
  return 0;
}

}  // namespace fsdp_plan
