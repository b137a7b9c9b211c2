// A PlanDiff for people (text) and for programs (JSON, docs/schemas/diff.schema.json).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "report/plan_diff.h"

namespace fsdp_plan {

constexpr int kDiffSchemaVersion = 1;

// What the header names each side by: the file given and what the plan says.
struct DiffSide {
  std::string file;
  const nlohmann::json* plan = nullptr;
};

nlohmann::ordered_json diff_to_json(const PlanDiff& d, const DiffSide& old_side, const DiffSide& new_side);
std::string diff_to_text(const PlanDiff& d, const DiffSide& old_side, const DiffSide& new_side);
// One line: "3 units added, 1 removed; 12 parameters moved; ..." or "no difference".
std::string diff_summary(const PlanDiff& d);

}  // namespace fsdp_plan
