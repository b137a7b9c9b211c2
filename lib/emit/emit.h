// Handing the plan to the training job: an Accelerate config file
// (emit/accelerate_fsdp1.cpp) or the PyTorch code that applies it (emit/torch_fsdp1.cpp);
// FSDP2 plans by their twins (emit/accelerate_fsdp2.cpp, emit/torch_fsdp2.cpp).
#pragma once

#include <stdexcept>
#include <string>

#include "plan/plan.h"

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

// The FSDP2 forms, called by the two above for plan.fsdp_version 2: the
// Accelerate config (fsdp_version: 2) whose fsdp2_prepare_model makes the
// plan's fully_shard calls, and apply_fsdp(model) making those calls.
std::string plan_to_accelerate_fsdp2(const Plan& plan);
std::string plan_to_torch_fsdp2(const Plan& plan);
// A 2-D plan (FSDP2 with tensor parallelism, emit/torch_fsdp2_tp.cpp):
// init_device_mesh, parallelize_module on mesh["tp"], then the fully_shard
// calls on the dp sub-mesh. Throws EmitError for a style torch lacks.
std::string plan_to_torch_fsdp2_tp(const Plan& plan);

}  // namespace fsdp_plan
