// Our own reader of a TorchScript archive's data.pkl: exactly the pickle
// opcodes and globals that PyTorch's C++ Pickler writes into archives (1.x and
// 2.x), nothing else. Values land in one flat arena of nodes addressed by
// index, so the pickle memo keeps identity (tied weights are one node),
// nothing recurses and nothing is freed one by one. Tensors keep their shape,
// dtype, requires_grad and storage; storages keep their key and size, and no
// storage byte is ever read. Torch-free.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/dtype.h"

namespace fsdp_plan::pickle {

// Containers nested deeper than this are refused: a million nested tuples is
// an attack, not a model. TorchScript attributes nest a few levels; objects
// do not count (each keeps its state apart).
constexpr uint32_t kMaxNesting = 2000;
// Values (nodes) in one pickle: each costs 8 bytes and a container 16 more,
// so this bounds memory at a few hundred MB. The data.pkl of 50,000 modules
// and 150,000 tensors is 10 MB of 4.8 million opcodes.
constexpr uint32_t kMaxValues = uint32_t{1} << 24;

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error("data.pkl is damaged: " + what) {}
};

enum class Kind : uint8_t {
  None, Bool, Int, Float, String,
  Tuple, List, Dict,  // items: elements; a dict's are key, value, key, value, ...
  Global,             // a class or function named by GLOBAL, not yet called
  Object,             // an instance of a __torch__ class: cls, state
  Tensor, Storage,
  Other,              // a device, complex number, enum value, qscheme: nothing we need
};

using NodeId = uint32_t;
constexpr NodeId kNoNode = 0xffffffffu;

// Read-only view of a run of elements in one of the Pickle's pools. Valid
// until the Pickle changes (never, once unpickle returned it).
template <typename T>
struct Span {
  const T* data = nullptr;
  size_t count = 0;
  size_t size() const { return count; }
  bool empty() const { return count == 0; }
  const T& operator[](size_t i) const { return data[i]; }
  const T* begin() const { return data; }
  const T* end() const { return data + count; }
};

struct Storage {
  const DtypeInfo* dtype = nullptr;  // from torch.FloatStorage: never null
  NodeId key = kNoNode;              // String: its record under data/
  NodeId location = kNoNode;         // String: "cpu", "meta", ...
  int64_t numel = 0;
};

struct Tensor {
  NodeId storage = kNoNode;
  int64_t offset = 0;
  uint32_t dims = 0;  // shape at Pickle::dims[dims, dims + ndim), the stride right after
  uint32_t ndim = 0;
  bool requires_grad = false;
  bool quantized = false;
};

// 8 bytes: a 50,000-module model has millions. What `ref` indexes depends on
// the kind: ints (Int), strings (String, Global), containers (Tuple, List,
// Dict), objects, tensors, storages. Bool keeps its value in `aux`, Global
// what it names.
struct Node {
  uint32_t ref = 0;
  Kind kind = Kind::None;
  bool used = false;  // inside another value: a container may no longer change
  uint8_t aux = 0;
};

// A tuple, list or dict: its items at Pickle::pool[begin, begin + size);
// room up to cap for a list or dict that grows in place.
struct Container {
  uint32_t begin = 0, size = 0, cap = 0;
  uint32_t depth = 1;  // nesting, counted as kMaxNesting counts it
};

struct Object {
  NodeId cls = kNoNode;  // the Global naming its class: "__torch__.foo.Bar"
  NodeId state = kNoNode;
};

// What data.pkl holds. root is the value STOP returns.
struct Pickle {
  std::vector<Node> nodes;
  std::vector<std::string> strings;  // String nodes; Global nodes: "module.name"
  std::vector<int64_t> ints;         // Int nodes
  std::vector<Container> containers;
  std::vector<NodeId> pool;          // every container's items
  std::vector<Object> objects;
  std::vector<Tensor> tensors;
  std::vector<Storage> storages;
  std::vector<int64_t> dims;         // tensors' shapes and strides
  NodeId root = kNoNode;

  const Node& node(NodeId id) const { return nodes[id]; }
  const std::string& str(NodeId id) const { return strings[nodes[id].ref]; }
  int64_t integer(NodeId id) const { return nodes[id].kind == Kind::Bool ? nodes[id].aux : ints[nodes[id].ref]; }
  // Tuple, List, Dict: elements; a dict's are key, value, key, value, ...
  Span<NodeId> elems(NodeId id) const {
    const Container& c = containers[nodes[id].ref];
    return {pool.data() + c.begin, c.size};
  }
  const Object& object(NodeId id) const { return objects[nodes[id].ref]; }
  const std::string& class_name(NodeId object_id) const { return str(object(object_id).cls); }
  const Tensor& tensor(NodeId id) const { return tensors[nodes[id].ref]; }
  Span<int64_t> shape(const Tensor& t) const { return {dims.data() + t.dims, t.ndim}; }
  Span<int64_t> stride(const Tensor& t) const { return {dims.data() + t.dims + t.ndim, t.ndim}; }
  const Storage& storage(NodeId id) const { return storages[nodes[id].ref]; }
};

// Throws Error with a one-line reason on anything else: an opcode or global
// TorchScript never writes, a malformed or truncated stream, values that do
// not fit what a global takes.
Pickle unpickle(const std::string& data);

// The globals accepted, "module.name" each (for docs and tests).
std::vector<std::string> accepted_globals();

}  // namespace fsdp_plan::pickle
