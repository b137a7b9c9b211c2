// The graph of a torch.export program (a .pt2's models/model.json), as data:
// every node in execution order with its operator, its arguments by schema
// name and its outputs; every tensor value's dtype, sizes, strides and offset
// (symbolic sizes kept as expressions, sym_expr.h); the module each node ran
// in; the placeholders' roles from the graph signature; the dynamic
// dimensions with their ranges. Read by the loader (loaders/export_walk.h)
// in the same pass as the module tree, which then holds it (ModuleTree::graph).
//
// The schema is torch/_export/serde/schema.py (torch 2.13, schema 8.x);
// tests/activations/GRAPH.md says what each field means to a planner.
//
// Walking the nodes and evaluating a shape:
//
//   const Graph& g = *tree.graph();
//   DimValues dims = DimValues::bind(g, {{"seq", 8192}});   // --dim seq=8192
//   for (NodeId n = 0; n < g.num_nodes(); ++n) {
//     const GraphNode& node = g.node(n);
//     if (g.op_name(node.op) != "aten.linear.default") continue;
//     ValueId x = g.tensor_arg(n, "input"), w = g.tensor_arg(n, "weight");
//     int64_t tokens = dims.numel(x) / dims.size(x, -1);   // sizes at seq=8192
//     ... g.tensor(w).requires_grad, tree.path(node.module) ...
//   }
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/sym_expr.h"

namespace fsdp_plan {

using ModuleId = int32_t;  // module_tree.h
using TensorId = int32_t;  // module_tree.h
using ValueId = int32_t;   // a value of the graph: a tensor or a symbolic int
using NodeId = int32_t;
using OpId = int32_t;      // an operator, interned: "aten.linear.default"
using StrId = int32_t;     // any other interned string (argument names, paths, classes)
using CallId = int32_t;    // one entry of an nn_module_stack: a module call
inline constexpr int32_t kNone = -1;

// A read-only view of contiguous elements (std::span is C++20).
template <typename T>
class Span {
 public:
  Span() = default;
  Span(const T* data, size_t size) : data_(data), size_(size) {}
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const T& operator[](size_t i) const { return data_[i]; }

 private:
  const T* data_ = nullptr;
  size_t size_ = 0;
};

// A size, stride or offset (torch.export's SymInt): a constant, or an
// expression with the value torch traced it at (its hint).
struct SymInt {
  int64_t value = 0;    // the constant; for an expression, its hint (kNoHint when none was written)
  ExprId expr = kNone;  // kNone: a constant
  bool constant() const { return expr == kNone; }
};
inline constexpr int64_t kNoHint = INT64_MIN;

// The union key of an argument (schema.py: Argument), one kind per key the
// reader knows; Other for the rest (as_graph of higher-order ops,
// as_custom_obj, as_complex, ...), which keep only their key's name.
enum class ArgKind : uint8_t {
  None,             // as_none
  Tensor,           // as_tensor: value
  Tensors,          // as_tensors: values (also index.Tensor's Tensor?[] when none is None)
  OptionalTensor,   // as_optional_tensor: value or kNone
  OptionalTensors,  // as_optional_tensors: values, kNone for each None
  Int,              // as_int: ints (one)
  Ints,             // as_ints: ints
  SymInt,           // as_sym_int: value (the symbolic int) and ints (one, its expression)
  SymInts,          // as_sym_ints: ints (constants and expressions) and values (kNone for constants)
  Float,            // as_float: f
  Floats,           // as_floats: floats
  Bool,             // as_bool: i
  Bools,            // as_bools: ints (0 / 1)
  String,           // as_string: str
  Strings,          // as_strings: strs
  ScalarType,       // as_scalar_type: i, the export dtype code (model/dtype.h)
  MemoryFormat,     // as_memory_format: i
  Layout,           // as_layout: i
  Device,           // as_device: str ("cpu", "cuda:0")
  Other,            // str: the union key
};
const char* arg_kind_name(ArgKind k);  // "tensor", "ints", ...

struct GraphArg {
  StrId name = kNone;  // the schema's argument name ("input", "dim"); kNone for an output
  ArgKind kind = ArgKind::None;
  bool keyword = false;  // written as keyword-only (kind 2)
  int32_t first = 0, count = 0;  // list elements in the pools (Graph::arg_*)
  int64_t i = 0;   // Tensor / OptionalTensor / SymInt: ValueId; Bool, ScalarType, MemoryFormat, Layout: the value;
                   // String, Device, Other: StrId
  double f = 0;    // Float
};

struct GraphNode {
  OpId op = kNone;
  StrId name = kNone;      // the node's name ("linear_3")
  CallId call = kNone;     // innermost nn_module_stack entry; kNone when the stack is empty
  ModuleId module = 0;     // the tree's module it ran in: the innermost call whose path is a module of
                           // the tree, else the root (ops outside any submodule belong to the caller)
  int32_t first_arg = 0, num_args = 0;
  int32_t first_out = 0, num_outs = 0;
};

// One module call of an nn_module_stack ("KEY,PATH,CLASS"): calls with the
// same outer calls and the same entry are one, so a node's stack is the
// chain of parents from its call.
struct ModuleCall {
  StrId key = kNone, path = kNone, cls = kNone;  // path "" for the root
  CallId parent = kNone;
  ModuleId module = kNone;  // the tree's module at `path`; kNone if the tree has none there
  int32_t depth = 0;        // 0 for the outermost
};

struct TensorMeta {
  uint8_t dtype = 0;    // export code (model/dtype.h: dtype_from_export_code)
  uint8_t layout = 0;   // schema.py: Layout (7: strided)
  bool requires_grad = false;  // as recorded: true only for trainable parameters (GRAPH.md 1)
  StrId device = kNone;  // "cpu", "meta", "cuda:0"
  int32_t rank = 0;
  int32_t first = 0;     // sizes then strides in the graph's dims pool
  SymInt storage_offset;
};

enum class ValueKind : uint8_t { Tensor, SymInt, Other };

struct GraphValue {
  StrId name = kNone;
  ValueKind kind = ValueKind::Tensor;
  NodeId producer = kNone;  // kNone: a placeholder (graph input)
  int32_t meta = kNone;     // Tensor: index of its TensorMeta; SymInt: its expression in sym_ints
};

enum class InputKind : uint8_t { UserInput, Parameter, Buffer, TensorConstant, CustomObj, Token, ConstantInput };
const char* input_kind_name(InputKind k);  // "user_input", "parameter", ...

// One placeholder, in order, with its role (schema.py: InputSpec).
struct GraphInput {
  InputKind kind = InputKind::UserInput;
  ValueId value = kNone;     // the placeholder; kNone for a constant_input
  StrId target = kNone;      // parameter_name, buffer_name, tensor_constant_name, custom_obj_name; a
                             // constant_input's name; a user input's placeholder name
  TensorId tensor = kNone;   // Parameter, Buffer: the tree's tensor
  bool persistent = true;    // Buffer
};

enum class OutputKind : uint8_t {
  UserOutput, LossOutput, BufferMutation, GradientToParameter, GradientToUserInput, UserInputMutation, Token,
  ParameterMutation
};
const char* output_kind_name(OutputKind k);

struct GraphOutput {
  OutputKind kind = OutputKind::UserOutput;
  ValueId value = kNone;  // kNone for a non-tensor user output (a constant)
  StrId target = kNone;   // buffer_name, parameter_name, user_input_name where the kind has one
};

// A dynamic dimension: a symbol of the program's size expressions.
struct GraphSymbol {
  std::string name;  // torch's ("s72")
  // What people call it: "batch" and "seq" for input_ids' (or inputs_embeds')
  // dims 0 and 1, "batch" for dim 0 of the first user input otherwise,
  // else "INPUT.DIM" of the first user input dimension that is exactly it,
  // else the symbol's own name. The Dim names given to torch.export are not
  // in the file (GRAPH.md 10).
  std::string dim;
  std::vector<std::string> aliases;  // every "INPUT.DIM" that is exactly it, and the symbol's name
  int64_t min = 0;                   // range_constraints, as recorded (0 and no max in torch 2.13)
  std::optional<int64_t> max;        // nullopt: unbounded
  int64_t hint = kNoHint;            // the value it was traced at, where recorded
};

class Graph {
 public:
  // The file it came from, for messages.
  const std::string& file() const { return file_; }

  NodeId num_nodes() const { return static_cast<NodeId>(nodes_.size()); }
  const GraphNode& node(NodeId n) const { return nodes_[static_cast<size_t>(n)]; }
  Span<GraphArg> args(NodeId n) const;
  // Each value the node returns, lists flattened; kNone for a None.
  Span<ValueId> outputs(NodeId n) const;
  // The argument the node passes as `name` (schema name); nullptr when the
  // call left it at its default (model.json does not write defaults).
  const GraphArg* arg(NodeId n, std::string_view name) const;
  // The tensor passed as `name`, or kNone (absent, None, or not a tensor).
  ValueId tensor_arg(NodeId n, std::string_view name) const;

  OpId num_ops() const { return static_cast<OpId>(op_names_.size()); }
  // "aten.linear.default" (the target without "torch.ops."); "transformers.grouped_mm_fallback.default".
  const std::string& op_name(OpId op) const { return *op_names_[static_cast<size_t>(op)]; }
  std::optional<OpId> find_op(std::string_view name) const;

  const std::string& str(StrId s) const { return *strings_[static_cast<size_t>(s)]; }
  std::optional<StrId> find_str(std::string_view s) const;

  // Argument payloads.
  Span<ValueId> arg_values(const GraphArg& a) const;  // Tensors, OptionalTensors, SymInts
  Span<SymInt> arg_ints(const GraphArg& a) const;     // Int, Ints, SymInt, SymInts, Bools
  Span<double> arg_floats(const GraphArg& a) const;   // Floats
  Span<StrId> arg_strs(const GraphArg& a) const;      // Strings

  ValueId num_values() const { return static_cast<ValueId>(values_.size()); }
  const GraphValue& value(ValueId v) const { return values_[static_cast<size_t>(v)]; }
  const std::string& value_name(ValueId v) const { return str(value(v).name); }
  std::optional<ValueId> find_value(std::string_view name) const;
  bool is_tensor(ValueId v) const { return v >= 0 && value(v).kind == ValueKind::Tensor; }
  // A tensor value's metadata (is_tensor(v) must hold).
  const TensorMeta& tensor(ValueId v) const { return metas_[static_cast<size_t>(value(v).meta)]; }
  Span<SymInt> sizes(ValueId v) const;
  Span<SymInt> strides(ValueId v) const;
  // A symbolic-int value's expression (or constant).
  const SymInt& sym_int(ValueId v) const { return sym_ints_[static_cast<size_t>(value(v).meta)]; }

  const std::vector<GraphInput>& inputs() const { return inputs_; }
  const std::vector<GraphOutput>& outputs() const { return outputs_; }

  CallId num_calls() const { return static_cast<CallId>(calls_.size()); }
  const ModuleCall& call(CallId c) const { return calls_[static_cast<size_t>(c)]; }
  // Whether `inner` is `outer` or runs inside it.
  bool within(CallId inner, CallId outer) const;

  const SymExprPool& exprs() const { return exprs_; }
  SymbolId num_symbols() const { return static_cast<SymbolId>(symbols_.size()); }
  const GraphSymbol& symbol(SymbolId s) const { return symbols_[static_cast<size_t>(s)]; }
  // A symbol by its dim name, an alias or its own name.
  std::optional<SymbolId> find_symbol(std::string_view name) const;
  // An expression as people read it, with dim names: "32*seq".
  std::string expr_text(ExprId e) const;
  // "seq (input_ids.1, s38; range 0..inf; traced at 32)".
  std::string describe_symbol(SymbolId s) const;

 private:
  friend class GraphBuilder;
  std::string file_;
  std::vector<GraphNode> nodes_;
  std::vector<GraphArg> args_;
  std::vector<ValueId> outs_;
  std::vector<ValueId> arg_values_;
  std::vector<SymInt> arg_ints_;
  std::vector<ValueId> arg_int_values_;  // parallel to arg_ints_: the sym int value, or kNone
  std::vector<double> arg_floats_;
  std::vector<StrId> arg_strs_;
  std::vector<GraphValue> values_;
  std::vector<TensorMeta> metas_;
  std::vector<SymInt> dims_;
  std::vector<SymInt> sym_ints_;
  std::vector<GraphInput> inputs_;
  std::vector<GraphOutput> outputs_;
  std::vector<ModuleCall> calls_;
  // The builder's texts, taken over whole: op names, strings and the
  // indexes' keys point into it (a deque's elements stay where they are).
  std::deque<std::string> texts_;
  std::vector<const std::string*> op_names_;
  std::vector<const std::string*> strings_;
  std::vector<ValueId> value_of_str_;  // per StrId: the value of that name, or kNone
  std::unordered_map<std::string_view, int32_t> op_index_, str_index_;
  SymExprPool exprs_;
  std::vector<GraphSymbol> symbols_;
};

// A --dim value as it will be (or was) used.
struct DimSetting {
  std::string name;    // the dim's name (GraphSymbol::dim)
  std::string symbol;  // torch's symbol
  int64_t value = 0;
};

// Values for a graph's symbols, to evaluate its sizes. Unbound symbols stay
// unbound: evaluating a size that needs one is an InputError naming the
// dimension (a plan needs every dim it uses). Not thread-safe (it memoizes).
class DimValues {
 public:
  DimValues() = default;
  // From --dim NAME=VALUE: NAME is a dim name, an alias ("input_ids.1") or a
  // symbol ("s38"). Throws InputError (naming the file) for a name the graph
  // has no dimension for, a value outside the recorded range, or one
  // dimension given twice.
  static DimValues bind(const Graph& g, const std::vector<std::pair<std::string, int64_t>>& given);
  // Every symbol at the value torch traced it at (where recorded), then `given` over them.
  static DimValues hints(const Graph& g, const std::vector<std::pair<std::string, int64_t>>& given = {});

  const Graph& graph() const { return *g_; }
  std::optional<int64_t> value(SymbolId s) const { return values_[static_cast<size_t>(s)]; }
  // The bound dims, in symbol order.
  std::vector<DimSetting> settings() const;

  // Throw InputError naming the file and, for a missing value, the dimension.
  int64_t eval(const SymInt& s) const;
  int64_t eval(ExprId e) const;
  // A tensor's sizes, one of them (negative counts from the end), its element count, strides, offset.
  std::vector<int64_t> sizes(ValueId v) const;
  int64_t size(ValueId v, int dim) const;
  int64_t numel(ValueId v) const;  // checked: beyond int64 is an InputError
  std::vector<int64_t> strides(ValueId v) const;
  int64_t storage_offset(ValueId v) const { return eval(g_->tensor(v).storage_offset); }

 private:
  explicit DimValues(const Graph& g);
  void set(SymbolId s, int64_t v, const std::string& given_as);
  const Graph* g_ = nullptr;
  std::vector<std::optional<int64_t>> values_;
  mutable std::vector<int64_t> memo_;  // per ExprId; kUnset until evaluated
  mutable std::vector<bool> memo_set_;
};

// Parses a --dim argument, "NAME=VALUE" (VALUE a whole number >= 0);
// throws std::invalid_argument with the reason.
std::pair<std::string, int64_t> parse_dim_arg(const std::string& text);

}  // namespace fsdp_plan
