// Module class names as TorchScript stores them, and isinstance on top of them.
//
// An archive keeps `__torch__.torch.nn.modules.linear.___torch_mangle_27.Linear`
// but not the class's bases. Demangling recovers `torch.nn.modules.linear.Linear`;
// a table generated from torch.nn and torchvision (class_table.inc) recovers the
// bases of the classes that ship there. A user's own class hierarchy cannot be
// recovered: such a class is only itself (and an nn.Module).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/module_tree.h"

namespace fsdp_plan {

// "__torch__.a.___torch_mangle_3.B" -> "a.B"
std::string demangle(std::string_view type_name);
// "a.b.C" -> "C"
std::string_view short_name(std::string_view qualified);

// The class and its known nn.Module bases, most derived first, demangled.
std::vector<std::string> class_lineage(const std::string& qualified);

// A class name as a policy writes it. A short name ("Linear", "_BatchNorm")
// matches a class of that name; a dotted one ("torch.nn.Linear") matches a
// class of that name whose module path starts with the dotted prefix, as
// Python's re-exports allow (torch.nn.Linear is torch.nn.modules.linear.Linear).
bool name_matches(std::string_view pattern, std::string_view qualified);

// Containers without forward(): FSDP can wrap them, but the unit fails at its
// first forward (FSDP1's size policy leaves them out by default, fully_shard
// refuses them). The module containers as policy patterns, for isinstance:
const std::vector<std::string>& module_container_classes();  // torch.nn.ModuleList, torch.nn.ModuleDict
// By class name: the module containers, and with `parameters` ParameterList
// and ParameterDict too (no forward either, and no children to wrap instead).
bool is_container(std::string_view qualified, bool parameters);

class ModuleTree;

// A module's class as people say it: "Linear" for any mangled Linear.
std::string bare_class(const ModuleTree& tree, int32_t module);

// The demangled classes of a tree's modules, each computed once. A traced
// model stores a distinct mangled name per module (49,541 names for 49,541
// modules), so questions asked per stored name cost a demangle per module.
class TreeClasses {
 public:
  explicit TreeClasses(const ModuleTree& tree);
  size_t size() const { return qualified_.size(); }
  int32_t of(size_t module) const { return of_[module]; }            // class id
  const std::string& qualified(int32_t c) const { return qualified_[static_cast<size_t>(c)]; }
  const std::string& short_name(int32_t c) const { return short_[static_cast<size_t>(c)]; }
  // Ids in order of first appearance (module id order).
  const std::vector<std::string>& all_qualified() const { return qualified_; }

 private:
  std::vector<int32_t> of_;
  std::vector<std::string> qualified_, short_;
};

// isinstance(module_of_class(qualified), pattern) for each pattern in a list.
// One matcher may serve many plans of one tree (fsdp-plan suggest): it keeps
// that tree's classes once computed.
class ClassMatcher {
 public:
  ClassMatcher() = default;
  // Bases as `tree` records them (ModuleTree::recorded_bases: a live module's
  // tree knows a user's own class hierarchy) come before the class table's.
  explicit ClassMatcher(const ModuleTree& tree) : bases_tree_(&tree) {}
  // True if `qualified` (demangled) or any of its bases matches any pattern.
  bool is_instance(const std::string& qualified, const std::vector<std::string>& patterns) const;
  // The classes of `tree`'s modules, kept for the last tree asked about.
  const TreeClasses& classes(const ModuleTree& tree) const;
  // The class and its bases, most derived first (class_lineage, or the tree's record).
  const std::vector<std::string>& lineage(const std::string& qualified) const;

 private:
  mutable const ModuleTree* bases_tree_ = nullptr;
  mutable std::unordered_map<std::string, std::vector<std::string>> cache_;
  mutable const ModuleTree* tree_ = nullptr;
  mutable size_t tree_modules_ = 0;
  mutable std::unique_ptr<TreeClasses> tree_classes_;
};

// isinstance(module, one of the listed classes), precomputed per module.
class ClassSet {
 public:
  ClassSet(const ModuleTree& tree, const ClassMatcher& matcher, const std::vector<std::string>& classes);
  bool contains(ModuleId m) const { return member_[static_cast<size_t>(m)]; }

 private:
  std::vector<bool> member_;
};

}  // namespace fsdp_plan
