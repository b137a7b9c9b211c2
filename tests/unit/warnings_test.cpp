// The warning table (util/warnings.h): one row per kind, the one way to
// raise a warning, and the policy's fail_on reading its kinds.
#include <doctest/doctest.h>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>

#include "policy/policy.h"
#include "util/warnings.h"

using namespace fsdp_plan;

TEST_CASE("every kind is in the table once") {
  std::set<std::string> seen;
  for (const WarningKind& k : warning_table()) {
    CHECK(seen.insert(k.kind).second);
    CHECK(find_warning_kind(k.kind) == &k);
    if (k.also) CHECK(*k.also != k.severity);
  }
  CHECK(warning_kinds().size() == warning_table().size());
  CHECK(find_warning_kind("no_such_kind") == nullptr);
}

TEST_CASE("make_warning takes the table's severity and refuses what the table lacks") {
  Warning w = make_warning("nested_wrap", "m");
  CHECK(w.kind == "nested_wrap");
  CHECK(w.severity == Severity::Error);
  CHECK(w.message == "m");
  CHECK(make_warning("empty_unit", Severity::Info, "root").severity == Severity::Info);
  CHECK(make_warning("empty_unit", Severity::Warning, "unit").severity == Severity::Warning);
  CHECK_THROWS_AS(make_warning("empty_unit", Severity::Error, "x"), std::logic_error);
  CHECK_THROWS_AS(make_warning("no_such_kind", "x"), std::logic_error);
}

TEST_CASE("fail_on accepts exactly the table's kinds and any") {
  for (const std::string& kind : warning_kinds()) CHECK(fail_on_error(kind).empty());
  CHECK(fail_on_error("any").empty());
  CHECK(fail_on_error("nested_wrapp").find("did you mean \"nested_wrap\"") != std::string::npos);
}

TEST_CASE("docs/warnings.md lists exactly the table's kinds, with their severities") {
  std::ifstream in(std::string(FSDP_PLAN_SOURCE_DIR) + "/docs/warnings.md");
  REQUIRE(in);
  std::stringstream text;
  text << in.rdbuf();
  // Rows: | `kind` | severity, maybe with the other one said | when |
  const std::regex row(R"(\n\| `([a-z0-9_]+)` \| ([^|]+) \|)");
  std::map<std::string, std::string> documented;
  const std::string doc = text.str();
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), row); it != std::sregex_iterator(); ++it)
    CHECK(documented.emplace((*it)[1], (*it)[2]).second);  // each kind once
  for (const WarningKind& k : warning_table()) {
    const std::string kind = k.kind;
    CAPTURE(kind);
    auto d = documented.find(k.kind);
    REQUIRE(d != documented.end());
    CHECK(d->second.rfind(severity_name(k.severity), 0) == 0);
    if (k.also) CHECK(d->second.find(severity_name(*k.also)) != std::string::npos);
  }
  CHECK(documented.size() == warning_table().size());
}
