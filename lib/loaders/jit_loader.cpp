// Loader through torch::jit::load: reads every weight and compiles every
// method. Slow on big models and refuses archives from newer PyTorch, but it
// is LibTorch's own reading of the file, so it is the reference for the
// structure-only loader.
#include <torch/script.h>

#include <unordered_map>

#include "../errors.h"
#include "dtype.h"
#include "loader.h"

namespace fsdp_plan {
namespace {

// LibTorch's messages span lines and may start with a blank one.
std::string first_line(const std::string& s) {
  auto start = s.find_first_not_of(" \n\t");
  if (start == std::string::npos) return "(no message)";
  return s.substr(start, s.find('\n', start) - start);
}

class TreeBuilder {
 public:
  ModuleTree build(const torch::jit::Module& root) {
    tree_.module(0).type_name = root.type()->name()->qualifiedName();
    // Explicit stack: deep chains must not overflow the C stack.
    std::vector<std::pair<c10::intrusive_ptr<c10::ivalue::Object>, ModuleId>> stack;
    stack.emplace_back(root._ivalue(), 0);
    while (!stack.empty()) {
      auto [obj, id] = stack.back();
      stack.pop_back();
      std::vector<std::pair<c10::intrusive_ptr<c10::ivalue::Object>, ModuleId>> children;
      const auto& type = obj->type();
      for (size_t i = 0; i < type->numAttributes(); ++i) {
        const c10::IValue& v = obj->getSlot(i);
        const std::string& name = type->getAttributeName(i);
        if (type->is_parameter(i)) {
          if (v.isTensor()) tree_.add_param(id, name, tensor_id(v.toTensor()));
        } else if (type->is_buffer(i)) {
          if (v.isTensor()) tree_.add_buffer(id, name, tensor_id(v.toTensor()));
        } else if (v.isObject() && v.toObjectRef().type()->is_module()) {
          auto child = v.toObject();
          ModuleId cid = tree_.add_module(id, name, child->type()->name()->qualifiedName());
          children.emplace_back(child, cid);
        }
      }
      for (auto it = children.rbegin(); it != children.rend(); ++it) stack.push_back(*it);
    }
    return std::move(tree_);
  }

 private:
  TensorId tensor_id(const at::Tensor& t) {
    auto [it, fresh] = ids_.try_emplace(t.unsafeGetTensorImpl(), 0);
    if (fresh) {
      TensorInfo info;
      info.shape = t.sizes().vec();
      info.dtype = dtype_name(t.scalar_type());
      info.itemsize = static_cast<int64_t>(t.element_size());
      it->second = tree_.add_tensor(std::move(info));
    }
    return it->second;
  }

  ModuleTree tree_;
  std::unordered_map<const c10::TensorImpl*, TensorId> ids_;
};

}  // namespace

ModuleTree load_with_jit(const std::string& path) {
  torch::jit::Module m;
  try {
    m = torch::jit::load(path, torch::kCPU);
  } catch (const c10::Error& e) {
    throw InputError(path, "torch::jit::load failed: " + first_line(e.what_without_backtrace()));
  } catch (const std::exception& e) {
    throw InputError(path, "torch::jit::load failed: " + first_line(e.what()));
  }
  return TreeBuilder().build(m);
}

}  // namespace fsdp_plan
