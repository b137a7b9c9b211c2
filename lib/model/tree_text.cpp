#include "model/tree_text.h"

#include <algorithm>
#include <vector>

#include "model/class_names.h"

namespace fsdp_plan {

std::string tree_to_text(const ModuleTree& tree) {
  std::vector<bool> seen(tree.num_tensors(), false);
  auto slots = [&](const std::vector<TensorSlot>& list, const char* kind, const std::string& indent) {
    std::string out;
    for (const auto& s : list) {
      const TensorInfo& info = tree.tensor(s.tensor);
      std::string shape;
      for (int64_t d : info.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      const bool again = seen[static_cast<size_t>(s.tensor)];
      seen[static_cast<size_t>(s.tensor)] = true;
      out += indent + "  " + kind + " " + s.name + " [" + shape + "] " + info.dtype +
             (again ? " (the same tensor as an earlier slot)" : "") + "\n";
    }
    return out;
  };
  std::vector<int> depth(tree.num_modules(), 0);  // incrementally: deep chains stay linear
  std::string out;
  for (ModuleId m : tree.preorder()) {
    const Module& mod = tree.module(m);
    if (m != 0) depth[static_cast<size_t>(m)] = depth[static_cast<size_t>(mod.parent)] + 1;
    const std::string indent(static_cast<size_t>(std::min(depth[static_cast<size_t>(m)], 40)) * 2, ' ');
    out += indent + (m == 0 ? std::string("(root)") : mod.name) + "  " + demangle(mod.type_name) + "\n";
    out += slots(mod.params, "param ", indent);
    out += slots(mod.buffers, "buffer", indent);
  }
  return out;
}

}  // namespace fsdp_plan
