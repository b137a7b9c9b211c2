// Expert parallelism's all-to-alls of one training step, per MoE layer, on
// the ep group: torchtitan's AllToAllTokenDispatcher (models/common/
// token_dispatcher.py) sends each rank's tokens x top_k routed rows out in
// dispatch and back in combine, both through all_to_all_single_autograd,
// whose backward is the reverse all-to-all; full checkpointing runs the
// forward's two again (torchtitan's selective policy saves all_to_all_single's
// outputs: no recompute). Blocking: the splits need a device-to-host sync, so
// they run on the compute stream's path (time/step_time.h).
#pragma once

#include "plan/comm.h"
#include "plan/plan.h"

namespace fsdp_plan {

// Empty (planned false) without an expert_parallel section.
EpComm ep_comm(const Plan& plan);

}  // namespace fsdp_plan
