// The one pass over models/model.json of a .pt2 (simdjson's DOM): what the
// module tree reads goes to a RawProgram, the graph to a GraphBuilder. Its
// parts are in three files: export_walk.cpp (the program's top levels, the
// nodes and their arguments), export_tensor_values.cpp (tensor metadata and
// symbolic shapes), export_signature.cpp (graph inputs, input and output specs).
#pragma once

#include <cstddef>
#include <future>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/graph_builder.h"
#include "model/loaders/export_dom.h"
#include "model/loaders/export_raw.h"

namespace fsdp_plan::pt2 {

class ProgramWalk {
 public:
  ProgramWalk(RawProgram& raw, GraphBuilder& g) : raw_(raw), g_(g) {}

  void top(dom::element doc);

  // One tensor_values entry as read, before the graph has it.
  struct TensorEntry {
    std::string_view name;
    RawMeta m;
    bool object = false;
    size_t dims = 0;
  };
  struct TensorEntries {
    bool object = false;
    std::vector<TensorEntry> entries;
    std::optional<JsonFail> fail;  // met after `entries`
  };

  // The part of tensor_values that reads only the DOM (export_tensor_values.cpp).
  static TensorEntries read_tensor_values(dom::element v);

  // The tensor_values object this walk will meet first, read ahead (walk_model starts it).
  void read_ahead(std::future<TensorEntries>* ahead) { ahead_ = ahead; }

 private:
  // export_walk.cpp: the program's top levels.
  void schema_version(dom::element v);
  void graph_module(dom::element v);
  void module_call_graph(dom::element v);
  void graph(dom::element v);

  // export_walk.cpp: nodes, their arguments and outputs.
  void nodes(dom::element v);
  std::string node_where() const { return "node " + std::to_string(raw_.node_stacks.size() - 1); }
  void node(dom::element v);
  void named_argument(dom::element v);

  // The single key of an Argument union object and its value.
  template <typename F>
  bool union_of(dom::element v, const What& what, F&& f) {
    if (!v.is_object()) {
      g_.damage(what + " is not an object");
      return false;
    }
    int keys = 0;
    for_fields(v, {}, [&](std::string_view k, dom::element x) {
      if (keys++ == 0) f(k, x);
    });
    if (keys != 1) g_.damage(what + (keys ? " has several kinds" : " is empty"));
    return keys >= 1;
  }

  ValueId tensor_name(dom::element v, const What& what);
  ValueId optional_tensor(dom::element v, const What& what);
  void sym_int_argument(dom::element v, const What& what);
  size_t argument(dom::element v);
  std::string device(dom::element v, const What& what);
  void output(dom::element v);

  // export_tensor_values.cpp: tensor metadata and symbolic shapes.
  static RawDim sym_int(dom::element v);
  static void dims(dom::element v, bool& is_list, std::vector<RawDim>& out, size_t& count);
  void tensor_values(dom::element v);
  void apply_tensor_values(TensorEntries t);
  SymInt graph_dim(const RawDim& d, const What& what);
  void to_graph(std::string_view name, const RawMeta& m, bool object);
  void sym_int_values(dom::element v);
  void range_constraints(dom::element v);

  // export_signature.cpp: graph inputs and the graph signature.
  void graph_inputs(dom::element v);
  void signature(dom::element v);
  std::optional<std::string> arg_name(dom::element v);
  ValueId argument_value(dom::element v, const What& what);
  void input_spec(dom::element v);
  void output_spec(dom::element v);

  RawProgram& raw_;
  GraphBuilder& g_;
  std::vector<SymInt> sizes_, strides_;  // to_graph's
  std::string last_device_;               // to_graph's last device and its id
  StrId last_device_id_ = kNone;
  std::future<TensorEntries>* ahead_ = nullptr;
};

}  // namespace fsdp_plan::pt2
