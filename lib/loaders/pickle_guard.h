// A dry run over data.pkl before LibTorch's Unpickler sees it. The Unpickler
// trusts its input: it allocates a string's declared length before reading it,
// grows its memo to any index a PUT names, indexes its stack past MARKs that
// are not there, and a value nested a million deep is freed by recursion. This
// walk follows the opcodes the Unpickler knows and refuses, with a one-line
// message, anything that would make it misbehave. Torch-free, header-only.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace fsdp_plan {

// Containers nested deeper than this are refused: freeing them recurses once
// per level. TorchScript attributes nest a few levels; modules do not count
// (the loader keeps objects flat).
constexpr uint32_t kMaxPickleNesting = 2000;

class PickleError : public std::runtime_error {
 public:
  explicit PickleError(const std::string& what)
      : std::runtime_error("data.pkl is damaged: " + what) {}
};

inline void check_pickle(const std::string& p) {
  struct Value {
    uint32_t depth = 1;
    int32_t global = -1;  // set when a GLOBAL pushed it: 0 other, 1 a class (REDUCE/BUILD give an object)
    uint32_t container = 0;  // index+1 into containers, for mutable containers
  };
  struct Container {
    uint32_t depth = 1;
    bool used = false;  // placed inside something: must not change any more
  };
  std::vector<Value> stack, memo;
  std::vector<size_t> marks;
  std::vector<Container> containers;
  size_t pos = 0;
  const size_t n = p.size();
  auto need = [&](size_t k, const char* what) {
    if (n - pos < k) throw PickleError(std::string(what) + " runs past the end");
  };
  auto u = [&](size_t k) {
    uint64_t v = 0;
    for (size_t i = 0; i < k; ++i) v |= uint64_t{static_cast<unsigned char>(p[pos + i])} << (8 * i);
    pos += k;
    return v;
  };
  auto mark_start = [&](bool pop) {
    if (marks.empty()) throw PickleError("a container has no MARK");
    size_t start = marks.back();
    if (pop) marks.pop_back();
    if (start > stack.size()) throw PickleError("a MARK points past the stack");
    return start;
  };
  auto deepest = [&](size_t from) {
    uint32_t d = 0;
    for (size_t i = from; i < stack.size(); ++i) {
      d = std::max(d, stack[i].depth);
      if (stack[i].container) containers[stack[i].container - 1].used = true;
    }
    if (d + 1 > kMaxPickleNesting) {
      throw PickleError("values nested more than " + std::to_string(kMaxPickleNesting) + " deep");
    }
    return d + 1;
  };
  auto new_container = [&](uint32_t depth) {
    containers.push_back({depth, false});
    Value v;
    v.depth = depth;
    v.container = static_cast<uint32_t>(containers.size());
    return v;
  };
  // Items from `start` go into the container just below them.
  auto fill = [&](size_t start, bool pairs) {
    if (start == 0) throw PickleError("nothing to add items to");
    if (pairs && (stack.size() - start) % 2 != 0) throw PickleError("a dict item has no value");
    Value& target = stack[start - 1];
    const uint32_t d = deepest(start);
    if (target.container) {
      Container& c = containers[target.container - 1];
      if (c.used) throw PickleError("a container is changed after it was used");
      c.depth = std::max(c.depth, d);
      target.depth = c.depth;
    }
    stack.resize(start);
  };
  auto pop_n = [&](size_t k, const char* what) {
    if (stack.size() < k) throw PickleError(std::string(what) + " finds too few values");
  };

  need(2, "the header");
  if (static_cast<unsigned char>(p[0]) != 0x80 || p[1] != 2) {
    throw PickleError("it does not start as a protocol 2 pickle");
  }
  pos = 2;
  while (true) {
    need(1, "an opcode");
    const unsigned char op = static_cast<unsigned char>(p[pos++]);
    switch (op) {
      case ']': stack.push_back(new_container(1)); break;  // EMPTY_LIST
      case '}': stack.push_back(new_container(1)); break;  // EMPTY_DICT
      case ')': case 'N': case 0x88: case 0x89: stack.push_back({}); break;
      case 'K': need(1, "BININT1"); pos += 1; stack.push_back({}); break;
      case 'M': need(2, "BININT2"); pos += 2; stack.push_back({}); break;
      case 'J': need(4, "BININT"); pos += 4; stack.push_back({}); break;
      case 'G': need(8, "BINFLOAT"); pos += 8; stack.push_back({}); break;
      case 0x8a: {  // LONG1
        need(1, "LONG1");
        const size_t len = u(1);
        if (len != 8) throw PickleError("a LONG1 is not 8 bytes");
        need(8, "LONG1");
        pos += 8;
        stack.push_back({});
      } break;
      case 'X': {  // BINUNICODE
        need(4, "a string length");
        const uint64_t len = u(4);
        if (len > n - pos) {
          throw PickleError("a string claims " + std::to_string(len) + " bytes, more than data.pkl holds");
        }
        pos += static_cast<size_t>(len);
        stack.push_back({});
      } break;
      case 'q': case 'r': {  // BINPUT, LONG_BINPUT
        const size_t k = op == 'q' ? 1 : 4;
        need(k, "BINPUT");
        const uint64_t id = u(k);
        if (stack.empty()) throw PickleError("BINPUT with an empty stack");
        if (id > memo.size()) throw PickleError("memo index " + std::to_string(id) + " out of order");
        if (id == memo.size()) memo.push_back(stack.back()); else memo[id] = stack.back();
      } break;
      case 'h': case 'j': {  // BINGET, LONG_BINGET
        const size_t k = op == 'h' ? 1 : 4;
        need(k, "BINGET");
        const uint64_t id = u(k);
        if (id >= memo.size()) throw PickleError("memo index " + std::to_string(id) + " was never set");
        stack.push_back(memo[id]);
      } break;
      case '(': marks.push_back(stack.size()); break;
      case 't': {  // TUPLE
        const size_t start = mark_start(true);
        Value v;
        v.depth = deepest(start);
        stack.resize(start);
        stack.push_back(v);
      } break;
      case 0x85: case 0x86: case 0x87: {  // TUPLE1..3
        const size_t k = op - 0x84u;
        pop_n(k, "TUPLE");
        Value v;
        v.depth = deepest(stack.size() - k);
        stack.resize(stack.size() - k);
        stack.push_back(v);
      } break;
      case 'l': case 'd': {  // LIST, DICT
        const size_t start = mark_start(true);
        if (op == 'd' && (stack.size() - start) % 2 != 0) throw PickleError("a dict item has no value");
        const uint32_t d = deepest(start);
        stack.resize(start);
        stack.push_back(new_container(d));
      } break;
      case 'e': fill(mark_start(true), false); break;  // APPENDS
      case 'u': fill(mark_start(true), true); break;   // SETITEMS
      case 's': pop_n(3, "SETITEM"); fill(stack.size() - 2, true); break;
      case 'c': {  // GLOBAL module\nname\n
        std::string parts[2];
        for (auto& part : parts) {
          const size_t nl = p.find('\n', pos);
          if (nl == std::string::npos) throw PickleError("a GLOBAL name runs past the end");
          part = p.substr(pos, nl - pos);
          pos = nl + 1;
        }
        const std::string& mod = parts[0];
        const std::string& name = parts[1];
        // Paths of the Unpickler that index past what they check, or that no
        // TorchScript module needs.
        if ((mod == "torch._tensor" && name == "_rebuild_from_type_v2") ||
            (mod == "torch._utils" && name == "_rebuild_sparse_tensor") ||
            mod == "torch.distributed.rpc") {
          throw PickleError("unsupported global " + mod + "." + name);
        }
        Value v;
        const bool builtin = mod == "torch" || mod == "torch._utils" || mod == "torch.jit._pickle" ||
                             mod == "collections" || mod == "builtins" || mod == "__main__";
        v.global = builtin ? 0 : 1;
        stack.push_back(v);
      } break;
      case 0x81:  // NEWOBJ
        pop_n(1, "NEWOBJ");
        stack.pop_back();
        break;
      case 'b': case 'R': {  // BUILD, REDUCE: functor, argument -> result
        pop_n(2, "REDUCE");
        const Value fn = stack[stack.size() - 2];
        Value v;
        v.depth = fn.global == 1 ? 1 : deepest(stack.size() - 1);
        if (fn.global == 1) (void)deepest(stack.size() - 1);  // the state is used
        stack.resize(stack.size() - 2);
        stack.push_back(v);
      } break;
      case 'Q': {  // BINPERSID
        pop_n(1, "BINPERSID");
        (void)deepest(stack.size() - 1);
        stack.back() = Value{};
      } break;
      case '.':  // STOP
        if (stack.size() != 1) throw PickleError("it does not end with exactly one value");
        return;
      default:
        throw PickleError("unknown opcode 0x" + std::string(1, "0123456789abcdef"[op >> 4]) +
                          std::string(1, "0123456789abcdef"[op & 15]) + " at byte " +
                          std::to_string(pos - 1));
    }
  }
}

}  // namespace fsdp_plan
