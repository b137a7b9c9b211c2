#include "activations/graph_input.h"

#include <algorithm>
#include <optional>

#include "activations/saved_ops.h"
#include "model/dtype.h"
#include "util/checked.h"
#include "util/errors.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

// A tensor's sizes, strides and storage span at the given --dim values,
// checked once here so that the walk's products (numel x itemsize, the span a
// view reaches, a retype to a wider dtype) cannot wrap: a size or stride
// below 0 is damage, a tensor past kMaxGraphTensorBytes or a graph past
// kMaxGraphBytes too large to plan (docs/limits.md). Returns its bytes.
int64_t checked_tensor_bytes(const Graph& g, ValueId v, const WalkTensor& t) {
  const std::string what = "tensor " + g.value_name(v);
  for (size_t d = 0; d < t.sizes.size(); ++d) {
    if (t.sizes[d] < 0)
      throw InputError(g.file(), what + " has the negative size " + std::to_string(t.sizes[d]) + " in dimension " +
                                     std::to_string(d) + " (a size expression below 0 at these --dim values)");
    if (d < t.strides.size() && t.strides[d] < 0)
      throw InputError(g.file(), what + " has the negative stride " + std::to_string(t.strides[d]) +
                                     " in dimension " + std::to_string(d));
  }
  if (t.offset < 0) throw InputError(g.file(), what + " has a negative storage offset");
  const int64_t itemsize = t.dtype ? t.dtype->itemsize : 4;
  // The storage it reaches: offset + sum (size - 1) x stride + 1 elements, or none when a size is 0.
  std::optional<int64_t> last = t.offset;
  bool empty = false;
  for (size_t d = 0; d < t.sizes.size() && last; ++d) {
    if (t.sizes[d] == 0) empty = true;
    const int64_t stride = d < t.strides.size() ? t.strides[d] : 0;
    if (auto step = checked_mul(t.sizes[d] > 0 ? t.sizes[d] - 1 : 0, stride)) last = checked_add(*last, *step);
    else last = std::nullopt;
  }
  std::optional<int64_t> numel = checked_product(t.sizes, itemsize);
  std::optional<int64_t> span = last ? checked_mul(*last + 1, itemsize) : std::nullopt;
  if (!numel || !span || *numel > kMaxGraphTensorBytes || (!empty && *span > kMaxGraphTensorBytes))
    throw TooLargeError(g.file(), what + " would hold " +
                                      (numel ? format_bytes(*numel) + " (" + std::to_string(*numel) + " bytes)"
                                             : std::string("more than 2^63 bytes")) +
                                      " at these --dim values, more than a tensor fsdp-plan plans (2^48 bytes, "
                                      "256 TiB; docs/limits.md)");
  return empty ? 0 : std::max(*numel, *span);
}

}  // namespace

WalkGraph walk_input(const Graph& g, const DimValues& dims) {
  WalkGraph w;
  // Tensor ids are the graph's value ids; a value that is no tensor keeps an empty entry.
  w.tensors.resize(static_cast<size_t>(g.num_values()));
  int64_t total = 0;  // every tensor's bytes: bounded, so no sum of them the walk makes can wrap
  for (ValueId v = 0; v < g.num_values(); ++v) {
    if (!g.is_tensor(v)) continue;
    const auto& meta = g.tensor(v);
    WalkTensor& t = w.tensors[static_cast<size_t>(v)];
    t.sizes = dims.sizes(v);
    t.strides = dims.strides(v);
    t.offset = dims.storage_offset(v);
    t.dtype = dtype_from_export_code(meta.dtype);
    if (!t.dtype) t.dtype = dtype_from_stem("Float");  // UNKNOWN: sized as float32
    t.requires_grad = meta.requires_grad;
    total = saturating_add(total, checked_tensor_bytes(g, v, t));
  }
  if (total > kMaxGraphBytes)
    throw TooLargeError(g.file(), "the graph's tensors would hold " + format_bytes(total) +
                                      " together at these --dim values, more than fsdp-plan plans (2^52 bytes, "
                                      "4 PiB; docs/limits.md)");
  for (const GraphInput& in : g.inputs()) {
    if (in.value == kNone || !g.is_tensor(in.value)) continue;
    WalkPlaceholder p;
    p.tensor = in.value;
    switch (in.kind) {
      case InputKind::Parameter: p.kind = WalkInput::Parameter; break;
      case InputKind::Buffer: p.kind = WalkInput::Buffer; break;
      case InputKind::TensorConstant: p.kind = WalkInput::Constant; break;
      case InputKind::UserInput: p.kind = WalkInput::UserInput; break;
      default: continue;  // custom objects, tokens, constant inputs: no tensor
    }
    p.param = in.tensor;
    w.placeholders.push_back(p);
  }
  w.nodes.reserve(static_cast<size_t>(g.num_nodes()));
  for (NodeId n = 0; n < g.num_nodes(); ++n) {
    const GraphNode& gn = g.node(n);
    WalkNode node;
    node.op = g.op_name(gn.op);
    node.row = find_op_row(node.op);
    node.row_found = true;
    // An empty nn_module_stack (sym_size of a dynamic export) names no module: the walk keeps
    // such a node in the run around it.
    node.module = gn.call == kNone ? -1 : gn.module;
    // Reserved: a WalkArg moved on growth costs as much as one built.
    const auto args = g.args(n);
    node.args.reserve(args.size());
    node.outputs.reserve(g.outputs(n).size());
    for (const GraphArg& a : args) {
      WalkArg arg;
      if (a.name != kNone) arg.name = g.str(a.name);
      switch (a.kind) {
        case ArgKind::None: break;
        case ArgKind::Tensor:
          arg.value.kind = ArgValue::Kind::Tensor;
          arg.tensors = {static_cast<int32_t>(a.i)};
          break;
        case ArgKind::OptionalTensor:
          if (a.i != kNone) {
            arg.value.kind = ArgValue::Kind::Tensor;
            arg.tensors = {static_cast<int32_t>(a.i)};
          }
          break;
        case ArgKind::Tensors:
        case ArgKind::OptionalTensors:
          arg.value.kind = ArgValue::Kind::Tensors;
          for (ValueId v : g.arg_values(a)) arg.tensors.push_back(v);
          break;
        case ArgKind::Int:
        case ArgKind::SymInt:
          arg.value = ArgValue::of_int(dims.eval(g.arg_ints(a)[0]));
          break;
        case ArgKind::Ints:
        case ArgKind::SymInts: {
          std::vector<int64_t> ints;
          for (const SymInt& s : g.arg_ints(a)) ints.push_back(dims.eval(s));
          arg.value = ArgValue::of_ints(std::move(ints));
          break;
        }
        case ArgKind::Float: arg.value = ArgValue::of_float(a.f); break;
        case ArgKind::Bool: arg.value = ArgValue::of_bool(a.i != 0); break;
        case ArgKind::Bools: {
          std::vector<int64_t> ints;
          for (const SymInt& s : g.arg_ints(a)) ints.push_back(s.value);
          arg.value = ArgValue::of_ints(std::move(ints));
          break;
        }
        case ArgKind::String:
        case ArgKind::Device: arg.value = ArgValue::of_str(g.str(static_cast<StrId>(a.i))); break;
        case ArgKind::ScalarType: {
          // The table compares dtypes by name (to.dtype: dtype == dtype(self)).
          const DtypeInfo* d = dtype_from_export_code(static_cast<int>(a.i));
          arg.value = d ? ArgValue::of_str(d->name) : ArgValue::of_int(a.i);
          break;
        }
        case ArgKind::MemoryFormat:
        case ArgKind::Layout: arg.value = ArgValue::of_int(a.i); break;
        default: arg.value.kind = ArgValue::Kind::Other; break;
      }
      node.args.push_back(std::move(arg));
    }
    for (ValueId v : g.outputs(n)) node.outputs.push_back(v != kNone && g.is_tensor(v) ? v : -1);
    w.nodes.push_back(std::move(node));
  }
  for (const GraphOutput& o : g.outputs())
    if (o.kind == OutputKind::UserOutput || o.kind == OutputKind::LossOutput)
      w.outputs.push_back(o.value != kNone && g.is_tensor(o.value) ? o.value : -1);
  return w;
}

std::shared_ptr<const WalkGraph> shared_walk_input(const std::shared_ptr<const Graph>& graph,
                                                   const std::vector<std::pair<std::string, int64_t>>& given,
                                                   const DimValues& dims) {
  // The entry holds its graph, so a graph freed and another made at its address cannot match.
  struct Entry {
    std::shared_ptr<const Graph> graph;
    std::vector<std::pair<std::string, int64_t>> given;
    std::shared_ptr<const WalkGraph> walk;
  };
  static thread_local Entry last;
  if (last.walk && last.graph == graph && last.given == given) return last.walk;
  auto walk = std::make_shared<const WalkGraph>(walk_input(*graph, dims));
  last = Entry{graph, given, walk};
  return walk;
}

}  // namespace fsdp_plan
