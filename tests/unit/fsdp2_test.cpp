// FSDP2 (fully_shard): call selection and order, what each call manages,
// refusals and memory (torch/distributed/fsdp/_fully_shard/; docs/memory-model.md "FSDP2").
#include <doctest/doctest.h>

#include "fsdp2/memory.h"
#include "report/json_writer.h"
#include "report/text_writer.h"
#include "tree_builder.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {

// emb (Embedding 10x4), layers (ModuleList) of two Blocks (fc: Linear 4->4), norm, head tied to emb.
TreeBuilder tied_lm() {
  TreeBuilder b("__torch__.LM");
  b.add("emb", "Embedding");
  TensorId w = b.param("emb", "weight", {10, 4});
  b.add("layers", "ModuleList");
  for (const char* i : {"0", "1"}) {
    std::string p = std::string("layers.") + i;
    b.add(p, "Block");
    b.linear(p + ".fc", 4, 4);
  }
  b.add("norm", "LayerNorm");
  b.param("norm", "weight", {4});
  b.add("head", "Linear");
  b.tie("head", "weight", w);
  return b;
}

const char* kBlocks = R"({"module_classes": ["Block"], "fsdp": {"version": 2, "world_size": 3}})";

}  // namespace

TEST_CASE("fsdp2: one call per selected module, bottom-up, the root last; units in forward order") {
  auto b = tied_lm();
  auto plan = plan_of(b, kBlocks);
  CHECK(plan.v2());
  CHECK(unit_paths(plan) == Names{"", "layers.0", "layers.1"});
  CHECK(plan.units[0].call == 2);
  CHECK(plan.units[1].call == 0);
  CHECK(plan.units[2].call == 1);
  CHECK(plan.units[1].parent == 0);
  CHECK(plan.units[1].depth == 1);
  // The root's call manages what no earlier call did, in post-order (children first).
  CHECK(param_names(plan, 0) == Names{"emb.weight", "norm.weight"});
  CHECK(param_names(plan, 1) == Names{"layers.0.fc.weight", "layers.0.fc.bias"});
  CHECK(plan.units[0].reshard_after_forward->kind == ReshardAfterForward::Kind::False);
  CHECK(plan.units[1].reshard_after_forward->kind == ReshardAfterForward::Kind::True);
  CHECK_FALSE(plan.has_errors());
}

TEST_CASE("fsdp2: a parameter tied across two calls is managed by both, and refused") {
  auto b = tied_lm();
  auto plan = plan_of(b, R"({"fsdp": {"version": 2}, "groups": [{"modules": ["emb"]}]})");
  CHECK(unit_paths(plan) == Names{"", "emb"});
  CHECK(param_names(plan, 0) == Names{"layers.0.fc.weight", "layers.0.fc.bias", "layers.1.fc.weight",
                                      "layers.1.fc.bias", "norm.weight", "head.weight"});
  CHECK(param_names(plan, 1) == Names{"emb.weight"});
  const Warning* w = find_warning(plan, "fsdp2_shared_param");
  REQUIRE(w);
  CHECK(w->severity == Severity::Error);
  CHECK(w->params == Names{"head.weight", "emb.weight"});
  CHECK(w->message.find("2.13") != std::string::npos);
  CHECK(w->message.find("fully_shard([a, b])") != std::string::npos);
}

TEST_CASE("fsdp2: a group of several modules is one call with its own reshard_after_forward") {
  auto b = tied_lm();
  auto plan = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"version": 2},
      "groups": [{"modules": ["emb", "head"], "reshard_after_forward": false}]})");
  CHECK(unit_paths(plan) == Names{"", "emb", "layers.0", "layers.1"});
  CHECK(plan.units[1].modules.size() == 2);
  CHECK(param_names(plan, 1) == Names{"emb.weight"});  // duplicates removed within the call
  CHECK(param_names(plan, 0) == Names{"norm.weight"});
  CHECK(plan.units[1].reshard_after_forward->kind == ReshardAfterForward::Kind::False);
  CHECK(plan.units[1].call == 2);  // at the post-order position of its last module, head
  CHECK_FALSE(plan.has_errors());
}

TEST_CASE("fsdp2: min_num_params follows Accelerate's rule: the whole count, strictly greater") {
  auto b = tied_lm();
  // emb, layers and head (tied to emb) hold 40 each, each Block and its fc 20, norm 4.
  auto plan = plan_of(b, R"({"min_num_params": 20, "fsdp": {"version": 2}})");
  CHECK(unit_paths(plan) == Names{"", "emb", "layers", "head"});
  CHECK(count_warnings(plan, "fsdp2_container") == 1);  // layers is a ModuleList
  CHECK(count_warnings(plan, "fsdp2_shared_param") == 1);  // emb and head in two calls
  CHECK(units_of(b, R"({"min_num_params": 19, "fsdp": {"version": 2}})") ==
        Names{"", "emb", "layers", "layers.0", "layers.0.fc", "layers.1", "layers.1.fc", "head"});
}

TEST_CASE("fsdp2: a container class a .pt2 only infers warns, never refuses (issue 24)") {
  auto b = tied_lm();
  auto plan = plan_of(b, R"({"min_num_params": 20, "fsdp": {"version": 2}})");
  const Warning* recorded = find_warning(plan, "fsdp2_container");
  REQUIRE(recorded);
  CHECK(recorded->severity == Severity::Error);
  // The same tree as torch.export writes it: layers never ran, its class guessed from its children.
  b.tree.module(b.id("layers")).class_source = ClassSource::Inferred;
  plan = plan_of(b, R"({"min_num_params": 20, "fsdp": {"version": 2}})");
  const Warning* w = find_warning(plan, "fsdp2_container");
  REQUIRE(w);
  CHECK(w->severity == Severity::Warning);
  CHECK(w->message.find("inferred as ModuleList") != std::string::npos);
  CHECK(w->message.find("stay sharded") != std::string::npos);  // the call manages nothing else: layers' own
  CHECK(count_warnings(plan, "fsdp2_not_called") == 0);
  // A never-called module with parameters of its own, sharded alone: its group is never gathered.
  b.tree.module(b.id("norm")).class_source = ClassSource::Unrecorded;
  plan = plan_of(b, R"({"fsdp": {"version": 2}, "groups": [{"modules": ["norm"]}]})");
  w = find_warning(plan, "fsdp2_not_called");
  REQUIRE(w);
  CHECK(w->severity == Severity::Warning);
  CHECK(w->modules == Names{"norm"});
  // In a group with a module that runs, the group is gathered when that one does.
  plan = plan_of(b, R"({"fsdp": {"version": 2}, "groups": [{"modules": ["norm", "layers.0"]}]})");
  CHECK(count_warnings(plan, "fsdp2_not_called") == 0);
}

TEST_CASE("fsdp2 text table: the trailing column has a header; a group shows what each module holds") {
  TreeBuilder b("__torch__.LM");
  b.add("emb", "Embedding");
  b.param("emb", "weight", {10, 4});
  b.add("layers", "ModuleList");
  b.add("layers.0", "Block");
  b.linear("layers.0.fc", 4, 4);
  b.add("norm", "LayerNorm");
  b.param("norm", "weight", {4});
  b.linear("head", 4, 10);  // 50 parameters, the group's largest
  auto plan = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"version": 2},
      "groups": [{"modules": ["norm", "head"], "reshard_after_forward": false}]})");
  const std::string text = plan_to_text(plan);
  std::vector<std::string> lines;
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1)
    lines.push_back(text.substr(at, nl - at));
  auto row = [&](const std::string& start) {
    for (const auto& l : lines)
      if (l.compare(0, start.size(), start) == 0) return l;
    return std::string();
  };
  auto words = [](const std::string& l) {  // the columns: what runs of two or more spaces part
    std::vector<std::string> out;
    for (size_t at = 0; at < l.size();) {
      size_t from = l.find_first_not_of(' ', at);
      if (from == std::string::npos) break;
      size_t to = l.find("  ", from);
      if (to == std::string::npos) to = l.size();
      out.push_back(l.substr(from, to - from));
      at = to;
    }
    return out;
  };
  const std::string header = row("   #  unit");
  REQUIRE(!header.empty());
  // Every column has a header, the call and reshard_after_forward too, where the rows have them.
  const std::string root = row("   0  (root)");
  REQUIRE(!root.empty());
  CHECK(header.size() >= root.size() - 6);
  CHECK(header.find("call") != std::string::npos);
  CHECK(header.find("reshard_after_forward") != std::string::npos);
  CHECK(header.find("call") == root.find("[" + std::to_string(plan.units[0].call) + "]"));
  // The group: its row is the group's, its totals the call's; one row per module under it, with its own.
  const std::string group = row("   2    [norm, head]");
  REQUIRE(!group.empty());
  CHECK(words(group)[1] == "[norm, head]");
  CHECK(words(group)[3] == "54");  // 4 + 50
  CHECK(group.find("LayerNorm") == std::string::npos);
  CHECK(words(row("          norm"))[1] == "LayerNorm");
  CHECK(words(row("          norm"))[2] == "4");
  CHECK(words(row("          head"))[1] == "Linear");
  CHECK(words(row("          head"))[2] == "50");
  CHECK(text.find("with head") == std::string::npos);
  CHECK(text.find("largest unit [norm, head] ") != std::string::npos);
}

TEST_CASE("fsdp2: a size policy's refused ModuleList comes with a fix that plans without it (issue 24)") {
  auto b = tied_lm();
  const char* size = R"({"min_num_params": 20, "fsdp": {"version": 2}})";
  auto plan = plan_of(b, size);
  const Warning* w = find_warning(plan, "fsdp2_container");
  REQUIRE(w);
  CHECK(w->severity == Severity::Error);
  CHECK(w->fix == nlohmann::ordered_json::parse(R"({"exclude_wrap_modules": ["torch.nn.ModuleList"]})"));
  CHECK(w->message.find("Accelerate does the same") != std::string::npos);
  CHECK(w->message.find(R"(Fix: add {"exclude_wrap_modules":["torch.nn.ModuleList"]} to the policy)") !=
        std::string::npos);
  // The fix, pasted in: the same threshold, every module over it but the ModuleList.
  auto fixed = plan_of(b, R"({"min_num_params": 20, "exclude_wrap_modules": ["torch.nn.ModuleList"],
      "fsdp": {"version": 2}})");
  CHECK(unit_paths(fixed) == Names{"", "emb", "head"});
  CHECK(count_warnings(fixed, "fsdp2_container") == 0);
  CHECK(fixed.policy.fsdp.v2());
  // Without exclude_wrap_modules, FSDP2's effective policy excludes nothing (FSDP1's defaults are not its).
  CHECK(plan_to_json(plan)["policy"]["exclude_wrap_modules"] == nlohmann::ordered_json::array());
  CHECK(plan_to_json(fixed)["policy"]["exclude_wrap_modules"] == nlohmann::ordered_json::array({"torch.nn.ModuleList"}));
}

TEST_CASE("fsdp2 refusals: 0-dim, mixed trainable dtypes, frozen of another dtype, bad int, unknown path") {
  TreeBuilder b;
  b.add("a", "Block");
  b.param("a", "scale", {});
  b.add("c", "Block");
  b.param("c", "w", {4, 4});
  b.param("c", "v", {4}, "bfloat16", 2);
  b.add("d", "Block");
  b.param("d", "w", {4, 4});
  TensorId frozen = b.param("d", "f", {4}, "bfloat16", 2);
  b.tree.add_tensor({});  // unused
  const_cast<TensorInfo&>(b.tree.tensor(frozen)).requires_grad = false;
  auto plan = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"version": 2, "world_size": 4},
      "groups": [{"modules": ["nope"]}, {"modules": ["d"], "reshard_after_forward": 3}]})");
  CHECK(count_warnings(plan, "fsdp2_scalar_param") == 1);
  CHECK(count_warnings(plan, "fsdp2_mixed_dtype") == 1);
  REQUIRE(find_warning(plan, "fsdp2_frozen_dtype"));
  CHECK(find_warning(plan, "fsdp2_frozen_dtype")->severity == Severity::Warning);
  CHECK(count_warnings(plan, "fsdp2_reshard_ranks") == 1);
  CHECK(count_warnings(plan, "unmatched_group") == 1);
  CHECK(plan.has_errors());
}

TEST_CASE("fsdp2: ignored parameters stay whole; the policy's groups need version 2") {
  auto b = tied_lm();
  auto plan = plan_of(b, R"({"module_classes": ["Block"], "ignored_params": ["norm.*"], "fsdp": {"version": 2}})");
  CHECK(param_names(plan, 0) == Names{"emb.weight"});
  CHECK(policy(R"({"groups": [{"modules": ["emb"]}]})").combination_error().find("FSDP2") != std::string::npos);
  CHECK_THROWS(policy(R"({"groups": [{"modules": ["layers.*"]}]})"));
  CHECK_THROWS(policy(R"({"fsdp": {"version": 3}})"));
  CHECK_THROWS(policy(R"({"fsdp": {"reshard_after_forward": 0}})"));
}

TEST_CASE("fsdp2 memory: dim-0 padded shards, bf16 gather, reduce-scatter in float32") {
  // One Linear(10 -> 7) under the root at world size 4: weight (7,10) -> (2,10), bias (7,) -> (2,).
  TreeBuilder b;
  b.linear("fc", 10, 7);
  auto plan = plan_of(b, R"({"fsdp": {"version": 2, "world_size": 4, "optimizer": "adam"},
      "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}})");
  CHECK(fsdp2_sharded_shape({7, 10}, 4) == std::vector<int64_t>{2, 10});
  CHECK(fsdp2_sharded_shape({3}, 4) == std::vector<int64_t>{1});
  const UnitMemory& um = plan.memory.units[0];
  CHECK(um.sharded_numel == 22);
  CHECK(um.sharded_bytes == 88);
  CHECK(um.unsharded_bytes == 22 * 4 * 2);
  const RankMemory& r = plan.memory.per_rank;
  CHECK(r.params_bytes == 88);
  CHECK(r.grads_bytes == 88);
  CHECK(r.optimizer_bytes == 2 * 88 + 2 * 4);  // exp_avg, exp_avg_sq and a float32 step per parameter
  auto json = plan_to_json(plan);
  CHECK(json["fsdp_version"] == 2);
  CHECK(json["units"][0]["params"][0]["sharded_shape"] == nlohmann::json::array({2, 10}));
  CHECK(json["memory"]["peak"]["categories"].contains("reduce_scatter"));
  CHECK(plan_to_text(plan).find("FSDP2") != std::string::npos);
}

TEST_CASE("fsdp2 memory: frozen parameters get no gradient and no optimizer state; HSDP shards over the group") {
  TreeBuilder b;
  b.linear("fc", 16, 16);
  TensorId f = b.param("fc", "frozen", {16, 16});
  const_cast<TensorInfo&>(b.tree.tensor(f)).requires_grad = false;
  auto plan = plan_of(b, R"({"fsdp": {"version": 2, "world_size": 8, "sharding_strategy": "HYBRID_SHARD",
      "shard_group_size": 4, "optimizer": "sgd-momentum"}})");
  CHECK(plan.memory.shard_group_size == 4);
  CHECK(plan.memory.replicate_size == 2);
  const RankMemory& r = plan.memory.per_rank;
  CHECK(r.params_bytes == (64 + 4 + 64) * 4);
  CHECK(r.grads_bytes == (64 + 4) * 4);
  CHECK(r.optimizer_bytes == (64 + 4) * 4);
}

TEST_CASE("fsdp2 memory: the timeline's largest step is the peak, with its categories; each step sums its categories") {
  auto b = tied_lm();
  auto plan = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"version": 2, "world_size": 3},
      "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}})");
  const MemoryPlan& m = plan.memory;
  REQUIRE_FALSE(m.timeline.empty());
  CHECK(m.timeline.front().phase == "forward");
  CHECK(m.timeline.front().unit == 0);
  CHECK(m.timeline.back().phase == "optimizer step");
  CHECK(m.timeline.back().unit == -1);
  const MemoryStep* peak = nullptr;
  for (const auto& s : m.timeline) {
    int64_t sum = 0;
    for (const auto& [name, bytes] : s.categories) sum += bytes;
    CHECK(sum == s.total_bytes());
    CHECK(s.total_bytes() <= m.per_rank.peak_bytes);
    if (!peak && s.total_bytes() == m.per_rank.peak_bytes) peak = &s;
  }
  REQUIRE(peak);
  CHECK(peak->phase == m.per_rank.peak_phase);
  CHECK(peak->unit == m.per_rank.peak_unit);
  CHECK(peak->categories == m.per_rank.peak_categories);
  // Consecutive events of one unit and phase are one step.
  for (size_t i = 1; i < m.timeline.size(); ++i)
    CHECK_FALSE((m.timeline[i].phase == m.timeline[i - 1].phase && m.timeline[i].unit == m.timeline[i - 1].unit));
}

TEST_CASE("fsdp2 memory: a plan prepared once says for each setting what a plan made with that setting says") {
  auto b = tied_lm();
  TensorId f = b.param("norm", "frozen", {5, 3});
  const_cast<TensorInfo&>(b.tree.tensor(f)).requires_grad = false;
  b.add("scale", "Scale");
  b.param("scale", "weight", {7});  // ignored: whole on every rank
  const Policy base = policy(R"({"module_classes": ["Block"], "ignored_params": ["scale.*"],
      "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}, "fsdp": {"version": 2, "world_size": 3}})");
  const Fsdp2Memory prepared(make_plan(b.tree, base, "m.pt"));
  auto same = [](const MemoryPlan& a, const MemoryPlan& e) {
    CHECK(a.shard_group_size == e.shard_group_size);
    CHECK(a.replicate_size == e.replicate_size);
    REQUIRE(a.units.size() == e.units.size());
    for (size_t i = 0; i < a.units.size(); ++i) {
      CHECK(a.units[i].flat_numel == e.units[i].flat_numel);
      CHECK(a.units[i].sharded_numel == e.units[i].sharded_numel);
      CHECK(a.units[i].sharded_bytes == e.units[i].sharded_bytes);
      CHECK(a.units[i].unsharded_bytes == e.units[i].unsharded_bytes);
      CHECK(a.units[i].compute_itemsize == e.units[i].compute_itemsize);
    }
    const RankMemory &x = a.per_rank, &y = e.per_rank;
    CHECK(x.params_bytes == y.params_bytes);
    CHECK(x.grads_bytes == y.grads_bytes);
    CHECK(x.optimizer_bytes == y.optimizer_bytes);
    CHECK(x.buffers_bytes == y.buffers_bytes);
    CHECK(x.steady_bytes == y.steady_bytes);
    CHECK(x.peak_bytes == y.peak_bytes);
    CHECK(x.peak_phase == y.peak_phase);
    CHECK(x.peak_unit == y.peak_unit);
    CHECK(x.peak_gathered == y.peak_gathered);
    CHECK(x.peak_categories == y.peak_categories);
    CHECK(x.host_bytes == y.host_bytes);
    REQUIRE(a.timeline.size() == e.timeline.size());
    for (size_t i = 0; i < a.timeline.size(); ++i) CHECK(a.timeline[i].categories == e.timeline[i].categories);
    CHECK(a.notes == e.notes);
  };
  for (int64_t world : {1, 2, 3, 8, 64}) {
    for (Optimizer o : {Optimizer::Adam, Optimizer::Sgd}) {
      for (bool offload : {false, true}) {
        for (std::optional<OptimizerImpl> impl :
             {std::optional<OptimizerImpl>(), std::optional<OptimizerImpl>(OptimizerImpl::ForLoop),
              std::optional<OptimizerImpl>(OptimizerImpl::Foreach), std::optional<OptimizerImpl>(OptimizerImpl::Fused)}) {
          Policy p = base;
          p.fsdp.world_size = world;
          p.fsdp.optimizer = o;
          p.fsdp.cpu_offload = offload;
          p.fsdp.optimizer_impl = impl;
          CAPTURE(world);
          same(prepared.estimate(memory_settings(p)), make_plan(b.tree, p, "m.pt").memory);
        }
      }
    }
  }
  Policy hybrid = base;
  hybrid.fsdp.world_size = 8;
  hybrid.fsdp.strategy = ShardingStrategy::HybridShard;
  hybrid.fsdp.shard_group_size = 4;
  same(prepared.estimate(memory_settings(hybrid)), make_plan(b.tree, hybrid, "m.pt").memory);
  CHECK(prepared.estimate(hybrid.fsdp, false).timeline.empty());
  hybrid.fsdp.shard_group_size = 3;  // does not divide 8
  CHECK_THROWS_AS(prepared.estimate(hybrid.fsdp), std::invalid_argument);
}

TEST_CASE("fsdp2: groups name modules by dotted path at any depth; a path that is no module is unmatched") {
  TreeBuilder b;
  b.add("blocks", "ModuleList");
  for (int i = 0; i < 2; ++i) {
    const std::string p = "blocks." + std::to_string(i);
    b.add(p, "Block");
    b.linear(p + ".fc", 4, 4);
  }
  auto plan = plan_of(b, R"({"fsdp": {"version": 2}, "groups": [{"modules": ["blocks.1.fc", "blocks.0"]},
      {"modules": ["blocks.9"]}, {"modules": ["blocks.1.fc.x"]}, {"modules": ["blocks..0"]}, {"modules": ["blocks"]}]})");
  CHECK(unit_paths(plan) == Names{"", "blocks", "blocks.1.fc"});  // a group is named by its first module
  REQUIRE(plan.units.size() == 3);
  CHECK(plan.units[2].modules == std::vector<ModuleId>{b.id("blocks.1.fc"), b.id("blocks.0")});
  CHECK(count_warnings(plan, "unmatched_group") == 3);
}

TEST_CASE("fsdp2_mixed_dtype gives the code of the fix: the fp32 router in a group of its own (issue 41, item 9)") {
  // DeepSeek-V3: transformers keeps mlp.gate.weight (the router) in float32 in a bf16 model.
  TreeBuilder b;
  b.add("layers", "ModuleList");
  for (const char* l : {"layers.0", "layers.1"}) {
    const std::string p = l;
    b.add(p, "Block");
    b.add(p + ".mlp", "MoE");
    b.add(p + ".mlp.up", "Linear");
    b.param(p + ".mlp.up", "weight", {64, 64}, "bfloat16", 2);
    b.add(p + ".mlp.gate", "Router");
    b.param(p + ".mlp.gate", "weight", {8, 64});  // float32
  }
  Plan plan = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"version": 2}})");
  REQUIRE(count_warnings(plan, "fsdp2_mixed_dtype") == 2);
  const Warning* w = nullptr;
  for (const auto& x : plan.warnings)
    if (x.kind == "fsdp2_mixed_dtype" && !w) w = &x;
  CHECK(w->message.find("fix: fully_shard(model.layers[0].mlp.gate) before fully_shard(model.layers[0])") !=
        std::string::npos);
  // The fix as a policy: the routers in groups of their own, first; then no error.
  Plan fixed = plan_of(b, R"({"module_classes": ["Block"], "groups": [{"modules": ["layers.0.mlp.gate"]},
      {"modules": ["layers.1.mlp.gate"]}], "fsdp": {"version": 2}})");
  CHECK(count_warnings(fixed, "fsdp2_mixed_dtype") == 0);
}
