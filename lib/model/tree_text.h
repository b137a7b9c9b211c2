// The module tree for people (`fsdp-plan --dump-tree -f text`): one line per
// module, indented by depth, with its class and its tensors.
#pragma once

#include <string>

#include "model/module_tree.h"

namespace fsdp_plan {

std::string tree_to_text(const ModuleTree& tree);

}  // namespace fsdp_plan
