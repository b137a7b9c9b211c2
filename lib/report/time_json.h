// The plan's communication and step-time estimate as JSON: units[i].comm,
// units[i].time, and the top-level "comm" and "time" sections
// (docs/schemas/plan.schema.json). Seconds are ESTIMATES ("estimate": true);
// bytes are exact. Each writes one value to a JsonSink (report/json_sink.h).
#pragma once

#include "plan/plan.h"
#include "report/json_sink.h"

namespace fsdp_plan {

void unit_comm_json(JsonSink& w, const Plan& plan, size_t unit);
void unit_time_json(JsonSink& w, const Plan& plan, size_t unit);
// `events`: with comm.collectives (and TP's) and time.timeline (--collectives).
void comm_json(JsonSink& w, const Plan& plan, bool events);
void time_json(JsonSink& w, const Plan& plan, bool events);

}  // namespace fsdp_plan
