// Hardware presets for the step-time estimate (docs/time-model.md section 5):
// per-GPU peak figures from the vendors' data sheets, and the time of one
// collective under NCCL's ring model (section 2). Every figure is a peak;
// the efficiencies of HardwareFigures turn them into estimates.
#pragma once

#include <string>

#include "plan/comm.h"
#include "plan/step_time.h"
#include "policy/settings.h"

namespace fsdp_plan {

// The preset's figures with `settings`' overrides applied (overridden lists them).
// Expects values hardware_value_error accepts.
HardwareFigures resolve_hardware(const HardwareSettings& settings);

// latency(n, nodes) + bytes x ring factor / (link peak x comm_efficiency) for
// one collective over `group`; 0 for a one-rank group. `bytes` is the
// unsharded buffer (Collective::bytes). `permute`: an all-to-all sending the
// whole buffer to one peer (Collective::permute), at its slowest hop.
CollectiveTime collective_time(CollectiveKind kind, int64_t bytes, const RankGroup& group, const HardwareFigures& hw,
                               bool permute = false);

}  // namespace fsdp_plan
