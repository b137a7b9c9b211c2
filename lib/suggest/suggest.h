// `fsdp-plan suggest`: try the wrapping policies a model admits, plan each in
// process, and rank those FSDP would accept by how they fit a memory budget.
// The base policy's settings (mixed precision, strategy, ignored parameters,
// world size) stay fixed; only what is wrapped varies.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/module_tree.h"
#include "plan/flops.h"
#include "plan/plan.h"
#include "policy/policy.h"

namespace fsdp_plan {

struct SuggestOptions {
  int64_t budget_bytes = 0;      // per rank
  int64_t activation_bytes = 0;  // allowance added to the memory model's peak
  size_t max_thresholds = 64;    // size-policy thresholds tried at most
  int64_t gpus_per_node = 8;     // world sizes past one node are advised in whole nodes
  // FLOPs per module (--flops): each candidate's step-time estimate gets its
  // compute, and the ranking its step time. Not owned; may be null.
  const FlopProfile* flops = nullptr;
  // When nothing fits, the single settings that would make a candidate fit
  // (Suggestion::advice). --maximize's probes skip it.
  bool advice = true;
  // --pin-wrapping: the base policy's wrapping as given, the one candidate
  // (no classes, sizes, groups, tp degrees, checkpointing or fixes tried).
  bool pin_wrapping = false;
};

// One policy tried, and what its plan says.
struct Candidate {
  std::string label;  // "module_classes [Block]", "min_num_params 1.2M", ...
  std::string origin; // "class", "class pair", "size", "base", "groups" (FSDP2), "fix"
  Policy policy;
  int fixes = 0;      // refusal fixes applied to reach this policy (origin "fix")

  // Filled by evaluation.
  std::string dropped;  // why it is out ("" if it is ranked): an error warning, a split tied weight
  int64_t units = 0;
  std::string largest_unit_path;
  int64_t largest_unit_numel = 0;
  double root_share = 0;      // root unit's share of the sharded parameters
  int64_t peak_bytes = 0;     // memory model, per rank
  int64_t needed_bytes = 0;   // peak + activation allowance
  bool fits = false;
  std::string peak_phase;
  int64_t regathered = 0;     // FSDP2: groups all-gathered again in backward (fewer is better at equal peak)
  // The step-time ESTIMATE of the plan (time/step_time.h): with FLOPs (--flops)
  // the step; without, the communication the overlap rules leave exposed when
  // compute hides what it can (docs/time-model.md section 6). What it ranks by.
  bool step_known = false;
  double step_s = 0;
  double exposed_comm_s = 0;
  double comm_s = 0;          // every collective's time, hidden or not
  bool time_known() const { return plan && plan->time.computed; }
  bool coarse = false;        // a single unit, or a root holding most parameters: behind every finer plan that fits
  // Every instance of the model's block class (its own class with the most
  // instances and parameters, suggest_candidates' first) is a unit, and no
  // unit lies inside one: the granularity Accelerate's TRANSFORMER_BASED_WRAP
  // and torchtitan wrap. Ranks ahead of finer plans (docs/time-model.md 6).
  bool per_block = false;
  // Activation checkpointing on the block class, added by suggest to a
  // per-block candidate when the graph sizes activations: it trades a
  // recompute in backward for memory, so it ranks behind the same plan without
  // it whenever both fit.
  bool checkpointed = false;
  // Of those, checkpointed selectively with torchtitan's policy (issue 42):
  // the matmul and attention outputs saved, so it recomputes less than full
  // checkpointing and ranks ahead of it when both fit.
  bool selective = false;
  // Its blocks compiled (policy "compile", issue 42), added by suggest beside
  // the checkpointed variants: the partitioner's smaller saves and the same
  // step estimate (compiled kernels' speed is not modelled), so it ranks
  // behind the same plan uncompiled when both fit, ahead of checkpointing.
  bool compiled = false;
  // The tensor- and context-parallel degrees (1: none). Candidates vary them
  // when the base policy has a tensor_parallel or context_parallel section
  // (suggest_candidates).
  int64_t tp = 1;
  int64_t cp = 1;
  int64_t ep = 1;  // the expert-parallel degree, varied the same way (expert_parallel)
  // The plan, kept for ranked candidates: advice re-estimates memory on it.
  // A ranking plan (PlanPurpose::Ranking): for a report, plan the policy again.
  std::shared_ptr<const Plan> plan;
};

// The time a candidate ranks by: its step estimate with FLOPs, its exposed
// communication without, times its tp and cp degrees. Every rank runs the
// export's micro-batch, so a step at tp t trains world / t of them (the tp
// group shares one; a cp group shares one sequence the same way): the same
// samples take t x c times the steps a plain plan's step trains, and plans of
// different degrees are compared per those samples.
double rank_seconds(const Candidate& c);

// A single setting that, changed on a candidate, would make it fit.
struct FitAdvice {
  std::string setting;  // "world_size", "mixed_precision", "optimizer"
  std::string value;    // "16", "bfloat16", "sgd", ...
  int64_t needed_bytes = 0;
  std::string policy_change;  // how to say it in the policy, e.g. "fsdp.world_size: 16"
  std::string candidate;      // the candidate's label
};

struct Suggestion {
  std::vector<Candidate> ranked;   // accepted candidates, best first
  std::vector<Candidate> dropped;  // in generation order
  size_t tried = 0;
  size_t duplicates = 0;           // same units as an earlier candidate: planned, not listed
  std::vector<FitAdvice> advice;   // when nothing fits: what would
};

// The candidate policies for `tree`, in a fixed order (no duplicates).
std::vector<Candidate> suggest_candidates(const ModuleTree& tree, const Policy& base, const SuggestOptions& opt);

// Plans every candidate and ranks them: fits the budget; among those that
// fit, plans finer than one unit (or a root-dominated one) first, then the
// lowest estimated step time (exposed communication without FLOPs), then
// fewer units, then lower peak, then fewer FSDP2 groups gathered again in
// backward, then smaller root share, then label; among those that do not
// fit, the lowest need first. A per-block candidate of a graph with known
// activations is also tried with its blocks checkpointed, fully and selectively
// (torchtitan's policy); among plans that fit, one without checkpointing ranks
// ahead of one with, and a selective one ahead of a full one. The memory model is the base policy's
// FSDP version's (fsdp.fsdp_version).
Suggestion suggest(const ModuleTree& tree, const Policy& base, const SuggestOptions& opt);

}  // namespace fsdp_plan
