#include "activations/saved_ops.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <optional>

#include "activations/graph_input.h"
#include "util/checked.h"

namespace fsdp_plan {

// The table's types, as saved_ops.inc fills them (gen_saved_ops.py writes it).
enum class ExprKind : uint8_t { None, Bool, Int, Float, Str, List, Name, And, Or, Not, Neg, If, Bin, Cmp, Call };
enum class TableOp : uint8_t {
  None,
  Add, Sub, Mul, FloorDiv,
  Eq, Ne, Lt, Le, Gt, Ge, In, NotIn,
  Has, Rg, Dim, Size, Numel, Dtype, Shape, Dims, Contiguous, ViewableFlat, ViewOk, FlattenOk, DenseLike, IsFloat,
  IsNumber, SameDtype, Ones, Len, CeilDiv,
};

struct ExprNode {
  ExprKind kind;
  TableOp op;
  int32_t count;  // children
  int32_t first;  // into kExprChildren
  int64_t i;
  double f;
  const char* s;
};
struct SaveItem {
  const char* tensor;  // an argument, or result / result1 ...; nullptr for a new tensor
  int32_t shape, dtype;  // expressions of a new tensor (-1 otherwise)
  const char* name;
  int32_t when;  // -1: always
  int32_t if_grad_first, if_grad_count;  // into kNames
  const char* device;  // nullptr: any
};
struct OpCase {
  int32_t when;  // -1: always
  const char* name;
  int32_t saves_first, saves_count;
  int32_t output_strides;  // -1: as recorded
  bool verified;
};
struct OutputAlias {
  const char* alias;
  int32_t alias_when;
};
struct Default {
  const char* name;
  int32_t value;  // a constant expression
};
struct OpRow {
  const char* op;
  int32_t differentiable_first, differentiable_count;
  const char* alias;
  int32_t outputs_first, outputs_count;
  int32_t defaults_first, defaults_count;
  int32_t cases_first, cases_count;
};

namespace {
using K = ExprKind;
using O = TableOp;
#include "activations/saved_ops.inc"

// `result` -> 0, `result1` -> 1, ...; nullopt for an argument name.
std::optional<size_t> output_index(std::string_view id) {
  if (id.rfind("result", 0) != 0) return std::nullopt;
  const std::string_view rest = id.substr(6);
  if (!std::all_of(rest.begin(), rest.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return rest.empty() ? 0 : static_cast<size_t>(std::stoul(std::string(rest)));
}

const ExprNode& node_at(int32_t i) { return kExprNodes[i]; }
int32_t child(const ExprNode& n, int k) { return kExprChildren[n.first + k]; }

// A value of the expression language: Python's None, bool, int, float, str and list.
struct Value {
  enum class Kind : uint8_t { None, Bool, Int, Float, Str, List } kind = Kind::None;
  int64_t i = 0;  // Bool and Int
  double f = 0;
  std::string_view s;
  std::vector<Value> list;

  static Value none() { return {}; }
  static Value boolean(bool b) {
    Value v;
    v.kind = Kind::Bool;
    v.i = b;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.kind = Kind::Int;
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v;
    v.kind = Kind::Float;
    v.f = x;
    return v;
  }
  static Value str(std::string_view x) {
    Value v;
    v.kind = Kind::Str;
    v.s = x;
    return v;
  }
  static Value ints(const std::vector<int64_t>& xs) {
    Value v;
    v.kind = Kind::List;
    v.list.reserve(xs.size());
    for (int64_t x : xs) v.list.push_back(integer(x));
    return v;
  }
  bool numeric() const { return kind == Kind::Bool || kind == Kind::Int || kind == Kind::Float; }
  double as_double() const { return kind == Kind::Float ? f : static_cast<double>(i); }
  bool truthy() const {
    switch (kind) {
      case Kind::None: return false;
      case Kind::Bool:
      case Kind::Int: return i != 0;
      case Kind::Float: return f != 0;
      case Kind::Str: return !s.empty();
      case Kind::List: return !list.empty();
    }
    return false;
  }
};

bool equal(const Value& a, const Value& b) {
  if (a.numeric() && b.numeric()) {
    if (a.kind == Value::Kind::Float || b.kind == Value::Kind::Float) return a.as_double() == b.as_double();
    return a.i == b.i;
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::None: return true;
    case Value::Kind::Str: return a.s == b.s;
    case Value::Kind::List:
      if (a.list.size() != b.list.size()) return false;
      for (size_t k = 0; k < a.list.size(); ++k)
        if (!equal(a.list[k], b.list[k])) return false;
      return true;
    default: return false;
  }
}

int64_t floor_div(int64_t a, int64_t b) {
  if (b == 0) throw TableExprError("integer division by zero");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t py_index(int64_t i, size_t n) {  // Python's t.sizes[i]
  const int64_t len = static_cast<int64_t>(n);
  if (i < -len || i >= len) throw TableExprError("dimension " + std::to_string(i) + " out of range");
  return i < 0 ? i + len : i;
}

int64_t py_mod(int64_t a, int64_t n) {
  if (n == 0) throw TableExprError("modulo by zero");
  int64_t r = a % n;
  return r < 0 ? r + n : r;
}

bool is_float_dtype(const DtypeInfo* d) {
  if (!d) return false;
  const std::string_view n = d->name;
  return n == "float32" || n == "bfloat16" || n == "float16" || n == "float64";
}

// The itemsize of a dtype the table names; 0 for one it does not.
const DtypeInfo* dtype_named(std::string_view name) {
  static const char* const stems[] = {"Double", "Float", "BFloat16", "Half", "Long", "Int", "Short",
                                      "Char", "Byte", "Bool", "ComplexFloat"};
  for (const char* stem : stems) {
    const DtypeInfo* d = dtype_from_stem(stem);
    if (d && name == d->name) return d;
  }
  return nullptr;
}

class Evaluator {
 public:
  Evaluator(const CallArgs& args, const std::vector<const OpTensor*>& outputs, const SaveEnv& env)
      : args_(args), outputs_(outputs), env_(env) {}

  Value eval(int32_t index) const {
    const ExprNode& n = node_at(index);
    switch (n.kind) {
      case K::None: return Value::none();
      case K::Bool: return Value::boolean(n.i != 0);
      case K::Int: return Value::integer(n.i);
      case K::Float: return Value::real(n.f);
      case K::Str: return Value::str(n.s);
      case K::List: {
        Value v;
        v.kind = Value::Kind::List;
        v.list.reserve(static_cast<size_t>(n.count));
        for (int k = 0; k < n.count; ++k) v.list.push_back(eval(child(n, k)));
        return v;
      }
      case K::Name: return name(n.s);
      case K::And: {
        for (int k = 0; k < n.count; ++k)
          if (!eval(child(n, k)).truthy()) return Value::boolean(false);
        return Value::boolean(true);
      }
      case K::Or: {
        for (int k = 0; k < n.count; ++k)
          if (eval(child(n, k)).truthy()) return Value::boolean(true);
        return Value::boolean(false);
      }
      case K::Not: return Value::boolean(!eval(child(n, 0)).truthy());
      case K::Neg: {
        Value v = eval(child(n, 0));
        if (v.kind == Value::Kind::Float) return Value::real(-v.f);
        if (!v.numeric()) throw TableExprError("negation of a non-number");
        return Value::integer(-v.i);
      }
      case K::If: return eval(child(n, 0)).truthy() ? eval(child(n, 1)) : eval(child(n, 2));
      case K::Bin: return binary(n.op, eval(child(n, 0)), eval(child(n, 1)));
      case K::Cmp: return Value::boolean(compare(n.op, eval(child(n, 0)), eval(child(n, 1))));
      case K::Call: return call(n);
    }
    throw TableExprError("unknown expression node");
  }

 private:
  Value name(std::string_view id) const {
    if (id == "device") return Value::str(device_name(env_.device));
    if (id == "sdpa") return Value::str(sdpa_name(env_.sdpa));
    const ArgValue* a = args_.find(id);
    if (!a) return Value::none();  // an optional argument the call left out
    switch (a->kind) {
      case ArgValue::Kind::None: return Value::none();
      case ArgValue::Kind::Bool: return Value::boolean(a->b);
      case ArgValue::Kind::Int: return Value::integer(a->i);
      case ArgValue::Kind::Float: return Value::real(a->f);
      case ArgValue::Kind::Str: return Value::str(a->s);
      case ArgValue::Kind::Ints: return Value::ints(a->ints);
      case ArgValue::Kind::Tensor:
      case ArgValue::Kind::Tensors: throw TableExprError(std::string(id) + " is a tensor; the table must use a function of it");
      case ArgValue::Kind::Other: throw TableExprError(std::string(id) + " has a value the table cannot read");
    }
    return Value::none();
  }

  static Value binary(O op, const Value& a, const Value& b) {
    if (op == O::Add && a.kind == Value::Kind::List && b.kind == Value::Kind::List) {
      Value v = a;
      v.list.insert(v.list.end(), b.list.begin(), b.list.end());
      return v;
    }
    if (!a.numeric() || !b.numeric()) throw TableExprError("arithmetic on a non-number");
    if (a.kind == Value::Kind::Float || b.kind == Value::Kind::Float) {
      const double x = a.as_double(), y = b.as_double();
      switch (op) {
        case O::Add: return Value::real(x + y);
        case O::Sub: return Value::real(x - y);
        case O::Mul: return Value::real(x * y);
        default: throw TableExprError("floor division of a float");
      }
    }
    switch (op) {
      case O::Add: return Value::integer(a.i + b.i);
      case O::Sub: return Value::integer(a.i - b.i);
      case O::Mul: return Value::integer(a.i * b.i);
      case O::FloorDiv: return Value::integer(floor_div(a.i, b.i));
      default: throw TableExprError("unknown arithmetic operator");
    }
  }

  static bool compare(O op, const Value& a, const Value& b) {
    switch (op) {
      case O::Eq: return equal(a, b);
      case O::Ne: return !equal(a, b);
      case O::In:
      case O::NotIn: {
        if (b.kind != Value::Kind::List) throw TableExprError("'in' needs a list");
        bool found = std::any_of(b.list.begin(), b.list.end(), [&](const Value& x) { return equal(a, x); });
        return op == O::In ? found : !found;
      }
      default: break;
    }
    if (!a.numeric() || !b.numeric()) throw TableExprError("ordering of a non-number");
    const double x = a.as_double(), y = b.as_double();
    const bool ints = a.kind != Value::Kind::Float && b.kind != Value::Kind::Float;
    switch (op) {
      case O::Lt: return ints ? a.i < b.i : x < y;
      case O::Le: return ints ? a.i <= b.i : x <= y;
      case O::Gt: return ints ? a.i > b.i : x > y;
      case O::Ge: return ints ? a.i >= b.i : x >= y;
      default: throw TableExprError("unknown comparison");
    }
  }

  // The tensor an argument or output names: result, result1, ... are outputs.
  const OpTensor* tensor_of(std::string_view id) const {
    if (std::optional<size_t> k = output_index(id)) return *k < outputs_.size() ? outputs_[*k] : nullptr;
    const ArgValue* a = args_.find(id);
    return a && a->kind == ArgValue::Kind::Tensor ? a->tensor : nullptr;
  }

  int64_t integer(int32_t index) const {
    Value v = eval(index);
    if (v.kind == Value::Kind::Float) return static_cast<int64_t>(v.f);
    if (!v.numeric()) throw TableExprError("expected an integer");
    return v.i;
  }
  std::vector<int64_t> int_list(int32_t index) const {
    Value v = eval(index);
    if (v.kind != Value::Kind::List) throw TableExprError("expected a list of integers");
    std::vector<int64_t> out;
    out.reserve(v.list.size());
    for (const Value& x : v.list) {
      if (!x.numeric()) throw TableExprError("expected a list of integers");
      out.push_back(x.kind == Value::Kind::Float ? static_cast<int64_t>(x.f) : x.i);
    }
    return out;
  }

  Value call(const ExprNode& n) const {
    switch (n.op) {
      case O::CeilDiv: {
        const int64_t x = integer(child(n, 0)), d = integer(child(n, 1));
        return Value::integer(-floor_div(-x, d));
      }
      case O::Ones: return Value::ints(std::vector<int64_t>(static_cast<size_t>(std::max<int64_t>(0, integer(child(n, 0)))), 1));
      case O::Len: {
        Value v = eval(child(n, 0));
        if (v.kind != Value::Kind::List) throw TableExprError("len() of a non-list");
        return Value::integer(static_cast<int64_t>(v.list.size()));
      }
      default: break;
    }
    const std::string_view id = node_at(child(n, 0)).s;
    if (n.op == O::Has) {
      const ArgValue* a = args_.find(id);
      return Value::boolean(a && a->kind != ArgValue::Kind::None);
    }
    if (n.op == O::IsNumber) {
      const ArgValue* a = args_.find(id);
      return Value::boolean(a && (a->kind == ArgValue::Kind::Int || a->kind == ArgValue::Kind::Float));
    }
    const OpTensor* t = tensor_of(id);
    if (n.op == O::Rg) {
      if (t) return Value::boolean(t->requires_grad);
      const ArgValue* a = args_.find(id);
      bool any = false;
      if (a) a->for_each_tensor([&](const OpTensor& x) { any = any || x.requires_grad; });
      return Value::boolean(any);
    }
    if (!t) throw TableExprError(std::string(id) + " is not a tensor here");
    switch (n.op) {
      case O::Dim: return Value::integer(static_cast<int64_t>(t->sizes.size()));
      case O::Size: return Value::integer(t->sizes[static_cast<size_t>(py_index(integer(child(n, 1)), t->sizes.size()))]);
      case O::Numel: return Value::integer(t->numel());
      case O::Dtype: return Value::str(t->dtype ? t->dtype->name : "");
      case O::Shape: return Value::ints(t->sizes);
      case O::Contiguous: return Value::boolean(is_contiguous(*t));
      case O::IsFloat: return Value::boolean(t->is_float());
      case O::DenseLike: return Value::ints(dense_like_strides(t->sizes, t->strides));
      case O::SameDtype: {
        const OpTensor* u = tensor_of(node_at(child(n, 1)).s);
        return Value::boolean(u && u->dtype == t->dtype);
      }
      case O::Dims: {
        // Python's t.sizes[a:b]
        const int64_t len = static_cast<int64_t>(t->sizes.size());
        auto clamp = [&](int64_t x) { return x < 0 ? std::max<int64_t>(0, x + len) : std::min(x, len); };
        const int64_t a = clamp(integer(child(n, 1))), b = clamp(integer(child(n, 2)));
        std::vector<int64_t> out;
        for (int64_t k = a; k < b; ++k) out.push_back(t->sizes[static_cast<size_t>(k)]);
        return Value::ints(out);
      }
      case O::ViewableFlat: {
        // x.reshape(-1, x.size(-1)) is a view: every dimension before the last, size-1 ones
        // left out, merges with the next (saved_ops.py: viewable_flat).
        if (t->sizes.size() < 2) return Value::boolean(true);
        std::vector<std::pair<int64_t, int64_t>> dims;
        for (size_t k = 0; k + 1 < t->sizes.size(); ++k)
          if (t->sizes[k] != 1) dims.emplace_back(t->sizes[k], t->strides[k]);
        for (size_t k = 0; k + 1 < dims.size(); ++k)
          if (dims[k].second != dims[k + 1].second * dims[k + 1].first) return Value::boolean(false);
        return Value::boolean(true);
      }
      case O::ViewOk: return Value::boolean(compute_view_strides(t->sizes, t->strides, int_list(child(n, 1))).has_value());
      case O::FlattenOk: {
        const int64_t len = static_cast<int64_t>(t->sizes.size());
        if (len == 0) return Value::boolean(true);
        const int64_t s0 = py_mod(integer(child(n, 1)), len), e0 = py_mod(integer(child(n, 2)), len);
        std::vector<int64_t> shape(t->sizes.begin(), t->sizes.begin() + s0);
        int64_t merged = 1;
        for (int64_t k = s0; k <= e0; ++k) merged *= t->sizes[static_cast<size_t>(k)];
        shape.push_back(merged);
        for (int64_t k = e0 + 1; k < len; ++k) shape.push_back(t->sizes[static_cast<size_t>(k)]);
        return Value::boolean(compute_view_strides(t->sizes, t->strides, shape).has_value());
      }
      default: throw TableExprError("unknown function");
    }
  }

  const CallArgs& args_;
  const std::vector<const OpTensor*>& outputs_;
  const SaveEnv& env_;
};

bool any_requires_grad(const CallArgs& args, int32_t first, int32_t count) {
  for (int32_t k = 0; k < count; ++k) {
    const ArgValue* a = args.find(kNames[first + k]);
    if (!a) continue;
    bool any = false;
    a->for_each_tensor([&](const OpTensor& t) { any = any || t.requires_grad; });
    if (any) return true;
  }
  return false;
}

}  // namespace

int64_t OpTensor::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

bool OpTensor::is_float() const { return is_float_dtype(dtype); }

ArgValue ArgValue::of_bool(bool v) {
  ArgValue a;
  a.kind = Kind::Bool;
  a.b = v;
  return a;
}
ArgValue ArgValue::of_int(int64_t v) {
  ArgValue a;
  a.kind = Kind::Int;
  a.i = v;
  return a;
}
ArgValue ArgValue::of_float(double v) {
  ArgValue a;
  a.kind = Kind::Float;
  a.f = v;
  return a;
}
ArgValue ArgValue::of_str(std::string v) {
  ArgValue a;
  a.kind = Kind::Str;
  a.s = std::move(v);
  return a;
}
ArgValue ArgValue::of_ints(std::vector<int64_t> v) {
  ArgValue a;
  a.kind = Kind::Ints;
  a.ints = std::move(v);
  return a;
}
ArgValue ArgValue::of_tensor(const OpTensor* t) {
  ArgValue a;
  a.kind = t ? Kind::Tensor : Kind::None;
  a.tensor = t;
  return a;
}
ArgValue ArgValue::of_tensors(std::vector<const OpTensor*> ts) {
  ArgValue a;
  a.kind = Kind::Tensors;
  a.tensors = std::move(ts);
  return a;
}

const ArgValue* CallArgs::find(std::string_view name) const {
  for (const auto& [n, v] : items)
    if (n == name) return &v;
  return nullptr;
}

void CallArgs::set_default(std::string_view name, ArgValue v) {
  if (!find(name)) items.emplace_back(std::string(name), std::move(v));
}

const OpRow* find_op_row(std::string_view op) {
  // The rows' names as views, made once: comparing the table's C strings
  // measured them again at each step of each search (a strlen per step, at
  // every node of a graph).
  static const std::vector<std::string_view> kOps = [] {
    std::vector<std::string_view> out;
    out.reserve(std::size(kRows));
    for (const OpRow& r : kRows) out.emplace_back(r.op);
    return out;
  }();
  const auto it = std::lower_bound(kOps.begin(), kOps.end(), op);
  return it != kOps.end() && *it == op ? &kRows[it - kOps.begin()] : nullptr;
}

std::vector<std::string> op_table_names() {
  std::vector<std::string> out;
  for (const OpRow& r : kRows) out.emplace_back(r.op);
  return out;
}

bool op_records(const OpRow& row, const CallArgs& args) {
  for (int32_t k = 0; k < row.differentiable_count; ++k) {
    const ArgValue* a = args.find(kNames[row.differentiable_first + k]);
    if (!a) continue;
    bool any = false;
    a->for_each_tensor([&](const OpTensor& t) { any = any || (t.requires_grad && t.is_float()); });
    if (any) return true;
  }
  return false;
}

std::vector<std::string_view> op_differentiable(const OpRow& row) {
  std::vector<std::string_view> out;
  out.reserve(static_cast<size_t>(row.differentiable_count));
  for (int32_t k = 0; k < row.differentiable_count; ++k) out.emplace_back(kNames[row.differentiable_first + k]);
  return out;
}

void add_op_defaults(const OpRow& row, CallArgs& args) {
  for (int32_t k = 0; k < row.defaults_count; ++k) {
    const Default& d = kDefaults[row.defaults_first + k];
    if (args.find(d.name)) continue;
    const ExprNode& n = node_at(d.value);
    switch (n.kind) {
      case K::Bool: args.items.emplace_back(d.name, ArgValue::of_bool(n.i != 0)); break;
      case K::Int: args.items.emplace_back(d.name, ArgValue::of_int(n.i)); break;
      case K::Float: args.items.emplace_back(d.name, ArgValue::of_float(n.f)); break;
      case K::Str: args.items.emplace_back(d.name, ArgValue::of_str(n.s)); break;
      default: args.items.emplace_back(d.name, ArgValue::none()); break;
    }
  }
}

const OpCase& select_op_case(const OpRow& row, const CallArgs& args, const std::vector<const OpTensor*>& outputs,
                             const SaveEnv& env) {
  Evaluator ev(args, outputs, env);
  for (int32_t k = 0; k < row.cases_count; ++k) {
    const OpCase& c = kCases[row.cases_first + k];
    if (c.when < 0 || ev.eval(c.when).truthy()) return c;
  }
  throw TableExprError(std::string(row.op) + ": no case matches");
}

const char* op_case_name(const OpCase& c) { return c.name; }
bool op_case_verified(const OpCase& c) { return c.verified; }
const char* op_row_alias(const OpRow& row) { return row.alias; }

std::optional<std::string> op_output_alias(const OpRow& row, size_t index, const CallArgs& args,
                                           const std::vector<const OpTensor*>& outputs, const SaveEnv& env) {
  if (row.alias) return std::string(row.alias);
  if (index >= static_cast<size_t>(row.outputs_count)) return std::nullopt;
  const OutputAlias& o = kOutputs[static_cast<size_t>(row.outputs_first) + index];
  if (!o.alias) return std::nullopt;
  if (o.alias_when >= 0 && !Evaluator(args, outputs, env).eval(o.alias_when).truthy()) return std::nullopt;
  return std::string(o.alias);
}

std::optional<std::vector<int64_t>> op_output_strides(const OpCase& c, const CallArgs& args,
                                                      const std::vector<const OpTensor*>& outputs,
                                                      const SaveEnv& env) {
  if (c.output_strides < 0) return std::nullopt;
  Value v = Evaluator(args, outputs, env).eval(c.output_strides);
  if (v.kind != Value::Kind::List) throw TableExprError("output_strides is not a list");
  std::vector<int64_t> out;
  for (const Value& x : v.list) out.push_back(x.kind == Value::Kind::Float ? static_cast<int64_t>(x.f) : x.i);
  return out;
}

std::vector<SavedTensor> op_saves(const OpRow& row, const OpCase& c, const CallArgs& args,
                                  const std::vector<const OpTensor*>& outputs, const SaveEnv& env) {
  (void)row;
  std::vector<SavedTensor> out;
  Evaluator ev(args, outputs, env);
  std::vector<std::string_view> slot_names;  // new tensors by name: one storage per name and call
  for (int32_t k = 0; k < c.saves_count; ++k) {
    const SaveItem& item = kSaveItems[c.saves_first + k];
    if (item.if_grad_count > 0 && !any_requires_grad(args, item.if_grad_first, item.if_grad_count)) continue;
    if (item.device && std::strcmp(item.device, device_name(env.device)) != 0) continue;
    if (item.when >= 0 && !ev.eval(item.when).truthy()) continue;
    if (item.tensor) {
      const std::string_view name = item.tensor;
      if (std::optional<size_t> i = output_index(name)) {
        if (*i >= outputs.size() || !outputs[*i]) throw TableExprError(std::string(name) + ": the call has no such output");
        const OpTensor& t = *outputs[*i];
        out.push_back({t.storage, -1, t.storage_bytes, t.dtype, std::string(name)});
        continue;
      }
      const ArgValue* a = args.find(name);
      // Absent, or a Python number where the schema takes a Tensor (mul(x, 0.5)): nothing saved.
      if (!a || a->kind == ArgValue::Kind::Int || a->kind == ArgValue::Kind::Float) continue;
      a->for_each_tensor([&](const OpTensor& t) {
        out.push_back({t.storage, -1, t.storage_bytes, t.dtype, std::string(name)});
      });
      continue;
    }
    // A tensor the decomposition makes: a new storage, shared by items of one name.
    std::vector<int64_t> sizes;
    {
      Value v = ev.eval(item.shape);
      if (v.kind != Value::Kind::List) throw TableExprError("a new tensor's shape is not a list");
      for (const Value& x : v.list) {
        if (!x.numeric()) throw TableExprError("a new tensor's shape holds a non-number");
        sizes.push_back(x.kind == Value::Kind::Float ? static_cast<int64_t>(x.f) : x.i);
      }
    }
    Value dv = ev.eval(item.dtype);
    if (dv.kind != Value::Kind::Str) throw TableExprError("a new tensor's dtype is not a name");
    const DtypeInfo* dtype = dtype_named(dv.s);
    if (!dtype) throw TableExprError("unknown dtype " + std::string(dv.s));
    int slot;
    if (item.name) {
      auto it = std::find(slot_names.begin(), slot_names.end(), std::string_view(item.name));
      slot = static_cast<int>(it - slot_names.begin());
      if (it == slot_names.end()) slot_names.emplace_back(item.name);
    } else {
      slot_names.emplace_back();  // unnamed: its own slot
      slot = static_cast<int>(slot_names.size()) - 1;
    }
    // Checked: a shape the table computes from the call (seq x seq scores) may pass int64; the walk then
    // takes the conservative path (every argument saved), whose sizes walk_input bounded.
    const std::optional<int64_t> bytes = checked_product(sizes, dtype->itemsize);
    if (!bytes || *bytes > kMaxGraphTensorBytes) throw TableExprError("a new tensor past 2^48 bytes");
    out.push_back({-1, slot, *bytes, dtype, item.name ? item.name : "new"});
  }
  return out;
}

std::optional<std::vector<int64_t>> compute_view_strides(const std::vector<int64_t>& sizes,
                                                         const std::vector<int64_t>& strides,
                                                         std::vector<int64_t> shape) {
  const std::optional<int64_t> numel_or = checked_product(sizes);
  if (!numel_or) return std::nullopt;
  const int64_t numel = *numel_or;
  auto minus = std::find(shape.begin(), shape.end(), -1);
  if (minus != shape.end()) {
    int64_t known = 1;
    for (int64_t s : shape)
      if (s != -1 && (s < 0 || __builtin_mul_overflow(known, s, &known))) return std::nullopt;
    *minus = known ? numel / known : 0;
  }
  // A view's shape comes from the call's arguments: checked, as a wrapped product could equal numel.
  const std::optional<int64_t> shape_numel = checked_product(shape);
  if (!shape_numel || *shape_numel != numel) return std::nullopt;
  if (numel == 0 || sizes.empty()) {
    if (!sizes.empty() || numel == 1) return std::vector<int64_t>(shape.size(), 1);
    return std::nullopt;
  }
  std::vector<int64_t> newstride(shape.size(), 0);
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(sizes.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= sizes[static_cast<size_t>(tensor_d)];
    if (tensor_d == 0 || (sizes[static_cast<size_t>(tensor_d - 1)] != 1 &&
                          strides[static_cast<size_t>(tensor_d - 1)] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[static_cast<size_t>(view_d)] == 1)) {
        newstride[static_cast<size_t>(view_d)] = view_numel * chunk_base_stride;
        view_numel *= shape[static_cast<size_t>(view_d)];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = strides[static_cast<size_t>(tensor_d - 1)];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return newstride;
}

std::vector<int64_t> dense_like_strides(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  const size_t n = sizes.size();
  std::vector<size_t> perm(n);
  std::iota(perm.begin(), perm.end(), size_t{0});
  // innermost first: by stride, ties by the later dimension first (saved_ops.py: dense_like)
  std::sort(perm.begin(), perm.end(), [&](size_t a, size_t b) {
    if (strides[a] != strides[b]) return strides[a] < strides[b];
    return a > b;
  });
  std::vector<int64_t> out(n, 0);
  int64_t acc = 1;
  for (size_t d : perm) {
    out[d] = acc;
    acc *= std::max<int64_t>(sizes[d], 1);
  }
  return out;
}

bool is_contiguous(const OpTensor& t) {
  int64_t expected = 1;
  for (size_t k = t.sizes.size(); k-- > 0;) {
    if (t.sizes[k] != 1 && t.strides[k] != expected) return false;
    expected *= t.sizes[k];
  }
  return true;
}

int64_t span_bytes(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int64_t itemsize,
                   int64_t offset) {
  int64_t last = offset;
  for (size_t k = 0; k < sizes.size(); ++k) {
    if (sizes[k] == 0) return 0;
    last += (sizes[k] - 1) * strides[k];
  }
  return (last + 1) * itemsize;
}

}  // namespace fsdp_plan
