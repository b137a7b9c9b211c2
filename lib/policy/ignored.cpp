#include "policy/ignored.h"

#include "util/strings.h"

namespace fsdp_plan {
namespace {

// Calls visit(module, path) in pre-order with each module's dotted path,
// built in one reused buffer so a deep chain costs no per-module allocation.
template <typename Visit>
void for_each_path(const ModuleTree& tree, Visit&& visit) {
  struct Frame {
    ModuleId module;
    size_t path_len;  // length of the parent's path, to cut back to
  };
  std::string path;
  std::vector<Frame> stack{{0, 0}};
  while (!stack.empty()) {
    Frame f = stack.back();
    stack.pop_back();
    path.resize(f.path_len);
    const Module& m = tree.module(f.module);
    if (f.module != 0) {
      if (!path.empty()) path += '.';
      path += m.name;
    }
    visit(f.module, static_cast<const std::string&>(path));
    for (auto it = m.children.rbegin(); it != m.children.rend(); ++it) stack.push_back({*it, path.size()});
  }
}

}  // namespace

Ignored resolve_ignored(const ModuleTree& tree, const Policy& policy) {
  Ignored out;
  out.module.assign(tree.num_modules(), false);
  out.tensor.assign(tree.num_tensors(), false);
  const auto& mod_globs = policy.ignored_modules;
  const auto& param_globs = policy.ignored_params;
  std::vector<bool> mod_hit(mod_globs.size(), false), param_hit(param_globs.size(), false);
  if (mod_globs.empty() && param_globs.empty()) return out;

  std::string full;
  for_each_path(tree, [&](ModuleId id, const std::string& path) {
    const Module& m = tree.module(id);
    bool ignored = id != 0 && out.module[static_cast<size_t>(m.parent)];
    for (size_t g = 0; g < mod_globs.size(); ++g) {
      if (glob_match(mod_globs[g], path)) {
        mod_hit[g] = true;
        ignored = true;
      }
    }
    out.module[static_cast<size_t>(id)] = ignored;
    for (const auto& slot : m.params) {
      if (ignored) out.tensor[static_cast<size_t>(slot.tensor)] = true;
      if (param_globs.empty()) continue;
      full = path.empty() ? slot.name : path + "." + slot.name;
      for (size_t g = 0; g < param_globs.size(); ++g) {
        // A tied tensor is one parameter: matching any of its names ignores it.
        if (glob_match(param_globs[g], full)) {
          param_hit[g] = true;
          out.tensor[static_cast<size_t>(slot.tensor)] = true;
        }
      }
    }
  });
  for (size_t g = 0; g < mod_globs.size(); ++g)
    if (!mod_hit[g]) out.unmatched_module_globs.push_back(mod_globs[g]);
  for (size_t g = 0; g < param_globs.size(); ++g)
    if (!param_hit[g]) out.unmatched_param_globs.push_back(param_globs[g]);
  return out;
}

}  // namespace fsdp_plan
