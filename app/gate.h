// The CI gate around a plan: budgets (--max-*, --fail-on, the policy's
// "checks") and a reviewed plan to match (--expect). Kept out of main.cpp so
// the plan pipeline there stays as it was.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "report/budgets.h"
#include "report/plan_diff.h"

namespace fsdp_plan {

struct GateOptions {
  Budgets budgets;     // from the command line: they override the policy's
  std::string expect;  // a reviewed plan (JSON) the new plan must equal
};

void add_gate_options(CLI::App& app, GateOptions& opt);

// A share from 0 to 1 (--max-root-share, --warn-root-share). CLI::Range lets
// "nan" through (every comparison with NaN is false): it always failed the
// budget and turned the warning off.
CLI::Validator share_validator();

class Gate {
 public:
  // Throws InputError for an unusable --expect file, or a budget the plan
  // has no data for; the caller then writes nothing.
  Gate(const nlohmann::ordered_json& plan, const Budgets& policy_budgets, const GateOptions& opt,
       const std::string& model_file);

  // Whether a Gate with these settings reads the plan JSON at all; when not,
  // the caller may pass an empty one (building it costs more than planning).
  static bool reads_plan(const Budgets& policy_budgets, const GateOptions& opt);

  bool passed() const;
  // The plan JSON plus "checks" and "expect" sections, when they apply.
  nlohmann::ordered_json annotate(nlohmann::ordered_json plan) const;
  // Lines for the end of the text plan.
  std::string text() const;
  // One line per failed check (a violated budget, a plan that differs from
  // --expect), for stderr: exit 1 always says why, wherever the plan went.
  std::vector<std::string> failures() const;

 private:
  std::optional<CheckReport> checks_;
  std::string expect_file_;
  std::optional<PlanDiff> diff_;
  nlohmann::json expected_, actual_;
};

}  // namespace fsdp_plan
