#include "model/loaders/export_walk.h"

namespace fsdp_plan::pt2 {

void ProgramWalk::top(dom::element doc) {
  if (!doc.is_object()) return;  // the tree's check (no schema_version) says it
  raw_.object = true;
  for_fields(doc, {"graph_module", "schema_version", "torch_version", "range_constraints"},
             [&](std::string_view k, dom::element v) {
               std::string_view s;
               if (k == "graph_module") graph_module(v);
               if (k == "schema_version") schema_version(v);
               if (k == "torch_version" && read_string(v, s)) raw_.torch_version = std::string(s);
               if (k == "range_constraints") range_constraints(v);
             });
}

void ProgramWalk::schema_version(dom::element v) {
  if (!v.is_object()) return;
  raw_.schema = true;
  for_fields(v, {"major", "minor"}, [&](std::string_view k, dom::element x) {
    if (k == "major") raw_.major_ok = read_int(x, raw_.major);
    if (k == "minor") raw_.minor_ok = read_int(x, raw_.minor);
  });
}

void ProgramWalk::graph_module(dom::element v) {
  if (!v.is_object()) return;
  raw_.graph_module = true;
  for_fields(v, {"graph", "signature", "module_call_graph"}, [&](std::string_view k, dom::element x) {
    if (k == "graph") graph(x);
    if (k == "signature") signature(x);
    if (k == "module_call_graph") module_call_graph(x);
  });
}

void ProgramWalk::module_call_graph(dom::element v) {
  if (!v.is_array()) return;
  raw_.calls = true;
  for_elements(v, [&](dom::element entry) {
    std::optional<std::string> fqn;
    if (entry.is_object()) {
      for_fields(entry, {"fqn"}, [&](std::string_view k, dom::element x) {
        std::string_view s;
        if (k == "fqn" && read_string(x, s)) fqn = std::string(s);
      });
    }
    raw_.call_fqns.push_back(std::move(fqn));
  });
}

void ProgramWalk::graph(dom::element v) {
  if (!v.is_object()) return;
  raw_.graph = true;
  for_fields(v, {"inputs", "nodes", "tensor_values", "sym_int_values"}, [&](std::string_view k, dom::element x) {
    if (k == "inputs") graph_inputs(x);
    if (k == "nodes") nodes(x);
    if (k == "tensor_values") tensor_values(x);
    if (k == "sym_int_values") sym_int_values(x);
  });
}

void ProgramWalk::nodes(dom::element v) {
  if (!v.is_array()) return;
  raw_.nodes = true;
  for_elements(v, [&](dom::element n) { node(n); });
}

void ProgramWalk::node(dom::element v) {
  raw_.node_stacks.emplace_back();
  if (!v.is_object()) {
    g_.damage(node_where() + " is not an object");
    return;
  }
  g_.begin_node();
  for_fields(v, {"target", "inputs", "outputs", "metadata", "name"}, [&](std::string_view k, dom::element x) {
    std::string_view s;
    if (k == "target") {
      if (read_string(x, s)) g_.set_target(s);
    } else if (k == "name") {
      if (read_string(x, s)) g_.set_name(s);
    } else if (k == "inputs") {
      if (!x.is_array()) return g_.damage(node_where() + ": inputs is not a list");
      for_elements(x, [&](dom::element a) { named_argument(a); });
    } else if (k == "outputs") {
      if (!x.is_array()) return g_.damage(node_where() + ": outputs is not a list");
      for_elements(x, [&](dom::element a) { output(a); });
    } else if (k == "metadata") {
      if (!x.is_object()) return;
      for_fields(x, {"nn_module_stack"}, [&](std::string_view mk, dom::element mv) {
        std::string_view stack;
        if (mk == "nn_module_stack" && read_string(mv, stack)) {
          raw_.node_stacks.back() = stack;
          g_.set_stack(stack);
        }
      });
    }
  });
  g_.end_node();
}

void ProgramWalk::named_argument(dom::element v) {
  if (!v.is_object()) return g_.damage(node_where() + ": an input that is not an object");
  StrId name = kNone;
  int64_t kind = 0;
  bool has_arg = false;
  GraphArg* arg = nullptr;
  size_t arg_index = 0;
  for_fields(v, {"name", "arg", "kind"}, [&](std::string_view k, dom::element x) {
    std::string_view s;
    if (k == "name" && read_string(x, s)) name = g_.intern(s);
    if (k == "kind") read_int(x, kind);
    if (k == "arg") {
      has_arg = true;
      arg_index = argument(x);
      arg = &g_.arg_at(arg_index);
    }
  });
  if (!has_arg) return g_.damage(node_where() + ": an input without an argument");
  arg = &g_.arg_at(arg_index);
  arg->name = name;
  arg->keyword = kind == 2;
  if (name == kNone) g_.damage(node_where() + ": an input without a name");
}

ValueId ProgramWalk::tensor_name(dom::element v, const What& what) {
  ValueId out = kNone;
  if (!v.is_object()) {
    g_.damage(what + ": a tensor argument that is not an object");
    return out;
  }
  for_fields(v, {"name"}, [&](std::string_view k, dom::element x) {
    std::string_view s;
    if (k == "name" && read_string(x, s)) out = g_.value(s);
  });
  if (out == kNone) g_.damage(what + ": a tensor argument without a name");
  return out;
}

// {"as_tensor": {...}} or {"as_none": ...} of an OptionalTensorArgument.
ValueId ProgramWalk::optional_tensor(dom::element v, const What& what) {
  ValueId out = kNone;
  union_of(v, what, [&](std::string_view k, dom::element x) {
    if (k == "as_tensor") out = tensor_name(x, what);
    else if (k != "as_none") g_.damage(what + ": an optional tensor of kind " + std::string(k));
  });
  return out;
}

// {"as_name": "sym_size_int_3"} or {"as_int": 4} of a SymIntArgument.
void ProgramWalk::sym_int_argument(dom::element v, const What& what) {
  union_of(v, what, [&](std::string_view k, dom::element x) {
    std::string_view s;
    int64_t i = 0;
    if (k == "as_name" && read_string(x, s)) {
      g_.push_int(SymInt{}, g_.value(s));
    } else if (k == "as_int" && read_int(x, i)) {
      g_.push_int(SymInt{i, kNone});
    } else {
      g_.damage(what + ": a symbolic int that is neither a name nor an integer");
      g_.push_int(SymInt{});
    }
  });
}

// Reads one Argument into a new argument of the current node; returns its index.
size_t ProgramWalk::argument(dom::element v) {
  const What what("node ", raw_.node_stacks.size() - 1, ": an argument");
  size_t index = 0;
  bool added = false;
  auto add = [&](ArgKind kind) -> GraphArg& {
    GraphArg& a = g_.add_arg(kNone, kind);
    index = g_.num_args() - 1;
    added = true;
    return a;
  };
  auto bad = [&](std::string_view k) { g_.damage(what + " " + std::string(k) + " has the wrong type"); };
  union_of(v, what, [&](std::string_view k, dom::element x) {
    int64_t i = 0;
    double f = 0;
    bool b = false;
    std::string_view s;
    if (k == "as_none") {
      add(ArgKind::None);
    } else if (k == "as_tensor") {
      add(ArgKind::Tensor).i = tensor_name(x, what);
    } else if (k == "as_tensors") {
      add(ArgKind::Tensors);
      if (!x.is_array()) return bad(k);
      for_elements(x, [&](dom::element e) { g_.push_value(tensor_name(e, what)); });
    } else if (k == "as_optional_tensor") {
      add(ArgKind::OptionalTensor).i = optional_tensor(x, what);
    } else if (k == "as_optional_tensors") {
      add(ArgKind::OptionalTensors);
      if (!x.is_array()) return bad(k);
      for_elements(x, [&](dom::element e) { g_.push_value(optional_tensor(e, what)); });
    } else if (k == "as_int") {
      add(ArgKind::Int);
      if (!read_int(x, i)) bad(k);
      g_.push_int(SymInt{i, kNone});
    } else if (k == "as_ints" || k == "as_bools") {
      const bool bools = k == "as_bools";
      add(bools ? ArgKind::Bools : ArgKind::Ints);
      if (!x.is_array()) return bad(k);
      for_elements(x, [&](dom::element e) {
        int64_t n = 0;
        bool bv = false;
        if (bools ? read_bool(e, bv) : read_int(e, n)) {
          g_.push_int(SymInt{bools ? int64_t{bv} : n, kNone});
        } else {
          bad(k);
        }
      });
    } else if (k == "as_sym_int") {
      add(ArgKind::SymInt).i = kNone;
      sym_int_argument(x, what);
      g_.arg_at(index).i = g_.last_int_value();
    } else if (k == "as_sym_ints") {
      add(ArgKind::SymInts);
      if (!x.is_array()) return bad(k);
      for_elements(x, [&](dom::element e) { sym_int_argument(e, what); });
    } else if (k == "as_float") {
      if (!read_double(x, f)) bad(k);
      add(ArgKind::Float).f = f;
    } else if (k == "as_floats") {
      add(ArgKind::Floats);
      if (!x.is_array()) return bad(k);
      for_elements(x, [&](dom::element e) {
        double d = 0;
        if (read_double(e, d)) g_.push_float(d);
        else bad(k);
      });
    } else if (k == "as_bool") {
      if (!read_bool(x, b)) bad(k);
      add(ArgKind::Bool).i = b;
    } else if (k == "as_string") {
      if (!read_string(x, s)) bad(k);
      add(ArgKind::String).i = g_.intern(s);
    } else if (k == "as_strings") {
      add(ArgKind::Strings);
      if (!x.is_array()) return bad(k);
      for_elements(x, [&](dom::element e) {
        std::string_view es;
        if (read_string(e, es)) g_.push_str(g_.intern(es));
        else bad(k);
      });
    } else if (k == "as_scalar_type" || k == "as_memory_format" || k == "as_layout") {
      if (!read_int(x, i)) bad(k);
      add(k == "as_scalar_type" ? ArgKind::ScalarType : k == "as_layout" ? ArgKind::Layout : ArgKind::MemoryFormat).i = i;
    } else if (k == "as_device") {
      add(ArgKind::Device).i = g_.intern(device(x, what));
    } else {
      // as_graph (higher-order ops), as_custom_obj, as_sym_bool, as_complex, ...: kept by kind only.
      add(ArgKind::Other).i = g_.intern(k);
    }
  });
  if (!added) add(ArgKind::None);
  return index;
}

std::string ProgramWalk::device(dom::element v, const What& what) {
  std::string type;
  int64_t index = -1;
  bool has_index = false;
  if (!v.is_object()) {
    g_.damage(what + ": a device that is not an object");
    return type;
  }
  for_fields(v, {"type", "index"}, [&](std::string_view k, dom::element x) {
    std::string_view s;
    if (k == "type" && read_string(x, s)) type = std::string(s);
    if (k == "index") has_index = read_int(x, index);
  });
  return has_index ? type + ":" + std::to_string(index) : type;
}

void ProgramWalk::output(dom::element v) {
  const What what("node ", raw_.node_stacks.size() - 1, ": an output");
  union_of(v, what, [&](std::string_view k, dom::element x) {
    if (k == "as_tensor") {
      g_.add_output(tensor_name(x, what));
    } else if (k == "as_tensors") {
      if (!x.is_array()) return g_.damage(what + " as_tensors is not a list");
      for_elements(x, [&](dom::element e) { g_.add_output(tensor_name(e, what)); });
    } else if (k == "as_optional_tensors") {
      if (!x.is_array()) return g_.damage(what + " as_optional_tensors is not a list");
      for_elements(x, [&](dom::element e) { g_.add_output(optional_tensor(e, what)); });
    } else if (k == "as_sym_int") {
      ValueId out = kNone;
      union_of(x, what, [&](std::string_view sk, dom::element sx) {
        std::string_view s;
        if (sk == "as_name" && read_string(sx, s)) out = g_.value(s);
      });
      g_.add_output(out);
    } else {
      g_.add_output(kNone);  // as_none, a constant, or a kind without a value of its own
    }
  });
}

}  // namespace fsdp_plan::pt2
