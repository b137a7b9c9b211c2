// Warnings beyond the units themselves.
#include <doctest/doctest.h>

#include "tree_builder.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

TEST_CASE("a model that already has FSDP applied is an error") {
  TreeBuilder by_class;
  by_class.add("layer", "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel");
  by_class.linear("layer._fsdp_wrapped_module", 2, 2);
  auto plan = plan_of(by_class, "{}");
  CHECK(plan.has_errors());
  const Warning* w = find_warning(plan, "nested_wrap");
  REQUIRE(w);
  CHECK(w->severity == Severity::Error);
  CHECK(w->modules == Names{"layer", "layer._fsdp_wrapped_module"});

  TreeBuilder by_param;
  by_param.add("m", "Block");
  by_param.param("m", "_flat_param", {10});
  CHECK(plan_of(by_param, "{}").has_errors());

  TreeBuilder clean;
  clean.linear("fc", 2, 2);
  CHECK_FALSE(plan_of(clean, "{}").has_errors());
}

TEST_CASE("policy class names that match nothing are reported with near names") {
  TreeBuilder b;
  b.add("blocks", "ModuleList").add("blocks.0", "TransformerBlock");
  b.linear("blocks.0.fc", 2, 2);
  auto plan = plan_of(b, R"({"module_classes": ["TransformerBlok", "Linear"], "force_leaf_modules": ["Nothing"]})");
  CHECK(count_warnings(plan, "unmatched_class") == 2);
  const Warning* w = find_warning(plan, "unmatched_class");
  REQUIRE(w);
  CHECK(w->classes == Names{"TransformerBlok"});
  REQUIRE(!w->suggestions.empty());
  CHECK(w->suggestions[0] == "TransformerBlock");
  // FSDP's own defaults are never reported, even when the model lacks them.
  CHECK(count_warnings(plan_of(b, R"({"min_num_params": 1})"), "unmatched_class") == 0);
  // A base class matches through inheritance, so it is not unmatched.
  TreeBuilder bn;
  bn.add("bn", "BatchNorm2d");
  CHECK(count_warnings(plan_of(bn, R"({"module_classes": ["_NormBase"]})"), "unmatched_class") == 0);
}

TEST_CASE("an empty root unit is only informational") {
  TreeBuilder b;
  b.linear("fc", 2, 2);
  auto plan = plan_of(b, R"({"module_classes": ["Linear"]})");
  const Warning* w = find_warning(plan, "empty_unit");
  REQUIRE(w);
  CHECK(w->severity == Severity::Info);
  CHECK_FALSE(plan.has_errors());
}

TEST_CASE("sizes follow each tensor's dtype") {
  TreeBuilder b;
  b.add("fc", "Linear");
  b.param("fc", "weight", {4, 4}, "bfloat16", 2);
  b.param("fc", "bias", {4}, "float64", 8);
  auto plan = plan_of(b, "{}");
  CHECK(plan.units[0].param_numel == 20);
  CHECK(plan.units[0].param_bytes == 16 * 2 + 4 * 8);
}

TEST_CASE("a mixed-precision policy that casts nothing says so (issue 41, item 2)") {
  auto tree_in = [](const std::string& dtype, int64_t itemsize) {
    TreeBuilder b;
    b.add("l", "Linear");
    b.param("l", "weight", {16, 16}, dtype, itemsize);
    return b;
  };
  const std::string mp = R"({"mixed_precision": {"param_dtype": "bfloat16"}})";
  TreeBuilder bf16 = tree_in("bfloat16", 2), fp32 = tree_in("float32", 4);
  CHECK(count_warnings(plan_of(bf16, mp), "mixed_precision_noop") == 1);
  CHECK(count_warnings(plan_of(fp32, mp), "mixed_precision_noop") == 0);
  CHECK(count_warnings(plan_of(bf16, "{}"), "mixed_precision_noop") == 0);
  // fp32 master weights (Accelerate's): the cast makes the policy do something.
  CHECK(count_warnings(plan_of(bf16, R"({"mixed_precision": {"param_dtype": "bfloat16"},
      "fsdp": {"fp32_master_weights": true}})"), "mixed_precision_noop") == 0);
}
