// What fully_shard refuses (FSDP2.md sections 1 and 8), as error-severity
// warnings with PyTorch's reason and the fix, and FSDP2's mixed precision per unit.
#pragma once

#include "fsdp2/units.h"
#include "model/class_names.h"
#include "plan/plan.h"
#include "plan/refusals.h"

namespace fsdp_plan {

// Runs after analyse(): units are sized. With `replan`, a size policy's
// refused containers get a fix, checked by planning again.
void analyse_fsdp2(Plan& plan, const Fsdp2Calls& calls, const ClassMatcher& matcher, const Replan* replan = nullptr);

}  // namespace fsdp_plan
