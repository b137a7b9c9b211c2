// `suggest` on models FSDP refuses as they are (LoRA's frozen weights in a
// trainable unit, a tied head): a refused candidate's policy with what the
// refusal checks know to fix, to try as a candidate of its own.
#pragma once

#include <optional>
#include <string>

#include "plan/plan.h"

namespace fsdp_plan {

struct FixedPolicy {
  Policy policy;
  std::string what;  // "tied weights in one unit", "frozen parameters in units of their own", ...
};

// The plan's policy with every fix it can take at once: the fix fragments of
// its error warnings (flat_param_refusals: mixed_requires_grad, mixed_dtype,
// integer_param, scalar_param), and each tied weight split across units kept
// in one: FSDP2 one fully_shard call for all its users (torchtitan's
// [tok_embeddings, norm, lm_head]); FSDP1 the units below the users' lowest
// common unit not wrapped (their classes out of module_classes, or in
// exclude_wrap_modules for a size policy). nullopt when there is nothing to fix.
std::optional<FixedPolicy> fix_refusals(const Plan& plan);

}  // namespace fsdp_plan
