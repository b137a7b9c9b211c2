#include <doctest/doctest.h>

#include "util/strings.h"

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

TEST_CASE("parse_size reads plain, decimal and binary sizes") {
  CHECK(parse_size("0") == 0);
  CHECK(parse_size("1073741824") == int64_t{1} << 30);
  CHECK(parse_size("80GiB") == int64_t{80} << 30);
  CHECK(parse_size("80 GiB") == int64_t{80} << 30);
  CHECK(parse_size("80gib") == int64_t{80} << 30);
  CHECK(parse_size("80GB") == int64_t{80} * 1000 * 1000 * 1000);
  CHECK(parse_size("80G") == int64_t{80} * 1000 * 1000 * 1000);
  CHECK(parse_size("1.5TiB") == (int64_t{3} << 40) / 2);
  CHECK(parse_size("0.3GB") == 300000000);  // exact, not 299999999
  CHECK(parse_size("512k") == 512000);
  CHECK(parse_size("512KiB") == 524288);
  CHECK(parse_size("12B") == 12);
  CHECK(parse_size("1.0001KiB") == 1024);  // rounds to the nearest byte
  CHECK(parse_size("7PiB") == int64_t{7} << 50);
}

TEST_CASE("parse_size rejects what is not a size") {
  CHECK_FALSE(parse_size(""));
  CHECK_FALSE(parse_size("GiB"));
  CHECK_FALSE(parse_size("-1"));
  CHECK_FALSE(parse_size("1.5"));  // a fraction of a byte
  CHECK_FALSE(parse_size("1.5B"));
  CHECK_FALSE(parse_size("80XB"));
  CHECK_FALSE(parse_size("80 GiB extra"));
  CHECK_FALSE(parse_size("1.2.3G"));
  CHECK_FALSE(parse_size("8EiB"));                      // no exbibytes
  CHECK_FALSE(parse_size("9223372036854775808"));      // int64 max + 1
  CHECK(parse_size("9223372036854775807") == INT64_MAX);
  CHECK_FALSE(parse_size("100000PiB"));
  CHECK_FALSE(parse_size("123456789012345678901"));    // too many digits
}

TEST_CASE("listing shows the first few; join shows all") {
  const std::vector<std::string> five = {"a", "b", "c", "d", "e"};
  CHECK(listing(five) == "a, b, c and 2 more");
  CHECK(listing(five, 5) == "a, b, c, d, e");
  CHECK(join(five) == "a, b, c, d, e");
  CHECK(join(five, "; ") == "a; b; c; d; e");
  CHECK(join({}) == "");
  CHECK(join({"only"}) == "only");
  // An empty item keeps its place (the root's path is empty).
  CHECK(join({"", "lm_head"}) == ", lm_head");
}
