// Which modules get wrapped: PyTorch's _recursive_wrap (torch/distributed/fsdp/wrap.py).
#include <doctest/doctest.h>

#include "fsdp1/select.h"
#include "tree_builder.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {
// a: Linear(10, 10); b: a container of two Linear(10, 10); 110 params each.
TreeBuilder three_linears(const std::string& container) {
  TreeBuilder b;
  b.linear("a", 10, 10).add("b", container).linear("b.0", 10, 10).linear("b.1", 10, 10);
  return b;
}
}  // namespace

TEST_CASE("subtree numel counts each tensor once and leaves ignored parameters out") {
  TreeBuilder b;
  b.add("enc", "Block").add("enc.emb", "Embedding").add("dec", "Block").add("dec.head", "Linear");
  TensorId w = b.param("enc.emb", "weight", {10, 10});
  b.tie("dec.head", "weight", w);
  TensorId bias = b.param("dec.head", "bias", {10});
  std::vector<bool> ignored(b.tree.num_tensors(), false);
  auto n = subtree_numel(b.tree, ignored);
  CHECK(n[0] == 110);  // the tied weight once
  CHECK(n[static_cast<size_t>(b.id("enc"))] == 100);
  CHECK(n[static_cast<size_t>(b.id("dec"))] == 110);
  CHECK(n[static_cast<size_t>(b.id("dec.head"))] == 110);
  ignored[static_cast<size_t>(bias)] = true;
  n = subtree_numel(b.tree, ignored);
  CHECK(n[0] == 100);
  CHECK(n[static_cast<size_t>(b.id("dec"))] == 100);
}

TEST_CASE("no wrapping policy: the root is the only unit") {
  auto b = three_linears("Sequential");
  auto plan = plan_of(b, "{}");
  CHECK(unit_paths(plan) == Names{""});
  CHECK(param_names(plan, 0) == Names{"a.weight", "a.bias", "b.0.weight", "b.0.bias", "b.1.weight", "b.1.bias"});
}

TEST_CASE("module_classes wraps every instance, the root keeps the rest") {
  auto b = three_linears("Sequential");
  auto plan = plan_of(b, R"({"module_classes": ["Linear"]})");
  CHECK(unit_paths(plan) == Names{"", "a", "b.0", "b.1"});
  CHECK(param_names(plan, 0).empty());
  CHECK(param_names(plan, 2) == Names{"b.0.weight", "b.0.bias"});
  CHECK(plan.units[2].parent == 0);
  CHECK(plan.units[2].depth == 1);
}

TEST_CASE("size-based: leaves big enough are wrapped, then remainders") {
  auto b = three_linears("Sequential");
  CHECK(units_of(b, R"({"min_num_params": 100})") == Names{"", "a", "b.0", "b.1"});
  // 150: no Linear is big enough alone, but b's remainder (220) is.
  auto big = plan_of(b, R"({"min_num_params": 150})");
  CHECK(unit_paths(big) == Names{"", "b"});
  CHECK(param_names(big, 0) == Names{"a.weight", "a.bias"});
  CHECK(param_names(big, 1) == Names{"b.0.weight", "b.0.bias", "b.1.weight", "b.1.bias"});
  // Exactly at the threshold counts as large (>=).
  CHECK(units_of(b, R"({"min_num_params": 110})").size() == 4);
  CHECK(units_of(b, R"({"min_num_params": 111})") == Names{"", "b"});
}

TEST_CASE("size-based never wraps ModuleList/ModuleDict unless told otherwise") {
  CHECK(units_of(three_linears("ModuleList"), R"({"min_num_params": 150})") == Names{""});
  CHECK(units_of(three_linears("ModuleDict"), R"({"min_num_params": 150})") == Names{""});
  CHECK(units_of(three_linears("ModuleList"), R"({"min_num_params": 150, "exclude_wrap_modules": []})") ==
        Names{"", "b"});
}

TEST_CASE("size-based does not look inside MultiheadAttention, unless another policy part recurses") {
  TreeBuilder b;
  b.add("attn", "MultiheadAttention");
  b.param("attn", "in_proj_weight", {30, 10});
  b.linear("attn.out_proj", 10, 10, "NonDynamicallyQuantizableLinear");
  auto plan = plan_of(b, R"({"min_num_params": 100})");
  CHECK(unit_paths(plan) == Names{""});
  CHECK(param_names(plan, 0) == Names{"attn.in_proj_weight", "attn.out_proj.weight", "attn.out_proj.bias"});
  CHECK(units_of(b, R"({"min_num_params": 100, "force_leaf_modules": []})") ==
        Names{"", "attn", "attn.out_proj"});
  // _or_policy: module_classes always says recurse, so force_leaf no longer stops the descent;
  // out_proj is a Linear by inheritance, and attn's remainder (300) is large.
  CHECK(units_of(b, R"({"min_num_params": 100, "module_classes": ["Linear"]})") ==
        Names{"", "attn", "attn.out_proj"});
}

TEST_CASE("tied weights make the remainder negative, as PyTorch computes it") {
  // mid holds enc.emb and dec.head sharing one weight: mid's numel is 100, but its
  // children report 100 + 100 wrapped, so its remainder is -100 and min 0 does not wrap it.
  TreeBuilder b;
  b.add("mid", "Sequential").add("mid.enc", "Block").add("mid.enc.emb", "Embedding");
  b.add("mid.dec", "Block").add("mid.dec.head", "Linear");
  TensorId w = b.param("mid.enc.emb", "weight", {10, 10});
  b.tie("mid.dec.head", "weight", w);
  auto plan = plan_of(b, R"({"min_num_params": 0})");
  CHECK(unit_paths(plan) == Names{"", "mid.enc", "mid.enc.emb", "mid.dec", "mid.dec.head"});
  CHECK(param_names(plan, 2) == Names{"mid.enc.emb.weight"});
  CHECK(param_names(plan, 4) == Names{"mid.dec.head.weight"});  // FSDP1 flattens a copy there
}

TEST_CASE("ignored parameters do not count toward size") {
  TreeBuilder b;
  b.linear("x", 2, 2);  // 4 + 2
  CHECK(units_of(b, R"({"min_num_params": 5})") == Names{"", "x"});
  CHECK(units_of(b, R"({"min_num_params": 5, "ignored_params": ["x.bias"]})") == Names{""});
}

TEST_CASE("the root is wrapped by the policy or not, and is a unit either way") {
  TreeBuilder b("__torch__.Block");
  b.linear("fc", 2, 2);
  auto plan = plan_of(b, R"({"module_classes": ["Block"]})");
  CHECK(unit_paths(plan) == Names{""});
  CHECK(param_names(plan, 0) == Names{"fc.weight", "fc.bias"});
}
