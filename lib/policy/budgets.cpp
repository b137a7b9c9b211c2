#include "policy/budgets.h"

#include <algorithm>

namespace fsdp_plan {

bool Budgets::empty() const {
  return !max_unit_numel && !max_units && !max_root_share && !max_peak_bytes && fail_on.empty();
}

void Budgets::override_with(const Budgets& over) {
  if (over.max_unit_numel) max_unit_numel = over.max_unit_numel;
  if (over.max_units) max_units = over.max_units;
  if (over.max_root_share) max_root_share = over.max_root_share;
  if (over.max_peak_bytes) max_peak_bytes = over.max_peak_bytes;
  if (over.warn_root_share) warn_root_share = over.warn_root_share;
  for (const auto& k : over.fail_on)
    if (std::find(fail_on.begin(), fail_on.end(), k) == fail_on.end()) fail_on.push_back(k);
}

}  // namespace fsdp_plan
