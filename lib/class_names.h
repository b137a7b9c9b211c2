// Module class names as TorchScript stores them, and isinstance on top of them.
//
// An archive keeps `__torch__.torch.nn.modules.linear.___torch_mangle_27.Linear`
// but not the class's bases. Demangling recovers `torch.nn.modules.linear.Linear`;
// a table generated from torch.nn and torchvision (class_table.inc) recovers the
// bases of the classes that ship there. A user's own class hierarchy cannot be
// recovered: such a class is only itself (and an nn.Module).
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

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

// isinstance(module_of_class(qualified), pattern) for each pattern in a list.
class ClassMatcher {
 public:
  // True if `qualified` (demangled) or any of its bases matches any pattern.
  bool is_instance(const std::string& qualified, const std::vector<std::string>& patterns) const;

 private:
  const std::vector<std::string>& lineage(const std::string& qualified) const;
  mutable std::unordered_map<std::string, std::vector<std::string>> cache_;
};

}  // namespace fsdp_plan
