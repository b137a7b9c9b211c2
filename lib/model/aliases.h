// Module aliases: one module object registered under two names (T5's
// `encoder.embed_tokens = self.shared`). Python's named_modules() lists it
// once, under its first name, so FSDP never visits the second; TorchScript
// saves each name as its own module sharing the same tensors. This stage
// finds those second names and removes them before planning.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/module_tree.h"

namespace fsdp_plan {

struct Alias {
  std::string path;      // the later name, not visited
  std::string alias_of;  // the earlier name (pre-order), through which FSDP reaches its tensors
};

// For each module, the earlier module (in pre-order) it is an alias of, or -1.
// An alias has the same class as the earlier module, the same parameters and
// buffers (same names, same TensorId) and children that are, recursively, its
// aliases. A subtree with no tensor at all is never an alias: nothing tells a
// shared module from two parameterless ones (two Dropouts).
std::vector<ModuleId> find_aliases(const ModuleTree& tree);

// The tree without the aliases' subtrees (TensorIds unchanged), and the
// aliases removed, outermost only, in pre-order.
struct Dealiased {
  std::unique_ptr<ModuleTree> tree;  // null when there is no alias
  std::vector<Alias> aliases;
};
Dealiased remove_aliases(const ModuleTree& tree);

}  // namespace fsdp_plan
