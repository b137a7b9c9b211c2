// CI budgets: limits on a plan from the policy's "checks" or the command line
// (--max-*, --fail-on). Not part of the wrapping; report/budgets.h evaluates them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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

}  // namespace fsdp_plan
