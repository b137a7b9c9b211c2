#include <doctest/doctest.h>

#include "report/diff_writer.h"
#include "report/json_writer.h"
#include "report/plan_diff.h"
#include "tree_builder.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;
using nlohmann::json;

namespace {

json plan(const char* policy_text, const char* path = "m.pt") {
  static TreeBuilder b = two_blocks_and_a_head();
  return json::parse(plan_to_json(make_plan(b.tree, policy(policy_text), path)).dump());
}

std::string text_of(const PlanDiff& d, const json& a, const json& b) {
  return diff_to_text(d, {"old.json", &a}, {"new.json", &b});
}
}  // namespace

TEST_CASE("the model's path and key order are not differences") {
  json a = plan(R"({"module_classes": ["Block"]})", "old/m.pt");
  json b = plan(R"({"module_classes": ["Block"]})", "new/m.pt");
  // Key order: nlohmann::json sorts keys, so a reordered file parses the same.
  json reordered = json::parse(R"({"b": 1, "a": 2})");
  CHECK(reordered == json::parse(R"({"a": 2, "b": 1})"));
  PlanDiff d = diff_plans(a, b);
  CHECK(d.equal());
  CHECK(diff_summary(d) == "no difference");
  CHECK(d.notes.empty());
}

TEST_CASE("units added, with the parameters that moved into them") {
  json a = plan("{}"), b = plan(R"({"module_classes": ["Block"]})");
  PlanDiff d = diff_plans(a, b);
  CHECK_FALSE(d.equal());
  REQUIRE(d.units_added.size() == 2);
  CHECK(d.units_added[0].path == "blocks.0");
  CHECK(d.units_added[0].cls == "Block");
  CHECK(d.units_added[0].param_numel == 20);
  CHECK(d.units_removed.empty());
  REQUIRE(d.units_changed.size() == 1);  // the root shrank
  CHECK(d.units_changed[0].path == "");
  bool numel_changed = false;
  for (const auto& c : d.units_changed[0].changes)
    if (c.field == "param_numel") numel_changed = c.old_value == 48 && c.new_value == 8;
  CHECK(numel_changed);
  REQUIRE(d.params_moved.size() == 4);
  CHECK(d.params_moved[0].name == "blocks.0.fc.weight");
  CHECK(d.params_moved[0].from == "");
  CHECK(d.params_moved[0].to == "blocks.0");
  CHECK(d.params_moved[0].numel == 16);
  REQUIRE(d.policy.size() == 2);  // auto_wrap and module_classes
  std::string text = text_of(d, a, b);
  CHECK(text.find("units added (2)") != std::string::npos);
  CHECK(text.find("  + blocks.0 ") != std::string::npos);
  CHECK(text.find("(root) -> blocks.0: 2 parameters, 20 elements") != std::string::npos);
  CHECK(text.find("param_numel:             48 -> 8 (-40)") != std::string::npos);
}

TEST_CASE("units removed, the other way round") {
  json a = plan(R"({"module_classes": ["Block"]})"), b = plan("{}");
  PlanDiff d = diff_plans(a, b);
  REQUIRE(d.units_removed.size() == 2);
  CHECK(d.units_removed[1].path == "blocks.1");
  CHECK(d.units_added.empty());
  CHECK(d.params_moved.size() == 4);
  CHECK(d.params_moved[0].to == "");
  auto j = diff_to_json(d, {"old.json", &a}, {"new.json", &b});
  CHECK(j["equal"] == false);
  CHECK(j["summary"]["units_removed"] == 2);
  CHECK(j["units"]["removed"][0]["path"] == "blocks.0");
  CHECK(j["params"]["moved"][0]["from"] == "blocks.0");
  CHECK(j["old"]["file"] == "old.json");
}

TEST_CASE("warnings that appeared or went away; the wording does not matter") {
  json a = plan(R"({"module_classes": ["Block"]})"), b = plan(R"({"module_classes": ["Block", "Missing"]})");
  PlanDiff d = diff_plans(a, b);
  REQUIRE(d.warnings_appeared.size() == 1);
  CHECK(d.warnings_appeared[0]["kind"] == "unmatched_class");
  CHECK(d.warnings_gone.empty());
  CHECK(text_of(d, a, b).find("warnings appeared (1)\n  + warning unmatched_class: ") != std::string::npos);
  PlanDiff back = diff_plans(b, a);
  CHECK(back.warnings_gone.size() == 1);
  CHECK(back.warnings_appeared.empty());

  json reworded = b;
  for (auto& w : reworded["warnings"]) w["message"] = "said differently";
  CHECK(diff_plans(b, reworded).warnings_appeared.empty());
}

TEST_CASE("parameters that leave every unit (newly ignored) are listed") {
  json a = plan(R"({"module_classes": ["Block"]})");
  json b = plan(R"({"module_classes": ["Block"], "ignored_params": ["head.*"]})");
  PlanDiff d = diff_plans(a, b);
  REQUIRE(d.params_removed.size() == 2);
  CHECK(d.params_removed[0].name == "head.weight");
  CHECK(d.params_removed[0].unit == "");
  CHECK(diff_plans(b, a).params_added.size() == 2);
}

TEST_CASE("a reshaped parameter and a changed class are reported") {
  json a = plan(R"({"module_classes": ["Block"]})"), b = a;
  b["units"][1]["params"][0]["shape"] = {8, 4};
  b["units"][1]["class"] = "BigBlock";
  PlanDiff d = diff_plans(a, b);
  REQUIRE(d.params_changed.size() == 1);
  CHECK(d.params_changed[0].name == "blocks.0.fc.weight");
  REQUIRE(d.units_changed.size() == 1);
  CHECK(d.units_changed[0].changes[0].field == "class");
}

TEST_CASE("sections and fields only one plan has are noted, not differences") {
  json a = plan(R"({"module_classes": ["Block"]})");
  a.erase("memory");  // as in a plan from a version without the memory model
  json b = a;
  b["memory"] = {{"per_rank", {{"peak_bytes", 100}}}};
  b["units"][0]["new_field"] = 1;
  b["checks"] = {{"passed", false}};  // the verdict of one run, not the plan
  PlanDiff d = diff_plans(a, b);
  CHECK(d.equal());
  CHECK(d.notes.size() == 2);
  json c = b;
  c["memory"]["per_rank"]["peak_bytes"] = 200;
  PlanDiff m = diff_plans(b, c);
  REQUIRE(m.other.size() == 1);
  CHECK(m.other[0].field == "memory.per_rank.peak_bytes");
  CHECK_FALSE(m.equal());
}

TEST_CASE("a schema_version change is a difference") {
  json a = plan("{}"), b = a;
  a["schema_version"] = 2;
  b["schema_version"] = 3;
  PlanDiff d = diff_plans(a, b);
  CHECK_FALSE(d.equal());
  CHECK(diff_summary(d) == "schema_version changed");
}

TEST_CASE("versions 1 and 2 compare: they differ only in comm and time, which diff skips") {
  json b = plan("{}");
  REQUIRE(b["schema_version"] == 2);
  json a = b;
  a["schema_version"] = 1;
  a["comm"] = {{"collectives", json::array({{{"numel", 4}, {"group_size", 8}}})}};  // version 1's shape
  a["time"] = {{"collectives", json::array()}, {"backward_end_s", 1.0}};
  for (const auto& [old_plan, new_plan] : {std::pair{a, b}, std::pair{b, a}}) {
    PlanDiff d = diff_plans(old_plan, new_plan);
    CHECK(d.equal());
    CHECK(diff_summary(d) == "no difference");
    REQUIRE(d.notes.size() == 1);
    CHECK(d.notes[0].find("differ only in comm and time") != std::string::npos);
  }
  json c = b;
  c["units"][0]["path"] = "renamed";  // a real change still shows
  CHECK_FALSE(diff_plans(a, c).equal());
}

TEST_CASE("plan_shape_error rejects what is not a plan") {
  CHECK(plan_shape_error(plan("{}")).empty());
  CHECK(plan_shape_error(json::array()).find("not a JSON object") != std::string::npos);
  CHECK(plan_shape_error(json::parse(R"({"units": []})")).find("schema_version") != std::string::npos);
  json p = plan("{}");
  p["units"] = json::array();
  CHECK(plan_shape_error(p).find("empty") != std::string::npos);
  p = plan("{}");
  p["units"][0].erase("path");
  CHECK(plan_shape_error(p).find("path") != std::string::npos);
  p = plan("{}");
  p["units"][0]["params"][0] = 3;
  CHECK(plan_shape_error(p).find("parameter") != std::string::npos);
}

TEST_CASE("the memory timeline is not compared: its changes show in units and the peak") {
  json a = plan(R"({"module_classes": ["Block"]})"), b = a;
  b["memory"]["timeline"][0]["gathered_bytes"] = 12345;
  CHECK(diff_plans(a, b).equal());
  b.at("memory").erase("timeline");  // a plan from a version without it
  PlanDiff d = diff_plans(a, b);
  CHECK(d.equal());
  CHECK(d.other.empty());
}
