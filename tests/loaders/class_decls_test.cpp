// Unit tests for the code/ class header parser (no torch needed).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "model/loaders/class_decls.h"

using fsdp_plan::parse_class_decls;

namespace {

const fsdp_plan::ClassDecl& at(const fsdp_plan::ClassDecls& decls, const std::string& name) {
  const fsdp_plan::ClassDecl* d = fsdp_plan::find_class(decls, name);
  REQUIRE(d);
  return *d;
}

std::vector<std::string> names(const fsdp_plan::ClassDecl& d) {
  std::vector<std::string> out;
  for (const auto& a : d.attributes) out.push_back(a.name);
  return out;
}

}  // namespace

TEST_CASE("module header: attributes in order, flags by name, constants skipped") {
  const char* src =
      "class Linear(Module):\n"
      "  __parameters__ = [\"weight\", \"bias\", ]\n"
      "  __buffers__ = []\n"
      "  weight : Tensor\n"
      "  bias : NoneType\n"
      "  training : bool\n"
      "  in_features : Final[int] = 4\n"
      "  __annotations__[\"0\"] = __torch__.torch.nn.modules.linear.Linear\n"
      "  def forward(self: __torch__.Linear,\n"
      "    input: Tensor) -> Tensor:\n"
      "    x : int = 3\n"
      "    return torch.linear(input, self.weight, self.bias)\n"
      "class Plain:\n"
      "  t : Tensor\n"
      "  def __setstate__(self: __torch__.Plain, s: Tuple[Tensor]) -> NoneType:\n"
      "    return None\n"
      "def helper(x: int) -> int:\n"
      "  y : int = 1\n"
      "  return x\n";
  auto classes = parse_class_decls(src);
  REQUIRE(classes.size() == 2);
  const auto& lin = at(classes, "Linear");
  CHECK(lin.is_module);
  CHECK_FALSE(lin.has_setstate);
  CHECK(names(lin) == std::vector<std::string>{"weight", "bias", "training", "0"});
  CHECK(lin.attributes[0].type == "Tensor");
  CHECK(lin.attributes[3].type == "__torch__.torch.nn.modules.linear.Linear");
  CHECK(lin.attributes[0].is_param);
  CHECK(lin.attributes[1].is_param);
  CHECK_FALSE(lin.attributes[2].is_param);
  CHECK_FALSE(lin.attributes[3].is_buffer);
  const auto& plain = at(classes, "Plain");
  CHECK_FALSE(plain.is_module);
  CHECK(plain.has_setstate);
  CHECK(names(plain) == std::vector<std::string>{"t"});
}

TEST_CASE("buffers and escaped names") {
  auto classes = parse_class_decls(
      "class B(Module):\n"
      "  __parameters__ = []\n"
      "  __buffers__ = [\"running_mean\", \"a\\\"b\", ]\n"
      "  running_mean : Tensor\n"
      "  __annotations__[\"a\\\"b\"] = Tensor\n");
  const auto& b = at(classes, "B");
  REQUIRE(b.attributes.size() == 2);
  CHECK(b.attributes[0].is_buffer);
  CHECK(b.attributes[1].name == "a\"b");
  CHECK(b.attributes[1].is_buffer);
}

TEST_CASE("classes in order of first declaration; a class declared again keeps the later body") {
  auto classes = parse_class_decls(
      "class A(Module):\n"
      "  x : Tensor\n"
      "class B:\n"
      "  y : int\n"
      "class A:\n"
      "  z : Tensor\n");
  REQUIRE(classes.size() == 2);
  CHECK(classes[0].first == "A");
  CHECK(classes[1].first == "B");
  CHECK_FALSE(at(classes, "A").is_module);
  CHECK(names(at(classes, "A")) == std::vector<std::string>{"z"});
  CHECK(fsdp_plan::find_class(classes, "C") == nullptr);
}

TEST_CASE("malformed input throws") {
  CHECK_THROWS(parse_class_decls("class (Module):\n"));
  CHECK_THROWS(parse_class_decls("class A(Module):\n  __parameters__ = [\"w\n"));
  CHECK_THROWS(parse_class_decls("class A(Module):\n  __annotations__[x] = Tensor\n"));
}
