// Module aliases (aliases.h): one module under two names, as T5 and BART in
// transformers 4 register `encoder.embed_tokens = self.shared`.
#include <doctest/doctest.h>

#include "report/json_writer.h"
#include "report/text_writer.h"
#include "tree_builder.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {

// T5's shape: shared (Embedding), encoder/decoder stacks whose embed_tokens is
// `shared` again, and lm_head (Linear), tied to shared.weight if asked: a real tie.
TreeBuilder t5_like(bool tie_head = true) {
  TreeBuilder b("__torch__.T5");
  b.add("shared", "Embedding");
  TensorId w = b.param("shared", "weight", {100, 8});
  for (const char* stack : {"encoder", "decoder"}) {
    std::string s = stack;
    b.add(s, "Stack");
    b.add(s + ".embed_tokens", "Embedding");
    b.tie(s + ".embed_tokens", "weight", w);
    b.add(s + ".block", "ModuleList");
    b.add(s + ".block.0", "Block");
    b.linear(s + ".block.0.fc", 8, 8);
  }
  b.add("lm_head", "Linear");
  if (tie_head)
    b.tie("lm_head", "weight", w);
  else
    b.param("lm_head", "weight", {100, 8});
  return b;
}

// The plan with --aliases.
Plan alias_plan_of(const TreeBuilder& b, const std::string& json) {
  Policy p = policy(json);
  p.module_aliases = true;
  return make_plan(b.tree, p, "m.pt");
}

}  // namespace

TEST_CASE("a module with the same class and the same tensors as an earlier one is its alias") {
  auto b = t5_like();
  auto alias_of = find_aliases(b.tree);
  CHECK(alias_of[static_cast<size_t>(b.id("encoder.embed_tokens"))] == b.id("shared"));
  CHECK(alias_of[static_cast<size_t>(b.id("decoder.embed_tokens"))] == b.id("shared"));
  CHECK(alias_of[static_cast<size_t>(b.id("lm_head"))] == -1);  // a Linear, not the Embedding
  CHECK(alias_of[static_cast<size_t>(b.id("shared"))] == -1);
  CHECK(alias_of[static_cast<size_t>(b.id("decoder.block.0"))] == -1);  // its own tensors
}

TEST_CASE("children must be aliases too, recursively; tensorless twins are not aliases") {
  TreeBuilder b("__torch__.Net");
  b.add("a", "Block");
  b.add("a.fc", "Linear");
  TensorId w = b.param("a.fc", "weight", {4, 4});
  b.add("a.act", "ReLU");
  b.add("b", "Block");  // the same object as a: same children, same tensors
  b.add("b.fc", "Linear");
  b.tie("b.fc", "weight", w);
  b.add("b.act", "ReLU");
  b.add("c", "Block");  // a different fc: not an alias
  b.add("c.fc", "Linear");
  b.param("c.fc", "weight", {4, 4});
  b.add("c.act", "ReLU");
  b.add("d", "Block");  // same fc tensor but under another name: not an alias
  b.add("d.proj", "Linear");
  b.tie("d.proj", "weight", w);
  auto alias_of = find_aliases(b.tree);
  CHECK(alias_of[static_cast<size_t>(b.id("b"))] == b.id("a"));
  CHECK(alias_of[static_cast<size_t>(b.id("b.fc"))] == b.id("a.fc"));
  CHECK(alias_of[static_cast<size_t>(b.id("c"))] == -1);
  CHECK(alias_of[static_cast<size_t>(b.id("d"))] == -1);
  CHECK(alias_of[static_cast<size_t>(b.id("d.proj"))] == b.id("a.fc"));
  CHECK(alias_of[static_cast<size_t>(b.id("c.act"))] == -1);  // two ReLUs: nothing tells them apart
}

TEST_CASE("without --aliases every module is planned, as for transformers 5's ties, with a hint") {
  // The same file as two Embeddings tied by weight (transformers 5's T5):
  // named_modules() lists both, and FSDP may wrap each.
  auto b = t5_like(/*tie_head=*/false);
  auto plan = plan_of(b, R"({"module_classes": ["Embedding", "Block"]})");
  CHECK(unit_paths(plan) == Names{"", "shared", "encoder.embed_tokens", "encoder.block.0", "decoder.embed_tokens",
                                  "decoder.block.0"});
  CHECK(plan.aliases.empty());
  CHECK(plan.tree == &b.tree);
  CHECK(!plan_to_json(plan).contains("aliases"));
  const Warning* w = find_warning(plan, "shared_param_across_units");
  REQUIRE(w != nullptr);
  CHECK(w->message.find("if 'encoder.embed_tokens' is the very module object 'shared' under a second name") !=
        std::string::npos);
  CHECK(w->message.find("plan with --aliases") != std::string::npos);
}

TEST_CASE("with --aliases the plan skips aliases as named_modules() does, and lists them") {
  auto b = t5_like(/*tie_head=*/false);
  auto plan = alias_plan_of(b, R"({"module_classes": ["Embedding", "Block"]})");
  // No unit for encoder.embed_tokens / decoder.embed_tokens: FSDP never visits them.
  CHECK(unit_paths(plan) == Names{"", "shared", "encoder.block.0", "decoder.block.0"});
  CHECK(param_names(plan, 1) == Names{"shared.weight"});
  REQUIRE(plan.aliases.size() == 2);
  CHECK(plan.aliases[0].path == "encoder.embed_tokens");
  CHECK(plan.aliases[0].alias_of == "shared");
  CHECK(plan.model.num_modules == static_cast<int64_t>(b.tree.num_modules()) - 2);
  CHECK(count_warnings(plan, "shared_param_across_units") == 0);
  CHECK(count_warnings(plan, "empty_unit") == 0);

  auto json = plan_to_json(plan);
  CHECK(json["aliases"][1]["path"] == "decoder.embed_tokens");
  CHECK(json["aliases"][1]["alias_of"] == "shared");
  CHECK(plan_to_text(plan).find("aliases encoder.embed_tokens = shared, decoder.embed_tokens = shared") !=
        std::string::npos);
}

TEST_CASE("aliases raise no tied-weight warning; a real tie split across units still does") {
  auto b = t5_like();
  // The stacks as units: their embed_tokens are `shared`, never visited, so no tie is split...
  auto stacks = alias_plan_of(b, R"({"module_classes": ["Stack"]})");
  CHECK(unit_paths(stacks) == Names{"", "encoder", "decoder"});
  CHECK(param_names(stacks, 0) == Names{"shared.weight"});
  CHECK(count_warnings(stacks, "shared_param_across_units") == 0);
  // ...but lm_head in a unit of its own splits a real tie.
  auto head = alias_plan_of(b, R"({"module_classes": ["Stack", "Linear"]})");
  REQUIRE(count_warnings(head, "shared_param_across_units") == 1);
  CHECK(find_warning(head, "shared_param_across_units")->message.find("--aliases") == std::string::npos);
  CHECK(find_warning(head, "shared_param_across_units")->params == Names{"shared.weight", "lm_head.weight"});
}

TEST_CASE("a model without aliases has no aliases field") {
  auto b = two_blocks_and_a_head();
  auto plan = alias_plan_of(b, R"({"module_classes": ["Block"]})");
  CHECK(plan.aliases.empty());
  CHECK(plan.tree == &b.tree);
  CHECK(!plan_to_json(plan).contains("aliases"));
}
