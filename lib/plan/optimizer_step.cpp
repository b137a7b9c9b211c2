#include "plan/optimizer_step.h"

#include <algorithm>

namespace fsdp_plan {

int64_t adam_step_temp_bytes(const std::vector<int64_t>& state_bytes, OptimizerImpl impl) {
  int64_t out = 0;
  switch (impl) {
    case OptimizerImpl::ForLoop:
      for (size_t k = 0; k < state_bytes.size(); ++k)
        out = std::max(out, (k > 0 ? state_bytes[k - 1] : 0) + 2 * state_bytes[k]);
      break;
    case OptimizerImpl::Foreach:
      // One group: FSDP's parameters share a device and (here) the state's dtype
      // (Optimizer._group_tensors_by_device_and_dtype).
      for (int64_t b : state_bytes) out += b;
      break;
    case OptimizerImpl::Fused: break;
  }
  return out;
}

}  // namespace fsdp_plan
