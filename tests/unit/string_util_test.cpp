#include <doctest/doctest.h>

#include "string_util.h"

using namespace fsdp_plan;

TEST_CASE("glob_match: * spans any run, dots included") {
  CHECK(glob_match("*", ""));
  CHECK(glob_match("*", "a.b.c"));
  CHECK(glob_match("blocks.*.mlp", "blocks.0.mlp"));
  CHECK(glob_match("blocks.*.mlp", "blocks.1.2.mlp"));
  CHECK_FALSE(glob_match("blocks.*.mlp", "blocks.0.mlp.fc"));
  CHECK(glob_match("*.bias", "layer.0.bias"));
  CHECK_FALSE(glob_match("*.bias", "bias"));
  CHECK(glob_match("a*b*c", "aXbYbZc"));
  CHECK_FALSE(glob_match("a*b*c", "aXbYbZ"));
  CHECK(glob_match("exact", "exact"));
  CHECK_FALSE(glob_match("exact", "exactly"));
  // Pathological patterns stay linear-ish: this must simply finish.
  CHECK_FALSE(glob_match("*a*a*a*a*a*a*a*a*b", std::string(2000, 'a')));
}

TEST_CASE("edit distance and suggestions") {
  CHECK(edit_distance("kitten", "sitting") == 3);
  CHECK(edit_distance("Linear", "linear") == 0);
  auto near = closest("min_num_param", {"module_classes", "min_num_params", "ignored_params"});
  REQUIRE(!near.empty());
  CHECK(near[0] == "min_num_params");
  CHECK(closest("zzzzzzzz", {"Linear", "Block"}).empty());
}

TEST_CASE("human-readable sizes") {
  CHECK(format_bytes(12) == "12 B");
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(format_bytes(int64_t{3} << 30) == "3.0 GiB");
  CHECK(format_count(999) == "999");
  CHECK(format_count(1234567) == "1.23M");
  CHECK(format_count(86567656) == "86.57M");
}
