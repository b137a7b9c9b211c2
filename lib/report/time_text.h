// The communication and step-time lines of the text plan, and the per-unit
// figures of its --wide view. Bytes are exact (what FSDP issues, counted as
// tests/timing/COMM.md says); seconds are the step-time model's ESTIMATE
// (docs/time-model.md), and every line that shows one says so.
#pragma once

#include <string>

#include "plan/plan.h"

namespace fsdp_plan {

// "1.23 s", "464.2 ms", "45.1 us", "0 s": three significant figures or so.
std::string format_seconds(double seconds);

// "comm    ..." and "time    ..." lines (each wrapped to 100 columns), or ""
// when the plan has neither (FSDP_PLAN_SKIP_TIME, bench/time_overhead.py).
std::string comm_time_text(const Plan& plan);

// --wide: a unit's communication per step (bytes, exact) and the part of it
// compute does not hide (estimate), as table cells.
std::string unit_comm_cell(const Plan& plan, size_t unit);
std::string unit_exposed_cell(const Plan& plan, size_t unit);

}  // namespace fsdp_plan
