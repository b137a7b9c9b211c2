// graph_dump MODEL.pt2 [NAME=VALUE ...]: the graph the .pt2 loader read
// (model/graph.h), as one JSON object, for test_graph.py to compare with what
// the file says (read by Python). Sizes are evaluated at the values given
// (as --dim would give them), the traced hints for the rest. Exit 2 on bad
// input, with the InputError's message.
#include <iostream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/graph.h"
#include "model/loaders/export_loader.h"
#include "util/errors.h"

using namespace fsdp_plan;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: graph_dump MODEL.pt2 [NAME=VALUE ...]\n";
    return 1;
  }
  try {
    const ModuleTree tree = load_export(argv[1]);
    if (!tree.graph()) throw InputError(argv[1], "no graph");
    const Graph& g = *tree.graph();
    std::vector<std::pair<std::string, int64_t>> given;
    for (int i = 2; i < argc; ++i) given.push_back(parse_dim_arg(argv[i]));
    const DimValues dims = DimValues::hints(g, given);

    nlohmann::ordered_json out;
    auto& syms = out["dims"] = nlohmann::ordered_json::object();
    for (SymbolId s = 0; s < g.num_symbols(); ++s) {
      syms[g.symbol(s).name] = {{"dim", g.symbol(s).dim}, {"min", g.symbol(s).min}};
    }
    auto& nodes = out["nodes"] = nlohmann::ordered_json::array();
    for (NodeId n = 0; n < g.num_nodes(); ++n) {
      const GraphNode& node = g.node(n);
      nlohmann::ordered_json outs = nlohmann::ordered_json::array();
      for (ValueId v : g.outputs(n)) {
        if (v == kNone) outs.push_back(nullptr);
        else outs.push_back(g.value_name(v));
      }
      nlohmann::ordered_json args = nlohmann::ordered_json::array();
      for (const GraphArg& a : g.args(n)) args.push_back(a.name == kNone ? "" : g.str(a.name));
      nodes.push_back({{"name", g.str(node.name)},
                       {"op", g.op_name(node.op)},
                       {"call", node.call == kNone ? "" : g.str(g.call(node.call).path)},
                       {"module", tree.path(node.module)},
                       {"args", args},
                       {"outputs", outs}});
    }
    auto& tensors = out["tensors"] = nlohmann::ordered_json::object();
    for (ValueId v = 0; v < g.num_values(); ++v) {
      if (!g.is_tensor(v)) continue;
      tensors[g.value_name(v)] = {{"dtype", g.tensor(v).dtype},
                                  {"requires_grad", g.tensor(v).requires_grad},
                                  {"sizes", dims.sizes(v)},
                                  {"strides", dims.strides(v)}};
    }
    std::cout << out.dump() << "\n";
  } catch (const InputError& e) {
    std::cerr << "InputError: " << e.file() << ": " << e.what() << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {
    std::cerr << "usage: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
