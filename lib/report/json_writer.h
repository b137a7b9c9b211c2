// The plan as JSON (schema_version 1). Field names are a contract that CI
// jobs and jq pipelines rely on: add fields, never rename or repurpose one.
#pragma once

#include <nlohmann/json.hpp>

#include "plan/plan.h"

namespace fsdp_plan {

constexpr int kPlanSchemaVersion = 1;

nlohmann::ordered_json plan_to_json(const Plan& plan);

}  // namespace fsdp_plan
