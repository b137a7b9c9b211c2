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

namespace fsdp_plan::pickle {

// Containers nested deeper than this are refused: a million nested tuples is
// an attack, not a model. TorchScript attributes nest a few levels; objects
// do not count (each keeps its state apart).
constexpr uint32_t kMaxNesting = 2000;

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

struct Storage {
  std::string dtype_stem;  // "Float" from torch.FloatStorage
  std::string key;         // its record under data/
  std::string location;    // "cpu", "meta", ...
  int64_t numel = 0;
};

struct Tensor {
  NodeId storage = kNoNode;
  int64_t offset = 0;
  std::vector<int64_t> shape, stride;
  bool requires_grad = false;
  bool quantized = false;
};

struct Node {
  Kind kind = Kind::None;
  uint32_t depth = 1;  // nesting, counted as kMaxNesting counts it
  bool used = false;   // inside another value: a container may no longer change
  uint32_t ref = 0;    // index into the arena's vector for this kind
  int64_t i = 0;       // Bool and Int values
};

struct Object {
  std::string cls;  // "__torch__.foo.Bar"
  NodeId state = kNoNode;
};

// What data.pkl holds. root is the value STOP returns.
struct Pickle {
  std::vector<Node> nodes;
  std::vector<std::string> strings;           // String nodes; Global nodes: "module.name"
  std::vector<std::vector<NodeId>> items;     // Tuple, List, Dict
  std::vector<Object> objects;
  std::vector<Tensor> tensors;
  std::vector<Storage> storages;
  NodeId root = kNoNode;

  const Node& node(NodeId id) const { return nodes[id]; }
  const std::string& str(NodeId id) const { return strings[nodes[id].ref]; }
  const std::vector<NodeId>& elems(NodeId id) const { return items[nodes[id].ref]; }
  const Object& object(NodeId id) const { return objects[nodes[id].ref]; }
  const Tensor& tensor(NodeId id) const { return tensors[nodes[id].ref]; }
  const Storage& storage(NodeId id) const { return storages[nodes[id].ref]; }
};

// Throws Error with a one-line reason on anything else: an opcode or global
// TorchScript never writes, a malformed or truncated stream, values that do
// not fit what a global takes.
Pickle unpickle(const std::string& data);

// The globals accepted, "module.name" each (for docs and tests).
std::vector<std::string> accepted_globals();

}  // namespace fsdp_plan::pickle
