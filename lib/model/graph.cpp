#include "model/graph.h"

#include <algorithm>
#include <stdexcept>

#include "model/dtype.h"
#include "model/graph_builder.h"
#include "util/errors.h"

namespace fsdp_plan {

// ---------------------------------------------------------------------------- names

const char* arg_kind_name(ArgKind k) {
  switch (k) {
    case ArgKind::None: return "none";
    case ArgKind::Tensor: return "tensor";
    case ArgKind::Tensors: return "tensors";
    case ArgKind::OptionalTensor: return "optional_tensor";
    case ArgKind::OptionalTensors: return "optional_tensors";
    case ArgKind::Int: return "int";
    case ArgKind::Ints: return "ints";
    case ArgKind::SymInt: return "sym_int";
    case ArgKind::SymInts: return "sym_ints";
    case ArgKind::Float: return "float";
    case ArgKind::Floats: return "floats";
    case ArgKind::Bool: return "bool";
    case ArgKind::Bools: return "bools";
    case ArgKind::String: return "string";
    case ArgKind::Strings: return "strings";
    case ArgKind::ScalarType: return "scalar_type";
    case ArgKind::MemoryFormat: return "memory_format";
    case ArgKind::Layout: return "layout";
    case ArgKind::Device: return "device";
    case ArgKind::Other: return "other";
  }
  return "other";
}

const char* input_kind_name(InputKind k) {
  switch (k) {
    case InputKind::UserInput: return "user_input";
    case InputKind::Parameter: return "parameter";
    case InputKind::Buffer: return "buffer";
    case InputKind::TensorConstant: return "tensor_constant";
    case InputKind::CustomObj: return "custom_obj";
    case InputKind::Token: return "token";
    case InputKind::ConstantInput: return "constant_input";
  }
  return "user_input";
}

const char* output_kind_name(OutputKind k) {
  switch (k) {
    case OutputKind::UserOutput: return "user_output";
    case OutputKind::LossOutput: return "loss_output";
    case OutputKind::BufferMutation: return "buffer_mutation";
    case OutputKind::GradientToParameter: return "gradient_to_parameter";
    case OutputKind::GradientToUserInput: return "gradient_to_user_input";
    case OutputKind::UserInputMutation: return "user_input_mutation";
    case OutputKind::Token: return "token";
    case OutputKind::ParameterMutation: return "parameter_mutation";
  }
  return "user_output";
}

// ---------------------------------------------------------------------------- Graph

Span<GraphArg> Graph::args(NodeId n) const {
  const GraphNode& nd = node(n);
  return {args_.data() + nd.first_arg, static_cast<size_t>(nd.num_args)};
}

Span<ValueId> Graph::outputs(NodeId n) const {
  const GraphNode& nd = node(n);
  return {outs_.data() + nd.first_out, static_cast<size_t>(nd.num_outs)};
}

const GraphArg* Graph::arg(NodeId n, std::string_view name) const {
  for (const GraphArg& a : args(n))
    if (a.name != kNone && str(a.name) == name) return &a;
  return nullptr;
}

ValueId Graph::tensor_arg(NodeId n, std::string_view name) const {
  const GraphArg* a = arg(n, name);
  if (!a || (a->kind != ArgKind::Tensor && a->kind != ArgKind::OptionalTensor)) return kNone;
  return static_cast<ValueId>(a->i);
}

std::optional<OpId> Graph::find_op(std::string_view name) const {
  auto it = op_index_.find(name);
  if (it == op_index_.end()) return std::nullopt;
  return it->second;
}

std::optional<StrId> Graph::find_str(std::string_view s) const {
  auto it = str_index_.find(s);
  if (it == str_index_.end()) return std::nullopt;
  return it->second;
}

std::optional<ValueId> Graph::find_value(std::string_view name) const {
  const std::optional<StrId> s = find_str(name);
  if (!s || value_of_str_[static_cast<size_t>(*s)] == kNone) return std::nullopt;
  return value_of_str_[static_cast<size_t>(*s)];
}

Span<ValueId> Graph::arg_values(const GraphArg& a) const {
  if (a.kind == ArgKind::SymInts || a.kind == ArgKind::SymInt) {
    return {arg_int_values_.data() + a.first, static_cast<size_t>(a.count)};
  }
  if (a.kind != ArgKind::Tensors && a.kind != ArgKind::OptionalTensors) return {};
  return {arg_values_.data() + a.first, static_cast<size_t>(a.count)};
}

Span<SymInt> Graph::arg_ints(const GraphArg& a) const {
  switch (a.kind) {
    case ArgKind::Int:
    case ArgKind::Ints:
    case ArgKind::SymInt:
    case ArgKind::SymInts:
    case ArgKind::Bools:
      return {arg_ints_.data() + a.first, static_cast<size_t>(a.count)};
    default:
      return {};
  }
}

Span<double> Graph::arg_floats(const GraphArg& a) const {
  if (a.kind != ArgKind::Floats) return {};
  return {arg_floats_.data() + a.first, static_cast<size_t>(a.count)};
}

Span<StrId> Graph::arg_strs(const GraphArg& a) const {
  if (a.kind != ArgKind::Strings) return {};
  return {arg_strs_.data() + a.first, static_cast<size_t>(a.count)};
}

Span<SymInt> Graph::sizes(ValueId v) const {
  const TensorMeta& m = tensor(v);
  return {dims_.data() + m.first, static_cast<size_t>(m.rank)};
}

Span<SymInt> Graph::strides(ValueId v) const {
  const TensorMeta& m = tensor(v);
  return {dims_.data() + m.first + m.rank, static_cast<size_t>(m.rank)};
}

bool Graph::within(CallId inner, CallId outer) const {
  for (CallId c = inner; c != kNone; c = call(c).parent)
    if (c == outer) return true;
  return false;
}

std::optional<SymbolId> Graph::find_symbol(std::string_view name) const {
  for (SymbolId s = 0; s < num_symbols(); ++s)
    if (symbols_[static_cast<size_t>(s)].dim == name) return s;
  for (SymbolId s = 0; s < num_symbols(); ++s)
    for (const auto& a : symbols_[static_cast<size_t>(s)].aliases)
      if (a == name) return s;
  return std::nullopt;
}

std::string Graph::expr_text(ExprId e) const {
  return exprs_.to_string(e, [this](SymbolId s) { return symbol(s).dim; });
}

namespace {
std::string range_text(const GraphSymbol& s) {
  return std::to_string(s.min) + ".." + (s.max ? std::to_string(*s.max) : std::string("inf"));
}
}  // namespace

std::string Graph::describe_symbol(SymbolId s) const {
  const GraphSymbol& g = symbol(s);
  std::string out = g.dim + " (";
  bool first = true;
  for (const auto& a : g.aliases) {
    if (a == g.dim) continue;
    out += (first ? "" : ", ") + a;
    first = false;
  }
  out += std::string(first ? "" : "; ") + "range " + range_text(g);
  if (g.hint != kNoHint) out += "; traced at " + std::to_string(g.hint);
  return out + ")";
}

// ---------------------------------------------------------------------------- DimValues

DimValues::DimValues(const Graph& g)
    : g_(&g),
      values_(static_cast<size_t>(g.num_symbols())),
      memo_(g.exprs().size(), 0),
      memo_set_(g.exprs().size(), false) {}

void DimValues::set(SymbolId s, int64_t v, const std::string& given_as) {
  const GraphSymbol& sym = g_->symbol(s);
  if (v < sym.min || (sym.max && v > *sym.max)) {
    throw InputError(g_->file(), "--dim " + given_as + "=" + std::to_string(v) +
                                     ": outside the range the export recorded for " + g_->describe_symbol(s) +
                                     "; give a value in " + range_text(sym));
  }
  values_[static_cast<size_t>(s)] = v;
  std::fill(memo_set_.begin(), memo_set_.end(), false);
}

DimValues DimValues::bind(const Graph& g, const std::vector<std::pair<std::string, int64_t>>& given) {
  DimValues d(g);
  std::vector<std::string> given_as(static_cast<size_t>(g.num_symbols()));
  for (const auto& [name, v] : given) {
    const auto s = g.find_symbol(name);
    if (!s) {
      if (g.num_symbols() == 0) {
        throw InputError(g.file(), "--dim " + name +
                                       ": the program has no dynamic dimensions (it was exported without "
                                       "torch.export.Dim), so its shapes are fixed; export it again with "
                                       "fsdp-plan-export --dynamic batch,seq to plan other sizes");
      }
      std::string known;
      for (SymbolId k = 0; k < g.num_symbols(); ++k) known += (k ? ", " : "") + g.describe_symbol(k);
      throw InputError(g.file(), "--dim " + name + ": the program has no such dimension; its dimensions: " + known);
    }
    std::string& prev = given_as[static_cast<size_t>(*s)];
    if (!prev.empty()) {
      throw InputError(g.file(), "--dim " + name + ": dimension " + g.symbol(*s).dim + " is given twice" +
                                     (prev == name ? std::string() : " (also as " + prev + ")"));
    }
    prev = name;
    d.set(*s, v, name);
  }
  return d;
}

DimValues DimValues::hints(const Graph& g, const std::vector<std::pair<std::string, int64_t>>& given) {
  DimValues d = bind(g, given);
  for (SymbolId s = 0; s < g.num_symbols(); ++s)
    if (!d.values_[static_cast<size_t>(s)] && g.symbol(s).hint != kNoHint) d.values_[static_cast<size_t>(s)] = g.symbol(s).hint;
  return d;
}

std::vector<DimSetting> DimValues::settings() const {
  std::vector<DimSetting> out;
  for (SymbolId s = 0; s < g_->num_symbols(); ++s) {
    if (values_[static_cast<size_t>(s)]) out.push_back({g_->symbol(s).dim, g_->symbol(s).name, *values_[static_cast<size_t>(s)]});
  }
  return out;
}

int64_t DimValues::eval(ExprId e) const {
  const auto i = static_cast<size_t>(e);
  if (memo_set_[i]) return memo_[i];
  SymbolId missing = kNone;
  try {
    memo_[i] = g_->exprs().evaluate(e, values_, &missing);
  } catch (const ExprError& err) {
    if (missing != kNone) {
      throw InputError(g_->file(), "the plan needs dimension " + g_->describe_symbol(missing) +
                                       ", which has no value: give --dim " + g_->symbol(missing).dim + "=N");
    }
    std::string at;
    for (const auto& s : settings()) at += (at.empty() ? "" : ", ") + s.name + "=" + std::to_string(s.value);
    throw InputError(g_->file(), "size expression " + g_->expr_text(e) + (at.empty() ? "" : " at " + at) + " gives " +
                                     err.what());
  }
  memo_set_[i] = true;
  return memo_[i];
}

int64_t DimValues::eval(const SymInt& s) const { return s.constant() ? s.value : eval(s.expr); }

std::vector<int64_t> DimValues::sizes(ValueId v) const {
  const Span<SymInt> in = g_->sizes(v);
  std::vector<int64_t> out;
  out.reserve(in.size());
  for (const SymInt& s : in) out.push_back(eval(s));
  return out;
}

std::vector<int64_t> DimValues::strides(ValueId v) const {
  const Span<SymInt> in = g_->strides(v);
  std::vector<int64_t> out;
  out.reserve(in.size());
  for (const SymInt& s : in) out.push_back(eval(s));
  return out;
}

int64_t DimValues::size(ValueId v, int dim) const {
  const auto sz = g_->sizes(v);
  const int rank = static_cast<int>(sz.size());
  const int d = dim < 0 ? dim + rank : dim;
  if (d < 0 || d >= rank) {
    throw InputError(g_->file(), "tensor " + g_->value_name(v) + " has " + std::to_string(rank) +
                                     " dimensions, not dimension " + std::to_string(dim));
  }
  return eval(sz[static_cast<size_t>(d)]);
}

int64_t DimValues::numel(ValueId v) const {
  int64_t n = 1;
  for (const SymInt& s : g_->sizes(v)) {
    const int64_t d = eval(s);
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) {
      throw InputError(g_->file(), "tensor " + g_->value_name(v) + " has an impossible size (" +
                                       (d < 0 ? "a negative dimension" : "more than 2^63 elements") + ")");
    }
  }
  return n;
}

std::pair<std::string, int64_t> parse_dim_arg(const std::string& text) {
  const auto eq = text.find('=');
  if (eq == std::string::npos || eq == 0) throw std::invalid_argument("expected NAME=VALUE, e.g. seq=8192");
  const std::string name = text.substr(0, eq), value = text.substr(eq + 1);
  if (value.empty() || value.size() > 18 || value.find_first_not_of("0123456789") != std::string::npos) {
    throw std::invalid_argument("the value of " + name + " must be a whole number from 0 up, not '" + value + "'");
  }
  return {name, std::stoll(value)};
}

// ---------------------------------------------------------------------------- GraphBuilder

GraphBuilder::GraphBuilder(std::string file, std::function<std::string(const std::string&)> damaged)
    : g_(std::make_unique<Graph>()), damaged_(std::move(damaged)) {
  g_->file_ = std::move(file);
}

void GraphBuilder::damage(const std::string& what) {
  if (first_damage_.empty()) first_damage_ = what;
}

void GraphBuilder::count_element() {
  if (++elements_ == kMaxGraphElements) {
    damage("the graph holds more than " + std::to_string(kMaxGraphElements) + " nodes, arguments and values");
  }
}

StrId GraphBuilder::intern(std::string_view s) {
  auto it = strs_.find(s);
  if (it != strs_.end()) return it->second;
  store_.emplace_back(s);
  const auto id = static_cast<StrId>(g_->strings_.size());
  g_->strings_.push_back(&store_.back());
  g_->value_of_str_.push_back(kNone);
  strs_.emplace(store_.back(), id);
  return id;
}

ValueId GraphBuilder::value(std::string_view name) {
  // By its interned name: one lookup finds both (a second map by name
  // hashed each new value's name twice more).
  const StrId s = intern(name);
  const ValueId known = g_->value_of_str_[static_cast<size_t>(s)];
  if (known != kNone) return known;
  count_element();
  const auto id = static_cast<ValueId>(g_->values_.size());
  GraphValue v;
  v.name = s;
  v.kind = ValueKind::Other;
  g_->values_.push_back(v);
  has_meta_.push_back(false);
  placeholder_.push_back(false);
  g_->value_of_str_[static_cast<size_t>(s)] = id;
  return id;
}

void GraphBuilder::begin_node() {
  count_element();
  GraphNode n;
  n.first_arg = static_cast<int32_t>(g_->args_.size());
  n.first_out = static_cast<int32_t>(g_->outs_.size());
  g_->nodes_.push_back(n);
  in_node_ = true;
}

void GraphBuilder::set_target(std::string_view target) {
  constexpr std::string_view kPrefix = "torch.ops.";
  std::string_view name = target.substr(0, kPrefix.size()) == kPrefix ? target.substr(kPrefix.size()) : target;
  auto it = ops_.find(name);
  OpId op;
  if (it != ops_.end()) {
    op = it->second;
  } else {
    store_.emplace_back(name);
    op = static_cast<OpId>(g_->op_names_.size());
    g_->op_names_.push_back(&store_.back());
    ops_.emplace(store_.back(), op);
  }
  g_->nodes_.back().op = op;
}

void GraphBuilder::set_name(std::string_view name) { g_->nodes_.back().name = intern(name); }

CallId GraphBuilder::call_for(CallId parent, std::string_view entry) {
  auto it = calls_.find(CallKey{parent, entry});
  if (it != calls_.end()) return it->second;
  // "KEY,PATH,CLASS": commas inside brackets belong to the key (torch/export/_trace.py writes
  // f"{key},{path},{class}"; a key may read "L__self___layers_slice_None__2__None__").
  std::string_view parts[3];
  size_t n = 0, start = 0;
  int depth = 0;
  for (size_t i = 0; i <= entry.size(); ++i) {
    const char c = i < entry.size() ? entry[i] : ',';
    if (c == '[' || c == '(') ++depth;
    else if (c == ']' || c == ')') --depth;
    else if (c == ',' && depth == 0) {
      if (n < 3) parts[n] = entry.substr(start, i - start);
      ++n;
      start = i + 1;
    }
  }
  if (n != 3) damage("an nn_module_stack entry is not key,path,class");
  ModuleCall c;
  c.key = intern(parts[0]);
  c.path = intern(parts[1]);
  c.cls = intern(parts[2]);
  c.parent = parent;
  c.depth = parent == kNone ? 0 : g_->calls_[static_cast<size_t>(parent)].depth + 1;
  const auto id = static_cast<CallId>(g_->calls_.size());
  g_->calls_.push_back(c);
  store_.emplace_back(entry);
  calls_.emplace(CallKey{parent, store_.back()}, id);
  return id;
}

void GraphBuilder::set_stack(std::string_view stack) {
  // Nodes come in runs over a few stacks (a layer's attention, its
  // projections, its MLP: a few hundred bytes each): the last few are
  // compared, lengths first, before the whole text is hashed.
  for (size_t i = 0; i < kRecentStacks; ++i) {
    if (recent_[i].text.data() && recent_[i].text == stack) {
      const Recent hit = recent_[i];
      for (size_t j = i; j > 0; --j) recent_[j] = recent_[j - 1];
      recent_[0] = hit;
      g_->nodes_.back().call = hit.call;
      return;
    }
  }
  auto it = stacks_.find(stack);
  CallId call = kNone;
  std::string_view stored;
  if (it != stacks_.end()) {
    call = it->second;
    stored = it->first;
  } else {
    size_t start = 0;
    while (start < stack.size()) {
      size_t end = stack.find(';', start);
      if (end == std::string_view::npos) end = stack.size();
      call = call_for(call, stack.substr(start, end - start));
      if (call != kNone && g_->calls_[static_cast<size_t>(call)].depth > 4096) {
        damage("an nn_module_stack more than 4096 modules deep");
        break;
      }
      start = end + 1;
    }
    store_.emplace_back(stack);
    stacks_.emplace(store_.back(), call);
    stored = store_.back();
  }
  for (size_t j = kRecentStacks - 1; j > 0; --j) recent_[j] = recent_[j - 1];
  recent_[0] = Recent{stored, call};
  g_->nodes_.back().call = call;
}

GraphArg& GraphBuilder::add_arg(StrId name, ArgKind kind) {
  count_element();
  GraphArg a;
  a.name = name;
  a.kind = kind;
  switch (kind) {
    case ArgKind::Tensors:
    case ArgKind::OptionalTensors:
      a.first = static_cast<int32_t>(g_->arg_values_.size());
      break;
    case ArgKind::Int:
    case ArgKind::Ints:
    case ArgKind::SymInt:
    case ArgKind::SymInts:
    case ArgKind::Bools:
      a.first = static_cast<int32_t>(g_->arg_ints_.size());
      break;
    case ArgKind::Floats:
      a.first = static_cast<int32_t>(g_->arg_floats_.size());
      break;
    case ArgKind::Strings:
      a.first = static_cast<int32_t>(g_->arg_strs_.size());
      break;
    default:
      break;
  }
  g_->args_.push_back(a);
  ++g_->nodes_.back().num_args;
  return g_->args_.back();
}

GraphArg& GraphBuilder::arg_at(size_t i) { return g_->args_[i]; }
size_t GraphBuilder::num_args() const { return g_->args_.size(); }
ValueId GraphBuilder::last_int_value() const {
  return g_->arg_int_values_.empty() ? kNone : g_->arg_int_values_.back();
}
const std::string& GraphBuilder::value_name(ValueId v) const { return g_->value_name(v); }

void GraphBuilder::push_value(ValueId v) {
  count_element();
  g_->arg_values_.push_back(v);
  ++g_->args_.back().count;
}

void GraphBuilder::push_int(const SymInt& v, ValueId named) {
  count_element();
  g_->arg_ints_.push_back(v);
  g_->arg_int_values_.push_back(named);
  ++g_->args_.back().count;
}

void GraphBuilder::push_float(double f) {
  count_element();
  g_->arg_floats_.push_back(f);
  ++g_->args_.back().count;
}

void GraphBuilder::push_str(StrId s) {
  count_element();
  g_->arg_strs_.push_back(s);
  ++g_->args_.back().count;
}

void GraphBuilder::add_output(ValueId v) {
  count_element();
  g_->outs_.push_back(v);
  GraphNode& n = g_->nodes_.back();
  ++n.num_outs;
  if (v == kNone) return;
  GraphValue& val = g_->values_[static_cast<size_t>(v)];
  if (val.producer != kNone || placeholder_[static_cast<size_t>(v)]) {
    damage("value " + g_->str(val.name) + " is made twice");
    return;
  }
  val.producer = static_cast<NodeId>(g_->nodes_.size() - 1);
}

void GraphBuilder::end_node() {
  GraphNode& n = g_->nodes_.back();
  if (n.op == kNone) damage("a node without a target");
  in_node_ = false;
}

SymbolId GraphBuilder::symbol(std::string_view name) {
  auto it = symbols_.find(name);
  if (it != symbols_.end()) return it->second;
  const auto id = static_cast<SymbolId>(g_->symbols_.size());
  GraphSymbol s;
  s.name = std::string(name);
  g_->symbols_.push_back(std::move(s));
  symbol_has_range_.push_back(false);
  store_.emplace_back(name);
  symbols_.emplace(store_.back(), id);
  return id;
}

SymInt GraphBuilder::expr(std::string_view text, int64_t hint, const std::string& what) {
  SymInt s;
  s.value = hint;
  try {
    s.expr = g_->exprs_.parse(text, [this](std::string_view n) { return symbol(n); });
  } catch (const ExprError& e) {
    damage(what + ": " + e.what());
    s.expr = kNone;
    s.value = 0;
    return s;
  }
  if (hint != kNoHint) {
    if (auto sym = g_->exprs_.as_symbol(s.expr)) {
      GraphSymbol& gs = g_->symbols_[static_cast<size_t>(*sym)];
      if (gs.hint == kNoHint) gs.hint = hint;
    }
  }
  return s;
}

void GraphBuilder::set_tensor(ValueId v, TensorMeta meta, const std::vector<SymInt>& sizes,
                              const std::vector<SymInt>& strides) {
  GraphValue& val = g_->values_[static_cast<size_t>(v)];
  if (has_meta_[static_cast<size_t>(v)]) {
    damage("value " + g_->str(val.name) + " has metadata twice");
    return;
  }
  has_meta_[static_cast<size_t>(v)] = true;
  meta.rank = static_cast<int32_t>(sizes.size());
  meta.first = static_cast<int32_t>(g_->dims_.size());
  for (const SymInt& s : sizes) {
    count_element();
    g_->dims_.push_back(s);
  }
  for (size_t i = 0; i < sizes.size(); ++i) g_->dims_.push_back(i < strides.size() ? strides[i] : SymInt{});
  val.kind = ValueKind::Tensor;
  val.meta = static_cast<int32_t>(g_->metas_.size());
  g_->metas_.push_back(meta);
}

void GraphBuilder::set_sym_int(ValueId v, const SymInt& s) {
  GraphValue& val = g_->values_[static_cast<size_t>(v)];
  if (has_meta_[static_cast<size_t>(v)]) {
    damage("value " + g_->str(val.name) + " has metadata twice");
    return;
  }
  has_meta_[static_cast<size_t>(v)] = true;
  val.kind = ValueKind::SymInt;
  val.meta = static_cast<int32_t>(g_->sym_ints_.size());
  g_->sym_ints_.push_back(s);
}

void GraphBuilder::add_placeholder(ValueId v) {
  if (placeholder_[static_cast<size_t>(v)]) return;
  placeholder_[static_cast<size_t>(v)] = true;
  placeholders_.push_back(v);
}

void GraphBuilder::add_input(const GraphInput& in) {
  count_element();
  g_->inputs_.push_back(in);
}

void GraphBuilder::add_output_spec(const GraphOutput& out) {
  count_element();
  g_->outputs_.push_back(out);
}

void GraphBuilder::add_range(std::string_view name, int64_t min, std::optional<int64_t> max) {
  const SymbolId s = symbol(name);
  if (symbol_has_range_[static_cast<size_t>(s)]) {
    damage("range_constraints names " + std::string(name) + " twice");
    return;
  }
  symbol_has_range_[static_cast<size_t>(s)] = true;
  GraphSymbol& g = g_->symbols_[static_cast<size_t>(s)];
  g.min = min;
  g.max = max;
  if (max && *max < min) damage("range_constraints of " + std::string(name) + " is empty");
}

namespace {

// HF's input names whose leading dims are the batch and the sequence.
struct KnownDims {
  const char* input;
  const char* dim0;
  const char* dim1;
};
constexpr KnownDims kKnownDims[] = {
    {"input_ids", "batch", "seq"},         {"inputs_embeds", "batch", "seq"},
    {"pixel_values", "batch", nullptr},    {"input_features", "batch", nullptr},
    {"input_values", "batch", nullptr},
};

}  // namespace

void GraphBuilder::name_symbols() {
  Graph& g = *g_;
  // Each user input's dims that are exactly a symbol, in signature order.
  struct Use {
    SymbolId s;
    std::string input;
    int dim;
  };
  std::vector<Use> uses;
  for (const GraphInput& in : g.inputs_) {
    if (in.kind != InputKind::UserInput || !g.is_tensor(in.value)) continue;
    const auto sizes = g.sizes(in.value);
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i].constant()) continue;
      if (auto s = g.exprs_.as_symbol(sizes[i].expr)) uses.push_back({*s, g.value_name(in.value), static_cast<int>(i)});
    }
  }
  auto name_taken = [&](const std::string& n) {
    for (const auto& s : g.symbols_)
      if (s.dim == n) return true;
    return false;
  };
  for (const Use& u : uses) {
    GraphSymbol& s = g.symbols_[static_cast<size_t>(u.s)];
    const std::string alias = u.input + "." + std::to_string(u.dim);
    if (std::find(s.aliases.begin(), s.aliases.end(), alias) == s.aliases.end()) s.aliases.push_back(alias);
    if (!s.dim.empty()) continue;
    for (const auto& k : kKnownDims) {
      if (u.input != k.input || u.dim > 1) continue;
      const char* want = u.dim == 0 ? k.dim0 : k.dim1;
      if (want && !name_taken(want)) s.dim = want;
    }
  }
  for (const Use& u : uses) {
    GraphSymbol& s = g.symbols_[static_cast<size_t>(u.s)];
    const std::string alias = u.input + "." + std::to_string(u.dim);
    if (s.dim.empty() && !name_taken(alias)) s.dim = alias;
  }
  for (GraphSymbol& s : g.symbols_) {
    if (s.dim.empty()) s.dim = s.name;
    if (std::find(s.aliases.begin(), s.aliases.end(), s.name) == s.aliases.end()) s.aliases.push_back(s.name);
  }
}

std::shared_ptr<const Graph> GraphBuilder::finish(
    const std::function<ModuleId(std::string_view)>& module_at,
    const std::function<TensorId(std::string_view, bool is_param)>& tensor_of) {
  Graph& g = *g_;
  auto fail = [&](const std::string& what) { throw InputError(g.file_, damaged_("graph: " + what)); };
  auto user_name = [&](NodeId n) {
    const StrId name = g.nodes_[static_cast<size_t>(n)].name;
    return "node " + (name == kNone ? std::to_string(n) : g.str(name));
  };
  if (!first_damage_.empty()) fail(first_damage_);
  // Module calls: the tree's module at each path.
  for (ModuleCall& c : g.calls_) c.module = module_at(g.str(c.path));
  for (GraphNode& n : g.nodes_) {
    n.module = 0;
    for (CallId c = n.call; c != kNone; c = g.calls_[static_cast<size_t>(c)].parent) {
      if (g.calls_[static_cast<size_t>(c)].module != kNone) {
        n.module = g.calls_[static_cast<size_t>(c)].module;
        break;
      }
    }
  }
  // Every value a node or the signature names is defined, and made before it is used.
  // `where` names the user in a message ("input_specs"); nullptr: node `user`, named only on damage.
  auto check_value = [&](ValueId v, NodeId user, bool tensor, const char* where) {
    if (v == kNone) return;
    const GraphValue& val = g.values_[static_cast<size_t>(v)];
    auto place = [&] { return where ? std::string(where) : user_name(user); };
    if (!has_meta_[static_cast<size_t>(v)]) {
      fail(place() + " names " + g.str(val.name) + ", which " + (tensor ? "tensor_values" : "sym_int_values") + " lacks");
    }
    if (tensor != (val.kind == ValueKind::Tensor)) {
      fail(place() + " names " + g.str(val.name) + " as a " + (tensor ? "tensor" : "symbolic int") + ", but it is not one");
    }
    if (user != kNone && !placeholder_[static_cast<size_t>(v)] && (val.producer == kNone || val.producer >= user)) {
      fail(place() + " uses " + g.str(val.name) + " before any node makes it");
    }
  };
  for (NodeId n = 0; n < g.num_nodes(); ++n) {
    for (const GraphArg& a : g.args(n)) {
      switch (a.kind) {
        case ArgKind::Tensor:
        case ArgKind::OptionalTensor:
          check_value(static_cast<ValueId>(a.i), n, true, nullptr);
          break;
        case ArgKind::Tensors:
        case ArgKind::OptionalTensors:
          for (ValueId v : g.arg_values(a)) check_value(v, n, true, nullptr);
          break;
        case ArgKind::SymInt:
        case ArgKind::SymInts:
          for (ValueId v : g.arg_values(a)) check_value(v, n, false, nullptr);
          break;
        default:
          break;
      }
    }
    for (ValueId v : g.outputs(n)) {
      if (v == kNone) continue;
      if (!has_meta_[static_cast<size_t>(v)]) fail(user_name(n) + " makes " + g.value_name(v) + ", which tensor_values lacks");
    }
  }
  // Sym int arguments take their value's expression.
  for (GraphArg& a : g.args_) {
    if (a.kind != ArgKind::SymInt && a.kind != ArgKind::SymInts) continue;
    for (int32_t k = 0; k < a.count; ++k) {
      const ValueId v = g.arg_int_values_[static_cast<size_t>(a.first + k)];
      if (v != kNone) g.arg_ints_[static_cast<size_t>(a.first + k)] = g.sym_int(v);
    }
  }
  auto check_defined = [&](ValueId v, const std::string& where) {
    if (v != kNone && !has_meta_[static_cast<size_t>(v)]) fail(where + " names " + g.value_name(v) + ", which the graph does not define");
  };
  for (GraphInput& in : g.inputs_) {
    switch (in.kind) {
      case InputKind::Parameter:
      case InputKind::Buffer:
      case InputKind::TensorConstant:
        check_value(in.value, kNone, true, "input_specs");
        break;
      case InputKind::UserInput:
        check_defined(in.value, "input_specs");
        break;
      default:
        break;
    }
    if (in.kind == InputKind::Parameter || in.kind == InputKind::Buffer) {
      in.tensor = tensor_of(g.str(in.target), in.kind == InputKind::Parameter);
    }
  }
  for (const GraphOutput& out : g.outputs_) {
    if (out.kind != OutputKind::Token) check_defined(out.value, "output_specs");
  }
  name_symbols();
  // The lookups: the builder's own, with the texts their keys view (moving
  // a deque moves none of its elements).
  g.texts_ = std::move(store_);
  g.str_index_ = std::move(strs_);
  g.op_index_ = std::move(ops_);
  return std::shared_ptr<const Graph>(std::move(g_));
}

}  // namespace fsdp_plan
