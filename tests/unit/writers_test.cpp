#include <doctest/doctest.h>

#include "json_writer.h"
#include "text_writer.h"
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

TEST_CASE("the JSON plan has the schema_version 1 fields") {
  auto b = model();
  auto plan = make_plan(b.tree, policy(R"({"module_classes": ["Block"], "mixed_precision": {}})"), "m.pt");
  auto j = plan_to_json(plan);
  CHECK(j["schema_version"] == 1);
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
