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

namespace fsdp_plan {

struct Budgets {
  std::optional<int64_t> max_unit_numel;  // parameters in any one unit
  std::optional<int64_t> max_units;       // number of units, root included
  std::optional<double> max_root_share;   // root unit's share of the sharded parameters, 0..1
  std::optional<int64_t> max_peak_bytes;  // memory.per_rank.peak_bytes
  std::vector<std::string> fail_on;       // warning kinds, or "any"
  // Not a budget: the root share above which the plan warns (root_too_large).
  std::optional<double> warn_root_share;

  bool empty() const;
  // Limits set in `over` replace these; fail_on kinds are added.
  void override_with(const Budgets& over);
};

// The warning kinds the planner emits, which "fail_on" accepts besides "any".
const std::vector<std::string>& warning_kinds();

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

}  // namespace fsdp_plan
