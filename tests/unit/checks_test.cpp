#include <doctest/doctest.h>

#include "report/budgets.h"
#include "report/json_writer.h"
#include "tree_builder.h"
#include "util/errors.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {

nlohmann::ordered_json plan_json(const char* policy_text) {
  static TreeBuilder b = two_blocks_and_a_head();  // plans point into their tree
  return plan_to_json(make_plan(b.tree, policy(policy_text), "m.pt"));
}

const CheckResult& only(const CheckReport& r) {
  REQUIRE(r.results.size() == 1);
  return r.results[0];
}
}  // namespace

TEST_CASE("max_unit_numel passes at the limit and names every unit over it") {
  auto j = plan_json(R"({"module_classes": ["Block"]})");
  Budgets b;
  b.max_unit_numel = 20;
  CHECK(only(evaluate_checks(j, b, "m.pt")).passed);
  b.max_unit_numel = 19;
  auto r = only(evaluate_checks(j, b, "m.pt"));
  CHECK_FALSE(r.passed);
  CHECK(r.actual == 20);
  CHECK(r.limit == 19);
  CHECK(r.units == std::vector<std::string>{"blocks.0", "blocks.1"});
}

TEST_CASE("max_units counts the root") {
  auto j = plan_json(R"({"module_classes": ["Block"]})");
  Budgets b;
  b.max_units = 3;
  CHECK(only(evaluate_checks(j, b, "m.pt")).passed);
  b.max_units = 2;
  auto r = only(evaluate_checks(j, b, "m.pt"));
  CHECK_FALSE(r.passed);
  CHECK(r.actual == 3);
}

TEST_CASE("max_root_share is the root's share of the sharded parameters") {
  auto j = plan_json(R"({"module_classes": ["Block"]})");  // root 8 of 48
  Budgets b;
  b.max_root_share = 0.2;
  auto ok = only(evaluate_checks(j, b, "m.pt"));
  CHECK(ok.passed);
  CHECK(ok.actual.get<double>() == doctest::Approx(8.0 / 48.0));
  b.max_root_share = 0.1;
  auto r = only(evaluate_checks(j, b, "m.pt"));
  CHECK_FALSE(r.passed);
  CHECK(r.units == std::vector<std::string>{""});
  // Without auto-wrap everything is in the root.
  b.max_root_share = 0.99;
  CHECK_FALSE(only(evaluate_checks(plan_json("{}"), b, "m.pt")).passed);
}

TEST_CASE("max_peak_bytes reads memory.per_rank.peak_bytes, and refuses a plan without it") {
  auto j = plan_json("{}");
  j.erase("memory");  // as in a plan from a version without the memory model
  Budgets b;
  b.max_peak_bytes = 1000;
  try {
    evaluate_checks(j, b, "m.pt");
    FAIL("a plan without memory passed max_peak_bytes");
  } catch (const InputError& e) {
    CHECK(e.file() == "m.pt");
    CHECK(std::string(e.what()).find("needs the memory model") != std::string::npos);
  }
  j["memory"] = {{"per_rank", {{"peak_bytes", 1000}}}};
  CHECK(only(evaluate_checks(j, b, "m.pt")).passed);
  j["memory"]["per_rank"]["peak_bytes"] = 1001;
  auto r = only(evaluate_checks(j, b, "m.pt"));
  CHECK_FALSE(r.passed);
  CHECK(r.actual == 1001);
}

TEST_CASE("fail_on counts warnings of a kind, and any counts all but info") {
  auto j = plan_json(R"({"module_classes": ["Block", "Missing"]})");
  Budgets b;
  b.fail_on = {"unmatched_class", "empty_unit", "any"};
  auto report = evaluate_checks(j, b, "m.pt");
  REQUIRE(report.results.size() == 3);
  CHECK_FALSE(report.results[0].passed);
  CHECK(report.results[0].actual == 1);
  CHECK(report.results[0].limit == "unmatched_class");
  CHECK(report.results[1].passed);
  CHECK_FALSE(report.results[2].passed);
  CHECK_FALSE(report.passed());
  b.fail_on = {"any"};
  CHECK(evaluate_checks(plan_json(R"({"module_classes": ["Block"]})"), b, "m.pt").passed());
}

TEST_CASE("command-line budgets override the policy's; fail_on kinds add up") {
  Budgets policy, cli;
  policy.max_units = 4;
  policy.max_unit_numel = 100;
  policy.fail_on = {"empty_unit"};
  cli.max_units = 2;
  cli.fail_on = {"empty_unit", "any"};
  policy.override_with(cli);
  CHECK(policy.max_units == 2);
  CHECK(policy.max_unit_numel == 100);
  CHECK(policy.fail_on == std::vector<std::string>{"empty_unit", "any"});
  CHECK(Budgets{}.empty());
}

TEST_CASE("checks JSON lists violations with rule, limit, actual and units; text says FAIL") {
  auto j = plan_json(R"({"module_classes": ["Block"]})");
  Budgets b;
  b.max_unit_numel = 10;
  b.max_units = 10;
  auto report = evaluate_checks(j, b, "m.pt");
  auto out = checks_to_json(report);
  CHECK(out["passed"] == false);
  CHECK(out["results"].size() == 2);
  REQUIRE(out["violations"].size() == 1);
  CHECK(out["violations"][0]["rule"] == "max_unit_numel");
  CHECK(out["violations"][0]["limit"] == 10);
  CHECK(out["violations"][0]["actual"] == 20);
  CHECK(out["violations"][0]["units"] == nlohmann::json::array({"blocks.0", "blocks.1"}));
  std::string text = checks_to_text(report);
  CHECK(text.find("FAIL  max_unit_numel: 20 > 10  (blocks.0, blocks.1)") != std::string::npos);
  CHECK(text.find("ok    max_units: 3 <= 10") != std::string::npos);
  CHECK(text.find("1 violated") != std::string::npos);
}
