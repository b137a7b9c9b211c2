// The step-time estimate of a plan (docs/time-model.md): per collective its
// time, per unit compute and the communication compute does not hide
// (exposed), and the step. Filled by time/step_time.h after the
// communication; read by the writers and suggest. Every figure is an
// ESTIMATE from peak hardware figures times stated efficiencies.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp_plan {

// The figures the estimate used: a preset's peaks with the overrides applied.
struct HardwareFigures {
  std::string preset;       // "h100"
  std::string name;         // "H100 SXM5 80GB"
  double bf16_flops = 0;    // dense Tensor Core peak, FLOP/s
  double tf32_flops = 0;    // dense TF32 peak (fp32 matmuls), FLOP/s
  double hbm_bytes_per_s = 0;
  double intra_node_bytes_per_s = 0;  // NVLink, per GPU per direction
  double inter_node_bytes_per_s = 0;  // the GPU's share of the network, per direction
  double host_bytes_per_s = 0;        // PCIe, per direction (CPU offload copies)
  int64_t gpus_per_node = 8;
  // The device's memory as torch.cuda.get_device_properties().total_memory
  // gives it (nvidia-smi's MiB): what plan/memory_fit.h compares the peak with.
  int64_t memory_bytes = 0;
  double compute_efficiency = 0.5;
  double comm_efficiency = 0.8;
  double memory_efficiency = 0.8;
  // NCCL ring, Simple protocol (NCCL src/graph/tuning.cc, as
  // torch/_inductor/comm_analysis.py copies it).
  double base_latency_s = 8.4e-6;
  double intra_step_latency_s = 3.4e-6;
  double inter_step_latency_s = 14e-6;
  std::vector<std::string> overridden;  // the settings that replaced a preset figure or default
};

struct CollectiveTime {  // parallel to CommPlan::collectives
  double seconds = 0;    // latency + bandwidth term + the CPU offload copy it carries
  double latency_s = 0;
  double bandwidth_s = 0;
  double host_copy_s = 0;
  int64_t nodes = 1;
  bool inter_node = false;
  double start = 0, end = 0;  // in the simulated step
};

struct UnitTime {  // parallel to Plan::units
  double all_gather_s = 0, reduce_scatter_s = 0, all_reduce_s = 0, host_copy_s = 0;
  int64_t forward_flops = 0, backward_flops = 0;
  double forward_compute_s = 0, backward_compute_s = 0;
  double exposed_forward_s = 0, exposed_backward_s = 0, exposed_tail_s = 0;
  // Tensor parallelism's collectives of the unit's modules: blocking, on the
  // compute stream's path (not in comm_s() or exposed_s()).
  double tp_forward_s = 0, tp_backward_s = 0;
  double comm_s() const { return all_gather_s + reduce_scatter_s + all_reduce_s + host_copy_s; }
  double exposed_s() const { return exposed_forward_s + exposed_backward_s + exposed_tail_s; }
};

// One span of the simulated step: a compute segment or a collective.
struct TimeSpan {
  bool compute = true;
  int collective = -1;  // index into CommPlan::collectives, for a collective
  int unit = -1;
  bool backward = false;
  double start = 0, end = 0;
};

struct StepTime {
  bool computed = false;
  // With FLOPs: compute, exposed communication, optimizer and step, in
  // seconds. Without (a TorchScript model, no --flops): only the
  // communication that stays exposed when every unit's compute is long enough
  // to hide its neighbours' collectives (docs/time-model.md section 6); the
  // compute, optimizer and step fields are 0 and meaningless.
  bool flops_known = false;
  std::string flops_source;
  HardwareFigures hardware;
  double compute_peak_flops = 0;  // the peak the compute ran at (bf16 or tf32)
  std::string compute_dtype;      // "bf16" or "tf32": the one most forward FLOPs run at
  // Which modules ran at which peak, as the assumptions say it (each module at its own dtype's).
  std::string compute_dtype_note;
  std::vector<CollectiveTime> collectives;
  std::vector<UnitTime> units;
  double comm_s = 0;          // every collective's time, summed (hidden or not)
  double channel_s = 0;       // the busiest process group's collectives: a lower bound of the step
  double exposed_comm_s = 0;
  double compute_s = 0;
  double optimizer_s = 0;
  // False with CPU offload: the optimizer steps on the host, not modelled (optimizer_s 0, left out of step_s).
  bool optimizer_modelled = true;
  int64_t optimizer_trainable_shard_numel = 0;
  double forward_end_s = 0, backward_compute_end_s = 0, backward_end_s = 0;
  double step_s = 0;
  // Tensor parallelism (CommPlan::tp): each collective alone on the tp group,
  // and their sum; with FLOPs the step waits for every one of them (a TP
  // collective's output is the next op's input: nothing overlaps it).
  std::vector<CollectiveTime> tp_collectives;  // parallel to CommPlan::tp.collectives
  double tp_comm_s = 0;
  // Expert parallelism's all-to-alls (CommPlan::ep), blocking the same way.
  std::vector<CollectiveTime> ep_collectives;  // parallel to CommPlan::ep.collectives
  double ep_comm_s = 0;
  // Context parallelism's ring (CommPlan::cp), blocking the same way.
  std::vector<CollectiveTime> cp_collectives;  // parallel to CommPlan::cp.collectives
  double cp_comm_s = 0;
  std::vector<TimeSpan> timeline;
  std::vector<std::string> assumptions;  // every one, as the outputs print them
};

}  // namespace fsdp_plan
