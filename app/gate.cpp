#include "gate.h"

#include <cmath>

#include "policy/policy.h"
#include "report/diff_writer.h"
#include "util/errors.h"
#include "util/file_io.h"
#include "util/json_input.h"
#include "util/strings.h"

namespace fsdp_plan {

CLI::Validator share_validator() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const double d = std::stod(v, &used);
          if (used == v.size() && std::isfinite(d) && d >= 0 && d <= 1) return "";
        } catch (const std::exception&) {
        }
        return "must be a share from 0 to 1, not " + v;
      },
      "FLOAT in [0 - 1]");  // what CLI::Range(0.0, 1.0) showed in --help
}

void add_gate_options(CLI::App& app, GateOptions& opt) {
  Budgets& b = opt.budgets;
  const char* group = "Budgets (exit 1 when violated; also settable under \"checks\" in the policy)";
  // Whole numbers as the policy JSON takes them, 1e6 included.
  const CLI::Validator whole_number(
      [](std::string& v) { return parse_count(v) ? std::string() : "\"" + v + "\" is not a whole number >= 0"; }, "");
  app.add_option_function<std::string>("--max-unit-numel", [&b](const std::string& v) { b.max_unit_numel = parse_count(v); },
                                       "at most N parameters in any one unit (1e8 is fine)")
      ->type_name("N")->check(whole_number)->group(group);
  app.add_option_function<int64_t>("--max-units", [&b](const int64_t& v) { b.max_units = v; },
                                   "at most N units, the root included")
      ->type_name("N")->check(CLI::NonNegativeNumber)->group(group);
  app.add_option_function<double>("--max-root-share", [&b](const double& v) { b.max_root_share = v; },
                                  "at most this share (0..1) of the sharded parameters left in the root unit")
      ->type_name("F")->check(share_validator())->group(group);
  app.add_option_function<std::string>(
         "--max-peak-bytes", [&b](const std::string& v) { b.max_peak_bytes = parse_size(v); },
         "at most this peak memory per rank (memory.per_rank.peak_bytes), e.g. 80GiB, 80GB, 1.5TiB")
      ->type_name("SIZE")
      ->check(CLI::Validator(
          [](std::string& v) { return parse_size(v) ? std::string() : "\"" + v + "\" is not a size (e.g. 80GiB)"; },
          ""))
      ->group(group);
  app.add_option("--fail-on", b.fail_on, "fail if the plan has a warning of KIND (repeatable; \"any\": any "
                                         "warning or error, not info)")
      ->type_name("KIND")
      ->check(CLI::Validator([](std::string& v) { return fail_on_error(v); }, ""))
      ->allow_extra_args(false)
      ->group(group);
  app.add_option("--expect", opt.expect, "exit 1 unless the plan equals this reviewed plan (JSON); the "
                                         "difference is printed as `fsdp-plan diff` would")
      ->type_name("PLAN.json")
      ->group("Reviewed plans");
}

Gate::Gate(const nlohmann::ordered_json& plan, const Budgets& policy_budgets, const GateOptions& opt,
           const std::string& model_file) {
  Budgets budgets = policy_budgets;
  budgets.override_with(opt.budgets);
  if (!budgets.empty()) checks_ = evaluate_checks(plan, budgets, model_file);

  if (!opt.expect.empty()) {
    expect_file_ = opt.expect;
    expected_ = load_plan_file(expect_file_);
    actual_ = nlohmann::json::parse(plan.dump());  // sorted keys: key order cannot differ
    diff_ = diff_plans(expected_, actual_);
  }
}

bool Gate::reads_plan(const Budgets& policy_budgets, const GateOptions& opt) {
  Budgets budgets = policy_budgets;
  budgets.override_with(opt.budgets);
  return !budgets.empty() || !opt.expect.empty();
}

bool Gate::passed() const { return (!checks_ || checks_->passed()) && (!diff_ || diff_->equal()); }

nlohmann::ordered_json Gate::annotate(nlohmann::ordered_json plan) const {
  if (checks_) plan["checks"] = checks_to_json(*checks_);
  if (diff_)
    plan["expect"] = {{"file", expect_file_},
                      {"equal", diff_->equal()},
                      {"diff", diff_to_json(*diff_, {expect_file_, &expected_}, {"(this run)", &actual_})}};
  return plan;
}

std::vector<std::string> Gate::failures() const {
  std::vector<std::string> out;
  if (checks_) out = violation_lines(*checks_);
  if (diff_ && !diff_->equal())
    out.push_back("the plan differs from " + expect_file_ + " (" + diff_summary(*diff_) +
                  "); fsdp-plan diff shows how");
  return out;
}

std::string Gate::text() const {
  std::string out;
  if (checks_) out += checks_to_text(*checks_);
  if (diff_) {
    if (diff_->equal()) {
      out += "\nexpect  same plan as " + expect_file_ + "\n";
    } else {
      out += "\nexpect  the plan differs from " + expect_file_ + " (" + diff_summary(*diff_) + ")\n\n";
      out += diff_to_text(*diff_, {expect_file_, &expected_}, {"(this run)", &actual_});
    }
  }
  return out;
}

}  // namespace fsdp_plan
