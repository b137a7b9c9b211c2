// Handing the plan to the training job: an Accelerate config file
// (accelerate_writer.cpp) or the PyTorch code that applies it (torch_writer.cpp).
#pragma once

#include <stdexcept>
#include <string>

#include "plan.h"

namespace fsdp_plan {

// The plan cannot be said in the requested form; the message says why.
struct EmitError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The Accelerate config (YAML, in the shape `accelerate config` writes) whose
// plan, read back by fsdp-plan the way Accelerate reads it, is this plan.
// Throws EmitError when no Accelerate config gives this plan.
std::string plan_to_accelerate(const Plan& plan);

// A Python module with apply_fsdp(model, ...) that builds exactly the plan's
// units with PyTorch FSDP, and checks that it did.
std::string plan_to_torch(const Plan& plan);

}  // namespace fsdp_plan
