#pragma once

namespace fsdp_plan {

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

}  // namespace fsdp_plan
