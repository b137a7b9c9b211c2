#include "model/loaders/unpickler.h"

#include <algorithm>
#include <cstring>

#include "model/dtype.h"

namespace fsdp_plan::pickle {
namespace {

// What a GLOBAL names; anything outside this list is refused.
enum Global : int64_t {
  kClass,          // __torch__.*: a module, script class, TorchBind class or enum
  kRebuildTensor,  // torch._utils._rebuild_tensor_v2
  kRebuildQTensor, // torch._utils._rebuild_qtensor
  kOrderedDict,    // collections.OrderedDict: a tensor's (empty) backward hooks
  kBuildList,      // torch.jit._pickle.build_{int,double,bool,tensor,generic}list
  kRestoreTypeTag, // torch.jit._pickle.restore_type_tag: a typed list or dict
  kDevice,         // torch.device
  kComplex,        // builtins.complex
  kStorageType,    // torch.FloatStorage, ...: names a storage's dtype
  kQScheme,        // torch.per_tensor_affine, ...: a quantized tensor's scheme
};

const char* const kLists[] = {"build_intlist", "build_doublelist", "build_boollist",
                              "build_tensorlist", "build_genericlist"};
const char* const kQSchemes[] = {"per_tensor_affine", "per_channel_affine", "per_tensor_symmetric",
                                 "per_channel_symmetric", "per_channel_affine_float_qparams"};

// -1 if refused.
int64_t classify(const std::string& mod, const std::string& name) {
  if (mod == "__torch__" || mod.rfind("__torch__.", 0) == 0) return kClass;
  if (mod == "torch._utils" && name == "_rebuild_tensor_v2") return kRebuildTensor;
  if (mod == "torch._utils" && name == "_rebuild_qtensor") return kRebuildQTensor;
  if (mod == "collections" && name == "OrderedDict") return kOrderedDict;
  if (mod == "torch.jit._pickle") {
    if (name == "restore_type_tag") return kRestoreTypeTag;
    for (const char* l : kLists) {
      if (name == l) return kBuildList;
    }
  }
  if (mod == "builtins" && name == "complex") return kComplex;
  if (mod == "torch") {
    if (name == "device") return kDevice;
    for (const char* q : kQSchemes) {
      if (name == q) return kQScheme;
    }
    const std::string suffix = "Storage";
    if (name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        dtype_from_stem(name.substr(0, name.size() - suffix.size()))) {
      return kStorageType;
    }
  }
  return -1;
}

class Unpickler {
 public:
  explicit Unpickler(const std::string& p) : p_(p), n_(p.size()) {
    // Reserved from data.pkl's size so that nothing is copied as it grows:
    // a 50,000-module model's (10 MB) makes 0.24 values, 0.32 container
    // items, 0.07 integers and 0.015 strings per byte. Pages never written
    // cost no memory; the cap bounds what a hostile size could reserve.
    const size_t guess = std::min<size_t>(n_, size_t{1} << 26);
    out_.nodes.reserve(guess / 3);
    out_.pool.reserve(guess / 3);
    out_.ints.reserve(guess / 8);
    out_.containers.reserve(guess / 8);
    out_.strings.reserve(guess / 32);
  }

  Pickle run() {
    need(2, "the header");
    if (static_cast<unsigned char>(p_[0]) != 0x80 || p_[1] != 2) {
      throw Error("it does not start as a protocol 2 pickle");
    }
    pos_ = 2;
    while (true) {
      need(1, "an opcode");
      const unsigned char op = static_cast<unsigned char>(p_[pos_++]);
      switch (op) {
        case ']': push(add(Kind::List, new_items())); break;  // EMPTY_LIST
        case '}': push(add(Kind::Dict, new_items())); break;  // EMPTY_DICT
        case ')': push(add(Kind::Tuple, new_items())); break; // EMPTY_TUPLE
        case 'N': push(add(Kind::None)); break;
        case 0x88: case 0x89: push(add_bool(op == 0x88)); break;  // NEWTRUE, NEWFALSE
        case 'K': need(1, "BININT1"); push(add_int(static_cast<int64_t>(u(1)))); break;
        case 'M': need(2, "BININT2"); push(add_int(static_cast<int64_t>(u(2)))); break;
        case 'J': need(4, "BININT"); push(add_int(static_cast<int32_t>(u(4)))); break;
        case 'G': {  // BINFLOAT, big-endian
          need(8, "BINFLOAT");
          pos_ += 8;
          push(add(Kind::Float));
        } break;
        case 0x8a: {  // LONG1: the Pickler writes int64 as 8 bytes
          need(1, "LONG1");
          if (u(1) != 8) throw Error("a LONG1 is not 8 bytes");
          need(8, "LONG1");
          push(add_int(static_cast<int64_t>(u(8))));
        } break;
        case 'X': {  // BINUNICODE
          need(4, "a string length");
          const uint64_t len = u(4);
          if (len > n_ - pos_) {
            throw Error("a string claims " + std::to_string(len) + " bytes, more than data.pkl holds");
          }
          push(add_string(p_.substr(pos_, static_cast<size_t>(len))));
          pos_ += static_cast<size_t>(len);
        } break;
        case 'q': case 'r': {  // BINPUT, LONG_BINPUT
          const size_t k = op == 'q' ? 1 : 4;
          need(k, "BINPUT");
          const uint64_t id = u(k);
          if (stack_.empty()) throw Error("BINPUT with an empty stack");
          if (id > memo_.size()) throw Error("memo index " + std::to_string(id) + " out of order");
          if (id == memo_.size()) memo_.push_back(stack_.back()); else memo_[id] = stack_.back();
        } break;
        case 'h': case 'j': {  // BINGET, LONG_BINGET
          const size_t k = op == 'h' ? 1 : 4;
          need(k, "BINGET");
          const uint64_t id = u(k);
          if (id >= memo_.size()) throw Error("memo index " + std::to_string(id) + " was never set");
          push(memo_[id]);
        } break;
        case '(': marks_.push_back(stack_.size()); break;  // MARK
        case 't': {  // TUPLE
          const size_t start = mark_start();
          push_tuple(start);
        } break;
        case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
          const size_t k = op - 0x84u;
          pop_n(k, "TUPLE");
          push_tuple(stack_.size() - k);
        } break;
        case 'l': case 'd': {  // LIST, DICT
          const size_t start = mark_start();
          if (op == 'd' && (stack_.size() - start) % 2 != 0) throw Error("a dict item has no value");
          const uint32_t d = deepest(start);
          const NodeId c = add(op == 'l' ? Kind::List : Kind::Dict, items_from(start));
          out_.containers[out_.nodes[c].ref].depth = d;
          stack_.resize(start);
          push(c);
        } break;
        case 'e': fill(mark_start(), Kind::List); break;  // APPENDS
        case 'u': fill(mark_start(), Kind::Dict); break;  // SETITEMS
        case 's': pop_n(3, "SETITEM"); fill(stack_.size() - 2, Kind::Dict); break;
        case 'c': global(); break;
        case 0x81: {  // NEWOBJ: cls, args -> a new object
          pop_n(2, "NEWOBJ");
          const NodeId cls = stack_[stack_.size() - 2];
          if (!is_global(cls, kClass)) throw Error("NEWOBJ of something that is not a class");
          (void)deepest(stack_.size() - 1);
          Object obj;
          obj.cls = cls;
          out_.objects.push_back(obj);
          const NodeId o = add(Kind::Object, static_cast<uint32_t>(out_.objects.size() - 1));
          stack_.resize(stack_.size() - 2);
          push(o);
        } break;
        case 'b': {  // BUILD: object, state -> object with that state
          pop_n(2, "BUILD");
          const NodeId obj = stack_[stack_.size() - 2];
          if (out_.node(obj).kind != Kind::Object) throw Error("BUILD of something that is not an object");
          Object& o = out_.objects[out_.node(obj).ref];
          if (o.state != kNoNode) throw Error("an object is built twice");
          (void)deepest(stack_.size() - 1);  // objects stay flat: their state does not nest them
          o.state = stack_.back();
          stack_.pop_back();
        } break;
        case 'R': reduce(); break;
        case 'Q': {  // BINPERSID: a storage
          pop_n(1, "BINPERSID");
          (void)deepest(stack_.size() - 1);
          const NodeId s = storage(stack_.back());
          stack_.back() = s;
        } break;
        case '.':  // STOP
          if (stack_.size() != 1) throw Error("it does not end with exactly one value");
          out_.root = stack_.back();
          return std::move(out_);
        default:
          throw Error("unknown opcode 0x" + std::string(1, "0123456789abcdef"[op >> 4]) +
                      std::string(1, "0123456789abcdef"[op & 15]) + " at byte " +
                      std::to_string(pos_ - 1));
      }
    }
  }

 private:
  void need(size_t k, const char* what) const {
    if (n_ - pos_ < k) throw Error(std::string(what) + " runs past the end");
  }
  uint64_t u(size_t k) {
    uint64_t v = 0;
    for (size_t i = 0; i < k; ++i) v |= uint64_t{static_cast<unsigned char>(p_[pos_ + i])} << (8 * i);
    pos_ += k;
    return v;
  }
  NodeId add(Kind kind, uint32_t ref = 0) {
    if (out_.nodes.size() >= kMaxValues)
      throw Error("more than " + std::to_string(kMaxValues) + " values, more than any model's structure");
    Node nd;
    nd.kind = kind;
    nd.ref = ref;
    out_.nodes.push_back(nd);
    return static_cast<NodeId>(out_.nodes.size() - 1);
  }
  NodeId add_int(int64_t v) {
    out_.ints.push_back(v);
    return add(Kind::Int, static_cast<uint32_t>(out_.ints.size() - 1));
  }
  NodeId add_bool(bool v) {
    const NodeId id = add(Kind::Bool);
    out_.nodes[id].aux = v;
    return id;
  }
  NodeId add_string(std::string s) {
    out_.strings.push_back(std::move(s));
    return add(Kind::String, static_cast<uint32_t>(out_.strings.size() - 1));
  }
  // Indices stay below 2^32: every container and pool slot takes a byte of
  // data.pkl at least (a list that grows takes at most four slots per item).
  uint32_t new_items() {
    Container c;
    c.begin = static_cast<uint32_t>(out_.pool.size());
    out_.containers.push_back(c);
    return static_cast<uint32_t>(out_.containers.size() - 1);
  }
  // A new container holding the stack from `start` on.
  uint32_t items_from(size_t start) {
    const uint32_t ref = new_items();
    out_.pool.insert(out_.pool.end(), stack_.begin() + static_cast<ptrdiff_t>(start), stack_.end());
    Container& c = out_.containers[ref];
    c.size = c.cap = static_cast<uint32_t>(stack_.size() - start);
    return ref;
  }
  uint32_t depth(NodeId id) const {
    const Node& nd = out_.nodes[id];
    const bool container = nd.kind == Kind::Tuple || nd.kind == Kind::List || nd.kind == Kind::Dict;
    return container ? out_.containers[nd.ref].depth : 1;
  }
  void push(NodeId id) { stack_.push_back(id); }
  void pop_n(size_t k, const char* what) const {
    if (stack_.size() < k) throw Error(std::string(what) + " finds too few values");
  }
  bool is_global(NodeId id, Global g) const {
    return out_.node(id).kind == Kind::Global && out_.node(id).aux == g;
  }
  size_t mark_start() {
    if (marks_.empty()) throw Error("a container has no MARK");
    const size_t start = marks_.back();
    marks_.pop_back();
    if (start > stack_.size()) throw Error("a MARK points past the stack");
    return start;
  }
  // One more than the deepest value from `from` on, which are now inside
  // something and may no longer change.
  uint32_t deepest(size_t from) {
    uint32_t d = 0;
    for (size_t i = from; i < stack_.size(); ++i) {
      d = std::max(d, depth(stack_[i]));
      out_.nodes[stack_[i]].used = true;
    }
    if (d + 1 > kMaxNesting) throw Error("values nested more than " + std::to_string(kMaxNesting) + " deep");
    return d + 1;
  }
  void push_tuple(size_t start) {
    const uint32_t d = deepest(start);
    const NodeId t = add(Kind::Tuple, items_from(start));
    out_.containers[out_.nodes[t].ref].depth = d;
    stack_.resize(start);
    push(t);
  }
  // Items from `start` go into the list or dict just below them.
  void fill(size_t start, Kind kind) {
    if (start == 0) throw Error("nothing to add items to");
    if (kind == Kind::Dict && (stack_.size() - start) % 2 != 0) throw Error("a dict item has no value");
    Node& target = out_.nodes[stack_[start - 1]];
    if (target.kind != kind) {
      throw Error(std::string(kind == Kind::List ? "APPENDS" : "SETITEMS") + " to something that is not a " +
                  (kind == Kind::List ? "list" : "dict"));
    }
    if (target.used) throw Error("a container is changed after it was used");
    const uint32_t d = deepest(start);
    Container& c = out_.containers[target.ref];
    c.depth = std::max(c.depth, d);
    const size_t k = stack_.size() - start;
    auto& pool = out_.pool;
    if (c.begin + c.cap == pool.size()) {
      pool.insert(pool.end(), stack_.begin() + static_cast<ptrdiff_t>(start), stack_.end());
      c.cap = c.size = static_cast<uint32_t>(c.size + k);  // last in the pool: grows in place
    } else if (c.size + k <= c.cap) {
      std::copy(stack_.begin() + static_cast<ptrdiff_t>(start), stack_.end(), pool.begin() + c.begin + c.size);
      c.size = static_cast<uint32_t>(c.size + k);
    } else {  // moves to the end with room to grow: linear however items come
      const size_t at = pool.size(), size = c.size + k;
      pool.resize(at + 2 * size, kNoNode);
      std::copy(pool.begin() + c.begin, pool.begin() + c.begin + c.size, pool.begin() + static_cast<ptrdiff_t>(at));
      std::copy(stack_.begin() + static_cast<ptrdiff_t>(start), stack_.end(),
                pool.begin() + static_cast<ptrdiff_t>(at + c.size));
      c.begin = static_cast<uint32_t>(at);
      c.size = static_cast<uint32_t>(size);
      c.cap = static_cast<uint32_t>(2 * size);
    }
    stack_.resize(start);
  }

  void global() {
    std::string parts[2];
    for (auto& part : parts) {
      const size_t nl = p_.find('\n', pos_);
      if (nl == std::string::npos) throw Error("a GLOBAL name runs past the end");
      part = p_.substr(pos_, nl - pos_);
      pos_ = nl + 1;
    }
    const int64_t g = classify(parts[0], parts[1]);
    if (g < 0) throw Error("unsupported global " + parts[0] + "." + parts[1]);
    out_.strings.push_back(parts[0] + "." + parts[1]);
    push(add(Kind::Global, static_cast<uint32_t>(out_.strings.size() - 1)));
    out_.nodes.back().aux = static_cast<uint8_t>(g);
  }

  // The elements of a tuple argument, or an error naming what takes it.
  // Valid until the pool grows: read it before making containers.
  Span<NodeId> args(NodeId id, size_t min, size_t max, const std::string& what) const {
    if (out_.node(id).kind != Kind::Tuple || out_.elems(id).size() < min || out_.elems(id).size() > max) {
      throw Error(what + " gets the wrong arguments");
    }
    return out_.elems(id);
  }
  Kind kind(NodeId id) const { return out_.node(id).kind; }

  void reduce() {  // REDUCE: callable, argument tuple -> result
    pop_n(2, "REDUCE");
    const NodeId fn = stack_[stack_.size() - 2], arg = stack_.back();
    if (kind(fn) != Kind::Global) throw Error("REDUCE of something that is not a global");
    const std::string& name = out_.str(fn);
    (void)deepest(stack_.size() - 1);
    NodeId result = kNoNode;
    switch (out_.node(fn).aux) {
      case kRebuildTensor: case kRebuildQTensor: result = tensor(fn, arg); break;
      case kOrderedDict: args(arg, 0, 0, name); result = add(Kind::Dict, new_items()); break;
      case kBuildList: {
        const NodeId list = args(arg, 1, 1, name)[0];
        if (kind(list) != Kind::List) throw Error(name + " gets the wrong arguments");
        result = list;
      } break;
      case kRestoreTypeTag: {
        const auto a = args(arg, 2, 2, name);
        if (kind(a[1]) != Kind::String) throw Error(name + " gets the wrong arguments");
        result = a[0];
      } break;
      case kDevice: {
        const auto a = args(arg, 1, 2, name);
        if (kind(a[0]) != Kind::String || (a.size() == 2 && kind(a[1]) != Kind::Int)) {
          throw Error(name + " gets the wrong arguments");
        }
        result = add(Kind::Other);
      } break;
      case kComplex: {
        for (NodeId x : args(arg, 2, 2, name)) {
          if (kind(x) != Kind::Float && kind(x) != Kind::Int) throw Error(name + " gets the wrong arguments");
        }
        result = add(Kind::Other);
      } break;
      case kClass: result = add(Kind::Other); break;  // an enum value: class(value)
      default: throw Error(name + " is not callable");
    }
    stack_.resize(stack_.size() - 2);
    push(result);
  }

  // Appends a tuple of integers to dims; returns how many.
  uint32_t ints(NodeId id, const std::string& what) {
    if (kind(id) != Kind::Tuple) throw Error("a tensor's " + what + " is not a tuple of integers");
    for (NodeId x : out_.elems(id)) {
      if (kind(x) != Kind::Int) throw Error("a tensor's " + what + " is not a tuple of integers");
      out_.dims.push_back(out_.integer(x));
    }
    return static_cast<uint32_t>(out_.elems(id).size());
  }

  // _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks[, metadata])
  // _rebuild_qtensor(storage, offset, size, stride, qparams, requires_grad, hooks)
  NodeId tensor(NodeId fn, NodeId arg) {
    const bool q = out_.node(fn).aux == kRebuildQTensor;
    const auto a = args(arg, q ? 7 : 6, 7, out_.str(fn));
    const NodeId grad = a[q ? 5 : 4];
    if (kind(a[0]) != Kind::Storage || kind(a[1]) != Kind::Int || kind(grad) != Kind::Bool) {
      throw Error(out_.str(fn) + " gets the wrong arguments");
    }
    Tensor t;
    t.storage = a[0];
    t.offset = out_.integer(a[1]);
    if (out_.dims.size() >= kNoNode / 2) throw Error("too many values");
    t.dims = static_cast<uint32_t>(out_.dims.size());
    t.ndim = ints(a[2], "shape");
    if (ints(a[3], "stride") != t.ndim) throw Error("a tensor's shape and stride differ in length");
    t.requires_grad = out_.integer(grad) != 0;
    t.quantized = q;
    out_.tensors.push_back(t);
    return add(Kind::Tensor, static_cast<uint32_t>(out_.tensors.size() - 1));
  }

  // ('storage', torch.FloatStorage, key, location, numel)
  NodeId storage(NodeId pid) {
    const auto a = args(pid, 5, 5, "a persistent id");
    if (kind(a[0]) != Kind::String || out_.str(a[0]) != "storage" || !is_global(a[1], kStorageType) ||
        kind(a[2]) != Kind::String || kind(a[3]) != Kind::String || kind(a[4]) != Kind::Int) {
      throw Error("a persistent id is not a storage");
    }
    Storage s;
    const std::string& type = out_.str(a[1]);  // "torch.FloatStorage"
    s.dtype = dtype_from_stem(type.substr(6, type.size() - 6 - 7));  // classify() found it
    s.key = a[2];
    s.location = a[3];
    s.numel = out_.integer(a[4]);
    out_.storages.push_back(s);
    return add(Kind::Storage, static_cast<uint32_t>(out_.storages.size() - 1));
  }

  const std::string& p_;
  const size_t n_;
  size_t pos_ = 0;
  Pickle out_;
  std::vector<NodeId> stack_, memo_;
  std::vector<size_t> marks_;
};

}  // namespace

Pickle unpickle(const std::string& data) { return Unpickler(data).run(); }

std::vector<std::string> accepted_globals() {
  std::vector<std::string> out = {"__torch__.* (module, script, TorchBind and enum classes)",
                                  "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_qtensor",
                                  "collections.OrderedDict", "torch.jit._pickle.restore_type_tag"};
  for (const char* l : kLists) out.push_back(std::string("torch.jit._pickle.") + l);
  out.push_back("torch.device");
  out.push_back("builtins.complex");
  for (const char* q : kQSchemes) out.push_back(std::string("torch.") + q);
  for (const std::string& stem : dtype_stems()) out.push_back("torch." + stem + "Storage");
  return out;
}

}  // namespace fsdp_plan::pickle
