// CI budgets on a plan: limits from the command line or the policy's
// "checks", evaluated into a report of which held and which were violated.
// Budgets read the plan's JSON, not Plan, so they see exactly the fields a
// user sees (and the memory section once the memory model fills it in).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "policy/budgets.h"

namespace fsdp_plan {

struct CheckResult {
  std::string rule;  // the budget's name: max_unit_numel, ..., fail_on
  nlohmann::ordered_json limit, actual;
  bool passed = true;
  std::vector<std::string> units;  // unit paths concerned ("" is the root)
};

struct CheckReport {
  std::vector<CheckResult> results;  // one per budget set, in a fixed order
  bool passed() const;
};

// Throws InputError naming `plan_file` if a budget needs data the plan lacks
// (max_peak_bytes without a memory section): a budget never passes silently.
CheckReport evaluate_checks(const nlohmann::ordered_json& plan, const Budgets& budgets,
                            const std::string& plan_file);

// {"passed", "results": [...], "violations": [the failed results]}
nlohmann::ordered_json checks_to_json(const CheckReport& report);
// A block for the end of the text plan: one line per budget, "ok" or "FAIL".
std::string checks_to_text(const CheckReport& report);
// One line per violated budget ("budget violated: max_units: 5 > 2"), for
// stderr: a failed check is said there whatever becomes of the plan.
std::vector<std::string> violation_lines(const CheckReport& report);

}  // namespace fsdp_plan
