// What a careful engineer wants to know about a plan beyond the units:
// sizes, per-unit mixed precision, and warnings (FSDP's own and ours).
#pragma once

#include <vector>

#include "model/class_names.h"
#include "plan/plan.h"
#include "policy/ignored.h"

namespace fsdp_plan {

// Fills unit sizes and mixed_precision, the model summary and the warnings.
void analyse(Plan& plan, const Ignored& ignored, const ClassMatcher& matcher);

}  // namespace fsdp_plan
