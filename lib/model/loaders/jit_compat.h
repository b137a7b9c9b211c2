// What differs between the LibTorch versions the jit plugin builds against
// (Debian's 1.13 and the torch 2.13 wheel's): the one place for it.
#pragma once

#include <torch/version.h>  // 2.x moved the macros to torch/headeronly/version.h, still included here

namespace fsdp_plan::jit_compat {

// TORCH_VERSION: "1.13.0" in 1.13; 2.x spells the same string.
constexpr const char* kLibTorchVersion = TORCH_VERSION;

}  // namespace fsdp_plan::jit_compat
