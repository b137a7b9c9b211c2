// The HTML page around the plan; the page itself is tested in chromium (tests/browser).
#include <doctest/doctest.h>

#include "report/html_writer.h"
#include "report/json_writer.h"
#include "tree_builder.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {
std::string embedded_json(const std::string& page) {
  const std::string open = R"(<script type="application/json" id="plan-data">)";
  const size_t from = page.find(open);
  REQUIRE(from != std::string::npos);
  const size_t begin = from + open.size(), end = page.find("</script>", begin);
  REQUIRE(end != std::string::npos);
  return page.substr(begin, end - begin);
}
}  // namespace

TEST_CASE("the page embeds the plan's JSON, and a path cannot close its script element") {
  TreeBuilder b;
  b.add("a</script><script>alert(1)</script>", "Block");
  b.param("a</script><script>alert(1)</script>", "w", {3});
  Plan plan = make_plan(b.tree, policy(R"({"module_classes": ["Block"]})"), "<!--m.pt");
  const auto json = plan_to_json(plan);
  const std::string page = plan_to_html(json);
  const std::string data = embedded_json(page);
  CHECK(data.find('<') == std::string::npos);
  CHECK(nlohmann::ordered_json::parse(data) == json);
  CHECK(page.find("@PLAN_JSON@") == std::string::npos);
  CHECK(page.rfind("</html>") != std::string::npos);
}

TEST_CASE("the page carries its libraries and their licences, and forbids requests") {
  TreeBuilder b;
  b.param("", "w", {2});
  const std::string page = plan_to_html(plan_to_json(make_plan(b.tree, policy("{}"), "m.pt")));
  CHECK(page.find("d3-hierarchy") != std::string::npos);
  CHECK(page.find("ISC") != std::string::npos);
  CHECK(page.find("Content-Security-Policy\" content=\"default-src 'none'") != std::string::npos);
  CHECK(page.find("src=\"http") == std::string::npos);
}
