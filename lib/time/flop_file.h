// --flops FILE: a training step's FLOPs per module, counted elsewhere (by
// torch.utils.flop_counter.FlopCounterMode, say, or tests/timing/flop_oracle.py,
// whose reference JSON is such a file). For a model whose file has no op
// graph (TorchScript), this is how the step-time estimate gets its compute.
//
//   {"modules": {"": {"forward": F, "backward": B},            (the whole step: required)
//                "model.layers.0": {"forward": F, "backward": B, "recompute": R}, ...},
//    "config": {"batch": 1, "seq": 4096}}                       (optional, reported)
//
// Each module's figures include its submodules' (FlopCounterMode's
// per-module counts); "recompute" (optional) is activation checkpointing's
// forward again in backward, when "backward" leaves it out. Other keys are ignored.
#pragma once

#include <string>

#include "model/module_tree.h"
#include "plan/flops.h"

namespace fsdp_plan {

// Throws InputError naming `file` for a malformed file or a module path the tree does not have.
FlopProfile parse_flop_file(const std::string& text, const std::string& file, const ModuleTree& tree);
FlopProfile load_flop_file(const std::string& file, const ModuleTree& tree);

}  // namespace fsdp_plan
