// The plan for people: a table of units as a tree, totals and warnings,
// readable at 100 columns.
#pragma once

#include <string>

#include "plan.h"

namespace fsdp_plan {

std::string plan_to_text(const Plan& plan);

}  // namespace fsdp_plan
