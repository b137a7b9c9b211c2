// Whether a plan's per-rank peak fits the --hardware GPU (docs/memory-model.md,
// "Does it fit"). The peak is the memory model's, PyTorch's caching allocator
// view (torch.cuda.max_memory_allocated); a process needs more than that, which
// the plan does not model and ASSUMES as a fixed headroom:
//  - the CUDA context and library handles (cuBLAS, cuDNN), outside the
//    allocator: kCudaContextBytes;
//  - NCCL's communicator buffers (NCCL_BUFFSIZE per channel per peer, NVLS
//    buffers on H100/H200), also outside it: kNcclBytes;
//  - the caching allocator's fragmentation (reserved minus allocated):
//    kFragmentationShare of the device's memory.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>

namespace fsdp_plan {

constexpr int64_t kCudaContextBytes = int64_t{512} << 20;  // 0.5 GiB
constexpr int64_t kNcclBytes = int64_t{1} << 30;            // 1 GiB
constexpr double kFragmentationShare = 0.05;                // of the device's memory

enum class FitVerdict {
  Fits,       // peak + headroom <= the device's memory
  Tight,      // peak <= the device's memory < peak + headroom: only if the headroom is not needed
  DoesNotFit  // peak > the device's memory
};

struct MemoryFit {
  bool computed = false;
  std::string hardware;           // preset, "h100"
  std::string hardware_name;      // "H100 SXM5 80GB"
  bool hardware_given = false;    // --hardware or the policy's; else the default
  int64_t device_bytes = 0;       // torch.cuda.get_device_properties().total_memory
  int64_t headroom_bytes = 0;     // the assumption above
  int64_t usable_bytes = 0;       // device_bytes - headroom_bytes
  int64_t peak_bytes = 0;
  bool activations_known = true;  // else the peak has no activations: a lower bound
  FitVerdict verdict = FitVerdict::Fits;
  // --max-peak-bytes (or the policy's checks.max_peak_bytes), when set.
  std::optional<int64_t> max_peak_bytes;
};

inline const char* fit_verdict_name(FitVerdict v) {
  switch (v) {
    case FitVerdict::Fits: return "fits";
    case FitVerdict::Tight: return "tight";
    case FitVerdict::DoesNotFit: return "does not fit";
  }
  return "fits";
}

inline int64_t assumed_headroom_bytes(int64_t device_bytes) {
  const auto fragmentation = static_cast<int64_t>(std::llround(kFragmentationShare * static_cast<double>(device_bytes)));
  return kCudaContextBytes + kNcclBytes + fragmentation;
}

inline MemoryFit memory_fit(int64_t peak_bytes, bool activations_known, const std::string& preset,
                            const std::string& name, bool hardware_given, int64_t device_bytes) {
  MemoryFit f;
  if (device_bytes <= 0) return f;
  f.computed = true;
  f.hardware = preset;
  f.hardware_name = name;
  f.hardware_given = hardware_given;
  f.device_bytes = device_bytes;
  f.headroom_bytes = assumed_headroom_bytes(device_bytes);
  f.usable_bytes = device_bytes - f.headroom_bytes;
  f.peak_bytes = peak_bytes;
  f.activations_known = activations_known;
  f.verdict = peak_bytes <= f.usable_bytes    ? FitVerdict::Fits
              : peak_bytes <= device_bytes ? FitVerdict::Tight
                                           : FitVerdict::DoesNotFit;
  return f;
}

}  // namespace fsdp_plan
