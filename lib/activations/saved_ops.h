// What autograd saves for backward, per ATen operator: the table of
// lib/activations/saved_ops.yaml (the reviewed source, each row citing
// derivatives.yaml or the decomposition it follows), compiled by
// gen_saved_ops.py into saved_ops.inc, and its evaluator. The semantics are
// tests/activations/saved_ops.py's (the reference evaluator, checked against
// autograd by tests/activations/test_saved_ops.py); the YAML's header gives the grammar.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "model/dtype.h"
#include "policy/settings.h"

namespace fsdp_plan {

// One tensor as the activation walk sees it: sizes and strides evaluated at
// the plan's dimensions, and the storage it lives in (views share their base's).
struct OpTensor {
  std::vector<int64_t> sizes, strides;
  int64_t offset = 0;
  const DtypeInfo* dtype = nullptr;
  int32_t storage = -1;
  int64_t storage_bytes = 0;  // the whole storage, not this view
  bool requires_grad = false;
  int64_t numel() const;
  bool is_float() const;  // float16/32/64, bfloat16: what can require grad
};

// One argument of a call, bound by its schema name (model.json's inputs[i].name).
struct ArgValue {
  enum class Kind : uint8_t { None, Bool, Int, Float, Str, Ints, Tensor, Tensors, Other };
  Kind kind = Kind::None;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::vector<int64_t> ints;
  const OpTensor* tensor = nullptr;
  std::vector<const OpTensor*> tensors;  // a list; nullptr for a None entry of an optional list

  static ArgValue none() { return {}; }
  static ArgValue of_bool(bool v);
  static ArgValue of_int(int64_t v);
  static ArgValue of_float(double v);
  static ArgValue of_str(std::string v);
  static ArgValue of_ints(std::vector<int64_t> v);
  static ArgValue of_tensor(const OpTensor* t);
  static ArgValue of_tensors(std::vector<const OpTensor*> ts);
  // The tensors it holds (one, a list's non-None entries, or none).
  template <class F>
  void for_each_tensor(F&& f) const {
    if (kind == Kind::Tensor && tensor) f(*tensor);
    if (kind == Kind::Tensors)
      for (const OpTensor* t : tensors)
        if (t) f(*t);
  }
};

// A call's arguments by name, in the order the graph wrote them (then the row's defaults).
struct CallArgs {
  std::vector<std::pair<std::string, ArgValue>> items;
  const ArgValue* find(std::string_view name) const;
  void set_default(std::string_view name, ArgValue v);  // only if absent
};

// The device whose kernels run the step, and the attention kernel asked for
// (policy/settings.h names them as the expressions do: 'cuda', 'flash').
struct SaveEnv {
  ComputeDevice device = ComputeDevice::Cuda;
  SdpaKernel sdpa = SdpaKernel::Default;
};

// A table expression that cannot be evaluated on this call (an argument the
// row expects is missing or of another kind): the walk counts the node as it
// counts an operator without a row.
struct TableExprError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct OpRow;
struct OpCase;

// The row of an operator ("aten.linear.default"), or nullptr.
const OpRow* find_op_row(std::string_view op);
// Every operator of the table, sorted.
std::vector<std::string> op_table_names();

// Whether autograd records the call: a differentiable argument is a floating
// tensor that requires grad. If not, nothing is saved and no output requires grad.
bool op_records(const OpRow& row, const CallArgs& args);
// The argument names the row says can carry a gradient (the table's own
// texts: the walk asks for them at every node).
std::vector<std::string_view> op_differentiable(const OpRow& row);
// The row's defaults, added to `args` where the call left them out.
void add_op_defaults(const OpRow& row, CallArgs& args);

// The case that applies (the row itself when it has no cases).
const OpCase& select_op_case(const OpRow& row, const CallArgs& args, const std::vector<const OpTensor*>& outputs,
                             const SaveEnv& env);
const char* op_case_name(const OpCase& c);  // nullptr when the row has no cases
bool op_case_verified(const OpCase& c);     // false: a CUDA kernel read from the sources, not measured

// The argument output `index` is a view of, when it is one on this call
// (views, in-place ops, reshape/contiguous/to/dropout when they return their
// input); nullopt: a new storage. `outputs` are the outputs' metadata as
// recorded (alias_when may read them).
std::optional<std::string> op_output_alias(const OpRow& row, size_t index, const CallArgs& args,
                                           const std::vector<const OpTensor*>& outputs, const SaveEnv& env);
// True for views and in-place ops whose every output aliases one argument (row's `alias`).
const char* op_row_alias(const OpRow& row);
// The strides the kernel gives its first output where the case says (the
// fused attention kernels), else nullopt.
std::optional<std::vector<int64_t>> op_output_strides(const OpCase& c, const CallArgs& args,
                                                      const std::vector<const OpTensor*>& outputs,
                                                      const SaveEnv& env);

// One tensor the call saves. `storage` is the argument's or output's storage;
// a tensor the decomposition makes has storage -1 and `new_slot` >= 0 (items of
// one call that share a name share a slot: one storage).
struct SavedTensor {
  int32_t storage = -1;
  int new_slot = -1;
  int64_t bytes = 0;  // the storage's bytes
  const DtypeInfo* dtype = nullptr;
  std::string what;   // the argument or the new tensor's name ("input", "logsumexp")
};
// What the call saves (op_records must hold; see saved_ops.py: predict).
std::vector<SavedTensor> op_saves(const OpRow& row, const OpCase& c, const CallArgs& args,
                                  const std::vector<const OpTensor*>& outputs, const SaveEnv& env);

// torch's computeStride (aten/src/ATen/TensorUtils.cpp): the strides of
// x.view(shape), or nullopt where no view exists. `shape` may hold one -1.
std::optional<std::vector<int64_t>> compute_view_strides(const std::vector<int64_t>& sizes,
                                                         const std::vector<int64_t>& strides,
                                                         std::vector<int64_t> shape);
// The strides empty_like gives (preserve_format): dense, in x's dimension order.
std::vector<int64_t> dense_like_strides(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides);
bool is_contiguous(const OpTensor& t);
// Bytes of the smallest storage that holds a tensor of these sizes and strides.
int64_t span_bytes(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides, int64_t itemsize,
                   int64_t offset = 0);

}  // namespace fsdp_plan
