#include "model/class_names.h"

#include <algorithm>
#include <unordered_map>

#include "model/module_tree.h"

namespace fsdp_plan {
namespace {

struct TableRow {
  const char* name;
  const char* bases;
};

constexpr TableRow kClassTable[] = {
#include "model/class_table.inc"
};

const std::unordered_map<std::string_view, std::string_view>& class_table() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string_view, std::string_view>();
    for (const auto& row : kClassTable) t->emplace(row.name, row.bases);
    return t;
  }();
  return *table;
}

constexpr std::string_view kTorchPrefix = "__torch__.";
constexpr std::string_view kMangle = "___torch_mangle_";
constexpr std::string_view kModuleClass = "torch.nn.modules.module.Module";

}  // namespace

std::string demangle(std::string_view type_name) {
  if (type_name.substr(0, kTorchPrefix.size()) == kTorchPrefix) type_name.remove_prefix(kTorchPrefix.size());
  std::string out;
  size_t pos = 0;
  while (pos <= type_name.size()) {
    size_t dot = type_name.find('.', pos);
    if (dot == std::string_view::npos) dot = type_name.size();
    std::string_view seg = type_name.substr(pos, dot - pos);
    if (seg.substr(0, kMangle.size()) != kMangle) {
      if (!out.empty()) out += '.';
      out += seg;
    }
    pos = dot + 1;
  }
  return out;
}

std::string_view short_name(std::string_view qualified) {
  size_t dot = qualified.rfind('.');
  return dot == std::string_view::npos ? qualified : qualified.substr(dot + 1);
}

std::vector<std::string> class_lineage(const std::string& qualified) {
  std::vector<std::string> out{qualified};
  auto it = class_table().find(qualified);
  if (it != class_table().end() && !it->second.empty()) {
    std::string_view bases = it->second;
    size_t pos = 0;
    while (pos <= bases.size()) {
      size_t bar = bases.find('|', pos);
      if (bar == std::string_view::npos) bar = bases.size();
      out.emplace_back(bases.substr(pos, bar - pos));
      pos = bar + 1;
    }
  }
  // Every module is an nn.Module, whatever else is known of it.
  if (qualified != kModuleClass) out.emplace_back(kModuleClass);
  return out;
}

bool name_matches(std::string_view pattern, std::string_view qualified) {
  if (pattern == qualified) return true;
  size_t pdot = pattern.rfind('.');
  if (pdot == std::string_view::npos) return pattern == short_name(qualified);
  if (pattern.substr(pdot + 1) != short_name(qualified)) return false;
  std::string_view prefix = pattern.substr(0, pdot);
  size_t qdot = qualified.rfind('.');
  if (qdot == std::string_view::npos) return false;
  std::string_view module_path = qualified.substr(0, qdot);
  return module_path == prefix ||
         (module_path.size() > prefix.size() && module_path.substr(0, prefix.size()) == prefix &&
          module_path[prefix.size()] == '.');
}

TreeClasses::TreeClasses(const ModuleTree& tree) : of_(tree.num_modules()) {
  std::unordered_map<std::string_view, int32_t> by_stored;  // the tree's strings outlive this map
  std::unordered_map<std::string, int32_t> by_qualified;
  for (size_t m = 0; m < tree.num_modules(); ++m) {
    const std::string& stored = tree.modules()[m].type_name;
    auto it = by_stored.find(stored);
    if (it == by_stored.end()) {
      std::string q = demangle(stored);
      auto [qit, fresh] = by_qualified.try_emplace(q, static_cast<int32_t>(qualified_.size()));
      if (fresh) {
        short_.emplace_back(fsdp_plan::short_name(q));
        qualified_.push_back(std::move(q));
      }
      it = by_stored.emplace(stored, qit->second).first;
    }
    of_[m] = it->second;
  }
}

const TreeClasses& ClassMatcher::classes(const ModuleTree& tree) const {
  if (!tree_classes_ || tree_ != &tree || tree_modules_ != tree.num_modules()) {
    if (bases_tree_ != &tree) {
      bases_tree_ = &tree;  // lineages depend on the tree's recorded bases
      cache_.clear();
    }
    tree_classes_ = std::make_unique<TreeClasses>(tree);
    tree_ = &tree;
    tree_modules_ = tree.num_modules();
  }
  return *tree_classes_;
}

const std::vector<std::string>& ClassMatcher::lineage(const std::string& qualified) const {
  auto it = cache_.find(qualified);
  if (it != cache_.end()) return it->second;
  const std::vector<std::string>* recorded = bases_tree_ ? bases_tree_->recorded_bases(qualified) : nullptr;
  if (!recorded) return cache_.emplace(qualified, class_lineage(qualified)).first->second;
  // Python's MRO, as the live module's tree recorded it: isinstance() exactly.
  std::vector<std::string> out{qualified};
  out.insert(out.end(), recorded->begin(), recorded->end());
  if (std::find(out.begin(), out.end(), std::string(kModuleClass)) == out.end()) out.emplace_back(kModuleClass);
  return cache_.emplace(qualified, std::move(out)).first->second;
}

bool ClassMatcher::is_instance(const std::string& qualified, const std::vector<std::string>& patterns) const {
  if (patterns.empty()) return false;
  for (const auto& cls : lineage(qualified))
    for (const auto& p : patterns)
      if (name_matches(p, cls)) return true;
  return false;
}

const std::vector<std::string>& module_container_classes() {
  static const std::vector<std::string> classes = {"torch.nn.ModuleList", "torch.nn.ModuleDict"};
  return classes;
}

bool is_container(std::string_view qualified, bool parameters) {
  const std::string_view s = short_name(qualified);
  for (const auto& c : module_container_classes())
    if (s == short_name(c)) return true;
  return parameters && (s == "ParameterList" || s == "ParameterDict");
}

std::string bare_class(const ModuleTree& tree, int32_t module) {
  return std::string(short_name(demangle(tree.module(module).type_name)));
}

ClassSet::ClassSet(const ModuleTree& tree, const ClassMatcher& matcher,
                   const std::vector<std::string>& classes)
    : member_(tree.num_modules(), false) {
  if (classes.empty()) return;
  // Models repeat a few classes many times: decide once per class.
  const TreeClasses& tc = matcher.classes(tree);
  std::vector<bool> is(tc.size());
  for (size_t c = 0; c < tc.size(); ++c) is[c] = matcher.is_instance(tc.qualified(static_cast<int32_t>(c)), classes);
  for (size_t i = 0; i < tree.num_modules(); ++i) member_[i] = is[static_cast<size_t>(tc.of(i))];
}

}  // namespace fsdp_plan
