// The graph a .pt2 holds (model/graph.h), read from a committed export:
// tests/export/data/llama_dyn.pt2, the corpus' tiny Llama exported by
// tests/activations/make_exports.py with Dim("batch") and Dim("seq") on
// input_ids and labels, traced at batch 2, seq 32 (486 KB). Then hostile
// graphs written by hand: each refused in one line naming the file.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "model/graph.h"
#include "model/graph_builder.h"
#include "model/loaders/export_loader.h"
#include "model/loaders/export_program.h"
#include "model/module_tree.h"
#include "util/errors.h"

using namespace fsdp_plan;

namespace {

const ModuleTree& llama() {
  static const ModuleTree tree = load_export(FSDP_PLAN_TEST_DATA "/llama_dyn.pt2");
  return tree;
}

NodeId node_named(const Graph& g, const std::string& name) {
  for (NodeId n = 0; n < g.num_nodes(); ++n)
    if (g.str(g.node(n).name) == name) return n;
  return kNone;
}

}  // namespace

TEST_CASE("nodes in order, ops interned, arguments by schema name") {
  const ModuleTree& t = llama();
  REQUIRE(static_cast<bool>(t.graph()));
  const Graph& g = *t.graph();
  CHECK(g.num_nodes() == 159);
  CHECK(g.op_name(g.node(0).op) == "aten.sym_size.int");
  CHECK(g.op_name(g.node(g.num_nodes() - 1).op) == "aten.cross_entropy_loss.default");
  int linears = 0;
  const auto linear = g.find_op("aten.linear.default");
  REQUIRE(linear);
  for (NodeId n = 0; n < g.num_nodes(); ++n) linears += g.node(n).op == *linear;
  CHECK(linears == 15);
  CHECK(!g.find_op("aten.nonexistent.default"));

  // linear: input and weight tensors, no bias (left at its default).
  const NodeId n = node_named(g, "linear");
  REQUIRE(n == 32);
  CHECK(g.node(n).op == *linear);
  const ValueId x = g.tensor_arg(n, "input"), w = g.tensor_arg(n, "weight");
  REQUIRE(x != kNone);
  REQUIRE(w != kNone);
  CHECK(g.arg(n, "bias") == nullptr);
  CHECK(g.tensor_arg(n, "bias") == kNone);
  REQUIRE(g.outputs(n).size() == 1);
  CHECK(g.value_name(g.outputs(n)[0]) == "linear");
  CHECK(g.value(g.outputs(n)[0]).producer == n);
  CHECK(g.value(w).producer == kNone);  // a placeholder
  CHECK(g.tensor(w).requires_grad);
  CHECK(!g.tensor(x).requires_grad);

  // The module it ran in: the innermost nn_module_stack entry, as a tree module.
  CHECK(t.path(g.node(n).module) == "model.layers.0.self_attn.q_proj");
  const ModuleCall& c = g.call(g.node(n).call);
  CHECK(g.str(c.path) == "model.layers.0.self_attn.q_proj");
  CHECK(g.str(c.cls) == "torch.nn.modules.linear.Linear");
  REQUIRE(c.parent != kNone);
  CHECK(g.str(g.call(c.parent).path) == "model.layers.0.self_attn");
  CHECK(c.depth == 4);  // root, model, model.layers.0, its self_attn, q_proj
  CHECK(g.within(g.node(n).call, c.parent));
  CHECK(!g.within(c.parent, g.node(n).call));

  // embedding: int padding_idx.
  const NodeId e = node_named(g, "embedding");
  REQUIRE(e != kNone);
  const GraphArg* pad = g.arg(e, "padding_idx");
  REQUIRE(pad);
  CHECK(pad->kind == ArgKind::Int);
  CHECK(g.arg_ints(*pad)[0].value == 0);

  // view: a size list of symbolic ints and constants.
  const NodeId v = node_named(g, "view");
  const GraphArg* size = g.arg(v, "size");
  REQUIRE(size);
  CHECK(size->kind == ArgKind::SymInts);
  REQUIRE(g.arg_ints(*size).size() == 4);
  CHECK(!g.arg_ints(*size)[0].constant());
  CHECK(g.arg_ints(*size)[2].constant());
  CHECK(g.arg_ints(*size)[2].value == -1);
  CHECK(g.value_name(g.arg_values(*size)[0]) == "sym_size_int_8");
  CHECK(g.arg_values(*size)[2] == kNone);
}

TEST_CASE("the signature: parameters and buffers as tree tensors, user inputs, outputs") {
  const ModuleTree& t = llama();
  const Graph& g = *t.graph();
  int params = 0, buffers = 0, users = 0;
  for (const GraphInput& in : g.inputs()) {
    if (in.kind == InputKind::Parameter) {
      ++params;
      REQUIRE(in.tensor != kNone);
      CHECK(g.is_tensor(in.value));
    }
    if (in.kind == InputKind::Buffer) {
      ++buffers;
      CHECK(in.tensor != kNone);
    }
    if (in.kind == InputKind::UserInput) ++users;
  }
  CHECK(params == 21);
  CHECK(buffers == 2);
  CHECK(users == 2);
  CHECK(g.str(g.inputs()[0].target) == "model.embed_tokens.weight");
  REQUIRE(g.outputs().size() == 2);
  CHECK(g.value_name(g.outputs()[0].value) == "cross_entropy_loss");
  CHECK(std::string(input_kind_name(g.inputs()[0].kind)) == "parameter");
}

TEST_CASE("dynamic dimensions: names, ranges, hints, and sizes at two settings") {
  const Graph& g = *llama().graph();
  REQUIRE(g.num_symbols() == 2);
  const auto batch = g.find_symbol("batch"), seq = g.find_symbol("seq");
  REQUIRE(batch);
  REQUIRE(seq);
  CHECK(g.symbol(*batch).name == "s72");
  CHECK(g.symbol(*seq).name == "s38");
  CHECK(g.find_symbol("input_ids.1") == seq);
  CHECK(g.find_symbol("s38") == seq);
  CHECK(g.symbol(*seq).min == 0);
  CHECK(!g.symbol(*seq).max);
  CHECK(g.symbol(*seq).hint == 32);
  CHECK(g.symbol(*batch).hint == 2);

  const ValueId out = *g.find_value("linear");
  CHECK(g.expr_text(g.sizes(out)[1].expr) == "seq");
  const DimValues traced = DimValues::hints(g);
  CHECK(traced.sizes(out) == std::vector<int64_t>{2, 32, 32});
  const DimValues big = DimValues::bind(g, {{"batch", 3}, {"seq", 8192}});
  CHECK(big.sizes(out) == std::vector<int64_t>{3, 8192, 32});
  CHECK(big.size(out, -2) == 8192);
  CHECK(big.numel(out) == 3 * 8192 * 32);
  CHECK(big.strides(out) == std::vector<int64_t>{8192 * 32, 32, 1});
  CHECK(big.settings().size() == 2);

  // Only seq given: what needs batch says so.
  const DimValues only_seq = DimValues::bind(g, {{"seq", 5}});
  CHECK_THROWS_WITH_AS(only_seq.numel(out),
                       doctest::Contains("the plan needs dimension batch (input_ids.0"), InputError);
  // The errors --dim gives.
  CHECK_THROWS_WITH_AS(DimValues::bind(g, {{"tokens", 5}}),
                       doctest::Contains("--dim tokens: the program has no such dimension; its dimensions: batch"),
                       InputError);
  CHECK_THROWS_WITH_AS(DimValues::bind(g, {{"seq", 5}, {"s38", 6}}),
                       doctest::Contains("dimension seq is given twice (also as seq)"), InputError);
  CHECK_THROWS_WITH_AS(DimValues::bind(g, {{"seq", 5}, {"seq", 6}}), doctest::Contains("is given twice"),
                       InputError);
  CHECK_THROWS_WITH_AS(DimValues::bind(g, {{"seq", 5}}).size(out, 3),
                       doctest::Contains("has 3 dimensions, not dimension 3"), InputError);
}

TEST_CASE("--dim NAME=VALUE") {
  CHECK(parse_dim_arg("seq=8192") == std::pair<std::string, int64_t>{"seq", 8192});
  CHECK_THROWS_WITH_AS(parse_dim_arg("seq"), "expected NAME=VALUE, e.g. seq=8192", std::invalid_argument);
  CHECK_THROWS_WITH_AS(parse_dim_arg("=3"), "expected NAME=VALUE, e.g. seq=8192", std::invalid_argument);
  CHECK_THROWS_AS(parse_dim_arg("seq=-1"), std::invalid_argument);
  CHECK_THROWS_AS(parse_dim_arg("seq=1e3"), std::invalid_argument);
  CHECK_THROWS_AS(parse_dim_arg("seq=9999999999999999999"), std::invalid_argument);
}

// ---------------------------------------------------------------------------- hostile graphs

namespace {

// A one-module program whose graph is `nodes` and `tensors` (JSON text).
ExportRecords program(const std::string& nodes, const std::string& tensors, const std::string& extra = "") {
  ExportRecords r;
  r.model = R"({"schema_version": {"major": 8, "minor": 20}, "graph_module": {
    "graph": {"inputs": [{"as_tensor": {"name": "x"}}], "nodes": [)" + nodes + R"(], "tensor_values": {)" + tensors + R"(}, "sym_int_values": {}},
    "signature": {"input_specs": [{"user_input": {"arg": {"as_tensor": {"name": "x"}}}}], "output_specs": []},
    "module_call_graph": [{"fqn": ""}]})" + extra + "}";
  r.weights = R"({"config": {}})";
  return r;
}

std::string tensor(const std::string& name, const std::string& sizes) {
  // Strides: as many as sizes (their values do not matter here).
  return "\"" + name + R"(": {"dtype": 7, "sizes": )" + sizes + R"(, "strides": )" + sizes +
         R"(, "requires_grad": false, "device": {"type": "cpu"}, "storage_offset": {"as_int": 0}, "layout": 7})";
}

std::string relu(const std::string& in, const std::string& out) {
  return R"({"target": "torch.ops.aten.relu.default", "name": ")" + out +
         R"(", "inputs": [{"name": "self", "arg": {"as_tensor": {"name": ")" + in +
         R"("}}, "kind": 1}], "outputs": [{"as_tensor": {"name": ")" + out + R"("}}], "metadata": {}})";
}

std::string refusal(const ExportRecords& r) {
  try {
    build_export_tree("h.pt2", r);
  } catch (const InputError& e) {
    return e.file() + ": " + e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a small hand-written graph reads") {
  ModuleTree t = build_export_tree(
      "h.pt2", program(relu("x", "y"), tensor("x", R"([{"as_int": 2}])") + "," + tensor("y", R"([{"as_int": 2}])")));
  REQUIRE(static_cast<bool>(t.graph()));
  CHECK(t.graph()->num_nodes() == 1);
  CHECK(t.graph()->node(0).module == 0);  // no stack: the root
  CHECK(t.graph()->node(0).call == kNone);
}

TEST_CASE("hostile graphs: one line naming the file and the record") {
  const std::string x = tensor("x", R"([{"as_int": 2}])"), y = tensor("y", R"([{"as_int": 2}])");
  // A value used before any node makes it.
  std::string m = refusal(program(relu("y", "z") + "," + relu("x", "y"), x + "," + y + "," + tensor("z", "[]")));
  CHECK(m.find("h.pt2") != std::string::npos);
  CHECK(m.find("uses y before any node makes it") != std::string::npos);
  CHECK(m.find('\n') == std::string::npos);
  // A tensor without metadata.
  CHECK(refusal(program(relu("x", "y"), x)).find("makes y, which tensor_values lacks") != std::string::npos);
  CHECK(refusal(program(relu("w", "y"), x + "," + y)).find("names w, which tensor_values lacks") !=
        std::string::npos);
  // Malformed size expressions, deep or huge.
  CHECK(refusal(program(relu("x", "y"), x + "," + tensor("y", R"x([{"as_expr": {"expr_str": "Mul(Integer(2)"}}])x")))
            .find("malformed size expression") != std::string::npos);
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += "Abs(";
  deep += "Integer(1)";
  for (int i = 0; i < 200; ++i) deep += ")";
  CHECK(refusal(program(relu("x", "y"), x + "," + tensor("y", R"x([{"as_expr": {"expr_str": ")x" + deep + R"x("}}])x")))
            .find("nested deeper than 64") != std::string::npos);
  CHECK(refusal(program(relu("x", "y"),
                        x + "," + tensor("y", R"x([{"as_expr": {"expr_str": "Integer(123456789012345678901234)"}}])x")))
            .find("beyond 64-bit") != std::string::npos);
  // Nodes that are not objects, arguments of no kind or of two.
  CHECK(!refusal(program("3", x)).empty());
  CHECK(!refusal(program(R"({"target": "torch.ops.aten.relu.default", "inputs": [{"name": "self", "arg": {}, "kind": 1}], "outputs": []})", x)).empty());
  CHECK(!refusal(program(R"({"target": "torch.ops.aten.relu.default", "inputs": [{"name": "self", "arg": {"as_int": 1, "as_float": 2.0}, "kind": 1}], "outputs": []})", x)).empty());
  CHECK(!refusal(program(R"({"target": "torch.ops.aten.relu.default", "inputs": "no", "outputs": []})", x)).empty());
  // A rank beyond the limit.
  std::string sizes = "[";
  for (int i = 0; i <= kMaxTensorRank; ++i) sizes += std::string(i ? "," : "") + R"({"as_int": 1})";
  sizes += "]";
  CHECK(refusal(program(relu("x", "y"), x + "," + tensor("y", sizes))).find("more than 64 dimensions") !=
        std::string::npos);
  // Deep JSON nesting in a node's metadata is refused by the parser, not by the stack.
  std::string nest;
  for (int i = 0; i < 5000; ++i) nest += "[";
  for (int i = 0; i < 5000; ++i) nest += "]";
  CHECK(!refusal(program(R"({"target": "torch.ops.aten.relu.default", "inputs": [], "outputs": [], "metadata": {"x": )" + nest + "}}", x)).empty());
}

TEST_CASE("floats torch writes as strings: Infinity, -Infinity, NaN") {
  const std::string x = tensor("x", R"([{"as_int": 2}])"), y = tensor("y", R"([{"as_int": 2}])");
  auto fill = [](const std::string& value) {
    return R"({"target": "torch.ops.aten.fill.Scalar", "name": "y", "inputs": [{"name": "self", "arg": {"as_tensor": {"name": "x"}}, "kind": 1}, {"name": "value", "arg": {"as_float": )" +
           value + R"(}, "kind": 1}], "outputs": [{"as_tensor": {"name": "y"}}], "metadata": {}})";
  };
  ModuleTree t = build_export_tree("h.pt2", program(fill(R"("-Infinity")"), x + "," + y));
  const GraphArg* v = t.graph()->arg(0, "value");
  REQUIRE(v);
  CHECK(v->kind == ArgKind::Float);
  CHECK(v->f == -std::numeric_limits<double>::infinity());
  CHECK(build_export_tree("h.pt2", program(fill(R"("Infinity")"), x + "," + y)).graph()->arg(0, "value")->f > 1e308);
  CHECK(std::isnan(build_export_tree("h.pt2", program(fill(R"("NaN")"), x + "," + y)).graph()->arg(0, "value")->f));
  CHECK(build_export_tree("h.pt2", program(fill("0.5"), x + "," + y)).graph()->arg(0, "value")->f == 0.5);
  CHECK(refusal(program(fill(R"("inf")"), x + "," + y)).find("as_float has the wrong type") != std::string::npos);
}
