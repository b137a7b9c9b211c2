// Builds a Graph (graph.h) in the order models/model.json holds it: nodes
// first, then the tensor and symbolic-int values they name, then the
// signature and the range constraints. Names are interned as they come; what
// can only be checked once everything is in (every tensor a node names has
// metadata, each value is made before it is used, ...) is checked by
// finish(). Damage is recorded, not thrown, so that the loader can report
// the tree's own checks first; finish() throws the first one.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/graph.h"

namespace fsdp_plan {

class GraphBuilder {
 public:
  // `file` names the archive in messages; `damaged` turns a detail into the
  // loader's one-line message for this record.
  GraphBuilder(std::string file, std::function<std::string(const std::string&)> damaged);

  StrId intern(std::string_view s);
  // The value called `name` (created on first mention, its kind decided by
  // what defines it).
  ValueId value(std::string_view name);

  // A node: begin, its arguments and outputs, end. `target` is the node's
  // "target" ("torch.ops.aten.linear.default").
  void begin_node();
  void set_target(std::string_view target);
  void set_name(std::string_view name);
  // The node's nn_module_stack, "KEY,PATH,CLASS;..." outermost first.
  void set_stack(std::string_view stack);
  GraphArg& add_arg(StrId name, ArgKind kind);
  // Arguments by index (references into the list do not survive add_arg).
  GraphArg& arg_at(size_t i);
  size_t num_args() const;
  // The sym int value of the last int pushed (kNone for a constant or none).
  ValueId last_int_value() const;
  const std::string& value_name(ValueId v) const;
  void add_output(ValueId v);  // kNone for a None
  void end_node();

  // List payloads of the last argument added (they extend its count).
  void push_value(ValueId v);            // Tensors, OptionalTensors
  void push_int(const SymInt& v, ValueId named = kNone);  // Ints, Bools, SymInt(s); named: a sym int value
  void push_float(double f);
  void push_str(StrId s);

  // A SymInt from its expression text and hint (kNoHint: none). A malformed
  // expression is recorded as damage (`what` says where).
  SymInt expr(std::string_view text, int64_t hint, const std::string& what);

  // tensor_values[name]: sizes and strides as SymInts.
  void set_tensor(ValueId v, TensorMeta meta, const std::vector<SymInt>& sizes, const std::vector<SymInt>& strides);
  // sym_int_values[name].
  void set_sym_int(ValueId v, const SymInt& s);
  // A graph.inputs entry: a placeholder.
  void add_placeholder(ValueId v);
  void add_input(const GraphInput& in);
  void add_output_spec(const GraphOutput& out);
  void add_range(std::string_view symbol, int64_t min, std::optional<int64_t> max);

  // Records damage (the first one is thrown by finish()).
  void damage(const std::string& what);
  bool damaged() const { return !first_damage_.empty(); }
  // Bounds on what one graph may hold, checked as it grows.
  void count_element();

  // Checks the whole graph and returns it. `module_at` maps a module path to
  // the tree's module (kNone when the tree has none there); `tensor_of` a
  // parameter or buffer name to its TensorId.
  std::shared_ptr<const Graph> finish(const std::function<ModuleId(std::string_view)>& module_at,
                                      const std::function<TensorId(std::string_view, bool is_param)>& tensor_of);

 private:
  CallId call_for(CallId parent, std::string_view entry);
  SymbolId symbol(std::string_view name);
  void name_symbols();

  std::unique_ptr<Graph> g_;
  std::function<std::string(const std::string&)> damaged_;
  std::string first_damage_;
  std::deque<std::string> store_;  // interned strings; views into it stay valid
  std::unordered_map<std::string_view, StrId> strs_;
  std::unordered_map<std::string_view, OpId> ops_;
  std::unordered_map<std::string_view, CallId> stacks_;  // whole stack text -> innermost call
  // The last distinct stacks met (texts in store_), most recent first.
  struct Recent {
    std::string_view text;
    CallId call = kNone;
  };
  static constexpr size_t kRecentStacks = 4;
  Recent recent_[kRecentStacks];
  struct CallKey {
    CallId parent;
    std::string_view entry;
    bool operator==(const CallKey& o) const { return parent == o.parent && entry == o.entry; }
  };
  struct CallKeyHash {
    size_t operator()(const CallKey& k) const {
      return std::hash<std::string_view>()(k.entry) * 31 + static_cast<size_t>(k.parent + 1);
    }
  };
  std::unordered_map<CallKey, CallId, CallKeyHash> calls_;
  std::unordered_map<std::string_view, SymbolId> symbols_;
  std::vector<bool> has_meta_;       // per value: tensor_values or sym_int_values defined it
  std::vector<bool> placeholder_;    // per value
  std::vector<ValueId> placeholders_;
  std::vector<bool> symbol_has_range_;
  bool in_node_ = false;
  size_t elements_ = 0;
};

// What one graph may hold: far above Llama-3-405B's (126 layers: about
// 8,000 nodes), far below what would exhaust memory.
inline constexpr size_t kMaxGraphElements = size_t{16} << 20;
inline constexpr int kMaxTensorRank = 64;

}  // namespace fsdp_plan
