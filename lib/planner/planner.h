// The pipeline from a module tree and a policy to a plan:
// ignored state -> wrap policy -> wrapped modules -> units -> analysis.
#pragma once

#include <string>

#include "model/class_names.h"
#include "plan/flops.h"
#include "plan/plan.h"

namespace fsdp_plan {

// What a plan is made for. A report (text, JSON, HTML, --emit) gets all of
// it. Ranking (suggest plans dozens of candidates on one tree) reads only the
// units, the refusals with their fixes and the memory peak: it gets no root
// warnings (never errors, and their fix search plans again) and no memory timeline.
enum class PlanPurpose { Report, Ranking };

// `tree` must outlive the plan. `model_path` is only reported.
Plan make_plan(const ModuleTree& tree, const Policy& policy, const std::string& model_path);
// The same, sharing `matcher` (and the tree's classes it keeps) across the
// many plans of one tree, as fsdp-plan suggest makes.
// `flops`, when known (--flops, the .pt2 graph), gives the step-time
// estimate its compute; it need not outlive the call.
Plan make_plan(const ModuleTree& tree, const Policy& policy, const std::string& model_path,
               const ClassMatcher& matcher, PlanPurpose purpose = PlanPurpose::Report,
               const FlopProfile* flops = nullptr);
// The plan points into the tree: planning a temporary would leave it dangling.
Plan make_plan(ModuleTree&& tree, const Policy& policy, const std::string& model_path) = delete;

}  // namespace fsdp_plan
