// FSDP1 refusals (flat_param_refusals) and root warnings on hand-built trees;
// the messages are torch 2.13's, checked against real FSDP in
// tests/differential/test_refusals.py.
#include <doctest/doctest.h>

#include "fsdp1/memory.h"
#include "policy/policy.h"
#include "report/json_writer.h"
#include "tree_builder.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {

Policy with_fix(const Policy& p, const nlohmann::ordered_json& fix) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  if (p.module_classes) j["module_classes"] = *p.module_classes;
  for (auto& [k, v] : fix.items()) {
    if (v.is_array())
      for (auto& x : v) j[k].push_back(x);
    else
      j[k] = v;
  }
  return parse_policy(j.dump(), "fixed.json");
}

}  // namespace

TEST_CASE("LoRA blocks mix frozen and trainable parameters: an FSDP1 error, fixed by wrapping Linear") {
  auto b = lora_blocks();
  auto plan = plan_of(b, R"({"module_classes": ["Block"]})");
  REQUIRE(plan.units.size() == 3);
  CHECK(plan.units[1].trainable_numel == 32);
  CHECK(plan.units[1].frozen_numel == 72);
  CHECK(plan.units[0].frozen_numel == 800);
  CHECK(plan.units[0].trainable_numel == 0);
  const Warning* w = find_warning(plan, "mixed_requires_grad");
  REQUIRE(w);
  CHECK(w->severity == Severity::Error);
  CHECK(plan.has_errors());
  CHECK(w->modules == Names{"layers.0", "layers.1"});
  // The fewer side of each unit: the LoRA weights.
  CHECK(w->params == Names{"layers.0.q.lora_A.default.weight", "layers.0.q.lora_B.default.weight",
                           "layers.1.q.lora_A.default.weight", "layers.1.q.lora_B.default.weight"});
  CHECK(w->message.find("\"Must flatten tensors with uniform `requires_grad` when `use_orig_params=False`\"") !=
        std::string::npos);
  CHECK(w->message.find("104 numel instead of 32 numel") == std::string::npos);  // two units: 208 vs 64
  CHECK(w->message.find("208 numel instead of 64 numel") != std::string::npos);
  CHECK(w->fix == nlohmann::ordered_json::parse(R"({"module_classes": ["torch.nn.modules.linear.Linear"]})"));

  auto fixed = make_plan(b.tree, with_fix(plan.policy, w->fix), "m.pt");
  CHECK(count_warnings(fixed, "mixed_requires_grad") == 0);
  CHECK_FALSE(fixed.has_errors());
}

TEST_CASE("with use_orig_params the mix is a warning, and the whole flat parameter gets a gradient") {
  auto b = lora_blocks();
  auto plan = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"use_orig_params": true, "world_size": 2}})");
  const Warning* w = find_warning(plan, "mixed_requires_grad");
  REQUIRE(w);
  CHECK(w->severity == Severity::Warning);
  CHECK_FALSE(plan.has_errors());
  CHECK(w->message.find("the gradient memory usage will be higher than expected (208 numel instead of 64 numel "
                        "before sharding via reduce-scatter)") != std::string::npos);
  CHECK(w->fix.contains("module_classes"));

  // Units: root (embed, frozen: 800), each block: norm 8 | base 64 | A 16 | B 16, aligned to 4 fp32 elements:
  // offsets 0, 8, 72, 88, total 104, padded to 104; shard 52 per rank.
  const MemoryPlan& m = plan.memory;
  CHECK(m.units[1].flat_numel == 104);
  CHECK(m.units[1].sharded_numel == 52);
  // Gradients: whole shards of the two blocks, none for the frozen root.
  CHECK(m.per_rank.grads_bytes == 2 * 52 * 4);
  // Adam state: rank 0's shard [0, 52) holds norm (8) and 44 of base_layer, all frozen -> no state.
  CHECK(m.per_rank.optimizer_bytes == 0);
}

TEST_CASE("frozen units carry no gradient and no optimizer state") {
  auto b = lora_blocks();
  auto fixed = plan_of(b, R"({"module_classes": ["Block", "Linear"], "fsdp": {"world_size": 2}})");
  CHECK(count_warnings(fixed, "mixed_requires_grad") == 0);
  int64_t trainable_shards = 0, all_shards = 0;
  for (size_t i = 0; i < fixed.units.size(); ++i) {
    all_shards += fixed.memory.units[i].sharded_bytes;
    if (fixed.units[i].trainable_numel > 0) trainable_shards += fixed.memory.units[i].sharded_bytes;
  }
  CHECK(trainable_shards == 4 * 8 * 4);  // four LoRA Linears of 16 elements, 8 per rank
  CHECK(fixed.memory.per_rank.params_bytes == all_shards);
  CHECK(fixed.memory.per_rank.grads_bytes == trainable_shards);
  // Adam: two states, and a 4-byte step per trainable flat parameter.
  CHECK(fixed.memory.per_rank.optimizer_bytes == 2 * trainable_shards + 4 * 4);
  // Ignored frozen parameters: whole on each rank, without gradient or state.
  auto ignored = plan_of(b, R"({"module_classes": ["Block", "Linear"], "ignored_params": ["embed.*"],
                                "fsdp": {"world_size": 2}})");
  CHECK(ignored.memory.per_rank.params_bytes == all_shards - fixed.memory.units[0].sharded_bytes + 800 * 4);
  CHECK(ignored.memory.per_rank.grads_bytes == trainable_shards);
}

TEST_CASE("a float32 parameter among bfloat16 ones: FSDP1's uniform dtype error, fixed by wrapping its module") {
  TreeBuilder b;
  for (std::string i : {"0", "1"}) {
    std::string blk = "blocks." + i;
    if (i == "0") b.add("blocks", "ModuleList");
    b.add(blk, "Block");
    b.add(blk + ".fc", "Linear");
    b.param(blk + ".fc", "weight", {8, 8}, "bfloat16", 2);
    b.add(blk + ".router", "Router");
    b.param(blk + ".router", "weight", {2, 8});
  }
  auto plan = plan_of(b, R"({"module_classes": ["Block"]})");
  const Warning* w = find_warning(plan, "mixed_dtype");
  REQUIRE(w);
  CHECK(w->severity == Severity::Error);
  CHECK(w->modules == Names{"blocks.0", "blocks.1"});
  CHECK(w->params == Names{"blocks.0.router.weight", "blocks.1.router.weight"});
  CHECK(w->message.find("\"Must flatten tensors with uniform dtype but got torch.bfloat16 and torch.float32\"") !=
        std::string::npos);
  CHECK(w->fix == nlohmann::ordered_json::parse(R"({"module_classes": ["Router"]})"));
  CHECK_FALSE(make_plan(b.tree, with_fix(plan.policy, w->fix), "m.pt").has_errors());

  // Held directly by the block beside bf16 ones: no class separates it.
  TreeBuilder direct;
  direct.add("blk", "Block");
  direct.param("blk", "w", {4}, "bfloat16", 2);
  direct.param("blk", "a_log", {4});
  auto p2 = plan_of(direct, R"({"module_classes": ["Block"]})");
  const Warning* w2 = find_warning(p2, "mixed_dtype");
  REQUIRE(w2);
  CHECK(w2->fix.is_null());
  CHECK(w2->message.find("mixed_precision.param_dtype") != std::string::npos);
}

TEST_CASE("integer parameters: FSDP1's message depends on whether one comes first") {
  TreeBuilder first;
  frozen(first, "", "ids", {3}, "int64", 8);
  first.linear("fc", 4, 4);
  auto p1 = plan_of(first, "{}");
  const Warning* w1 = find_warning(p1, "integer_param");
  REQUIRE(w1);
  CHECK(w1->severity == Severity::Error);
  CHECK(w1->params == Names{"ids"});
  CHECK(w1->message.find("\"Cannot flatten integer dtype tensors\"") != std::string::npos);
  CHECK(w1->fix == nlohmann::ordered_json::parse(R"({"ignored_params": ["ids"]})"));
  CHECK(count_warnings(p1, "mixed_dtype") == 0);  // integers are integer_param's

  TreeBuilder later;
  later.linear("fc", 4, 4);
  later.add("emb", "Lookup");
  frozen(later, "emb", "ids", {3}, "int64", 8);
  auto p2 = plan_of(later, "{}");  // kept: the warning points into it
  const Warning* w2 = find_warning(p2, "integer_param");
  REQUIRE(w2);
  CHECK(w2->message.find("\"Must flatten tensors with uniform dtype but got torch.float32 and torch.int64\"") !=
        std::string::npos);
}

TEST_CASE("scalar parameters are refused, named from their unit as FSDP names them") {
  TreeBuilder b;
  b.add("blk", "Block");
  b.linear("blk.fc", 4, 4);
  b.param("blk", "scale", {});
  auto plan = plan_of(b, R"({"module_classes": ["Block"]})");
  const Warning* w = find_warning(plan, "scalar_param");
  REQUIRE(w);
  CHECK(w->severity == Severity::Error);
  CHECK(w->modules == Names{"blk"});
  CHECK(w->params == Names{"blk.scale"});
  CHECK(w->message.find("\"FSDP doesn't support scalar parameters. Change scale to a 1D tensor with numel equal "
                        "to 1.\"") != std::string::npos);
  CHECK(w->fix == nlohmann::ordered_json::parse(R"({"ignored_params": ["blk.scale"]})"));
}

TEST_CASE("a root holding most of the model, with the modules left there and a fix") {
  TreeBuilder b;
  b.add("embed", "Embedding");
  b.param("embed", "weight", {1000, 8});
  b.add("blocks", "ModuleList");
  b.add("blocks.0", "Block");
  b.linear("blocks.0.fc", 8, 8);
  b.linear("head", 8, 4);
  auto plan = plan_of(b, R"({"module_classes": ["Block"]})");
  const Warning* w = find_warning(plan, "root_too_large");
  REQUIRE(w);
  CHECK(w->severity == Severity::Warning);
  CHECK(w->modules == Names{"embed", "head"});
  CHECK(w->message.find("embed (Embedding) 8.00K, head (Linear) 36") != std::string::npos);
  CHECK(w->fix == nlohmann::ordered_json::parse(R"({"module_classes": ["torch.nn.modules.sparse.Embedding"]})"));
  // The threshold is a setting.
  CHECK(count_warnings(plan_of(b, R"({"module_classes": ["Block"], "checks": {"warn_root_share": 1}})"),
                       "root_too_large") == 0);
  // One unit is single_unit's business (and only over 100M parameters).
  CHECK(count_warnings(plan_of(b, "{}"), "root_too_large") == 0);
  CHECK(count_warnings(plan_of(b, "{}"), "single_unit") == 0);
}

TEST_CASE("a tied embedding is not moved out of the root: that would split the tied weights") {
  TreeBuilder b;
  b.add("embed", "Embedding");
  TensorId t = b.param("embed", "weight", {1000, 8});
  b.add("blocks", "ModuleList");
  b.add("blocks.0", "Block");
  b.linear("blocks.0.fc", 8, 8);
  b.add("head", "Linear");
  b.tie("head", "weight", t);
  auto plan = plan_of(b, R"({"module_classes": ["Block"]})");
  const Warning* w = find_warning(plan, "root_too_large");
  REQUIRE(w);
  CHECK(w->fix.is_null());
}

TEST_CASE("a model over 100M parameters as one unit, and the repeated block to wrap") {
  TreeBuilder b;
  b.add("blocks", "ModuleList");
  for (std::string i : {"0", "1", "2"}) {
    b.add("blocks." + i, "Block");
    b.linear("blocks." + i + ".fc", 6000, 6000);
  }
  auto plan = plan_of(b, "{}");
  const Warning* w = find_warning(plan, "single_unit");
  REQUIRE(w);
  CHECK(w->modules == Names{"blocks"});
  CHECK(w->fix == nlohmann::ordered_json::parse(R"({"module_classes": ["Block"]})"));
  CHECK(count_warnings(plan_of(b, R"({"module_classes": ["Block"]})"), "single_unit") == 0);
}

TEST_CASE("FSDP2: the root group stays unsharded too, so both root warnings apply; no FSDP1 refusal") {
  TreeBuilder b;
  b.add("embed", "Embedding");
  b.param("embed", "weight", {1000, 8});
  b.add("blocks", "ModuleList");
  b.add("blocks.0", "Block");
  b.linear("blocks.0.fc", 8, 8);
  b.linear("head", 8, 4);
  auto plan = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"version": 2}})");
  REQUIRE(plan.v2());
  const Warning* w = find_warning(plan, "root_too_large");
  REQUIRE(w);
  CHECK(w->modules == Names{"embed", "head"});
  CHECK(w->fix == nlohmann::ordered_json::parse(R"({"module_classes": ["torch.nn.modules.sparse.Embedding"]})"));
  // A group of two modules (fully_shard([embed, head])) takes both out of the root.
  auto grouped = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"version": 2},
                                "groups": [{"modules": ["embed", "head"]}]})");
  CHECK(count_warnings(grouped, "root_too_large") == 0);

  TreeBuilder big;
  big.add("blocks", "ModuleList");
  for (std::string i : {"0", "1", "2"}) {
    big.add("blocks." + i, "Block");
    big.linear("blocks." + i + ".fc", 6000, 6000);
  }
  auto big_plan = plan_of(big, R"({"fsdp": {"version": 2}})");
  const Warning* s = find_warning(big_plan, "single_unit");
  REQUIRE(s);
  CHECK(s->fix == nlohmann::ordered_json::parse(R"({"module_classes": ["Block"]})"));

  // FSDP2 keeps parameters apart: a LoRA mix of frozen and trainable is no refusal there.
  auto lora = lora_blocks();
  CHECK(count_warnings(plan_of(lora, R"({"module_classes": ["Block"], "fsdp": {"version": 2}})"),
                       "mixed_requires_grad") == 0);
}

TEST_CASE("requires_grad and trainable/frozen counts are in the JSON; fail_on takes the new kinds") {
  auto b = lora_blocks();
  auto j = plan_to_json(plan_of(b, R"({"module_classes": ["Block"]})"));
  CHECK(j["units"][0]["params"][0]["requires_grad"] == false);
  CHECK(j["units"][1]["trainable_numel"] == 32);
  CHECK(j["units"][1]["frozen_numel"] == 72);
  bool has_fix = false;
  for (auto& w : j["warnings"]) has_fix = has_fix || w.contains("fix");
  CHECK(has_fix);
  for (auto k : {"mixed_requires_grad", "mixed_dtype", "integer_param", "scalar_param", "root_too_large", "single_unit"})
    CHECK(fail_on_error(k).empty());
}
