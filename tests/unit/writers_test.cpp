#include <doctest/doctest.h>

#include <set>
#include <sstream>
#include <string>

#include "report/json_writer.h"
#include "report/text_writer.h"
#include "tree_builder.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {
TreeBuilder model() {
  TreeBuilder b("__torch__.___torch_mangle_2.Net");
  b.add("body", "Block");
  b.linear("body.fc", 4, 4);
  b.add("bn", "BatchNorm1d");
  b.param("bn", "weight", {4});
  b.buffer("bn", "running_mean", {4});
  return b;
}
}  // namespace

TEST_CASE("the JSON plan has the schema_version 2 fields") {
  auto b = model();
  auto plan = make_plan(b.tree, policy(R"({"module_classes": ["Block"], "mixed_precision": {}})"), "m.pt");
  auto j = plan_to_json(plan);
  CHECK(j["schema_version"] == 2);
  CHECK(j["model"]["path"] == "m.pt");
  CHECK(j["model"]["root_class"] == "Net");
  CHECK(j["model"]["num_modules"] == 4);
  CHECK(j["model"]["param_numel"] == 24);
  CHECK(j["model"]["buffer_numel"] == 4);
  CHECK(j["policy"]["module_classes"][0] == "Block");
  REQUIRE(j["units"].size() == 3);
  const auto& root = j["units"][0];
  CHECK(root["index"] == 0);
  CHECK(root["path"] == "");
  CHECK(root["class"] == "Net");
  CHECK(root["qualified_class"] == "Net");
  CHECK(root["parent"].is_null());
  CHECK(root["depth"] == 0);
  CHECK(root["mixed_precision"] == true);
  const auto& body = j["units"][1];
  CHECK(body["path"] == "body");
  CHECK(body["parent"] == 0);
  CHECK(body["depth"] == 1);
  CHECK(body["param_numel"] == 20);
  CHECK(body["param_bytes"] == 80);
  CHECK(body["params"][0]["name"] == "body.fc.weight");
  CHECK(body["params"][0]["shape"] == nlohmann::json::array({4, 4}));
  CHECK(body["params"][0]["dtype"] == "float32");
  CHECK(body["params"][0]["numel"] == 16);
  const auto& bn = j["units"][2];
  CHECK(bn["class"] == "BatchNorm1d");
  CHECK(bn["qualified_class"] == "torch.nn.modules.batchnorm.BatchNorm1d");
  CHECK(bn["mixed_precision"] == false);
  CHECK(bn["buffers"][0]["name"] == "bn.running_mean");
  CHECK(bn["buffer_bytes"] == 16);
  bool found = false;
  for (const auto& w : j["warnings"])
    if (w["kind"] == "mixed_precision_override") {
      found = true;
      CHECK(w["severity"] == "warning");
      CHECK(w["classes"][0] == "BatchNorm1d");
    }
  CHECK(found);
}

TEST_CASE("the same input gives byte-identical output") {
  auto b1 = model();
  auto b2 = model();
  auto p1 = make_plan(b1.tree, policy(R"({"module_classes": ["Block"]})"), "m.pt");
  auto p2 = make_plan(b2.tree, policy(R"({"module_classes": ["Block"]})"), "m.pt");
  CHECK(plan_to_json(p1).dump(1) == plan_to_json(p2).dump(1));
  CHECK(plan_to_text(p1) == plan_to_text(p2));
}

TEST_CASE("the text plan fits in 100 columns and names units, totals and warnings") {
  auto b = model();
  auto plan = make_plan(b.tree, policy(R"({"module_classes": ["Block", "Missing"]})"), "m.pt");
  std::string text = plan_to_text(plan);
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    CHECK(end - start <= 100);
    start = end + 1;
  }
  CHECK(text.find("(root)") != std::string::npos);
  CHECK(text.find("body") != std::string::npos);
  CHECK(text.find("2 units") != std::string::npos);
  CHECK(text.find("unmatched_class") != std::string::npos);
}

TEST_CASE("shorten_path drops middle names, longest first, keeping both ends and the indices") {
  const std::string p = "blocks.0.layers.1.layers.window_attention";
  CHECK(shorten_path(p, 100) == p);
  CHECK(shorten_path(p, 36) == "blocks.0.*.1.layers.window_attention");
  CHECK(shorten_path(p, 32) == "blocks.0.*.1.*.window_attention");
  CHECK(shorten_path(p, 26) == "blocks.0.*.1.*.window_attention");  // as short as it gets: indices stay
  CHECK(shorten_path("a_very_long_single_name", 5) == "a_very_long_single_name");  // nothing to drop
}

TEST_CASE("text rows stay distinct and complete: long paths (maxvit_t's), whole class names, --wide") {
  // maxvit_t's shape: blocks.N.layers.M.layers.{MBconv,window_attention,grid_attention}.
  TreeBuilder b("__torch__.torchvision.models.maxvit.MaxVit");
  b.add("blocks", "ModuleList");
  for (const char* i : {"0", "1"}) {
    const std::string blk = std::string("blocks.") + i;
    b.add(blk, "__torch__.torchvision.models.maxvit.MaxVitBlock").add(blk + ".layers", "ModuleList");
    for (const char* j : {"0", "1"}) {
      const std::string layer = blk + ".layers." + j;
      b.add(layer, "__torch__.torchvision.models.maxvit.MaxVitLayer").add(layer + ".layers", "Sequential");
      for (const char* part : {"window_attention", "grid_attention"}) {
        const std::string p = layer + ".layers." + part;
        b.add(p, "__torch__.torchvision.models.maxvit.PartitionAttentionLayer");
        b.param(p, "w", {4});
      }
    }
  }
  auto plan = make_plan(b.tree, policy(R"({"module_classes": ["PartitionAttentionLayer"]})"), "m.pt");
  auto rows = [](const std::string& text) {
    std::vector<std::string> out;
    size_t at = text.find("   #  unit");
    for (size_t end = text.find('\n', at); (at = end + 1) < text.size() && text[at] != '\n'; end = text.find('\n', at))
      out.push_back(text.substr(at, text.find('\n', at) - at));
    return out;
  };
  // 100 columns: paths lose middle names, never the indices; classes stay whole.
  std::string narrow = plan_to_text(plan, {100, false});
  auto r = rows(narrow);
  REQUIRE(r.size() == 9);
  CHECK(std::set<std::string>(r.begin(), r.end()).size() == 9);
  CHECK(r[1].find("  blocks.0.*.0.*.window_attention  ") != std::string::npos);
  CHECK(r[8].find("  blocks.1.*.1.*.grid_attention  ") != std::string::npos);
  for (size_t i = 1; i < r.size(); ++i) CHECK(r[i].find("PartitionAttentionLayer ") != std::string::npos);
  for (const auto& row : r) CHECK(row.size() <= 100);
  // Too narrow for that: indices stay, rows stay distinct and aligned, if wider than asked.
  auto tight = rows(plan_to_text(plan, {60, false}));
  CHECK(tight[1].find("  blocks.0.*.0.*.window_attention  ") != std::string::npos);
  CHECK(tight[1].size() == tight[8].size());
  // Wide: everything whole, columns as wide as the content.
  std::string wide = plan_to_text(plan, {100, true});
  CHECK(wide.find("  blocks.1.layers.1.layers.grid_attention  ") != std::string::npos);
  // A wide enough terminal shortens nothing either; --wide also appends each unit's comm/step and
  // exposed est columns (report/time_text.h), so each of its lines starts with the other's.
  std::istringstream narrow_lines(plan_to_text(plan, {200, false})), wide_lines(wide);
  int lines = 0;
  for (std::string a, b; std::getline(narrow_lines, a) && std::getline(wide_lines, b); ++lines)
    CHECK(b.compare(0, a.size(), a) == 0);
  CHECK(lines > 10);
}

TEST_CASE("text rows: colliding shortenings get more room, and no row is shortened that fits the column") {
  // peft LoRA's shape: q_proj.base_layer, q_proj.lora_A.default, q_proj.lora_B.default beside plain projections.
  TreeBuilder b("__torch__.LlamaForCausalLM");
  b.add("model", "__torch__.LlamaModel").add("model.layers", "ModuleList");
  b.add("model.layers.0", "__torch__.LlamaDecoderLayer").add("model.layers.0.self_attn", "__torch__.LlamaAttention");
  b.add("model.layers.0.self_attn.q_proj", "__torch__.peft.Linear");
  for (const char* leaf : {"base_layer", "lora_A", "lora_B"}) {
    std::string p = std::string("model.layers.0.self_attn.q_proj.") + leaf;
    if (std::string(leaf) != "base_layer") {
      b.add(p, "__torch__.torch.nn.modules.container.ModuleDict");
      p += ".default";
    }
    b.add(p, "__torch__.torch.nn.modules.linear.Linear");
    b.param(p, "weight", {4, 4});
  }
  b.add("model.layers.0.mlp", "__torch__.LlamaMLP").add("model.layers.0.mlp.up_proj", "__torch__.torch.nn.modules.linear.Linear");
  b.param("model.layers.0.mlp.up_proj", "weight", {4, 4});
  auto plan = make_plan(b.tree, policy(R"({"module_classes": ["Linear", "LlamaDecoderLayer"]})"), "m.pt");
  std::string text = plan_to_text(plan, {70, false});
  CHECK(text.find("model.layers.0.mlp.up_proj ") != std::string::npos);  // fits: whole
  std::set<std::string> shown;
  for (const char* leaf : {"base_layer", "lora_A", "lora_B"}) {
    size_t at = text.find(leaf);
    REQUIRE(at != std::string::npos);
    size_t start = text.rfind(' ', at) + 1;
    shown.insert(text.substr(start, text.find(' ', at) - start));
  }
  CHECK(shown.size() == 3);  // distinct rows
}

TEST_CASE("warnings of one kind fold into one text line with the count and the first paths (issue 41, item 9)") {
  // A LoRA-like FSDP2 plan: every layer has fp32 adapters beside frozen bf16 weights.
  TreeBuilder b;
  b.add("layers", "ModuleList");
  for (int i = 0; i < 5; ++i) {
    const std::string p = "layers." + std::to_string(i);
    b.add(p, "Block");
    TensorInfo base{{64, 64}, "bfloat16", 2};
    base.requires_grad = false;
    b.tree.add_param(b.id(p), "base", b.tree.add_tensor(base));
    b.param(p, "lora", {4, 64});
  }
  Plan plan = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"version": 2}})");
  REQUIRE(count_warnings(plan, "fsdp2_frozen_dtype") == 5);
  const std::string text = plan_to_text(plan);
  size_t lines = 0;
  for (size_t at = text.find("fsdp2_frozen_dtype"); at != std::string::npos; at = text.find("fsdp2_frozen_dtype", at + 1))
    ++lines;
  CHECK(lines == 1);
  CHECK(text.find("fsdp2_frozen_dtype (x5: layers.0, layers.1, layers.2, ...; --format json lists each)") !=
        std::string::npos);
  // JSON keeps every instance.
  size_t in_json = 0;
  const auto json = plan_to_json(plan);
  for (const auto& w : json.at("warnings"))
    if (w.at("kind").get<std::string>() == "fsdp2_frozen_dtype") ++in_json;
  CHECK(in_json == 5);
}

TEST_CASE("identical consecutive unit rows fold into one, --wide unfolds them (issue 41, item 9)") {
  TreeBuilder b;
  b.add("layers", "ModuleList");
  for (int i = 0; i < 8; ++i) b.linear("layers." + std::to_string(i), 16, 16, "Block");
  b.linear("head", 16, 4);
  Plan plan = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"version": 2, "world_size": 2}})");
  const std::string text = plan_to_text(plan);
  CHECK(text.find("layers.0 .. layers.7  x8") != std::string::npos);
  CHECK(text.find("layers.3 ") == std::string::npos);
  // The fully_shard calls they are, as a range: "[a..b]".
  const size_t at = text.find("layers.0 .. layers.7  x8");
  const std::string line = text.substr(at, text.find('\n', at) - at);
  CHECK(line.find("..", line.find("x8")) != std::string::npos);
  TextOptions wide;
  wide.wide = true;
  const std::string unfolded = plan_to_text(plan, wide);
  CHECK(unfolded.find(" x8") == std::string::npos);
  CHECK(unfolded.find("layers.3 ") != std::string::npos);
}
