// The step-time model (docs/time-model.md sections 3 and 4): one training
// step simulated on one compute stream and one channel per process group,
// with the overlap rules F1-F2, B1-B4 that FSDP1 and FSDP2 follow; per unit
// its compute and the communication left exposed; then the optimizer step.
// Version-neutral: the plan's CommPlan says what each version issues, when.
// tests/timing/time_model.py is its reference, reproduced number for number.
#pragma once

#include "plan/flops.h"
#include "plan/step_time.h"

namespace fsdp_plan {

struct Plan;

// Needs plan.comm. Without `flops` (a TorchScript model, no --flops file):
// only the exposed communication under the assumption of docs/time-model.md
// section 6, every computing unit's compute long enough to hide its
// neighbours' collectives (StepTime::flops_known false).
// Throws InputError-free std::invalid_argument when `flops` does not fit the
// plan (a unit's FLOPs negative).
StepTime estimate_step_time(const Plan& plan, const HardwareFigures& hw, const FlopProfile* flops);

}  // namespace fsdp_plan
