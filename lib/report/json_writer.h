// The plan as JSON (schema_version 1). Field names are a contract that CI
// jobs and jq pipelines rely on: add fields, never rename or repurpose one.
#pragma once

#include <nlohmann/json.hpp>

#include "plan/plan.h"
#include "report/json_document.h"

namespace fsdp_plan {

constexpr int kPlanSchemaVersion = 1;

// The plan as a document whose long arrays are made as they are written; it
// refers to `plan`, which must outlive it.
JsonDocument plan_json(const Plan& plan);
// The same, as one value (plan_json(plan).filled()).
nlohmann::ordered_json plan_to_json(const Plan& plan);

}  // namespace fsdp_plan
