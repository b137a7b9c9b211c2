#include "model/loaders/export_program.h"

#include <algorithm>
#include <future>
#include <system_error>
#include <limits>
#include <optional>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>
#include <simdjson.h>

#include "model/dtype.h"
#include "model/graph.h"
#include "model/graph_builder.h"
#include "util/errors.h"

namespace fsdp_plan {
namespace {

// models/model.json (9.4 MB for Llama-3-70B, most of it stack traces) is read
// in one pass by simdjson's On-Demand parser: what the tree and the graph
// need is taken as the walk meets it, everything else is skipped unparsed
// (its brackets and strings are still checked: a cut or unbalanced file is
// refused). The small weights and constants configs stay with nlohmann.
// std::map objects there: an ordered_json object checks every insertion
// against all its keys.
using Json = nlohmann::json;
namespace dom = simdjson::dom;

// ---------------------------------------------------------------------------- nlohmann records

// Exactly a Json: nlohmann's constructors would take a simdjson element too.
template <typename J, std::enable_if_t<std::is_same_v<J, Json>, int> = 0>
const Json* member(const J& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

bool get_int(const Json* v, int64_t& out) {
  if (!v) return false;
  if (v->is_number_unsigned()) {
    const auto u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    out = static_cast<int64_t>(u);
    return true;
  }
  if (!v->is_number_integer()) return false;
  out = v->get<int64_t>();
  return true;
}

const std::string* get_string(const Json* v) { return v && v->is_string() ? v->get_ptr<const std::string*>() : nullptr; }

// nn_module_stack entries are "key,path,class"; torch splits them at commas
// outside brackets (a path may read "layers[0]").
std::vector<std::string> split_stack_entry(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '[' || c == '(') ++depth;
    else if (c == ']' || c == ')') --depth;
    else if (c == ',' && depth == 0) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(s.substr(start));
  return out;
}

// ---------------------------------------------------------------------------- raw metadata

// One entry of a sizes / strides list, or a storage offset, as written.
struct RawDim {
  enum Kind : uint8_t { Int, Expr, Bad } kind = Bad;
  int64_t value = 0;
  std::string expr;  // Expr: the srepr text
  int64_t hint = kNoHint;
};

// A TensorMeta as written (schema.py: TensorMeta), from either parser: the
// tree's checks and the graph both read it.
struct RawMeta {
  bool has_dtype = false;
  int64_t dtype = 0;
  bool sizes_array = false, strides_array = false, has_offset = false;
  std::vector<RawDim> sizes, strides;
  RawDim offset;
  std::optional<bool> requires_grad;
  std::string device_type;
  std::optional<int64_t> device_index;
  int64_t layout = 0;
};

std::string dim_key(const RawDim& d) {
  switch (d.kind) {
    case RawDim::Int: return std::to_string(d.value);
    case RawDim::Expr: return "e:" + d.expr;
    case RawDim::Bad: return "?";
  }
  return "?";
}

// dtype, sizes, strides and offset: one tensor if the file and this agree.
std::string view_key(const RawMeta& m) {
  std::string out = std::to_string(m.dtype) + "|";
  for (const auto& d : m.sizes) out += dim_key(d) + ",";
  out += "|";
  if (m.strides_array)
    for (const auto& d : m.strides) out += dim_key(d) + ",";
  out += "|" + (m.has_offset ? dim_key(m.offset) : std::string());
  return out;
}

// The weights and constants configs are read by simdjson's DOM (nlohmann's
// std::map objects cost 170 instructions a byte: 42M for the 240 KB config of
// Llama-3-70B), with nlohmann's rules: a key given twice keeps its last value,
// member() takes the key up to a NUL as c_str() gave it. Text simdjson
// refuses goes to nlohmann, which either reads it (numbers past 64 bits,
// nesting past 1024) or says why not, in the words it always did.
std::optional<dom::element> member(dom::element obj, std::string_view key) {
  std::optional<dom::element> out;
  dom::object o;
  if (obj.get_object().get(o)) return out;
  for (dom::key_value_pair field : o)
    if (field.key == key) out = field.value;
  return out;
}

// nlohmann's is_number_integer within int64; its unsigned above int64 refused.
bool get_int(const std::optional<dom::element>& v, int64_t& out) {
  return v && v->type() == dom::element_type::INT64 && !v->get_int64().get(out);
}

std::optional<std::string_view> get_string(const std::optional<dom::element>& v) {
  std::string_view s;
  if (!v || !v->is_string() || v->get_string().get(s)) return std::nullopt;
  return s;
}

std::optional<bool> get_bool(const Json* v) {
  if (!v || !v->is_boolean()) return std::nullopt;
  return v->get<bool>();
}

std::optional<bool> get_bool(const std::optional<dom::element>& v) {
  bool b = false;
  if (!v || !v->is_bool() || v->get_bool().get(b)) return std::nullopt;
  return b;
}

bool is_array(const Json* v) { return v && v->is_array(); }
bool is_array(const std::optional<dom::element>& v) { return v && v->is_array(); }

template <typename F>
void each(const Json* v, F&& f) {
  for (const Json& e : *v) f(&e);
}

template <typename F>
void each(const std::optional<dom::element>& v, F&& f) {
  dom::array arr;
  if (v->get_array().get(arr)) return;
  for (dom::element e : arr) f(std::optional<dom::element>(e));
}

// One config entry's value of a member: a pointer (nlohmann) or an optional (simdjson).
template <typename V>
RawDim raw_dim(const V& s) {
  RawDim d;
  int64_t v = 0;
  if (const auto e = member(*s, "as_expr")) {
    d.kind = RawDim::Expr;
    if (const auto text = get_string(member(*e, "expr_str"))) d.expr = std::string(*text);
    if (const auto h = member(*e, "hint"); h && get_int(member(*h, "as_int"), v)) d.hint = v;
  } else if (get_int(member(*s, "as_int"), v)) {
    d.kind = RawDim::Int;
    d.value = v;
  }
  return d;
}

template <typename V>
RawMeta raw_meta(const V& meta) {
  RawMeta m;
  m.has_dtype = get_int(member(*meta, "dtype"), m.dtype);
  if (const auto sizes = member(*meta, "sizes"); is_array(sizes)) {
    m.sizes_array = true;
    each(sizes, [&](const auto& s) { m.sizes.push_back(raw_dim(s)); });
  }
  if (const auto strides = member(*meta, "strides"); is_array(strides)) {
    m.strides_array = true;
    each(strides, [&](const auto& s) { m.strides.push_back(raw_dim(s)); });
  }
  if (const auto off = member(*meta, "storage_offset")) {
    m.has_offset = true;
    m.offset = raw_dim(off);
  }
  m.requires_grad = get_bool(member(*meta, "requires_grad"));
  if (const auto dev = member(*meta, "device")) {
    if (const auto t = get_string(member(*dev, "type"))) m.device_type = std::string(*t);
  }
  return m;
}

// What the tree reads of one entry of a weights or constants config.
struct ConfigEntry {
  bool has_meta = false;  // a tensor_meta member, of any type
  RawMeta meta;
  std::optional<std::string> path_name;
  std::optional<bool> is_param;
};

template <typename V>
ConfigEntry config_entry(const V& v) {
  ConfigEntry c;
  if (const auto meta = member(*v, "tensor_meta")) {
    c.has_meta = true;
    c.meta = raw_meta(meta);
  }
  if (const auto p = get_string(member(*v, "path_name"))) c.path_name = std::string(*p);
  c.is_param = get_bool(member(*v, "is_param"));
  return c;
}

// A config record: its "config" object's entries, each key's last value.
struct Config {
  bool object = false;  // "config" is an object
  std::unordered_map<std::string, ConfigEntry> entries;
  // The keys of every object one level down, in file order, repeats kept:
  // the order nlohmann's parse callback gave at depth 2.
  std::vector<std::string> order;

  // member(config, fqn.c_str()), as nlohmann's lookup went.
  const ConfigEntry* find(const std::string& fqn) const {
    auto it = entries.find(std::string(fqn.c_str()));
    return it == entries.end() ? nullptr : &it->second;
  }
};

// ---------------------------------------------------------------------------- the walk

// A simdjson error, or a key given twice, thrown out of the walk: the
// message comes from nlohmann's reading of the same text where it too
// refuses it, as before simdjson read this record.
struct JsonFail {
  simdjson::error_code code;
  std::string what;
};

[[noreturn]] void twice(std::string_view key) {
  throw JsonFail{simdjson::SUCCESS, "key \"" + std::string(key) + "\" given twice in one object"};
}

// An integer within int64 (nlohmann's is_number_integer, unsigned above
// int64's range refused, as get_int above).
bool read_int(dom::element v, int64_t& out) {
  if (v.type() != dom::element_type::INT64) return false;
  return !v.get_int64().get(out);
}

// A float argument: a number, or the strings torch writes for the others
// (torch/_export/serde/serialize.py: _dataclass_to_dict, "Infinity",
// "-Infinity", "NaN": masked_fill(-inf) in attention masks).
bool read_double(dom::element v, double& out) {
  std::string_view s;
  if (v.is_string() && !v.get_string().get(s)) {
    if (s == "Infinity") out = std::numeric_limits<double>::infinity();
    else if (s == "-Infinity") out = -std::numeric_limits<double>::infinity();
    else if (s == "NaN") out = std::numeric_limits<double>::quiet_NaN();
    else return false;
    return true;
  }
  const auto t = v.type();
  if (t != dom::element_type::INT64 && t != dom::element_type::UINT64 && t != dom::element_type::DOUBLE) return false;
  return !v.get_double().get(out);
}

bool read_bool(dom::element v, bool& out) { return v.is_bool() && !v.get_bool().get(out); }

bool read_string(dom::element v, std::string_view& out) { return v.is_string() && !v.get_string().get(out); }

// Calls f(key, value) for each field of an object; a key of `known` given
// twice refuses the file (nlohmann kept the last silently, other readers the first).
template <typename F>
void for_fields(dom::element v, std::initializer_list<std::string_view> known, F&& f) {
  dom::object obj;
  if (v.get_object().get(obj)) return;
  uint64_t seen = 0;
  for (dom::key_value_pair field : obj) {
    int i = 0;
    for (std::string_view k : known) {
      if (k == field.key) {
        if (seen & (uint64_t{1} << i)) twice(field.key);
        seen |= uint64_t{1} << i;
        break;
      }
      ++i;
    }
    f(field.key, field.value);
  }
}

template <typename F>
void for_elements(dom::element v, F&& f) {
  dom::array arr;
  if (v.get_array().get(arr)) return;
  for (dom::element e : arr) f(e);
}

// Where a value sits, for a damage message: its text is made only when damage
// is recorded. Built eagerly ("node 1234: an argument", "tensor x's size")
// it cost a heap string or two per argument, output and dimension read (an
// estimate: some 100,000 for a 70B graph), for messages a sound file never gives.
class What {
 public:
  What(const char* text) : head_(text) {}  // a fixed text
  What(const char* head, size_t number, const char* tail) : head_(head), tail_(tail), number_(number), numbered_(true) {}
  What(const char* head, std::string_view name) : head_(head), name_(name) {}
  // This one with more words after it ("'s size").
  What with(const char* more) const {
    What w = *this;
    w.more_ = more;
    return w;
  }
  std::string str() const {
    std::string out = head_;
    if (numbered_) out += std::to_string(number_);
    out.append(name_.data(), name_.size());
    return out + tail_ + more_;
  }
  friend std::string operator+(const What& w, const char* s) { return w.str() + s; }

 private:
  const char* head_;
  const char* tail_ = "";
  const char* more_ = "";
  std::string_view name_;
  size_t number_ = 0;
  bool numbered_ = false;
};

// What the module tree reads of an input_specs entry.
struct RawSpec {
  bool parameter = false, buffer = false;
  std::optional<std::string> parameter_name, buffer_name;
  std::string parameter_arg, buffer_arg;  // arg.name
  std::optional<bool> persistent;
};

// What the module tree reads of models/model.json; the graph goes to the builder.
struct RawProgram {
  bool object = false;
  bool schema = false, major_ok = false, minor_ok = false;
  int64_t major = 0, minor = 0;
  std::optional<std::string> torch_version;
  bool graph_module = false, graph = false, tensor_values = false;
  bool calls = false;
  std::vector<std::optional<std::string>> call_fqns;
  bool nodes = false;
  std::vector<std::optional<std::string_view>> node_stacks;
  bool specs = false;
  std::vector<RawSpec> input_specs;
  std::unordered_map<std::string_view, RawMeta> metas;  // tensor_values, by name
};

class ProgramWalk {
 public:
  ProgramWalk(RawProgram& raw, GraphBuilder& g) : raw_(raw), g_(g) {}

  void top(dom::element doc) {
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

 private:
  void schema_version(dom::element v) {
    if (!v.is_object()) return;
    raw_.schema = true;
    for_fields(v, {"major", "minor"}, [&](std::string_view k, dom::element x) {
      if (k == "major") raw_.major_ok = read_int(x, raw_.major);
      if (k == "minor") raw_.minor_ok = read_int(x, raw_.minor);
    });
  }

  void graph_module(dom::element v) {
    if (!v.is_object()) return;
    raw_.graph_module = true;
    for_fields(v, {"graph", "signature", "module_call_graph"}, [&](std::string_view k, dom::element x) {
      if (k == "graph") graph(x);
      if (k == "signature") signature(x);
      if (k == "module_call_graph") module_call_graph(x);
    });
  }

  void module_call_graph(dom::element v) {
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

  void graph(dom::element v) {
    if (!v.is_object()) return;
    raw_.graph = true;
    for_fields(v, {"inputs", "nodes", "tensor_values", "sym_int_values"}, [&](std::string_view k, dom::element x) {
      if (k == "inputs") graph_inputs(x);
      if (k == "nodes") nodes(x);
      if (k == "tensor_values") tensor_values(x);
      if (k == "sym_int_values") sym_int_values(x);
    });
  }

  // ------------------------------------------------------------------ nodes

  void nodes(dom::element v) {
    if (!v.is_array()) return;
    raw_.nodes = true;
    for_elements(v, [&](dom::element n) { node(n); });
  }

  std::string node_where() const { return "node " + std::to_string(raw_.node_stacks.size() - 1); }

  void node(dom::element v) {
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

  void named_argument(dom::element v) {
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

  // {"name": "x"} of a TensorArgument.
  ValueId tensor_name(dom::element v, const What& what) {
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
  ValueId optional_tensor(dom::element v, const What& what) {
    ValueId out = kNone;
    union_of(v, what, [&](std::string_view k, dom::element x) {
      if (k == "as_tensor") out = tensor_name(x, what);
      else if (k != "as_none") g_.damage(what + ": an optional tensor of kind " + std::string(k));
    });
    return out;
  }

  // {"as_name": "sym_size_int_3"} or {"as_int": 4} of a SymIntArgument.
  void sym_int_argument(dom::element v, const What& what) {
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
  size_t argument(dom::element v) {
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

  std::string device(dom::element v, const What& what) {
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

  void output(dom::element v) {
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

  // ------------------------------------------------------------------ values

  static RawDim sym_int(dom::element v) {
    RawDim d;
    if (!v.is_object()) return d;
    // {"as_int": n} or {"as_expr": {"expr_str": ..., "hint": {"as_int": n}}}; the first key decides, as
    // nlohmann's member() lookups found as_expr before as_int.
    bool expr = false;
    int64_t iv = 0;
    bool int_ok = false;
    for_fields(v, {"as_int", "as_expr"}, [&](std::string_view k, dom::element x) {
      if (k == "as_int") int_ok = read_int(x, iv);
      if (k == "as_expr") {
        expr = true;
        if (!x.is_object()) return;
        for_fields(x, {"expr_str", "hint"}, [&](std::string_view ek, dom::element ex) {
          std::string_view s;
          if (ek == "expr_str" && read_string(ex, s)) d.expr = std::string(s);
          if (ek == "hint" && ex.is_object()) {
            for_fields(ex, {"as_int"}, [&](std::string_view hk, dom::element hx) {
              int64_t h = 0;
              if (hk == "as_int" && read_int(hx, h)) d.hint = h;
            });
          }
        });
      }
    });
    if (expr) {
      d.kind = RawDim::Expr;
    } else if (int_ok) {
      d.kind = RawDim::Int;
      d.value = iv;
    }
    return d;
  }

  // A sizes or strides list; `count` gets its length (each one an element
  // of the graph, counted by apply_tensor_values).
  static void dims(dom::element v, bool& is_list, std::vector<RawDim>& out, size_t& count) {
    dom::array arr;
    if (v.get_array().get(arr)) return;
    is_list = true;
    out.reserve(std::min<size_t>(arr.size(), kMaxTensorRank + 1));  // a tensor's rank; more is damage
    for_elements(v, [&](dom::element e) {
      ++count;
      out.push_back(sym_int(e));
    });
  }

 public:
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

  // The part of tensor_values that reads only the DOM (half its cost, 7,000
  // tensors for Llama-3-70B): a second thread does it while the nodes are walked.
  static TensorEntries read_tensor_values(dom::element v) {
    TensorEntries out;
    dom::object obj;
    if (v.get_object().get(obj)) return out;
    out.object = true;
    out.entries.reserve(obj.size());
    try {
      for (dom::key_value_pair field : obj) {
        TensorEntry e;
        e.name = field.key;
        dom::element x = field.value;
        RawMeta& m = e.m;
        e.object = x.is_object();
        if (e.object) {
          for_fields(x, {"dtype", "sizes", "requires_grad", "device", "strides", "storage_offset", "layout"},
                     [&](std::string_view k, dom::element f) {
                       if (k == "dtype") m.has_dtype = read_int(f, m.dtype);
                       else if (k == "sizes") dims(f, m.sizes_array, m.sizes, e.dims);
                       else if (k == "strides") dims(f, m.strides_array, m.strides, e.dims);
                       else if (k == "storage_offset") {
                         m.has_offset = true;
                         m.offset = sym_int(f);
                       } else if (k == "requires_grad") {
                         bool b = false;
                         if (read_bool(f, b)) m.requires_grad = b;
                       } else if (k == "device") {
                         if (!f.is_object()) return;
                         for_fields(f, {"type", "index"}, [&](std::string_view dk, dom::element dv) {
                           std::string_view s;
                           int64_t idx = 0;
                           if (dk == "type" && read_string(dv, s)) m.device_type = std::string(s);
                           if (dk == "index" && read_int(dv, idx)) m.device_index = idx;
                         });
                       } else if (k == "layout") {
                         read_int(f, m.layout);
                       }
                     });
        }
        out.entries.push_back(std::move(e));
      }
    } catch (const JsonFail& fail) {
      out.fail = fail;
    }
    return out;
  }

  // The tensor_values object this walk will meet first, read ahead (walk_model starts it).
  void read_ahead(std::future<TensorEntries>* ahead) { ahead_ = ahead; }

 private:
  void tensor_values(dom::element v) {
    if (ahead_ && ahead_->valid()) {
      std::future<TensorEntries>* ahead = ahead_;
      ahead_ = nullptr;
      return apply_tensor_values(ahead->get());
    }
    apply_tensor_values(read_tensor_values(v));
  }

  // In file order, as one pass did: each entry's dimensions counted, its
  // graph value set, its name checked against the earlier ones.
  void apply_tensor_values(TensorEntries t) {
    if (!t.object) return;
    raw_.tensor_values = true;
    raw_.metas.reserve(t.entries.size());
    for (TensorEntry& e : t.entries) {
      for (size_t i = 0; i < e.dims; ++i) g_.count_element();
      to_graph(e.name, e.m, e.object);
      if (!raw_.metas.emplace(e.name, std::move(e.m)).second) {
        throw JsonFail{simdjson::SUCCESS, "key \"" + std::string(e.name) + "\" given twice in one object"};
      }
    }
    if (t.fail) throw *t.fail;
  }

  SymInt graph_dim(const RawDim& d, const What& what) {
    if (d.kind == RawDim::Int) return SymInt{d.value, kNone};
    if (d.kind == RawDim::Expr) return g_.expr(d.expr, d.hint, what.str());
    g_.damage(what + " is neither an integer nor an expression");
    return SymInt{};
  }

  void to_graph(std::string_view name, const RawMeta& m, bool object) {
    const What what("tensor ", name);
    if (!object) return g_.damage(what + ": its metadata is not an object");
    TensorMeta t;
    const DtypeInfo* dt = m.has_dtype && m.dtype > 0 && m.dtype <= 255 ? dtype_from_export_code(static_cast<int>(m.dtype)) : nullptr;
    if (!dt) return g_.damage(what + " has no known dtype");
    t.dtype = static_cast<uint8_t>(m.dtype);
    if (!m.sizes_array) return g_.damage(what + " has no sizes");
    if (m.sizes.size() > static_cast<size_t>(kMaxTensorRank)) {
      return g_.damage(what + " has more than " + std::to_string(kMaxTensorRank) + " dimensions");
    }
    if (m.strides_array && m.strides.size() != m.sizes.size()) {
      return g_.damage(what + " has " + std::to_string(m.strides.size()) + " strides for " +
                       std::to_string(m.sizes.size()) + " sizes");
    }
    // Scratch lists, kept between tensors (set_tensor copies them).
    std::vector<SymInt>& sizes = sizes_;
    std::vector<SymInt>& strides = strides_;
    sizes.clear();
    strides.clear();
    for (const RawDim& d : m.sizes) {
      sizes.push_back(graph_dim(d, what.with("'s size")));
      if (sizes.back().constant() && sizes.back().value < 0) return g_.damage(what + " has a negative size");
    }
    for (const RawDim& d : m.strides) strides.push_back(graph_dim(d, what.with("'s stride")));
    if (m.has_offset) t.storage_offset = graph_dim(m.offset, what.with("'s storage offset"));
    t.requires_grad = m.requires_grad.value_or(false);
    t.layout = static_cast<uint8_t>(m.layout >= 0 && m.layout < 256 ? m.layout : 0);
    std::string dev = m.device_type;
    if (m.device_index) dev += ":" + std::to_string(*m.device_index);
    // Tensors come on one device or two: the last one's id is kept.
    if (last_device_id_ == kNone || dev != last_device_) {
      last_device_id_ = g_.intern(dev);
      last_device_ = std::move(dev);
    }
    t.device = last_device_id_;
    g_.set_tensor(g_.value(name), t, sizes, strides);
  }

  void sym_int_values(dom::element v) {
    if (!v.is_object()) return;
    dom::object obj;
    if (v.get_object().get(obj)) return;
    for (dom::key_value_pair field : obj) {
      const std::string_view name = field.key;
      const RawDim d = sym_int(field.value);
      g_.set_sym_int(g_.value(name), graph_dim(d, What("symbolic int ", name)));
    }
  }

  void graph_inputs(dom::element v) {
    if (!v.is_array()) return;
    for_elements(v, [&](dom::element a) {
      union_of(a, "a graph input", [&](std::string_view k, dom::element x) {
        if (k == "as_tensor") {
          const ValueId t = tensor_name(x, "a graph input");
          if (t != kNone) g_.add_placeholder(t);
        } else if (k == "as_sym_int") {
          union_of(x, "a graph input", [&](std::string_view sk, dom::element sx) {
            std::string_view s;
            if (sk == "as_name" && read_string(sx, s)) g_.add_placeholder(g_.value(s));
          });
        }
      });
    });
  }

  // ------------------------------------------------------------------ signature

  void signature(dom::element v) {
    if (!v.is_object()) return;
    for_fields(v, {"input_specs", "output_specs"}, [&](std::string_view k, dom::element x) {
      if (k == "input_specs" && x.is_array()) {
        raw_.specs = true;
        for_elements(x, [&](dom::element s) { input_spec(s); });
      }
      if (k == "output_specs" && x.is_array()) {
        for_elements(x, [&](dom::element s) { output_spec(s); });
      }
    });
  }

  // {"name": ...} of an arg, as a string.
  std::optional<std::string> arg_name(dom::element v) {
    std::optional<std::string> out;
    if (!v.is_object()) return out;
    for_fields(v, {"name"}, [&](std::string_view k, dom::element x) {
      std::string_view s;
      if (k == "name" && read_string(x, s)) out = std::string(s);
    });
    return out;
  }

  // The value an Argument union names (as_tensor, as_sym_int), or kNone.
  ValueId argument_value(dom::element v, const What& what) {
    ValueId out = kNone;
    union_of(v, what, [&](std::string_view k, dom::element x) {
      if (k == "as_tensor") {
        out = tensor_name(x, what);
      } else if (k == "as_sym_int") {
        union_of(x, what, [&](std::string_view sk, dom::element sx) {
          std::string_view s;
          if (sk == "as_name" && read_string(sx, s)) out = g_.value(s);
        });
      }
    });
    return out;
  }

  void input_spec(dom::element v) {
    RawSpec spec;
    const What what("input spec ", raw_.input_specs.size(), "");
    if (v.is_object()) {
      for_fields(v, {"user_input", "parameter", "buffer", "tensor_constant", "custom_obj", "token", "constant_input"},
                 [&](std::string_view kind, dom::element body) {
                   GraphInput in;
                   std::optional<std::string> name, target;
                   if (!body.is_object()) {
                     g_.damage(what + " is not an object");
                     return;
                   }
                   ValueId value = kNone;
                   for_fields(body, {"arg", "parameter_name", "buffer_name", "persistent", "tensor_constant_name",
                                     "custom_obj_name", "name"},
                              [&](std::string_view k, dom::element x) {
                                std::string_view s;
                                if (k == "arg") {
                                  if (kind == "user_input") {
                                    value = argument_value(x, what);
                                  } else {
                                    name = arg_name(x);
                                    if (name) value = g_.value(*name);
                                  }
                                } else if (k == "persistent") {
                                  bool b = true;
                                  if (read_bool(x, b)) spec.persistent = b;
                                } else if (k != "name" || kind == "constant_input") {
                                  if (read_string(x, s)) target = std::string(s);
                                }
                              });
                   in.value = value;
                   if (kind == "parameter") {
                     spec.parameter = true;
                     spec.parameter_name = target;
                     spec.parameter_arg = name.value_or("");
                     in.kind = InputKind::Parameter;
                   } else if (kind == "buffer") {
                     spec.buffer = true;
                     spec.buffer_name = target;
                     spec.buffer_arg = name.value_or("");
                     in.kind = InputKind::Buffer;
                     in.persistent = spec.persistent.value_or(true);
                   } else if (kind == "tensor_constant") {
                     in.kind = InputKind::TensorConstant;
                   } else if (kind == "custom_obj") {
                     in.kind = InputKind::CustomObj;
                   } else if (kind == "token") {
                     in.kind = InputKind::Token;
                   } else if (kind == "constant_input") {
                     in.kind = InputKind::ConstantInput;
                     in.value = kNone;
                   } else if (kind == "user_input") {
                     in.kind = InputKind::UserInput;
                     if (value != kNone) target = g_.value_name(value);
                   } else {
                     return;  // a kind of a newer schema: not a placeholder this reader knows
                   }
                   if (target) in.target = g_.intern(*target);
                   g_.add_input(in);
                 });
    }
    raw_.input_specs.push_back(std::move(spec));
  }

  void output_spec(dom::element v) {
    const What what = "output spec";
    union_of(v, what, [&](std::string_view kind, dom::element body) {
      static const std::pair<std::string_view, OutputKind> kKinds[] = {
          {"user_output", OutputKind::UserOutput},
          {"loss_output", OutputKind::LossOutput},
          {"buffer_mutation", OutputKind::BufferMutation},
          {"gradient_to_parameter", OutputKind::GradientToParameter},
          {"gradient_to_user_input", OutputKind::GradientToUserInput},
          {"user_input_mutation", OutputKind::UserInputMutation},
          {"token", OutputKind::Token},
          {"parameter_mutation", OutputKind::ParameterMutation}};
      GraphOutput out;
      bool known = false;
      for (const auto& [name, k] : kKinds) {
        if (name == kind) {
          out.kind = k;
          known = true;
        }
      }
      if (!known || !body.is_object()) return;
      for_fields(body, {"arg", "buffer_name", "parameter_name", "user_input_name"}, [&](std::string_view k, dom::element x) {
        std::string_view s;
        if (k == "arg") {
          if (out.kind == OutputKind::UserOutput) {
            out.value = argument_value(x, what);
          } else if (auto n = arg_name(x)) {
            out.value = g_.value(*n);
          }
        } else if (read_string(x, s)) {
          out.target = g_.intern(s);
        }
      });
      g_.add_output_spec(out);
    });
  }

  void range_constraints(dom::element v) {
    if (!v.is_object()) return;
    dom::object obj;
    if (v.get_object().get(obj)) return;
    for (dom::key_value_pair field : obj) {
      const std::string_view name = field.key;
      dom::element x = field.value;
      int64_t min = 0;
      std::optional<int64_t> max;
      bool min_ok = false;
      if (x.is_object()) {
        for_fields(x, {"min_val", "max_val"}, [&](std::string_view k, dom::element r) {
          int64_t n = 0;
          if (k == "min_val") min_ok = read_int(r, n) ? (min = n, true) : r.is_null();
          // Beyond int64 (torch's int_oo written as a number) is no bound.
          if (k == "max_val" && read_int(r, n)) max = n;
        });
      }
      bool plain = !name.empty() && name.size() <= 256;
      for (char c : name) plain &= std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      if (!plain) {
        g_.damage("range_constraints names something that is not a symbol");
        continue;
      }
      if (!min_ok) g_.damage("range_constraints of " + std::string(name) + " has no min_val");
      g_.add_range(name, min, max);
    }
  }

  RawProgram& raw_;
  GraphBuilder& g_;
  std::vector<SymInt> sizes_, strides_;  // to_graph's
  std::string last_device_;               // to_graph's last device and its id
  StrId last_device_id_ = kNone;
  std::future<TensorEntries>* ahead_ = nullptr;
};

// ---------------------------------------------------------------------------- the tree

class ProgramReader {
 public:
  ProgramReader(const std::string& file, ExportRecords& rec)
      : file_(file),
        model_record_("models/" + rec.model_name + ".json"),
        weights_record_("data/weights/" + rec.model_name + "_weights_config.json"),
        constants_record_("data/constants/" + rec.model_name + "_constants_config.json"),
        rec_(rec),
        graph_(file, [this](const std::string& what) { return damaged_text(model_record_, what); }) {}

  ModuleTree build() {
    // The weights config needs nothing of the program: a second thread reads
    // it while this one walks models/model.json (its errors still come after
    // the program's, from get()). Without a thread to spare, it waits its turn.
    const auto weights_of = [this] { return read_config(rec_.weights, weights_record_, true); };
    std::future<Config> weights_read;
    try {
      weights_read = std::async(std::launch::async, weights_of);
    } catch (const std::system_error&) {
      weights_read = std::async(std::launch::deferred, weights_of);
    }
    walk_model();
    check_version();
    if (!raw_.graph_module) damaged(model_record_, "no graph_module object");
    if (!raw_.graph) damaged(model_record_, "no graph object");
    build_modules();
    record_classes();
    const Config weights = weights_read.get();
    if (!weights.object) damaged(weights_record_, "no config object");
    Config constants;
    if (!rec_.constants.empty()) {
      constants = read_config(rec_.constants, constants_record_, false);
      if (!constants.object) damaged(constants_record_, "no config object");
    }
    add_tensors(weights, rec_.constants.empty() ? nullptr : &constants);
    infer_missing_classes();
    tree_.set_graph(graph_.finish(
        [this](std::string_view path) {
          auto it = by_path_.find(std::string(path));
          return it == by_path_.end() ? kNone : it->second;
        },
        [this](std::string_view fqn, bool) {
          auto it = tensor_by_name_.find(std::string(fqn));
          return it == tensor_by_name_.end() ? kNone : it->second;
        }));
    return std::move(tree_);
  }

 private:
  std::string damaged_text(const std::string& record, const std::string& what) const {
    return "record " + record + " is damaged (" + what + "); " + kSaveExportAgain;
  }
  [[noreturn]] void damaged(const std::string& record, const std::string& what) const {
    throw InputError(file_, damaged_text(record, what));
  }

  // One pass over models/model.json. Where simdjson refuses the text,
  // nlohmann's message says why, as it did when nlohmann read this record.
  void walk_model() {
    static_assert(kModelPadding >= simdjson::SIMDJSON_PADDING, "simdjson reads further past the end");
    const bool in_place = rec_.model_in_place.data() != nullptr;
    if (!in_place) {
      // simdjson reads up to SIMDJSON_PADDING bytes past the end: room for them, so the text is not copied.
      rec_.model.reserve(rec_.model.size() + simdjson::SIMDJSON_PADDING);
    }
    const std::string_view text = in_place ? rec_.model_in_place : std::string_view(rec_.model);
    // A top value other than an object has no schema_version; nlohmann says
    // whether it is JSON at all (200,000 nested arrays are).
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first == std::string::npos || text[first] != '{') {
      refuse_json(text, {simdjson::INCORRECT_TYPE, {}}, true);
      return;
    }
    dom::parser parser;
    try {
      dom::element doc;
      if (auto e = parser.parse(reinterpret_cast<const uint8_t*>(text.data()), text.size(), false).get(doc)) {
        throw JsonFail{e, {}};
      }
      // The first graph_module.graph.tensor_values is the one the walk meets
      // first (a key given twice is refused when the walk meets the second).
      std::future<ProgramWalk::TensorEntries> ahead;
      dom::element values;
      if (!doc["graph_module"]["graph"]["tensor_values"].get(values) && values.is_object()) {
        try {
          ahead = std::async(std::launch::async, [values] { return ProgramWalk::read_tensor_values(values); });
        } catch (const std::system_error&) {
          // no thread to spare: the walk reads them in turn
        }
      }
      ProgramWalk walk(raw_, graph_);
      walk.read_ahead(&ahead);
      walk.top(doc);
    } catch (const JsonFail& fail) {
      refuse_json(text, fail, false);
    }
    // The parser's strings go with it: keep what the tree reads later.
    // Runs of nodes share a stack (a few hundred bytes): the one before is
    // compared before the text is hashed.
    std::unordered_set<std::string_view> seen;
    std::string_view prev;
    for (const auto& s : raw_.node_stacks) {
      if (!s || (prev.data() && *s == prev)) continue;
      prev = *s;
      if (seen.insert(*s).second) stacks_.emplace_back(*s);
    }
    raw_.node_stacks.clear();
    for (const RawSpec& spec : raw_.input_specs) {
      for (const std::string* arg : {&spec.parameter_arg, &spec.buffer_arg}) {
        auto it = raw_.metas.find(*arg);
        if (it != raw_.metas.end()) metas_.emplace(*arg, it->second);
      }
    }
    raw_.metas.clear();
  }

  // Throws nlohmann's message for text it refuses; for text it reads, the
  // message of `fail` (simdjson refuses nesting deeper than 1024, and keys
  // given twice), or nothing when `accept` (the caller reports what is wrong).
  void refuse_json(std::string_view text, const JsonFail& fail, bool accept) const {
    std::string why = fail.what;
    try {
      const Json parsed = Json::parse(text.begin(), text.end());
      (void)parsed;
      if (accept) return;
    } catch (const Json::exception& e) {
      why = e.what();
      const auto tag = why.find("] ");
      if (why.rfind("[json.exception.", 0) == 0 && tag != std::string::npos) why = why.substr(tag + 2);
    }
    if (why.empty()) {
      why = fail.code == simdjson::DEPTH_ERROR
                ? "nested deeper than " + std::to_string(simdjson::DEFAULT_MAX_DEPTH) + " levels"
                : simdjson::error_message(fail.code);
    }
    damaged(model_record_, "invalid JSON: " + why);
  }

  // torch.export.load refuses another major schema version (0.0 means unversioned).
  void check_version() const {
    if (!raw_.schema || !raw_.major_ok || !raw_.minor_ok) damaged(model_record_, "no schema_version");
    if (raw_.major != kExportSchemaMajor && !(raw_.major == 0 && raw_.minor == 0)) {
      const auto& torch_version = raw_.torch_version;
      throw InputError(file_, "exported program schema version " + std::to_string(raw_.major) + "." +
                                  std::to_string(raw_.minor) +
                                  (torch_version ? " (torch " + *torch_version + ")" : std::string()) +
                                  ", but fsdp-plan reads version " + std::to_string(kExportSchemaMajor) +
                                  ".x, as torch 2.13 writes it; " + kSaveExportAgain + " under torch 2.13");
    }
  }

  // A weights or constants config: simdjson's reading, or nlohmann's where
  // simdjson refuses the text (see member() above).
  Config read_config(std::string& text, const std::string& record, bool want_order) const {
    Config out;
    text.reserve(text.size() + simdjson::SIMDJSON_PADDING);  // simdjson then reads it in place
    dom::parser parser;
    dom::element doc;
    if (parser.parse(text).get(doc)) {
      std::vector<std::string> order;
      const Json parsed = parse(text, record, want_order ? &order : nullptr);
      const Json* config = member(parsed, "config");
      if (config && config->is_object()) {
        out.object = true;
        for (auto it = config->begin(); it != config->end(); ++it) out.entries.emplace(it.key(), config_entry(&*it));
      }
      out.order = std::move(order);
      return out;
    }
    dom::object top;
    if (doc.get_object().get(top)) return out;
    for (dom::key_value_pair field : top) {
      dom::object inner;
      if (field.value.get_object().get(inner)) continue;
      if (field.key == "config") {
        out.object = true;
        out.entries.clear();  // a second "config" replaces the first, as in nlohmann's map
        for (dom::key_value_pair e : inner) {
          out.entries.insert_or_assign(std::string(e.key), config_entry(std::optional<dom::element>(e.value)));
        }
      }
      if (want_order)
        for (dom::key_value_pair e : inner) out.order.emplace_back(e.key);
    }
    // A "config" that is not an object, after one that is: nlohmann kept the last.
    if (const auto last = member(doc, "config"); last && !last->is_object()) {
      out.object = false;
      out.entries.clear();
    }
    return out;
  }

  // `config_keys`, if given, gets the keys of the "config" object (depth 2)
  // in file order, which the map forgets.
  Json parse(const std::string& text, const std::string& record,
             std::vector<std::string>* config_keys = nullptr) const {
    try {
      if (!config_keys) return Json::parse(text);
      return Json::parse(text, [config_keys](int depth, Json::parse_event_t event, Json& parsed) {
        if (event == Json::parse_event_t::key && depth == 2 && parsed.is_string()) {
          config_keys->push_back(parsed.get<std::string>());
        }
        return true;
      });
    } catch (const Json::exception& e) {
      std::string what = e.what();
      const auto tag = what.find("] ");
      if (what.rfind("[json.exception.", 0) == 0 && tag != std::string::npos) what = what.substr(tag + 2);
      damaged(record, "invalid JSON: " + what);
    }
  }

  // Paths in named_modules(remove_duplicate=False) order: torch.export records
  // the whole hierarchy in module_call_graph, called or not.
  void build_modules() {
    if (!raw_.calls || raw_.call_fqns.empty()) damaged(model_record_, "no module_call_graph");
    const auto& first = raw_.call_fqns.front();
    if (!first || !first->empty()) damaged(model_record_, "module_call_graph does not start with the root");
    by_path_.emplace("", 0);
    tree_.module(0).class_source = ClassSource::Unrecorded;
    for (const auto& entry : raw_.call_fqns) {
      if (!entry) damaged(model_record_, "a module_call_graph entry without fqn");
      const std::string& fqn = *entry;
      if (by_path_.count(fqn)) continue;
      const auto dot = fqn.rfind('.');
      const std::string parent = dot == std::string::npos ? "" : fqn.substr(0, dot);
      const std::string name = dot == std::string::npos ? fqn : fqn.substr(dot + 1);
      auto p = by_path_.find(parent);
      // Entries added for preserve_module_call_signature can name paths
      // outside the hierarchy; they are not modules of the tree.
      if (p == by_path_.end() || name.empty()) continue;
      const ModuleId id = tree_.add_module(p->second, name, "");
      tree_.module(id).class_source = ClassSource::Unrecorded;
      by_path_.emplace(fqn, id);
    }
  }

  // Each node's nn_module_stack names the modules whose forward it ran in,
  // with their classes.
  void record_classes() {
    if (!raw_.nodes) damaged(model_record_, "no graph nodes");
    std::unordered_set<std::string> seen;
    for (const std::string& stack : stacks_) {
      size_t start = 0;
      while (start <= stack.size()) {
        size_t end = stack.find(';', start);
        if (end == std::string::npos) end = stack.size();
        std::string item = stack.substr(start, end - start);
        start = end + 1;
        if (!seen.insert(item).second) continue;
        auto parts = split_stack_entry(item);
        if (parts.size() != 3 || parts[2].empty()) damaged(model_record_, "an nn_module_stack entry is not key,path,class");
        auto it = by_path_.find(parts[1]);
        if (it == by_path_.end()) continue;
        Module& m = tree_.module(it->second);
        if (m.class_source == ClassSource::Recorded) continue;
        m.type_name = parts[2];
        m.class_source = ClassSource::Recorded;
      }
    }
  }

  struct Meta {
    TensorInfo info;
    bool on_meta = false;
  };

  Meta read_meta(const RawMeta& meta, const std::string& what, const std::string& record) {
    Meta out;
    if (!meta.has_dtype) damaged(record, what + " has no dtype");
    const int64_t code = meta.dtype;
    const DtypeInfo* dt = code > 0 && code <= 255 ? dtype_from_export_code(static_cast<int>(code)) : nullptr;
    if (!dt) damaged(record, what + " has unknown dtype code " + std::to_string(code));
    out.info.dtype = dt->name;
    out.info.itemsize = dt->itemsize;
    if (!meta.sizes_array) damaged(record, what + " has no sizes");
    int64_t bytes = dt->itemsize;
    for (const RawDim& s : meta.sizes) {
      if (s.kind == RawDim::Expr) {
        throw InputError(file_, what + " has a symbolic shape; parameters and buffers of an exported "
                                       "program have fixed shapes, so the file is damaged; " +
                                    std::string(kSaveExportAgain));
      }
      // The planner multiplies these out: refuse shapes no storage could have.
      int64_t d = s.value;
      if (s.kind != RawDim::Int || d < 0 || __builtin_mul_overflow(bytes, d, &bytes) || bytes > (int64_t{1} << 50)) {
        damaged(record, what + " has an impossible shape");
      }
      out.info.shape.push_back(d);
    }
    total_bytes_ += bytes;
    if (total_bytes_ > (int64_t{1} << 62)) damaged(record, "tensors add up to an impossible size");
    out.info.requires_grad = meta.requires_grad.value_or(true);
    out.on_meta = meta.device_type == "meta";
    return out;
  }

  // One tensor per (file, view): dtype, sizes, strides and offset (view_key,
  // made only here); tensors without a file are each their own.
  TensorId tensor_for(const std::string& file_key, Meta meta, const RawMeta& raw) {
    if (file_key.empty()) return tree_.add_tensor(std::move(meta.info));
    auto [it, fresh] = tensor_ids_.try_emplace(file_key + "|" + view_key(raw), 0);
    if (fresh) it->second = tree_.add_tensor(std::move(meta.info));
    return it->second;
  }

  void add_tensor(const std::string& fqn, bool is_param, const ConfigEntry* config_entry, const char* config_tag,
                  const std::string& config_record, const std::string& arg) {
    if (!seen_.insert(fqn).second) return;
    const auto dot = fqn.rfind('.');
    const std::string owner = dot == std::string::npos ? "" : fqn.substr(0, dot);
    const std::string local = dot == std::string::npos ? fqn : fqn.substr(dot + 1);
    auto m = by_path_.find(owner);
    if (m == by_path_.end() || local.empty()) {
      damaged(model_record_, (is_param ? "parameter " : "buffer ") + fqn +
                                 " belongs to no module of module_call_graph");
    }
    const std::string what = (is_param ? "parameter " : "buffer ") + fqn;
    const std::string* record = &config_record;
    const RawMeta* meta = nullptr;
    if (config_entry && config_entry->has_meta) {
      meta = &config_entry->meta;
    } else {
      auto it = raw_.tensor_values && !arg.empty() ? metas_.find(arg) : metas_.end();
      if (it == metas_.end()) damaged(config_record, what + " has no tensor metadata");
      meta = &it->second;
      record = &model_record_;
    }
    std::string file_key;
    if (config_entry) {
      if (!config_entry->path_name) damaged(config_record, what + " has no path_name");
      file_key = std::string(config_tag) + *config_entry->path_name;
    }
    Meta info = read_meta(*meta, what, *record);
    // Meta tensors have no storage: torch writes them all to one record, so
    // the record says nothing about ties (each is its own tensor here).
    if (info.on_meta) file_key.clear();
    const TensorId t = tensor_for(file_key, std::move(info), *meta);
    tensor_by_name_.emplace(fqn, t);
    if (is_param) {
      tree_.add_param(m->second, local, t);
    } else {
      tree_.add_buffer(m->second, local, t);
    }
  }

  // The graph signature lists parameters in named_parameters() order, then
  // buffers, each module's in registration order. Strict export leaves out
  // aliases and unused tensors; the weights config (the state_dict) has them.
  void add_tensors(const Config& wconfig, const Config* cconfig) {
    if (!raw_.specs) damaged(model_record_, "no graph signature input_specs");
    for (const RawSpec& spec : raw_.input_specs) {
      if (spec.parameter) {
        if (!spec.parameter_name) damaged(model_record_, "a parameter input without parameter_name");
        const std::string& fqn = *spec.parameter_name;
        add_tensor(fqn, true, wconfig.find(fqn), "w:", weights_record_, spec.parameter_arg);
      } else if (spec.buffer) {
        if (!spec.buffer_name) damaged(model_record_, "a buffer input without buffer_name");
        const std::string& fqn = *spec.buffer_name;
        const bool in_constants = spec.persistent && !*spec.persistent;
        if (in_constants) {
          add_tensor(fqn, false, cconfig ? cconfig->find(fqn) : nullptr, "c:", constants_record_, spec.buffer_arg);
        } else {
          add_tensor(fqn, false, wconfig.find(fqn), "w:", weights_record_, spec.buffer_arg);
        }
      }
    }
    for (const std::string& fqn : wconfig.order) {
      const ConfigEntry* entry = wconfig.find(fqn);
      if (!entry) continue;  // a key of another depth-2 object
      if (!entry->is_param) damaged(weights_record_, fqn + " has no is_param");
      add_tensor(fqn, *entry->is_param, entry, "w:", weights_record_, "");
    }
  }

  // A module whose forward never ran has no recorded class. Two kinds are
  // told by their contents: containers that cannot be called at all (a
  // ModuleList holds only children named 0..n-1, a ModuleDict only other
  // children), and children torch.nn always makes of one class but never
  // calls (MultiheadAttention reads out_proj's weight directly).
  void infer_missing_classes() {
    for (ModuleId id = 0; id < static_cast<ModuleId>(tree_.num_modules()); ++id) {
      Module& m = tree_.module(id);
      if (m.class_source != ClassSource::Unrecorded) continue;
      const std::string inferred = infer_class(id);
      m.type_name = inferred.empty() ? kUnrecordedClass : inferred;
      m.class_source = inferred.empty() ? ClassSource::Unrecorded : ClassSource::Inferred;
    }
  }

  std::string infer_class(ModuleId id) const {
    const Module& m = tree_.module(id);
    if (m.parent >= 0 && m.name == "out_proj" &&
        tree_.module(m.parent).type_name == "torch.nn.modules.activation.MultiheadAttention") {
      return "torch.nn.modules.linear.NonDynamicallyQuantizableLinear";
    }
    if (m.children.empty() || !m.params.empty() || !m.buffers.empty()) return "";
    bool list = true;
    for (size_t i = 0; list && i < m.children.size(); ++i) {
      list = tree_.module(m.children[i]).name == std::to_string(i);
    }
    return list ? "torch.nn.modules.container.ModuleList" : "torch.nn.modules.container.ModuleDict";
  }

  const std::string& file_;
  const std::string model_record_, weights_record_, constants_record_;
  ExportRecords& rec_;
  RawProgram raw_;
  GraphBuilder graph_;
  std::vector<std::string> stacks_;  // the distinct nn_module_stack texts, in first-use order
  std::unordered_map<std::string, RawMeta> metas_;
  ModuleTree tree_;
  std::unordered_map<std::string, ModuleId> by_path_;
  std::unordered_set<std::string> seen_;
  std::unordered_map<std::string, TensorId> tensor_ids_, tensor_by_name_;
  int64_t total_bytes_ = 0;
};

}  // namespace

ModuleTree build_export_tree(const std::string& file, ExportRecords records) {
  return ProgramReader(file, records).build();
}

}  // namespace fsdp_plan
