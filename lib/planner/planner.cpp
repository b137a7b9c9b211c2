#include "planner/planner.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "activations/activations.h"
#include "cp/attention.h"
#include "cp/comm.h"
#include "ep/activations.h"
#include "ep/comm.h"
#include "ep/experts.h"
#include "fsdp1/comm.h"
#include "fsdp1/memory.h"
#include "fsdp1/select.h"
#include "fsdp1/sharded_views.h"
#include "fsdp1/units.h"
#include "fsdp1/wrap_policy.h"
#include "fsdp2/comm.h"
#include "fsdp2/memory.h"
#include "fsdp2/units.h"
#include "fsdp2/warnings.h"
#include "model/aliases.h"
#include "plan/analysis.h"
#include "plan/grad_accumulation.h"
#include "plan/master_weights.h"
#include "plan/unused_params.h"
#include "plan/refusals.h"
#include "policy/ignored.h"
#include "time/flops.h"
#include "time/hardware.h"
#include "time/step_time.h"
#include "tp/activations.h"
#include "tp/comm.h"
#include "tp/model_plan.h"
#include "tp/placements.h"

namespace fsdp_plan {

namespace {

// Communication follows from the units and the memory model's sizes; the
// step-time estimate from the communication and the FLOPs: --flops where
// given, else a .pt2's graph (after the activations: its checkpointed
// modules recompute), else none (TorchScript).
// FSDP_PLAN_SKIP_TIME=1 (internal, for bench/time_overhead.py only) skips
// both stages, so a plan's run time can be measured with and without them;
// the outputs then lack "comm" and "time", as a plan of an older binary did.
void add_comm_and_time(Plan& plan, const FlopProfile* flops) {
  static const bool skip = [] {
    const char* v = std::getenv("FSDP_PLAN_SKIP_TIME");
    return v != nullptr && std::string(v) == "1";
  }();
  if (skip) return;
  plan.comm = plan.v2() ? fsdp2_comm(plan) : fsdp1_comm(plan);
  plan.comm.tp = tp_comm(plan);  // on the tp group, blocking (time/step_time.h)
  plan.comm.ep = ep_comm(plan);  // on the ep group, blocking too
  plan.comm.cp = cp_comm(plan);  // attention's ring on the cp group, blocking too
  std::optional<FlopProfile> from_graph;
  if (!flops && plan.tree->graph()) flops = &from_graph.emplace(plan_graph_flops(plan, *plan.tree->graph()));
  plan.time = estimate_step_time(plan, resolve_hardware(plan.policy.hardware), flops);
}

// The peak against the --hardware GPU's memory less the assumed headroom
// (plan/memory_fit.h), and against the policy's checks.max_peak_bytes
// (--max-peak-bytes replaces it: plan_command.cpp).
void add_memory_fit(Plan& plan) {
  const HardwareFigures hw = resolve_hardware(plan.policy.hardware);
  plan.fit = memory_fit(plan.memory.per_rank.peak_bytes, plan.activations.known(), hw.preset, hw.name,
                        plan.policy.hardware.preset_given, hw.memory_bytes);
  plan.fit.max_peak_bytes = plan.policy.checks.max_peak_bytes;
}

// fsdp.fp32_master_weights (plan/master_weights.h): the plan goes on with the
// cast tree, which it keeps; the note says what was cast.
void cast_master_weights(Plan& plan, const std::vector<TensorId>& cast) {
  std::shared_ptr<const ModuleTree> cast_tree = with_float32(*plan.tree, cast);
  if (!cast_tree) return;
  plan.warnings.push_back(master_weights_note(*plan.tree, cast, plan.policy));
  plan.master_weights_tree = cast_tree;
  plan.tree = cast_tree.get();
}

// With `search_fixes`, warnings try their fixes by planning again without.
Plan plan_with(const ModuleTree& loaded, const Policy& policy, const std::string& model_path,
               const ClassMatcher& shared_matcher, bool search_fixes, PlanPurpose purpose,
               const FlopProfile* flops) {
  const bool report = purpose == PlanPurpose::Report;
  // With --aliases, plan the tree Python's named_modules() walks: each module once.
  Dealiased dealiased = policy.module_aliases ? remove_aliases(loaded) : Dealiased{};
  std::shared_ptr<const ModuleTree> own(std::move(dealiased.tree));
  const ModuleTree& tree = own ? *own : loaded;
  // A dealiased tree is another tree: the shared matcher keeps the loaded one's classes.
  ClassMatcher own_matcher(tree);
  const ClassMatcher& matcher = own ? own_matcher : shared_matcher;
  Ignored ignored = resolve_ignored(tree, policy);

  Plan plan;
  plan.tree = &tree;
  plan.dealiased_tree = own;
  plan.aliases = std::move(dealiased.aliases);
  plan.policy = policy;
  plan.model.path = model_path;
  // The device mesh, once: FSDP, TP, communication and time ask it for their sizes and groups.
  plan.mesh = device_mesh(policy.fsdp, policy.tensor_parallel ? &*policy.tensor_parallel : nullptr,
                          policy.expert_parallel ? &*policy.expert_parallel : nullptr,
                          policy.context_parallel ? &*policy.context_parallel : nullptr);
  const Replan replan = [&](const Policy& p) { return plan_with(tree, p, model_path, matcher, false, purpose, flops); };
  if (plan.v2()) {
    // FSDP2: Accelerate casts before fully_shard, so every stage sees the cast tree.
    if (policy.fsdp.fp32_master_weights) cast_master_weights(plan, fsdp2_master_weight_casts(tree));
    const ModuleTree& cast = *plan.tree;
    // FSDP2: fully_shard calls, bottom-up, then the root.
    Fsdp2Calls calls = fsdp2_calls(cast, policy, matcher, ignored);
    plan.units = group_units_fsdp2(cast, calls.calls, ignored.tensor);
    analyse(plan, ignored, matcher);
    // The containers' fix replans twice: for reports only (suggest does not rank it).
    analyse_fsdp2(plan, calls, matcher, report && search_fixes ? &replan : nullptr);
    find_ungraded_params(plan);  // no gradient, no reduce-scatter, no optimizer state
    if (report) root_warnings(plan, search_fixes ? &replan : nullptr);  // the root group is never resharded either
    // parallelize_module runs before fully_shard: FSDP2 shards each TP-local tensor.
    if (policy.tensor_parallel) {
      if (policy.tensor_parallel->from_model) resolve_model_tp_plan(*plan.policy.tensor_parallel, cast, model_path);
      plan.tensor_parallel =
          plan_tensor_parallel(cast, *plan.policy.tensor_parallel, plan.mesh, plan.warnings);
    }
    // The routed experts split over ep before fully_shard (torchtitan's parallelize, then apply_fsdp),
    // their tokens one rank's (with cp, its share of the sequence).
    if (policy.expert_parallel) {
      const auto rank_dims = cast.graph() ? rank_walk_dims(plan, *cast.graph()) : plan.policy.activations.dims;
      plan.expert_parallel = plan_expert_parallel(cast, plan.policy, rank_dims, plan.mesh, matcher, model_path);
    }
    // Per tp rank, or with rank 0's experts (the two are not planned together: Policy::combination_error).
    RankLocal local;
    if (plan.expert_parallel)
      local.tensors = ep_local_tensors(plan);
    else
      local.graph = tp_local_graph(plan);
    plan.activations = plan_activations(plan, matcher, &plan.warnings, local);
    // The sequence split over cp (the walk ran at one rank's share): the attention calls' ring.
    if (policy.context_parallel) {
      plan.context_parallel = plan_context_parallel(plan);
      if (auto w = load_balance_warning(*plan.context_parallel)) plan.warnings.push_back(*w);
    }
    plan.memory = estimate_memory_fsdp2(plan, memory_settings(policy), report);
    add_gradient_accumulation(plan);
    add_comm_and_time(plan, flops);
    add_memory_fit(plan);
    return plan;
  }
  std::vector<bool> wrapped(tree.num_modules(), false);
  std::string ranks_differ;
  if (auto wrap_policy = make_wrap_policy(policy, tree, matcher)) {
    // FSDP1 with use_orig_params shrinks flattened tied weights as it goes, by rank.
    std::optional<ShardedViews> views;
    if (policy.fsdp.use_orig_params) views.emplace(tree, ignored, policy.fsdp);
    wrapped = select_wrapped(tree, *wrap_policy, ignored, views ? &*views : nullptr);
    if (views) ranks_differ = rank_disagreement(tree, ignored, policy.fsdp, *wrap_policy, wrapped, *views);
  }
  plan.units = group_units(tree, wrapped, ignored.tensor, policy.fsdp.use_orig_params);
  // FSDP1: Accelerate casts each wrapped unit's flat parameter; the units stay as built.
  if (policy.fsdp.fp32_master_weights) cast_master_weights(plan, fsdp1_master_weight_casts(tree, plan.units));
  analyse(plan, ignored, matcher);
  if (!ranks_differ.empty()) {
    plan.warnings.push_back(make_warning(
        "shared_param_across_units",
        "ranks would not build the same units: " + ranks_differ +
                " (with use_orig_params=True each rank counts a tied weight an earlier unit flattened at its own "
                "shard of it, and this policy decides by size); their collectives would not match and the job "
                "hangs or fails; fix: let one unit hold every use of the tied weight, or wrap by module_classes"));
  }
  flat_param_refusals(plan, search_fixes ? &replan : nullptr);
  if (report) root_warnings(plan, search_fixes ? &replan : nullptr);
  plan.activations = plan_activations(plan, matcher, &plan.warnings);
  plan.memory = estimate_memory(plan, memory_settings(policy), report);
  add_gradient_accumulation(plan);
  add_comm_and_time(plan, flops);
  add_memory_fit(plan);
  return plan;
}

}  // namespace

Plan make_plan(const ModuleTree& tree, const Policy& policy, const std::string& model_path) {
  ClassMatcher matcher(tree);
  return plan_with(tree, policy, model_path, matcher, true, PlanPurpose::Report, nullptr);
}

Plan make_plan(const ModuleTree& tree, const Policy& policy, const std::string& model_path,
               const ClassMatcher& matcher, PlanPurpose purpose, const FlopProfile* flops) {
  return plan_with(tree, policy, model_path, matcher, true, purpose, flops);
}

}  // namespace fsdp_plan
