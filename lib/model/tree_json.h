// The module tree as JSON, for `fsdp-plan --dump-tree` and for comparing
// loaders. Tensor ids are renumbered in pre-order of first use, so two
// loaders that agree on the model give byte-identical dumps.
#pragma once

#include <nlohmann/json.hpp>

#include "model/module_tree.h"

namespace fsdp_plan {

nlohmann::ordered_json tree_to_json(const ModuleTree& tree);

}  // namespace fsdp_plan
