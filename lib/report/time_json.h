// The plan's communication and step-time estimate as JSON: units[i].comm,
// units[i].time, and the top-level "comm" and "time" sections
// (docs/schemas/plan.schema.json). Seconds are ESTIMATES ("estimate": true);
// bytes are exact.
#pragma once

#include <nlohmann/json.hpp>

#include "plan/plan.h"

namespace fsdp_plan {

nlohmann::ordered_json unit_comm_json(const Plan& plan, size_t unit);
nlohmann::ordered_json unit_time_json(const Plan& plan, size_t unit);
// The sections with their long arrays empty: the writer streams them from
// comm_collective_json (comm.collectives), time_collective_json
// (time.collectives) and time_span_json (time.timeline).
nlohmann::ordered_json comm_json(const Plan& plan);
nlohmann::ordered_json time_json(const Plan& plan);
nlohmann::ordered_json comm_collective_json(const Plan& plan, size_t i);
nlohmann::ordered_json time_collective_json(const Plan& plan, size_t i);
nlohmann::ordered_json time_span_json(const Plan& plan, size_t i);

}  // namespace fsdp_plan
