// The plan as JSON (schema_version 2, docs/plan-format.md). Field names are a contract that CI
// jobs and jq pipelines rely on: add fields; a field that changes meaning or goes raises the version.
#pragma once

#include <nlohmann/json.hpp>

#include "plan/plan.h"
#include "report/json_sink.h"

namespace fsdp_plan {

constexpr int kPlanSchemaVersion = 2;

struct PlanJsonOptions {
  // The step's events: every collective in issue order (comm.collectives,
  // comm.tensor_parallel.collectives) and the simulated timeline
  // (time.timeline), which indexes them. Three records a unit, most of a big
  // plan's JSON: the per-unit and per-step figures say the same sums, so they
  // are written only when asked for (--collectives).
  bool collectives = false;
};

// The plan, one object, to `w`: a JsonTextSink writes it as it goes (its
// bytes those of plan_to_json(plan).dump(1)), a JsonValueSink builds it.
// `trailing`'s keys (the gate's "checks" and "expect") follow the plan's own.
void plan_json(JsonSink& w, const Plan& plan,
               const nlohmann::ordered_json& trailing = nlohmann::ordered_json::object(),
               const PlanJsonOptions& options = {});
// The same, as one value.
nlohmann::ordered_json plan_to_json(const Plan& plan, const PlanJsonOptions& options = {});

}  // namespace fsdp_plan
