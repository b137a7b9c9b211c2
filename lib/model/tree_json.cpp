#include "model/tree_json.h"

#include <unordered_map>

namespace fsdp_plan {

nlohmann::ordered_json tree_to_json(const ModuleTree& tree) {
  std::unordered_map<TensorId, int> canonical;
  auto slots = [&](const std::vector<TensorSlot>& list) {
    auto out = nlohmann::ordered_json::array();
    for (const auto& s : list) {
      auto [it, fresh] = canonical.try_emplace(s.tensor, static_cast<int>(canonical.size()));
      (void)fresh;
      const TensorInfo& t = tree.tensor(s.tensor);
      out.push_back({{"name", s.name}, {"tensor", it->second}, {"shape", t.shape},
                     {"dtype", t.dtype}, {"itemsize", t.itemsize},
                     {"requires_grad", t.requires_grad}});
    }
    return out;
  };
  auto modules = nlohmann::ordered_json::array();
  for (ModuleId m : tree.preorder()) {
    const Module& mod = tree.module(m);
    modules.push_back({{"path", tree.path(m)}, {"type", mod.type_name},
                       {"params", slots(mod.params)}, {"buffers", slots(mod.buffers)}});
  }
  return {{"modules", std::move(modules)}, {"num_tensors", canonical.size()}};
}

}  // namespace fsdp_plan
