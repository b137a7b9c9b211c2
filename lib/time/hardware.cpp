#include "time/hardware.h"

namespace fsdp_plan {
namespace {

// Sources (docs/time-model.md section 5): NVIDIA's H100, H200 and A100 data
// sheets (dense Tensor Core figures are half the "with sparsity" ones), DGX
// H100 / A100 user guides (one 400 Gb/s NDR or 200 Gb/s HDR NIC per GPU),
// torch/_inductor/analysis/device_info.py for the same compute and HBM figures.
HardwareFigures preset_figures(HardwarePreset p) {
  HardwareFigures hw;
  hw.preset = hardware_names().name(p);
  switch (p) {
    case HardwarePreset::H100:
      // H100 SXM5 80GB: BF16 989.4 TFLOP/s dense, TF32 494.7, HBM3 3.35 TB/s,
      // NVLink 4 900 GB/s total, PCIe Gen5 x16 64 GB/s per direction.
      hw.name = "H100 SXM5 80GB";
      hw.memory_bytes = int64_t{81559} << 20;  // 79.6 GiB: nvidia-smi's 81559 MiB
      hw.bf16_flops = 989.4e12;
      hw.tf32_flops = 494.7e12;
      hw.hbm_bytes_per_s = 3.35e12;
      hw.intra_node_bytes_per_s = 450e9;
      hw.inter_node_bytes_per_s = 50e9;
      hw.host_bytes_per_s = 64e9;
      break;
    case HardwarePreset::H200:
      // H200 SXM 141GB: the H100's Tensor Cores, HBM3e 4.8 TB/s, NVLink 4.
      hw.name = "H200 SXM 141GB";
      hw.memory_bytes = int64_t{143771} << 20;  // 140.4 GiB: nvidia-smi's 143771 MiB
      hw.bf16_flops = 989.4e12;
      hw.tf32_flops = 494.7e12;
      hw.hbm_bytes_per_s = 4.8e12;
      hw.intra_node_bytes_per_s = 450e9;
      hw.inter_node_bytes_per_s = 50e9;
      hw.host_bytes_per_s = 64e9;
      break;
    case HardwarePreset::A100:
      // A100 SXM4 80GB: BF16 312 TFLOP/s dense, TF32 156, HBM2e 2,039 GB/s,
      // NVLink 3 600 GB/s total, PCIe Gen4 x16 32 GB/s per direction.
      hw.name = "A100 SXM4 80GB";
      hw.memory_bytes = int64_t{81920} << 20;  // 80 GiB: nvidia-smi's 81920 MiB
      hw.bf16_flops = 312e12;
      hw.tf32_flops = 156e12;
      hw.hbm_bytes_per_s = 2.039e12;
      hw.intra_node_bytes_per_s = 300e9;
      hw.inter_node_bytes_per_s = 25e9;
      hw.host_bytes_per_s = 32e9;
      break;
  }
  return hw;
}

}  // namespace

HardwareFigures resolve_hardware(const HardwareSettings& s) {
  HardwareFigures hw = preset_figures(s.preset);
  if (s.gpus_per_node) {
    hw.gpus_per_node = *s.gpus_per_node;
    hw.overridden.push_back("gpus_per_node");
  }
  if (s.intra_node_gbps) {
    hw.intra_node_bytes_per_s = *s.intra_node_gbps * 1e9;
    hw.overridden.push_back("intra_node_bandwidth");
  }
  if (s.inter_node_gbps) {
    hw.inter_node_bytes_per_s = *s.inter_node_gbps * 1e9;
    hw.overridden.push_back("inter_node_bandwidth");
  }
  if (s.compute_efficiency) {
    hw.compute_efficiency = *s.compute_efficiency;
    hw.overridden.push_back("compute_efficiency");
  }
  if (s.comm_efficiency) {
    hw.comm_efficiency = *s.comm_efficiency;
    hw.overridden.push_back("comm_efficiency");
  }
  if (s.memory_efficiency) {
    hw.memory_efficiency = *s.memory_efficiency;
    hw.overridden.push_back("memory_efficiency");
  }
  return hw;
}

CollectiveTime collective_time(CollectiveKind kind, int64_t bytes, const RankGroup& group, const HardwareFigures& hw,
                               bool permute) {
  CollectiveTime t;
  const int64_t n = group.size;
  if (n <= 1) return t;
  t.nodes = group.nodes(hw.gpus_per_node);
  // nccl-tests' bus-bandwidth factors: a ring all-gather or reduce-scatter
  // moves (n-1)/n of the buffer through each rank, an all-reduce twice that.
  // Latency: NCCL's ring Simple model (tuning.cc via Inductor's
  // _nccl_algo_time): a base, plus one hop latency per step, network hops for
  // the steps that cross nodes.
  double factor;
  int64_t steps, inter_steps;
  if (kind == CollectiveKind::AllReduce) {
    factor = static_cast<double>(2 * (n - 1)) / static_cast<double>(n);
    steps = 2 * (n - 1);
    inter_steps = 2 * (t.nodes - 1);
  } else if (kind == CollectiveKind::AllToAll && permute) {
    // permute_tensor: the whole buffer to the next rank of the ring, all at once.
    factor = 1.0;
    steps = 1;
    inter_steps = t.nodes > 1 ? 1 : 0;
  } else if (kind == CollectiveKind::AllToAll) {
    // nccl-tests' alltoall: (n-1)/n of the buffer leaves each rank, every
    // peer's message sent at once: one step of latency, a network hop if any
    // peer is on another node.
    factor = static_cast<double>(n - 1) / static_cast<double>(n);
    steps = 1;
    inter_steps = t.nodes > 1 ? 1 : 0;
  } else {
    factor = static_cast<double>(n - 1) / static_cast<double>(n);
    steps = n - 1;
    inter_steps = t.nodes - 1;
  }
  t.inter_node = t.nodes > 1;
  // A ring that leaves the node runs at the slowest hop: the GPU's share of the network.
  const double bw = (t.inter_node ? hw.inter_node_bytes_per_s : hw.intra_node_bytes_per_s) * hw.comm_efficiency;
  t.latency_s = hw.base_latency_s + static_cast<double>(steps - inter_steps) * hw.intra_step_latency_s +
                static_cast<double>(inter_steps) * hw.inter_step_latency_s;
  t.bandwidth_s = static_cast<double>(bytes) * factor / bw;
  t.seconds = t.latency_s + t.bandwidth_s;
  return t;
}

}  // namespace fsdp_plan
