#include "model/module_tree.h"

#include <algorithm>
#include <unordered_map>
#include <utility>

namespace fsdp_plan {

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

ModuleTree::ModuleTree() { modules_.emplace_back(); }

ModuleId ModuleTree::add_module(ModuleId parent, std::string name, std::string type_name) {
  const auto id = static_cast<ModuleId>(modules_.size());
  Module m;
  m.name = std::move(name);
  m.type_name = std::move(type_name);
  m.parent = parent;
  modules_.push_back(std::move(m));
  module(parent).children.push_back(id);
  return id;
}

void ModuleTree::reserve_tensors(size_t n) {
  tensors_.reserve(n);
  sizes_.reserve(n);
}

TensorId ModuleTree::add_tensor(TensorInfo info) {
  sizes_.push_back({info.numel(), info.shape.empty() ? 1 : info.shape[0], false});
  tensors_.push_back(std::move(info));
  return static_cast<TensorId>(tensors_.size() - 1);
}

void ModuleTree::add_param(ModuleId m, std::string name, TensorId t) {
  module(m).params.push_back({std::move(name), t});
  sizes_[static_cast<size_t>(t)].param = true;
}

void ModuleTree::add_buffer(ModuleId m, std::string name, TensorId t) {
  module(m).buffers.push_back({std::move(name), t});
}

const std::vector<std::string>* ModuleTree::recorded_bases(const std::string& type_name) const {
  auto it = bases_.find(type_name);
  return it == bases_.end() ? nullptr : &it->second;
}

void ModuleTree::set_bases(const std::string& type_name, std::vector<std::string> bases) {
  bases_[type_name] = std::move(bases);
}

void ModuleTree::copy_class_info(const ModuleTree& from) {
  record_ = from.record_;
  bases_ = from.bases_;
}

std::string ModuleTree::path(ModuleId m) const {
  std::vector<const std::string*> parts;
  for (ModuleId cur = m; cur > 0; cur = module(cur).parent) parts.push_back(&module(cur).name);
  std::string out;
  for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
    if (!out.empty()) out += '.';
    out += **it;
  }
  return out;
}

std::vector<std::string> ModuleTree::paths() const {
  std::vector<std::string> out(modules_.size());
  for (size_t m = 1; m < modules_.size(); ++m) {
    const std::string& parent = out[static_cast<size_t>(modules_[m].parent)];
    out[m] = parent.empty() ? modules_[m].name : parent + "." + modules_[m].name;
  }
  return out;
}

std::string ModuleTree::qualify(ModuleId m, const std::string& local) const {
  std::string p = path(m);
  return p.empty() ? local : p + "." + local;
}

int ModuleTree::depth(ModuleId m) const {
  int d = 0;
  for (ModuleId cur = m; cur > 0; cur = module(cur).parent) ++d;
  return d;
}

std::vector<ModuleId> ModuleTree::preorder(ModuleId from) const {
  std::vector<ModuleId> order;
  std::vector<ModuleId> stack{from};
  while (!stack.empty()) {
    ModuleId m = stack.back();
    stack.pop_back();
    order.push_back(m);
    const auto& ch = module(m).children;
    for (auto it = ch.rbegin(); it != ch.rend(); ++it) stack.push_back(*it);
  }
  return order;
}

std::vector<ModuleId> ModuleTree::postorder(ModuleId from) const {
  std::vector<ModuleId> order;
  std::vector<std::pair<ModuleId, size_t>> stack{{from, 0}};  // module, next child
  while (!stack.empty()) {
    auto& [m, child] = stack.back();
    const auto& ch = module(m).children;
    if (child < ch.size()) {
      const ModuleId c = ch[child++];
      stack.push_back({c, 0});
      continue;
    }
    order.push_back(m);
    stack.pop_back();
  }
  return order;
}

std::vector<int64_t> subtree_numel(const ModuleTree& tree, const std::vector<bool>& ignored_tensor) {
  const size_t n = tree.num_modules();
  // How many slots hold each tensor: most hold one, tied weights more.
  std::vector<int32_t> uses(tree.num_tensors(), 0);
  for (const auto& m : tree.modules())
    for (const auto& s : m.params) ++uses[static_cast<size_t>(s.tensor)];

  // Tensors used once add to every ancestor: a bottom-up sum does it.
  std::vector<int64_t> own(n, 0);
  for (size_t i = 0; i < n; ++i)
    for (const auto& s : tree.modules()[i].params)
      if (!ignored_tensor[static_cast<size_t>(s.tensor)] && uses[static_cast<size_t>(s.tensor)] == 1)
        own[i] += tree.numel(s.tensor);
  std::vector<int64_t> total = own;
  for (size_t i = n; i-- > 1;) total[static_cast<size_t>(tree.modules()[i].parent)] += total[i];

  // A tied tensor counts once in each module above any of its uses: walk up
  // from each use, stopping where an earlier walk for this tensor passed.
  std::unordered_map<TensorId, std::vector<ModuleId>> tied_uses;
  for (size_t i = 0; i < n; ++i)
    for (const auto& s : tree.modules()[i].params)
      if (!ignored_tensor[static_cast<size_t>(s.tensor)] && uses[static_cast<size_t>(s.tensor)] > 1)
        tied_uses[s.tensor].push_back(static_cast<ModuleId>(i));
  std::vector<TensorId> marked_by(n, -1);
  for (const auto& [t, mods] : tied_uses) {
    const int64_t numel = tree.numel(t);
    for (ModuleId m : mods) {
      for (ModuleId cur = m; cur >= 0 && marked_by[static_cast<size_t>(cur)] != t; cur = tree.module(cur).parent) {
        marked_by[static_cast<size_t>(cur)] = t;
        total[static_cast<size_t>(cur)] += numel;
      }
    }
  }
  return total;
}

}  // namespace fsdp_plan
