// The plan's JSON writer (report/json_sink.h, report/json_writer.h) and the
// output writer it feeds (util/file_io.h): the bytes nlohmann's dump(1) gives,
// one source for the value and the text, nothing partial.
#include <doctest/doctest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>

#include "plan/flops.h"
#include "report/json_sink.h"
#include "report/json_writer.h"
#include "tree_builder.h"
#include "util/errors.h"
#include "util/file_io.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;
using ojson = nlohmann::ordered_json;

namespace {

// What a JsonTextSink writes for what `say` says to it.
template <class F>
std::string text_of(F&& say) {
  std::string out;
  size_t pieces = 0;
  JsonTextSink w([&](std::string_view piece) {
    out.append(piece);
    ++pieces;
  });
  say(static_cast<JsonSink&>(w));
  w.flush();
  CHECK(pieces >= 1);
  return out;
}

template <class F>
ojson value_of(F&& say) {
  JsonValueSink w;
  say(static_cast<JsonSink&>(w));
  return w.take();
}

std::string text_of_value(const ojson& v) {
  return text_of([&](JsonSink& w) { w.json(v); });
}

std::string plan_text(const Plan& plan, const ojson& trailing = ojson::object(), PlanJsonOptions options = {}) {
  return text_of([&](JsonSink& w) { plan_json(w, plan, trailing, options); });
}

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Doubles where nlohmann's shortest form has a rule: whole numbers get ".0",
// exponents from 1e21 up and below 1e-5 ("1e+21", "1e-06"), negative zero
// "-0.0", the extremes, and non-finite ones null.
const double kDoubles[] = {0.0, -0.0, 1.0, -1.0, 3.0, 0.1, -1.5, 1.0 / 3.0, 2.5e-7, 1e-5, 1e-6, 123.456,
                           1e15, 1e16, 1e17, 12345678901234567.0, 1e20, 1e21, 1e22, 1.7976931348623157e308,
                           -1.7976931348623157e308, 5e-324, 2.2250738585072014e-308, 8.4e-6, 989.5e12,
                           std::nan(""), std::numeric_limits<double>::infinity(),
                           -std::numeric_limits<double>::infinity()};

// Strings with every escape dump_escaped has, bytes it leaves alone (DEL,
// '/', non-ASCII UTF-8 of 2, 3 and 4 bytes) and the empty string.
const char* const kStrings[] = {"", "plain", "quote \" back\\slash", "\b\t\n\f\r", "\x01\x1f\x0b\x7f/",
                                "caf\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80", "mixed \xc3\xa9\n\"",
                                "blocks.0.attn"};

}  // namespace

TEST_CASE("json text sink: dump(1)'s bytes for every kind of value") {
  ojson v = ojson::object();
  v["empty_object"] = ojson::object();
  v["empty_array"] = ojson::array();
  v["nested_empty"] = ojson::array({ojson::array(), ojson::object(), ojson::array({ojson::object()})});
  v["null"] = nullptr;
  v["bools"] = ojson::array({true, false});
  v["ints"] = ojson::array({0, -1, 42, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()});
  v["unsigned"] = ojson::array({uint64_t{0}, std::numeric_limits<uint64_t>::max()});
  ojson doubles = ojson::array();
  for (double d : kDoubles) doubles.push_back(d);
  v["doubles"] = doubles;
  ojson strings = ojson::object();
  for (const char* s : kStrings) strings[s] = s;  // each as a key and as a value
  v["strings"] = strings;
  v["deep"] = ojson::parse(R"({"a": {"b": {"c": [1, {"d": [[2], []]}, {}]}}})");
  CHECK(text_of_value(v) == v.dump(1));
  for (const ojson& part : v) CHECK(text_of_value(part) == part.dump(1));  // each at the root too
  for (int c = 0; c < 0x80; ++c) {  // every ASCII byte, one at a time
    const ojson s = std::string(1, static_cast<char>(c)) + "x";
    CHECK(text_of_value(s) == s.dump(1));
  }
  for (double d : kDoubles) CHECK(text_of_value(ojson(d)) == ojson(d).dump(1));
  CHECK(text_of_value(ojson(-0.0)) == "-0.0");
  CHECK(text_of_value(ojson(1e21)) == "1e+21");
  CHECK(text_of_value(ojson(3.0)) == "3.0");
}

TEST_CASE("json sinks: the typed calls build the value nlohmann's constructor does, and write its dump(1)") {
  const auto say = [](JsonSink& w) {
    w.object([&] {
      w.field("int", 7);
      w.field("int64", int64_t{-9});
      w.field("size", size_t{3});
      w.field("double", 2.0);
      w.field("third", 1.0 / 3.0);
      w.field("tiny", 5e-324);
      w.field("float", 0.1f);
      w.field("bool", true);
      w.field("literal", "text");
      w.field("string", std::string("s\n\u00e9"));
      w.field("view", std::string_view("v"));
      w.field("none", std::optional<int>());
      w.field("some", std::optional<bool>(false));
      w.field("null", nullptr);
      w.field("shape", std::vector<int64_t>{4, 8});
      w.field("no_names", std::vector<std::string>{});
      w.field("dom", ojson::parse(R"({"x": [1.5, {"y": null}], "z": {}})"));
      w.object_field("empty", [] {});
      w.array_field("rows", [&] {
        for (int i = 0; i < 2; ++i) w.object([&] { w.field("i", i); });
      });
    });
  };
  const ojson expected = {{"int", 7}, {"int64", int64_t{-9}}, {"size", size_t{3}}, {"double", 2.0},
                          {"third", 1.0 / 3.0}, {"tiny", 5e-324}, {"float", 0.1f}, {"bool", true},
                          {"literal", "text"}, {"string", "s\n\u00e9"}, {"view", "v"},
                          {"none", nullptr}, {"some", false}, {"null", nullptr}, {"shape", std::vector<int64_t>{4, 8}},
                          {"no_names", ojson::array()}, {"dom", ojson::parse(R"({"x": [1.5, {"y": null}], "z": {}})")},
                          {"empty", ojson::object()}, {"rows", ojson::array({{{"i", 0}}, {{"i", 1}}})}};
  const ojson built = value_of(say);
  CHECK(built == expected);
  CHECK(built.dump(1) == expected.dump(1));
  // The same number types: a size_t stays unsigned, an int signed, a float a double.
  CHECK(built["size"].is_number_unsigned());
  CHECK(built["int"].is_number_integer());
  CHECK(!built["int"].is_number_unsigned());
  CHECK(built["float"].is_number_float());
  CHECK(text_of(say) == expected.dump(1));
}

TEST_CASE("json text sink: bad UTF-8 throws as dump() does, a long value comes in pieces") {
  // A byte no UTF-8 has, a continuation byte first, a sequence cut short.
  for (const std::string bad : {"ok \xff", "\x80", "x\xc3"}) {
    CHECK_THROWS_AS(ojson(bad).dump(1), nlohmann::json::type_error);
    CHECK_THROWS_AS(text_of([&](JsonSink& w) { w.value(bad); }), nlohmann::json::type_error);
  }
  std::string out;
  size_t pieces = 0;
  JsonTextSink w([&](std::string_view piece) {
    out.append(piece);
    ++pieces;
  });
  ojson rows = ojson::array();
  w.begin_array();
  for (int i = 0; i < 20000; ++i) {
    w.value(std::string("row ") + std::to_string(i));
    rows.push_back(std::string("row ") + std::to_string(i));
  }
  w.end();
  w.flush();
  CHECK(pieces > 2);
  CHECK(out == rows.dump(1));
}

TEST_CASE("json text sink: the word-at-a-time paths agree with dump(1) at every length and position") {
  // Lengths 0..40 cross the 4- and 8-byte words and their overlapping last
  // word; each special byte (and a plain one) at each position, as a key and
  // as a value.
  const char specials[] = {'\x01', '\x1f', '"', '\\', '\n', '\x7f', '!', '#', '[', ']', ' '};
  ojson keys = ojson::object(), values = ojson::array();
  for (size_t n = 0; n <= 40; ++n) {
    const std::string base(n, 'a');
    values.push_back(base);
    keys[base] = n;
    for (size_t at = 0; at < n; ++at)
      for (const char c : specials) {
        std::string s = base;
        s[at] = c;
        values.push_back(s);
        keys[s] = at;
      }
    if (n > 0) {
      std::string s = base;
      s[n - 1] = '\xc3';  // UTF-8 at the very end: the whole string goes to nlohmann
      s += '\xa9';
      values.push_back(s);
      keys[s] = -1;
    }
  }
  CHECK(text_of_value(values) == values.dump(1));
  CHECK(text_of_value(keys) == keys.dump(1));
  // A string longer than the buffer, and nesting deeper than a word of spaces.
  const ojson big = ojson::array({std::string(200000, 'x'), std::string(70000, '"')});
  CHECK(text_of_value(big) == big.dump(1));
  ojson deep = 1;
  for (int d = 0; d < 40; ++d) deep = d % 2 ? ojson::array({deep, d}) : ojson({{"k", deep}, {"d", d}});
  CHECK(text_of_value(deep) == deep.dump(1));
}

TEST_CASE("json text sink: remembered doubles are written as dump(1) writes each") {
  // Many more distinct doubles than the cache holds, each again after others
  // took its slot, and values whose bit patterns differ in one bit (-0.0 and
  // 0.0, neighbours).
  ojson v = ojson::array();
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < 2000; ++i) {
      v.push_back(static_cast<double>(i) * 1e-7 / 3.0);
      v.push_back(std::nextafter(1.0 + i, 2e9));
    }
  for (double d : {0.0, -0.0, 0.0, -0.0, 5e-324, -5e-324, 1.0, std::nextafter(1.0, 2.0), 1.0}) v.push_back(d);
  for (double d : kDoubles) v.push_back(d);
  for (double d : kDoubles) v.push_back(d);
  CHECK(text_of_value(v) == v.dump(1));
}

namespace {

// A tree whose names need escapes and UTF-8, with a frozen parameter, a
// buffer, an empty module and a tied weight.
TreeBuilder awkward_tree() {
  TreeBuilder b("__torch__.Net\"quoted\"");
  b.add("blocks", "ModuleList");
  b.add("blocks.0", "Block");
  b.linear("blocks.0.fc", 4, 4);
  b.add("blocks.1", "Block");
  b.linear("blocks.1.fc", 4, 4);
  b.add("blocks.1.caf\xc3\xa9", "Block\tTab");
  b.param("blocks.1.caf\xc3\xa9", "w\\", {3, 5}, "bfloat16", 2);
  b.add("empty", "Sequential");
  b.buffer("blocks.0", "mask\n", {7});
  frozen(b, "blocks.0", "frozen", {2, 2});
  const TensorId head = b.param("", "emb", {6, 4});
  b.add("head", "Linear");
  b.tie("head", "weight", head);
  return b;
}

// FLOPs for every module: the step-time estimate's doubles, none of them whole.
FlopProfile some_flops(const ModuleTree& tree) {
  FlopProfile f;
  f.source = "flops \"test\"";
  f.own.resize(tree.num_modules());
  for (size_t m = 0; m < tree.num_modules(); ++m) {
    f.own[m] = {int64_t(1000003 * (m + 1)), int64_t(2000017 * (m + 1)), 0};
    f.forward_order.emplace_back(static_cast<ModuleId>(m), f.own[m].forward);
  }
  return f;
}

}  // namespace

TEST_CASE("json writer: a plan written as it goes is its value's dump(1), FSDP1 and FSDP2") {
  const TreeBuilder b = awkward_tree();
  const FlopProfile flops = some_flops(b.tree);
  const char* policies[] = {
      R"({"module_classes": ["Block"]})",
      R"({"module_classes": ["Block"], "fsdp": {"world_size": 3, "sharding_strategy": "HYBRID_SHARD"}})",
      R"({"fsdp": {"version": 2}, "module_classes": ["Block"]})",
      R"({"fsdp": {"version": 2, "world_size": 8}, "module_classes": ["Block", "Missing"]})",
      "{}",
  };
  for (const char* text : policies) {
    CAPTURE(text);
    for (const bool with_flops : {false, true}) {
      const Plan plan = make_plan(b.tree, policy(text), "m\"odel\".pt", ClassMatcher(), PlanPurpose::Report,
                                  with_flops ? &flops : nullptr);
      REQUIRE(plan.comm.computed);
      REQUIRE(plan.time.computed);
      const ojson value = plan_to_json(plan);
      CHECK(plan_text(plan) == value.dump(1));
      CHECK(value["units"].size() == plan.units.size());
      CHECK(value["time"]["flops_known"] == with_flops);
      // The step's events only when asked for (--collectives), and then in both sinks alike.
      CHECK_FALSE(value["comm"].contains("collectives"));
      CHECK_FALSE(value["time"].contains("timeline"));
      const ojson events = plan_to_json(plan, {true});
      CHECK(plan_text(plan, ojson::object(), {true}) == events.dump(1));
      CHECK(events["comm"]["collectives"].size() == plan.comm.collectives.size());
      CHECK(events["time"]["timeline"].size() == plan.time.timeline.size());
      // The gate's keys come after the plan's, as Gate::annotate puts them.
      const ojson gate = {{"checks", {{"passed", true}, {"rules", ojson::array()}}}, {"expect", nullptr}};
      ojson annotated = value;
      for (auto it = gate.begin(); it != gate.end(); ++it) annotated[it.key()] = it.value();
      CHECK(plan_text(plan, gate) == annotated.dump(1));
    }
  }
}

TEST_CASE("json writer: an empty model's plan, and one of many units") {
  TreeBuilder empty;
  const Plan none = make_plan(empty.tree, policy("{}"), "e.pt");
  CHECK(plan_text(none) == plan_to_json(none).dump(1));
  TreeBuilder wide;
  wide.add("layers", "ModuleList");
  for (int i = 0; i < 300; ++i) {
    const std::string path = "layers." + std::to_string(i);
    wide.add(path, "Block");
    wide.param(path, "w", {int64_t(i + 1), 3});
  }
  for (const char* text :
       {R"({"module_classes": ["Block"]})", R"({"fsdp": {"version": 2}, "module_classes": ["Block"]})"}) {
    const Plan plan = make_plan(wide.tree, policy(text), "w.pt");
    CHECK(plan.units.size() == 301);
    CHECK(plan_text(plan) == plan_to_json(plan).dump(1));
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
    // Large pieces go uncopied when nothing is gathered before them; the
    // bytes still arrive in order, whichever way each piece takes.
    std::string expected;
    OutputWriter out(path, "plan");
    for (const size_t n : {size_t{100000}, size_t{3}, size_t{40000}, size_t{70000}, size_t{1} << 20, size_t{5}}) {
      const std::string piece(n, static_cast<char>('a' + expected.size() % 26));
      out.write(piece);
      expected += piece;
    }
    out.commit();
    CHECK(read_all(path) == expected);
  }
  {
    OutputWriter out(path, "plan");
    out.write("half");
  }  // an error before commit: the old file stays, and no temporary file is left
  CHECK(read_all(path).size() == 100000u + 3 + 40000 + 70000 + (1u << 20) + 5);
  std::remove(path.c_str());
  CHECK(::rmdir(dir) == 0);  // empty: the temporary files are gone
  CHECK_THROWS_AS(OutputWriter("/nonexistent-dir/plan.json", "plan"), InputError);
}
