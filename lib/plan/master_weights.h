// fsdp.fp32_master_weights: the parameters Accelerate casts to float32 before
// FSDP shards them when mixed_precision is bf16, fp16 or fp8, so that the
// sharded parameters, their gradients and the optimizer state are float32
// while MixedPrecision's param_dtype is what the forward, the all-gathers and
// (by default) the reductions use.
//  - FSDP2 (accelerate/utils/fsdp_utils.py: fsdp2_prepare_model, "Upcast to
//    fp32 master weights"), before fully_shard: every parameter with
//    requires_grad whose dtype is not float32; frozen parameters keep theirs.
//  - FSDP1 (accelerate/accelerator.py: prepare_model, after wrapping): each
//    unit's FlatParameter that requires grad (with use_orig_params, when any
//    of its parameters does: torch's _validate_tensors_to_flatten) and is not
//    float32, whole: its frozen parameters too. FSDP1's _uses_param_mixed_precision
//    compares against the updated _orig_param_dtype, so param_dtype applies.
#pragma once

#include <memory>
#include <vector>

#include "model/module_tree.h"
#include "plan/plan.h"
#include "util/warnings.h"

namespace fsdp_plan {

// FSDP2: the parameters cast, in tree order.
std::vector<TensorId> fsdp2_master_weight_casts(const ModuleTree& tree);
// FSDP1: the parameters of `units` cast; a unit whose parameters mix dtypes
// is left as it is (FSDP refuses it before Accelerate casts anything).
std::vector<TensorId> fsdp1_master_weight_casts(const ModuleTree& tree, const std::vector<Unit>& units);
// A copy of `tree` with `cast` in float32 (the graph shared), or nullptr when `cast` is empty.
std::shared_ptr<const ModuleTree> with_float32(const ModuleTree& tree, const std::vector<TensorId>& cast);
// The info note that says what was cast and what it costs, read from the tree before the cast.
Warning master_weights_note(const ModuleTree& before, const std::vector<TensorId>& cast, const Policy& policy);

}  // namespace fsdp_plan
