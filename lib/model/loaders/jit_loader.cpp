// The LibTorch plugin behind --loader jit: torch::jit::load reads every weight
// and compiles every method. Slow on big models and refuses archives from
// newer PyTorch, but it is LibTorch's own reading of the file, so it is the
// reference for the structure-only loader. Built as fsdp_plan_jit.so and
// dlopen'ed by jit_plugin_host.cpp; only C crosses the boundary.
#include <torch/script.h>

#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/loaders/jit_compat.h"
#include "model/loaders/jit_plugin.h"

namespace {

// LibTorch's messages span lines and may start with a blank one.
std::string first_line(const std::string& s) {
  auto start = s.find_first_not_of(" \n\t");
  if (start == std::string::npos) return "(no message)";
  return s.substr(start, s.find('\n', start) - start);
}

class TreeWalker {
 public:
  explicit TreeWalker(const fsdp_plan_jit_sink& sink) : sink_(sink) {}

  void walk(const torch::jit::Module& root) {
    sink_.set_root_type(sink_.ctx, root.type()->name()->qualifiedName().c_str());
    // Explicit stack: deep chains must not overflow the C stack.
    std::vector<std::pair<c10::intrusive_ptr<c10::ivalue::Object>, int32_t>> stack;
    stack.emplace_back(root._ivalue(), 0);
    std::vector<std::pair<c10::intrusive_ptr<c10::ivalue::Object>, int32_t>> children;
    while (!stack.empty()) {
      auto [obj, id] = stack.back();
      stack.pop_back();
      children.clear();
      const auto& type = obj->type();
      for (size_t i = 0; i < type->numAttributes(); ++i) {
        const c10::IValue& v = obj->getSlot(i);
        const std::string& name = type->getAttributeName(i);
        if (type->is_parameter(i)) {
          if (v.isTensor()) sink_.add_param(sink_.ctx, id, name.c_str(), tensor_id(v.toTensor()));
        } else if (type->is_buffer(i)) {
          if (v.isTensor()) sink_.add_buffer(sink_.ctx, id, name.c_str(), tensor_id(v.toTensor()));
        } else if (v.isObject() && v.toObjectRef().type()->is_module()) {
          auto child = v.toObject();
          const int32_t cid = sink_.add_module(sink_.ctx, id, name.c_str(),
                                               child->type()->name()->qualifiedName().c_str());
          children.emplace_back(child, cid);
        }
      }
      for (auto it = children.rbegin(); it != children.rend(); ++it) stack.push_back(*it);
    }
  }

 private:
  int64_t tensor_id(const at::Tensor& t) {
    auto [it, fresh] = ids_.try_emplace(t.unsafeGetTensorImpl(), 0);
    if (fresh) {
      const std::vector<int64_t> shape = t.sizes().vec();
      it->second = sink_.add_tensor(sink_.ctx, shape.data(), shape.size(),
                                    c10::toString(t.scalar_type()), t.requires_grad() ? 1 : 0);
    }
    return it->second;
  }

  const fsdp_plan_jit_sink& sink_;
  std::unordered_map<const c10::TensorImpl*, int64_t> ids_;
};

void set_error(char* err, size_t err_len, const std::string& what) {
  if (err_len == 0) return;
  const size_t n = std::min(what.size(), err_len - 1);
  std::memcpy(err, what.data(), n);
  err[n] = '\0';
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int fsdp_plan_jit_abi(void) { return FSDP_PLAN_JIT_ABI; }

__attribute__((visibility("default"))) const char* fsdp_plan_jit_version(void) {
  return fsdp_plan::jit_compat::kLibTorchVersion;
}

__attribute__((visibility("default"))) int fsdp_plan_jit_load(const char* path,
                                                              const fsdp_plan_jit_sink* sink,
                                                              char* err, size_t err_len) {
  try {
    torch::jit::Module m;
    try {
      m = torch::jit::load(path, torch::kCPU);
    } catch (const c10::Error& e) {
      set_error(err, err_len, "torch::jit::load failed: " + first_line(e.what_without_backtrace()));
      return 2;
    } catch (const std::exception& e) {
      set_error(err, err_len, "torch::jit::load failed: " + first_line(e.what()));
      return 2;
    }
    TreeWalker(*sink).walk(m);
    return 0;
  } catch (const std::exception& e) {
    set_error(err, err_len, "--loader jit failed: " + first_line(e.what()));
    return 2;
  }
}

}  // extern "C"
