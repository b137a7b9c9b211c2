#include <doctest/doctest.h>

#include "policy/policy.h"
#include "tree_builder.h"
#include "util/errors.h"

using namespace fsdp_plan;

namespace {
std::string error_of(const std::string& json) {
  try {
    parse_policy(json, "p.json");
  } catch (const InputError& e) {
    CHECK(e.file() == "p.json");
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("an empty policy auto-wraps nothing and has FSDP's defaults") {
  Policy p = parse_policy("{}", "p.json");
  CHECK_FALSE(p.auto_wrap());
  CHECK(p.force_leaf_modules == std::vector<std::string>{"torch.nn.MultiheadAttention"});
  CHECK(p.exclude_wrap_modules == std::vector<std::string>{"torch.nn.ModuleList", "torch.nn.ModuleDict"});
  CHECK_FALSE(p.mixed_precision.has_value());
}

TEST_CASE("a full policy parses") {
  Policy p = parse_policy(R"({
    "module_classes": ["Block", "torch.nn.TransformerEncoderLayer"],
    "min_num_params": 1e8,
    "force_leaf_modules": [],
    "mixed_precision": {"param_dtype": "torch.bfloat16", "reduce_dtype": "float32", "buffer_dtype": null},
    "ignored_modules": ["blocks.0"],
    "ignored_params": ["*.bias"]
  })", "p.json");
  CHECK(p.auto_wrap());
  CHECK(p.module_classes->size() == 2);
  CHECK(*p.min_num_params == 100000000);
  CHECK(p.force_leaf_modules.empty());
  CHECK(p.force_leaf_given);
  REQUIRE(p.mixed_precision.has_value());
  CHECK(*p.mixed_precision->param_dtype == "bfloat16");
  CHECK_FALSE(p.mixed_precision->buffer_dtype.has_value());
  CHECK(p.mixed_precision->ignore_classes == std::vector<std::string>{"torch.nn.modules.batchnorm._BatchNorm"});
  CHECK(p.ignored_params == std::vector<std::string>{"*.bias"});
  CHECK_FALSE(parse_policy(R"({"mixed_precision": null})", "p").mixed_precision.has_value());
}

TEST_CASE("policy errors name the problem") {
  CHECK(error_of("{\n  \"min_num_params\": 5,\n}").find("line 3, column 1") != std::string::npos);
  CHECK(error_of("{\"min_num_param\": 5}") == "unknown key \"min_num_param\"; did you mean \"min_num_params\"?");
  CHECK(error_of("{\"mixed_precision\": {\"param_dtyp\": \"bfloat16\"}}").find("did you mean \"param_dtype\"") !=
        std::string::npos);
  CHECK(error_of("{\"min_num_params\": -1}") == "\"min_num_params\" must be >= 0, not -1");
  CHECK(error_of("{\"min_num_params\": 1.5}") == "\"min_num_params\" must be a whole number, not 1.5");
  CHECK(error_of("{\"min_num_params\": 1e30}").find("too large") != std::string::npos);
  CHECK(error_of("{\"min_num_params\": \"100\"}") == "\"min_num_params\" must be an integer, not a string");
  CHECK(error_of("{\"module_classes\": \"Block\"}") == "\"module_classes\" must be a list of strings, not a string");
  CHECK(error_of("{\"module_classes\": []}").find("is empty") != std::string::npos);
  CHECK(error_of("{\"module_classes\": [\"A\", \"A\"]}") == "\"module_classes\" lists \"A\" twice");
  CHECK(error_of("{\"module_classes\": [1]}").find("holds an integer") != std::string::npos);
  CHECK(error_of("[]") == "a policy must be a JSON object, not a list");
  CHECK(error_of("{\"mixed_precision\": {\"param_dtype\": \"bf16\"}}").find("not a floating dtype") !=
        std::string::npos);
  CHECK(error_of("{\"ignored_modules\": [\"\"]}").rfind(
            "\"ignored_modules\" holds an empty string, the root's path: the root cannot be named, but \"*\"", 0) == 0);
  // Found by the fuzzer: a number too big for a double is not a parse_error in nlohmann.
  CHECK(error_of("{\"min_num_params\": 1e400}") == "invalid JSON: number overflow parsing '1e400'");
}

TEST_CASE("policy checks parse, with sizes as strings or numbers") {
  Policy p = parse_policy(R"({"checks": {"max_unit_numel": 1e6, "max_units": 10, "max_root_share": 0.25,
                              "max_peak_bytes": "80GiB", "fail_on": ["empty_unit", "any"]}})", "p.json");
  CHECK(p.checks.max_unit_numel == 1000000);
  CHECK(p.checks.max_units == 10);
  CHECK(p.checks.max_root_share == doctest::Approx(0.25));
  CHECK(p.checks.max_peak_bytes == int64_t{80} << 30);
  CHECK(p.checks.fail_on == std::vector<std::string>{"empty_unit", "any"});
  CHECK(parse_policy(R"({"checks": {"max_peak_bytes": 1024}})", "p").checks.max_peak_bytes == 1024);
  CHECK(parse_policy("{}", "p").checks.empty());
  CHECK(parse_policy(R"({"checks": null})", "p").checks.empty());
}

TEST_CASE("policy checks errors name the problem") {
  CHECK(error_of(R"({"checks": {"max_unit_numels": 5}})") ==
        "unknown key \"max_unit_numels\" in \"checks\"; did you mean \"max_unit_numel\"?");
  CHECK(error_of(R"({"checks": []})") == "\"checks\" must be an object, not a list");
  CHECK(error_of(R"({"checks": {"max_units": -1}})") == "\"checks.max_units\" must be >= 0, not -1");
  CHECK(error_of(R"({"checks": {"max_units": "4"}})") == "\"checks.max_units\" must be an integer, not a string");
  CHECK(error_of(R"({"checks": {"max_root_share": 25}})") ==
        "\"checks.max_root_share\" is a share between 0 and 1, not 25");
  CHECK(error_of(R"({"checks": {"max_root_share": "25%"}})") ==
        "\"checks.max_root_share\" must be a number, not a string");
  CHECK(error_of(R"({"checks": {"max_peak_bytes": "80XB"}})").find("not a size") != std::string::npos);
  CHECK(error_of(R"({"checks": {"max_peak_bytes": true}})") ==
        "\"checks.max_peak_bytes\" must be a byte count or a size string, not a boolean");
  CHECK(error_of(R"({"checks": {"fail_on": ["empty_unt"]}})") ==
        "\"checks.fail_on\" names \"empty_unt\", not a warning kind; did you mean \"empty_unit\"?");
  CHECK(error_of(R"({"checks": {"fail_on": "any"}})") == "\"checks.fail_on\" must be a list of strings, not a string");
  CHECK(error_of(R"({"check": {}})") == "unknown key \"check\"; did you mean \"checks\"?");
}

TEST_CASE("mixed precision's other fields: PyTorch's defaults per FSDP version, and the fields a version lacks") {
  Policy none = parse_policy(R"({"mixed_precision": {"param_dtype": "bfloat16"}})", "p.json");
  const MixedPrecision& d = *none.mixed_precision;
  CHECK_FALSE(d.keep_low_grads());
  CHECK_FALSE(d.casts_forward_inputs(FsdpVersion::V1));  // MixedPrecision: False
  CHECK(d.casts_forward_inputs(FsdpVersion::V2));        // MixedPrecisionPolicy: True
  CHECK(d.casts_root_forward_inputs());
  CHECK(none.combination_error().empty());

  Policy p = parse_policy(R"({"mixed_precision": {"keep_low_precision_grads": true, "cast_forward_inputs": false,
                              "cast_root_forward_inputs": false}})", "p.json");
  CHECK(p.mixed_precision->keep_low_grads());
  CHECK_FALSE(p.mixed_precision->casts_forward_inputs(FsdpVersion::V2));
  CHECK_FALSE(p.mixed_precision->casts_root_forward_inputs());
  CHECK(p.combination_error().empty());
  p.fsdp.version = FsdpVersion::V2;
  CHECK(p.combination_error().find("FSDP2's MixedPrecisionPolicy has no keep_low_precision_grads") == 0);

  Policy o = parse_policy(R"({"mixed_precision": {"output_dtype": "torch.float32", "cast_forward_inputs": true}})",
                          "p.json");
  CHECK(*o.mixed_precision->output_dtype == "float32");
  CHECK(o.combination_error().find("FSDP1's MixedPrecision has no output_dtype") == 0);
  o.fsdp.version = FsdpVersion::V2;
  CHECK(o.combination_error().empty());
  // null is the default, given or not.
  CHECK(parse_policy(R"({"mixed_precision": {"output_dtype": null}})", "p").combination_error().empty());

  CHECK_THROWS_WITH(parse_policy(R"({"mixed_precision": {"cast_forward_inputs": 1}})", "p.json"),
                    "\"mixed_precision.cast_forward_inputs\" must be true or false, not an integer");
  CHECK_THROWS_WITH(parse_policy(R"({"mixed_precision": {"output_dtype": "int8"}})", "p.json"),
                    doctest::Contains("\"mixed_precision.output_dtype\" is \"int8\", not a floating dtype"));
}

TEST_CASE("adamw is echoed as adamw, with Adam's state (issue 41, item 9)") {
  Policy p = parse_policy(R"({"fsdp": {"optimizer": "adamw"}})", "p.json");
  CHECK(std::string(optimizer_name(p.fsdp.optimizer)) == "adamw");
  CHECK(policy_to_json(p)["fsdp"]["optimizer"] == "adamw");
  CHECK(policy_file_json(p)["fsdp"]["optimizer"] == "adamw");
  CHECK(optimizer_states(p.fsdp.optimizer) == 2);
  test::TreeBuilder b;
  b.linear("l", 64, 64);
  const Plan adamw = make_plan(b.tree, p, "m.pt");
  const Plan adam = make_plan(b.tree, parse_policy(R"({"fsdp": {"optimizer": "adam"}})", "p.json"), "m.pt");
  CHECK(adamw.memory.per_rank.peak_bytes == adam.memory.per_rank.peak_bytes);
  CHECK(adamw.memory.per_rank.optimizer_bytes == adam.memory.per_rank.optimizer_bytes);
}
