// Which unit owns what: FSDP's _get_fully_sharded_module_to_states
// (torch/distributed/fsdp/_wrap_utils.py), and a
// tied weight split across units as FSDP1's wrapper builds it (bottom-up; a copy per unit without
// use_orig_params, the first unit built with it), checked against torch 2.13 in tests/differential.
#include <doctest/doctest.h>

#include "tree_builder.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {

// tok (Embedding), blocks.{0,1} (Block: ln, fc), head (Linear sharing tok's weight).
TreeBuilder gpt() {
  TreeBuilder b("__torch__.GPT");
  b.add("tok", "Embedding");
  TensorId w = b.param("tok", "weight", {100, 8});
  b.add("blocks", "ModuleList");
  for (const char* i : {"0", "1"}) {
    std::string p = std::string("blocks.") + i;
    b.add(p, "Block").add(p + ".ln", "LayerNorm");
    b.param(p + ".ln", "weight", {8});
    b.param(p + ".ln", "bias", {8});
    b.linear(p + ".fc", 8, 8);
  }
  b.add("head", "Linear");
  b.tie("head", "weight", w);
  return b;
}
}  // namespace

TEST_CASE("units own their subtree minus wrapped descendants, in pre-order") {
  auto b = gpt();
  auto plan = plan_of(b, R"({"module_classes": ["Block"]})");
  CHECK(unit_paths(plan) == Names{"", "blocks.0", "blocks.1"});
  CHECK(param_names(plan, 0) == Names{"tok.weight"});  // head.weight is the same tensor
  CHECK(param_names(plan, 1) ==
        Names{"blocks.0.ln.weight", "blocks.0.ln.bias", "blocks.0.fc.weight", "blocks.0.fc.bias"});
  CHECK(plan.units[0].param_numel == 800);
  CHECK(plan.units[1].param_numel == 8 + 8 + 64 + 8);
  CHECK(plan.units[1].param_bytes == 4 * (8 + 8 + 64 + 8));
  CHECK(plan.model.param_numel == 800 + 2 * 88);
  CHECK(count_warnings(plan, "shared_param_across_units") == 0);  // both uses sit in the root unit
}

namespace {
const char* kOrig = R"("fsdp": {"use_orig_params": true})";
std::string with_orig(const std::string& policy) { return policy.substr(0, policy.size() - 1) + ", " + kOrig + "}"; }
}  // namespace

TEST_CASE("a tied weight between a unit and the root: a copy in each, or the unit built first") {
  // The embedding sits in a wrapped unit, the head in the root. FSDP1 builds emb_block before the root.
  TreeBuilder b;
  b.add("head", "Linear");
  b.add("emb_block", "Block").add("emb_block.emb", "Embedding");
  TensorId w = b.param("emb_block.emb", "weight", {10, 4});
  b.tie("head", "weight", w);
  const std::string classes = R"({"module_classes": ["Block"]})";
  auto plan = plan_of(b, classes);
  CHECK(unit_paths(plan) == Names{"", "emb_block"});
  CHECK(param_names(plan, 0) == Names{"head.weight"});  // the root's own copy
  CHECK(param_names(plan, 1) == Names{"emb_block.emb.weight"});
  CHECK(plan.units[0].param_numel == 40);
  CHECK(plan.units[1].param_numel == 40);
  CHECK(plan.memory.units[0].flat_numel + plan.memory.units[1].flat_numel == 80);  // held twice
  const Warning* shared = find_warning(plan, "shared_param_across_units");
  REQUIRE(shared);
  CHECK(shared->params == Names{"head.weight", "emb_block.emb.weight"});
  CHECK(shared->message.find("flattens a copy into each") != std::string::npos);
  CHECK(shared->message.find("held 2 times") != std::string::npos);
  CHECK(shared->message.find("by not wrapping 'emb_block'") != std::string::npos);
  CHECK(count_warnings(plan, "empty_unit") == 0);

  auto orig = plan_of(b, with_orig(classes));
  CHECK(param_names(orig, 0).empty());  // emb_block, built first, holds it
  CHECK(param_names(orig, 1) == Names{"emb_block.emb.weight"});
  shared = find_warning(orig, "shared_param_across_units");
  REQUIRE(shared);
  CHECK(shared->message.find("first unit built, 'emb_block'") != std::string::npos);
  const Warning* empty = find_warning(orig, "empty_unit");
  REQUIRE(empty);
  CHECK(empty->modules == Names{""});
}

TEST_CASE("a tied weight between two sibling units") {
  TreeBuilder b;
  b.add("emb_block", "Block").add("emb_block.emb", "Embedding");
  TensorId w = b.param("emb_block.emb", "weight", {10, 4});
  b.add("head", "Linear");
  b.tie("head", "weight", w);
  b.param("head", "bias", {10});
  const std::string classes = R"({"module_classes": ["Block", "Linear"]})";
  auto plan = plan_of(b, classes);
  CHECK(unit_paths(plan) == Names{"", "emb_block", "head"});
  CHECK(param_names(plan, 1) == Names{"emb_block.emb.weight"});
  CHECK(param_names(plan, 2) == Names{"head.weight", "head.bias"});
  auto orig = plan_of(b, with_orig(classes));
  CHECK(param_names(orig, 1) == Names{"emb_block.emb.weight"});
  CHECK(param_names(orig, 2) == Names{"head.bias"});
  const Warning* shared = find_warning(orig, "shared_param_across_units");
  REQUIRE(shared);
  CHECK(shared->message.find("by not wrapping 'emb_block', 'head'") != std::string::npos);
}

TEST_CASE("a tied weight where the sharing modules are nested: units are built bottom-up") {
  // d (Head) encloses d.l.1 (Block); both, and unit a, use a's tensors. Pre-order would give
  // d before d.l.1; FSDP1 builds a, d.l.1, d, then the root (torch 2.13 under the fake backend
  // builds exactly these flat parameters from the same model).
  TreeBuilder b;
  b.add("a", "Block").add("a.e", "Sequential").linear("a.e.0", 4, 4).add("a.e.1", "Sequential");
  b.linear("a.e.1.0", 4, 10);
  b.add("d", "Head").add("d.l", "Sequential").add("d.l.0", "Linear");
  b.tie("d.l.0", "weight", b.tree.module(b.id("a.e.0")).params[0].tensor);
  b.param("d.l.0", "bias", {4});
  b.add("d.l.1", "Block").add("d.l.1.e", "Linear");
  b.tie("d.l.1.e", "weight", b.tree.module(b.id("a.e.1.0")).params[0].tensor);
  b.param("d.l.1.e", "bias", {10});
  b.tie("d.l.1.e", "extra", b.tree.module(b.id("d.l.0")).params[1].tensor);  // d's own bias, also in d.l.1
  const std::string classes = R"({"module_classes": ["Block", "Head"]})";
  auto plan = plan_of(b, classes);
  CHECK(unit_paths(plan) == Names{"", "a", "d", "d.l.1"});
  CHECK(param_names(plan, 1) == Names{"a.e.0.weight", "a.e.0.bias", "a.e.1.0.weight", "a.e.1.0.bias"});
  CHECK(param_names(plan, 2) == Names{"d.l.0.weight", "d.l.0.bias"});
  CHECK(param_names(plan, 3) == Names{"d.l.1.e.weight", "d.l.1.e.bias", "d.l.1.e.extra"});
  auto orig = plan_of(b, with_orig(classes));
  CHECK(param_names(orig, 2).empty());  // a took d.l.0.weight, d.l.1 took d's bias: both built before d
  CHECK(param_names(orig, 3) == Names{"d.l.1.e.bias", "d.l.1.e.extra"});
  CHECK(count_warnings(orig, "shared_param_across_units") == 3);
}

TEST_CASE("a tied weight ignored through one of its modules is in no unit") {
  TreeBuilder b;
  b.add("emb", "Block").add("emb.e", "Embedding");
  TensorId w = b.param("emb.e", "weight", {10, 4});
  b.add("head", "Linear");
  b.tie("head", "weight", w);
  for (const char* orig : {"false", "true"}) {
    auto plan = plan_of(b, std::string(R"({"module_classes": ["Block"], "ignored_modules": ["head"], )") +
                               R"("fsdp": {"use_orig_params": )" + orig + "}}");
    CHECK(param_names(plan, 0).empty());
    CHECK(param_names(plan, 1).empty());
    CHECK(count_warnings(plan, "shared_param_across_units") == 0);
  }
}

TEST_CASE("use_orig_params: a size policy sees a flattened tied weight at its rank-0 shard") {
  // emb (4000) is built first; at world size 4 the root then counts only its 1000-element view in
  // head, so head (1000 + 1000) falls below min_num_params and is not wrapped; on one rank,
  // with NO_SHARD, or without use_orig_params, head counts 5000 and is wrapped.
  TreeBuilder b;
  b.add("emb", "Embedding");
  TensorId w = b.param("emb", "weight", {1000, 4});
  b.add("head", "Linear");
  b.tie("head", "weight", w);
  b.param("head", "bias", {1000});
  const std::string size = R"({"min_num_params": 3000, "fsdp": {"world_size": 4, "use_orig_params": )";
  CHECK(units_of(b, size + "false}}") == Names{"", "emb", "head"});
  CHECK(units_of(b, size + "true}}") == Names{"", "emb"});
  CHECK(units_of(b, R"({"min_num_params": 3000, "fsdp": {"world_size": 1, "use_orig_params": true}})") ==
        Names{"", "emb", "head"});
  CHECK(units_of(b, R"({"min_num_params": 3000, "fsdp": {"world_size": 4, "sharding_strategy": "NO_SHARD", )"
                    R"("use_orig_params": true}})") == Names{"", "emb", "head"});
}

TEST_CASE("with use_orig_params every parameter and buffer is owned exactly once") {
  auto b = gpt();
  b.buffer("blocks.1.ln", "stat", {3});
  TensorId shared_buf = b.buffer("blocks.0", "mask", {4, 4});
  b.tree.add_buffer(b.id("blocks.1"), "mask", shared_buf);
  auto plan = plan_of(b, R"({"module_classes": ["Block", "Linear", "LayerNorm"], "fsdp": {"use_orig_params": true}})");
  std::vector<int> owners(b.tree.num_tensors(), 0);
  for (const auto& u : plan.units) {
    for (const auto& o : u.params) ++owners[static_cast<size_t>(o.tensor)];
    for (const auto& o : u.buffers) ++owners[static_cast<size_t>(o.tensor)];
  }
  for (int n : owners) CHECK(n == 1);
  CHECK(buffer_names(plan, 1) == Names{"blocks.0.mask"});
}

TEST_CASE("ignored modules: not wrapped, parameters owned by no unit, buffers still grouped") {
  TreeBuilder b;
  b.linear("a", 2, 2);
  b.add("b", "Block").linear("b.fc", 2, 2).add("b.bn", "BatchNorm1d");
  b.param("b.bn", "weight", {2});
  b.buffer("b.bn", "running_mean", {2});
  auto plan = plan_of(b, R"({"module_classes": ["Linear", "BatchNorm1d"], "ignored_modules": ["b"]})");
  CHECK(unit_paths(plan) == Names{"", "a"});
  CHECK(param_names(plan, 0).empty());
  CHECK(buffer_names(plan, 0) == Names{"b.bn.running_mean"});
  CHECK(plan.model.param_numel == 6 + 6 + 2);  // the model's totals still count them

  auto by_param = plan_of(b, R"({"module_classes": ["Linear"], "ignored_params": ["*.bias"]})");
  CHECK(unit_paths(by_param) == Names{"", "a", "b.fc"});
  CHECK(param_names(by_param, 1) == Names{"a.weight"});
  CHECK(param_names(by_param, 0) == Names{"b.bn.weight"});
}

TEST_CASE("ignore globs that match nothing, and an ignored root, are reported") {
  TreeBuilder b;
  b.linear("a", 2, 2);
  auto plan = plan_of(b, R"({"ignored_modules": ["nope.*"], "ignored_params": ["*.gamma"]})");
  CHECK(count_warnings(plan, "unmatched_ignore") == 2);
  auto all = plan_of(b, R"({"ignored_modules": ["*"]})");
  CHECK(find_warning(all, "ignored_root"));
  CHECK(param_names(all, 0).empty());
}

TEST_CASE("mixed precision: ignore classes become units of their own, without mixed precision") {
  TreeBuilder b;
  b.add("conv", "Conv2d");
  b.param("conv", "weight", {4, 3, 3, 3});
  b.add("bn", "BatchNorm2d");
  b.param("bn", "weight", {4});
  b.buffer("bn", "running_mean", {4});
  b.linear("fc", 4, 2);
  auto plan = plan_of(b, R"({"module_classes": ["Linear"], "mixed_precision": {"param_dtype": "bfloat16"}})");
  CHECK(unit_paths(plan) == Names{"", "bn", "fc"});
  CHECK(plan.units[0].mixed_precision == true);
  CHECK(plan.units[1].mixed_precision == false);
  CHECK(plan.units[2].mixed_precision == true);
  const Warning* w = find_warning(plan, "mixed_precision_override");
  REQUIRE(w);
  CHECK(w->classes == Names{"BatchNorm2d"});
  CHECK(w->modules == Names{"bn"});

  // Mixed precision alone auto-wraps nothing, so nothing is overridden.
  auto alone = plan_of(b, R"({"mixed_precision": {"param_dtype": "bfloat16"}})");
  CHECK(unit_paths(alone) == Names{""});
  CHECK(alone.units[0].mixed_precision == true);
  CHECK_FALSE(find_warning(alone, "mixed_precision_override"));

  // No mixed precision: null per unit.
  CHECK_FALSE(plan_of(b, R"({"module_classes": ["Linear"]})").units[0].mixed_precision.has_value());

  // Its OR part always recurses, so even a size policy that wraps nothing reaches bn.
  auto sized = plan_of(b, R"({"min_num_params": 100000, "mixed_precision": {"ignore_classes": ["_BatchNorm"]}})");
  CHECK(unit_paths(sized) == Names{"", "bn"});
}

TEST_CASE("a 100,000-deep chain and a 100,000-wide module plan without recursion") {
  TreeBuilder deep;
  ModuleId parent = 0;
  for (int i = 0; i < 100000; ++i) {
    parent = deep.tree.add_module(parent, "c", i % 2 ? "__torch__.Block" : "__torch__.Other");
    deep.tree.add_param(parent, "w", deep.tree.add_tensor({{2}, "float32", 4}));
  }
  auto plan = plan_of(deep, R"({"module_classes": ["Block"], "min_num_params": 1})");
  CHECK(plan.units.size() == 100001);
  CHECK(plan.units.back().depth == 100000);
  CHECK(plan.model.param_numel == 200000);

  TreeBuilder wide;
  for (int i = 0; i < 100000; ++i) {
    ModuleId m = wide.tree.add_module(0, std::to_string(i), "__torch__.Block");
    wide.tree.add_param(m, "w", wide.tree.add_tensor({{3}, "float32", 4}));
  }
  auto wplan = plan_of(wide, R"({"module_classes": ["Block"]})");
  CHECK(wplan.units.size() == 100001);
  CHECK(param_names(wplan, 100000) == Names{"99999.w"});
}

TEST_CASE("use_orig_params: ranks that count a tied weight differently and so wrap differently are reported") {
  // Real FSDP1 (fake backend, world size 4, each rank in turn) wraps b on ranks 0 and 1 only: a's flat
  // parameter is [tied 15, pad 1, other 15, pad 1], shards of 8; b counts 8 + 13 on rank 0, 7 + 13 on
  // rank 1 and 0 + 13 on ranks 2 and 3 against min_num_params 20.
  TreeBuilder b;
  b.add("a", "Module").add("a.tied", "Linear").add("a.other", "Linear");
  TensorId w = b.param("a.tied", "weight", {3, 5});
  b.param("a.other", "weight", {3, 5});
  b.add("b", "Linear");
  b.tie("b", "weight", w);
  b.param("b", "bias", {3});
  b.param("b", "extra", {10});
  auto plan = plan_of(b, R"({"min_num_params": 20, "fsdp": {"world_size": 4, "use_orig_params": true}})");
  CHECK(unit_paths(plan) == Names{"", "a", "b"});
  const Warning* split = nullptr;
  for (const auto& x : plan.warnings)
    if (x.message.rfind("ranks would not build the same units", 0) == 0) split = &x;
  REQUIRE(split);
  CHECK(split->kind == "shared_param_across_units");
  CHECK(split->message.find("rank 0 wraps 'b' and rank 2 does not") != std::string::npos);
  // Without use_orig_params every rank counts the whole tensor: no such warning.
  auto flat = plan_of(b, R"({"min_num_params": 20, "fsdp": {"world_size": 4}})");
  for (const auto& x : flat.warnings) CHECK(x.message.find("ranks would not") == std::string::npos);
}
