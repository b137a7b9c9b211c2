// The streamed JSON writer (report/json_document.h) and the output writer it
// feeds (util/file_io.h): same bytes as nlohmann's dump(1), nothing partial.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "report/json_document.h"
#include "report/json_writer.h"
#include "tree_builder.h"
#include "util/errors.h"
#include "util/file_io.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;
using ojson = nlohmann::ordered_json;

namespace {

std::string written(const JsonDocument& doc) {
  std::string out;
  doc.write([&out](std::string_view piece) { out.append(piece); });
  return out;
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("json document: written as dump(1) writes it filled, arrays at any depth") {
  JsonDocument doc;
  doc.skeleton = ojson::parse(R"({"a": 1, "list": [], "outer": {"x": "y\n\"z", "inner": {"rows": [], "k": {}},
                                   "empty": []}, "last": [1, {"p": [2, 3]}]})");
  auto row = [](size_t i) { return ojson{{"i", i}, {"nested", {{"deep", ojson::array({i, "s"})}}}, {"none", {}}}; };
  doc.arrays.push_back({{"list"}, 3, row});
  doc.arrays.push_back({{"outer", "inner", "rows"}, 2, row});
  doc.arrays.push_back({{"outer", "empty"}, 0, row});
  const ojson whole = doc.filled();
  CHECK(whole["list"].size() == 3);
  CHECK(whole["outer"]["inner"]["rows"][1]["i"] == 1);
  CHECK(whole["outer"]["empty"] == ojson::array());
  CHECK(written(doc) == whole.dump(1));
  // The key order is the skeleton's, the arrays in their places.
  CHECK(whole.begin().key() == "a");
  CHECK(std::next(whole.begin()).key() == "list");
}

TEST_CASE("json document: a plan written from its document is its JSON's dump(1)") {
  TreeBuilder b;
  b.add("blocks", "ModuleList").add("blocks.0", "Block").add("blocks.1", "Block").add("head", "Linear");
  b.param("blocks.0", "w", {8, 8});
  b.param("blocks.1", "w", {8, 8});
  b.param("head", "weight", {4, 8});
  for (const char* text : {R"({"module_classes": ["Block"]})", R"({"fsdp": {"version": 2}, "module_classes": ["Block"]})"}) {
    const Plan plan = make_plan(b.tree, policy(text), "m.pt");
    CHECK(written(plan_json(plan)) == plan_to_json(plan).dump(1));
  }
}

TEST_CASE("output writer: a file appears whole at commit, and not at all without it") {
  char dir[] = "/tmp/fsdp-plan-out-XXXXXX";
  REQUIRE(::mkdtemp(dir) != nullptr);
  const std::string path = std::string(dir) + "/plan.json";
  {
    OutputWriter out(path, "plan");
    out.write("{");
    out.write(std::string(3 << 20, ' '));  // past one write chunk: already on disk, under the temporary name
    out.write("}");
    CHECK(::access(path.c_str(), F_OK) != 0);
    out.commit();
  }
  CHECK(read_all(path).size() == (3u << 20) + 2);
  {
    OutputWriter out(path, "plan");
    out.write("half");
  }  // an error before commit: the old file stays, and no temporary file is left
  CHECK(read_all(path).size() == (3u << 20) + 2);
  std::remove(path.c_str());
  CHECK(::rmdir(dir) == 0);  // empty: the temporary files are gone
  CHECK_THROWS_AS(OutputWriter("/nonexistent-dir/plan.json", "plan"), InputError);
}
