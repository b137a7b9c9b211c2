#include "model/aliases.h"

#include <map>
#include <unordered_map>

#include "model/class_names.h"

namespace fsdp_plan {

std::vector<ModuleId> find_aliases(const ModuleTree& tree) {
  const size_t n = tree.num_modules();
  // Each module's structure, interned bottom-up: equal ids, equal structure.
  std::unordered_map<std::string, int64_t> names;
  auto name_id = [&](const std::string& s) {
    return names.emplace(s, static_cast<int64_t>(names.size())).first->second;
  };
  std::map<std::vector<int64_t>, int32_t> shapes;
  std::vector<int32_t> shape(n, -1);
  std::vector<bool> has_tensor(n, false);
  for (size_t i = n; i-- > 0;) {  // children have larger ids
    const Module& m = tree.modules()[i];
    std::vector<int64_t> key{name_id(demangle(m.type_name)), static_cast<int64_t>(m.params.size())};
    for (const auto& s : m.params) key.insert(key.end(), {name_id(s.name), s.tensor});
    key.push_back(static_cast<int64_t>(m.buffers.size()));
    for (const auto& s : m.buffers) key.insert(key.end(), {name_id(s.name), s.tensor});
    bool tensors = !m.params.empty() || !m.buffers.empty();
    for (ModuleId c : m.children) {
      key.insert(key.end(), {name_id(tree.module(c).name), shape[static_cast<size_t>(c)]});
      tensors = tensors || has_tensor[static_cast<size_t>(c)];
    }
    has_tensor[i] = tensors;
    shape[i] = shapes.emplace(std::move(key), static_cast<int32_t>(shapes.size())).first->second;
  }
  std::vector<ModuleId> alias_of(n, -1);
  std::unordered_map<int32_t, ModuleId> first;
  for (ModuleId m : tree.preorder()) {
    const auto i = static_cast<size_t>(m);
    if (!has_tensor[i] || m == 0) continue;
    auto [it, inserted] = first.emplace(shape[i], m);
    if (!inserted) alias_of[i] = it->second;
  }
  return alias_of;
}

Dealiased remove_aliases(const ModuleTree& tree) {
  const std::vector<ModuleId> alias_of = find_aliases(tree);
  Dealiased out;
  std::vector<ModuleId> new_id(tree.num_modules(), -1);
  for (ModuleId m : tree.preorder()) {
    const auto i = static_cast<size_t>(m);
    if (m != 0 && new_id[static_cast<size_t>(tree.module(m).parent)] < 0) continue;  // inside a removed subtree
    if (alias_of[i] >= 0) {
      out.aliases.push_back({tree.path(m), tree.path(alias_of[i])});
      continue;
    }
    new_id[i] = 0;  // marks "kept"; the real id comes below
  }
  if (out.aliases.empty()) return out;
  auto copy = std::make_unique<ModuleTree>();
  copy->copy_class_info(tree);
  for (size_t t = 0; t < tree.num_tensors(); ++t) copy->add_tensor(tree.tensor(static_cast<TensorId>(t)));
  for (ModuleId m : tree.preorder()) {
    const auto i = static_cast<size_t>(m);
    if (new_id[i] < 0) continue;
    const Module& mod = tree.module(m);
    ModuleId id = 0;
    if (m == 0) {
      copy->module(0).type_name = mod.type_name;
      copy->module(0).name = mod.name;
    } else {
      id = copy->add_module(new_id[static_cast<size_t>(mod.parent)], mod.name, mod.type_name);
    }
    new_id[i] = id;
    for (const auto& s : mod.params) copy->add_param(id, s.name, s.tensor);
    for (const auto& s : mod.buffers) copy->add_buffer(id, s.name, s.tensor);
  }
  out.tree = std::move(copy);
  return out;
}

}  // namespace fsdp_plan
