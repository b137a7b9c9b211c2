// build_export_tree on hand-written records: the rules the .pt2 reader relies
// on, each in the smallest program that shows it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>

#include "model/loaders/export_program.h"
#include "util/errors.h"

using namespace fsdp_plan;

namespace {

std::string meta(int dtype, const std::string& sizes, bool rg = true, const std::string& device = "cpu") {
  return R"({"dtype": )" + std::to_string(dtype) + R"(, "sizes": )" + sizes +
         R"(, "requires_grad": )" + (rg ? "true" : "false") + R"(, "device": {"type": ")" + device +
         R"("}, "strides": [], "storage_offset": {"as_int": 0}, "layout": 7})";
}

// A root Net with children `a` (Linear, called), `b` (never called, holds
// children 0 and 1) and `b.0`, `b.1` (called).
ExportRecords records(const std::string& weights, const std::string& specs = "", const std::string& tensors = "") {
  ExportRecords r;
  r.model = R"({"schema_version": {"major": 8, "minor": 20}, "graph_module": {
    "graph": {"nodes": [
      {"target": "torch.ops.aten.relu.default", "metadata": {"nn_module_stack": "L__self__,,m.Net;L__self__a,a,torch.nn.modules.linear.Linear"}},
      {"target": "torch.ops.aten.relu.default", "metadata": {"nn_module_stack": "L__self__,,m.Net;L__self__b.0,b.0,m.Cell"}},
      {"target": "torch.ops.aten.relu.default", "metadata": {"nn_module_stack": "L__self__,,m.Net;L__self__b.1,b.1,m.Cell"}}],
      "tensor_values": {)" + tensors + R"(}},
    "signature": {"input_specs": [)" + specs + R"(]},
    "module_call_graph": [{"fqn": ""}, {"fqn": "a"}, {"fqn": "b"}, {"fqn": "b.0"}, {"fqn": "b.1"}]}})";
  r.weights = R"({"config": {)" + weights + "}}";
  return r;
}

std::string entry(const std::string& fqn, const std::string& file, const std::string& m, bool param = true) {
  return "\"" + fqn + R"(": {"path_name": ")" + file + R"(", "is_param": )" + (param ? "true" : "false") +
         R"(, "use_pickle": false, "tensor_meta": )" + m + "}";
}

}  // namespace

TEST_CASE("paths from module_call_graph, classes from nn_module_stack, containers inferred") {
  ModuleTree t = build_export_tree("x.pt2", records(entry("a.weight", "weight_0", meta(7, R"([{"as_int": 2}, {"as_int": 3}])"))));
  REQUIRE(t.num_modules() == 5);
  CHECK(t.module(0).type_name == "m.Net");
  CHECK(t.path(1) == "a");
  CHECK(t.module(1).type_name == "torch.nn.modules.linear.Linear");
  CHECK(t.module(2).type_name == "torch.nn.modules.container.ModuleList");
  CHECK(t.module(2).class_source == ClassSource::Inferred);
  CHECK(t.module(3).type_name == "m.Cell");
  REQUIRE(t.module(1).params.size() == 1);
  const TensorInfo& w = t.tensor(t.module(1).params[0].tensor);
  CHECK(w.shape == std::vector<int64_t>{2, 3});
  CHECK(w.dtype == "float32");
  CHECK(w.itemsize == 4);
}

TEST_CASE("one record and one view is one tensor; another view of it is not; meta tensors never merge") {
  const std::string m23 = meta(13, R"([{"as_int": 2}, {"as_int": 3}])");
  ModuleTree t = build_export_tree(
      "x.pt2", records(entry("a.weight", "weight_0", m23) + "," + entry("b.0.w", "weight_0", m23) + "," +
                       entry("b.1.w", "weight_0", meta(13, R"([{"as_int": 6}])")) + "," +
                       entry("b.1.u", "weight_1", meta(7, "[]", false, "meta")) + "," +
                       entry("b.1.v", "weight_1", meta(7, "[]", false, "meta"))));
  CHECK(t.module(1).params[0].tensor == t.module(3).params[0].tensor);
  CHECK(t.module(4).params[0].tensor != t.module(1).params[0].tensor);
  CHECK(t.module(4).params[1].tensor != t.module(4).params[2].tensor);
  CHECK(t.tensor(t.module(1).params[0].tensor).dtype == "bfloat16");
  CHECK_FALSE(t.tensor(t.module(4).params[1].tensor).requires_grad);
}

TEST_CASE("graph signature order first, then the weights config's own order; buffers by is_param") {
  const std::string m1 = meta(7, R"([{"as_int": 1}])");
  ModuleTree t = build_export_tree(
      "x.pt2",
      records(entry("b.0.z", "weight_1", m1) + "," + entry("b.0.y", "weight_0", m1) + "," +
                  entry("b.0.x", "weight_2", m1) + "," + entry("b.0.buf", "weight_3", m1, false),
              R"({"parameter": {"arg": {"name": "p_y"}, "parameter_name": "b.0.y"}})",
              // The placeholder's own metadata (the graph checks every placeholder has it).
              R"("p_y": {"dtype": 7, "sizes": [{"as_int": 1}], "strides": [{"as_int": 1}], "requires_grad": true,
                 "device": {"type": "cpu"}, "storage_offset": {"as_int": 0}, "layout": 7})"));
  const Module& cell = t.module(3);
  REQUIRE(cell.params.size() == 3);
  CHECK(cell.params[0].name == "y");
  CHECK(cell.params[1].name == "z");
  CHECK(cell.params[2].name == "x");
  REQUIRE(cell.buffers.size() == 1);
  CHECK(cell.buffers[0].name == "buf");
}

TEST_CASE("a never-called module with its own tensors has no class") {
  ExportRecords r = records(entry("b.weight", "weight_0", meta(7, "[]")));
  ModuleTree t = build_export_tree("x.pt2", r);
  CHECK(t.module(2).type_name == kUnrecordedClass);
  CHECK(t.module(2).class_source == ClassSource::Unrecorded);
}

TEST_CASE("damaged programs are InputErrors") {
  const std::string ok = entry("a.weight", "weight_0", meta(7, R"([{"as_int": 2}])"));
  CHECK_THROWS_AS(build_export_tree("x.pt2", records(entry("nowhere.w", "weight_0", meta(7, "[]")))), InputError);
  CHECK_THROWS_AS(build_export_tree("x.pt2", records(entry("a.w", "weight_0", meta(99, "[]")))), InputError);
  CHECK_THROWS_AS(build_export_tree("x.pt2", records(entry("a.w", "weight_0", meta(7, R"([{"as_int": -2}])")))),
                  InputError);
  ExportRecords r = records(ok);
  r.model.replace(r.model.find("\"major\": 8"), 10, "\"major\": 7");
  CHECK_THROWS_WITH_AS(build_export_tree("x.pt2", r), doctest::Contains("schema version 7.20"), InputError);
  r = records(ok);
  r.weights = "[1, 2";
  CHECK_THROWS_WITH_AS(build_export_tree("x.pt2", r), doctest::Contains("invalid JSON"), InputError);
}

// The weights config is read by simdjson with nlohmann's rules (it was read
// by nlohmann alone): the last value of a key given twice, the keys of every
// object one level down for the order, text only nlohmann reads still read.
namespace {

std::string config_text(const std::string& body) { return "{" + body + "}"; }

}  // namespace

TEST_CASE("weights config: a key given twice keeps its last value, as nlohmann's map did") {
  ExportRecords r = records("");
  r.weights = config_text(R"("config": {)" + entry("a.weight", "weight_0", meta(7, R"([{"as_int": 5}])")) + "," +
                          entry("a.weight", "weight_0", meta(13, R"([{"as_int": 2}, {"as_int": 3}])")) + "}");
  ModuleTree t = build_export_tree("x.pt2", r);
  REQUIRE(t.module(1).params.size() == 1);
  CHECK(t.tensor(t.module(1).params[0].tensor).shape == std::vector<int64_t>{2, 3});
  CHECK(t.tensor(t.module(1).params[0].tensor).dtype == "bfloat16");
  // Inside an entry too: the second tensor_meta, the second sizes.
  r.weights = config_text(R"("config": {"a.weight": {"path_name": "weight_0", "is_param": false, "is_param": true,
      "tensor_meta": )" + meta(7, "[]") + R"(, "tensor_meta": {"dtype": 7, "sizes": [], "sizes": [{"as_int": 4}]}}})");
  t = build_export_tree("x.pt2", r);
  REQUIRE(t.module(1).params.size() == 1);
  CHECK(t.tensor(t.module(1).params[0].tensor).shape == std::vector<int64_t>{4});
  CHECK(t.tensor(t.module(1).params[0].tensor).requires_grad);  // the last tensor_meta has none: true
  // A second "config" replaces the first; one that is not an object leaves none.
  r.weights = config_text(R"("config": {)" + entry("a.weight", "weight_0", meta(7, R"([{"as_int": 5}])")) +
                          R"(}, "config": {)" + entry("b.0.w", "weight_0", meta(7, R"([{"as_int": 6}])")) + "}");
  t = build_export_tree("x.pt2", r);
  CHECK(t.module(1).params.empty());
  REQUIRE(t.module(3).params.size() == 1);
  r.weights = config_text(R"("config": {)" + entry("a.weight", "weight_0", meta(7, "[]")) + R"(}, "config": 5)");
  CHECK_THROWS_WITH_AS(build_export_tree("x.pt2", r), doctest::Contains("no config object"), InputError);
}

TEST_CASE("weights config: the order is every depth-2 key, as nlohmann's parse callback gave it") {
  const std::string m1 = meta(7, R"([{"as_int": 1}])");
  ExportRecords r = records("");
  // "x" lists b.0.z first: b.0.z comes before b.0.y although config holds y first.
  r.weights = config_text(R"("x": {"b.0.z": 1, "other": [{"b.0.y": 2}]}, "config": {)" +
                          entry("b.0.y", "weight_0", m1) + "," + entry("b.0.z", "weight_1", m1) + "}");
  ModuleTree t = build_export_tree("x.pt2", r);
  REQUIRE(t.module(3).params.size() == 2);
  CHECK(t.module(3).params[0].name == "z");
  CHECK(t.module(3).params[1].name == "y");
}

TEST_CASE("weights config: what simdjson refuses and nlohmann reads is still read") {
  const std::string deep = std::string(2000, '[') + std::string(2000, ']');
  ExportRecords r = records("");
  r.weights = config_text(R"("huge": 123456789012345678901234567890, "deep": )" + deep + R"(, "config": {)" +
                          entry("a.weight", "weight_0", meta(7, R"([{"as_int": 2}])")) + "}");
  ModuleTree t = build_export_tree("x.pt2", r);
  REQUIRE(t.module(1).params.size() == 1);
  CHECK(t.tensor(t.module(1).params[0].tensor).shape == std::vector<int64_t>{2});
  // And what neither reads is refused in nlohmann's words.
  r.weights = R"({"config": {"a.weight": [1, 2}})";
  CHECK_THROWS_WITH_AS(build_export_tree("x.pt2", r),
                       doctest::Contains("(invalid JSON: parse error at line 1, column 30: syntax error while "
                                         "parsing array - unexpected '}'; expected ']');"),
                       InputError);
  r = records(entry("a.weight", "weight_0", meta(7, "[]")).replace(
      entry("a.weight", "weight_0", meta(7, "[]")).find("true"), 4, "1"));
  CHECK_THROWS_WITH_AS(build_export_tree("x.pt2", r), doctest::Contains("a.weight has no is_param"), InputError);
}

TEST_CASE("weights config: a name is looked up up to a NUL, as nlohmann's member(c_str()) did") {
  const std::string m1 = meta(7, R"([{"as_int": 3}])");
  ExportRecords r = records(entry("a.weight", "weight_0", m1),
                            R"({"parameter": {"arg": {"name": "p_w"}, "parameter_name": "a.weight\u0000x"}})",
                            R"("p_w": {"dtype": 7, "sizes": [{"as_int": 3}], "strides": [{"as_int": 1}],
                               "requires_grad": true, "device": {"type": "cpu"}, "storage_offset": {"as_int": 0},
                               "layout": 7})");
  ModuleTree t = build_export_tree("x.pt2", r);
  REQUIRE(t.module(1).params.size() == 2);
  CHECK(t.module(1).params[0].name == std::string("weight\0x", 8));
  CHECK(t.module(1).params[1].name == "weight");
  CHECK(t.module(1).params[0].tensor == t.module(1).params[1].tensor);  // one record, one view
}
