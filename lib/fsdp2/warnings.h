// What fully_shard refuses (torch/distributed/fsdp/_fully_shard/_fully_shard.py and _fsdp_init.py:
// containers, scalar parameters; _fsdp_param_group.py: mixed dtypes at lazy init), as error-severity
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
