// What FSDP will refuse, or accept and regret, said before launch. Each
// warning quotes PyTorch's own words, names the units and parameters, and
// carries a policy fix that planning again has shown to work.
#pragma once

#include <functional>

#include "plan/plan.h"

namespace fsdp_plan {

// Plans the same model under another policy, without searching fixes itself.
using Replan = std::function<Plan(const Policy&)>;

// FSDP1's flat parameter (FlatParamHandle, _init_utils): one per unit, so its
// parameters must share one floating dtype and, without use_orig_params, one
// requires_grad; scalar parameters are refused. Kinds: mixed_requires_grad,
// mixed_dtype, integer_param, scalar_param. `replan` may be null: no fixes.
void flat_param_refusals(Plan& plan, const Replan* replan);

// Either FSDP version: a root unit holding more than
// checks.warn_root_share of the parameters (root_too_large), or a model over
// kSingleUnitNumel planned as one unit (single_unit).
constexpr double kDefaultWarnRootShare = 0.5;
constexpr int64_t kSingleUnitNumel = 100'000'000;
void root_warnings(Plan& plan, const Replan* replan);

}  // namespace fsdp_plan
