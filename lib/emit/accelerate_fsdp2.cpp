// --emit accelerate for an FSDP2 plan: an fsdp_version 2 config whose
// fsdp2_prepare_model (Accelerate 1.15.0: policy bottom-up, untied input
// embedding, [norm, (embedding,) head] tail with reshard_after_forward False,
// root) makes exactly the plan's fully_shard calls. Accelerate says one class
// list or one size threshold, one bool for reshard_after_forward and one dtype
// for mixed precision; the class list is tried from the policy, then from the
// plan's groups (smallest first), and each candidate is read back the way
// Accelerate reads it and must give the plan's calls before it is written.
#include <algorithm>

#include "accelerate/config.h"
#include "emit/accelerate_yaml.h"
#include "emit/emit.h"
#include "emit/emit_text.h"
#include "model/class_names.h"
#include "model/module_tree.h"
#include "planner/planner.h"

namespace fsdp_plan {
namespace {

bool same_reshard(const Unit& a, const Unit& b) {
  return a.reshard_after_forward.value_or(ReshardAfterForward{}) == b.reshard_after_forward.value_or(ReshardAfterForward{});
}

// Where the plan Accelerate would make differs from the wanted one, or "".
std::string group_difference(const Plan& want, const Plan& got) {
  bool same = want.units.size() == got.units.size();
  for (size_t i = 0; same && i < want.units.size(); ++i)
    same = want.units[i].modules == got.units[i].modules && want.units[i].call == got.units[i].call;
  if (!same) {
    for (const Unit& u : want.units) {
      if (u.modules.size() < 2) continue;
      bool made = std::any_of(got.units.begin(), got.units.end(), [&](const Unit& g) { return g.modules == u.modules; });
      if (!made)
        return "the group " + unit_text(want, u) + " (several modules in one fully_shard call) is not one "
               "Accelerate makes (it groups only [final norm, (tied input embedding,) output embedding]); "
               "Accelerate would make " + units_text(got) + ", the plan has " + units_text(want);
    }
    return "Accelerate would make the groups " + units_text(got) + ", the plan has " + units_text(want);
  }
  for (size_t i = 0; i < want.units.size(); ++i)
    if (!same_reshard(want.units[i], got.units[i]))
      return "reshard_after_forward differs on group " + unit_text(want, want.units[i]) +
             " (Accelerate sets one fsdp_reshard_after_forward for all groups, false for its tail group)";
  const FsdpSettings &a = want.memory.settings, &b = got.memory.settings;
  if (a.world_size != b.world_size || a.strategy != b.strategy || a.cpu_offload != b.cpu_offload ||
      want.memory.shard_group_size != got.memory.shard_group_size)
    return "the FSDP settings differ";
  return "";
}

// fsdp_auto_wrap_policy and what it reads.
struct Wrap {
  std::string policy = "NO_WRAP";
  std::optional<int64_t> min_num_params;
  std::vector<std::string> classes;
};

std::string yaml_for(const Plan& plan, const Wrap& wrap, const std::string& mixed_precision, bool reshard) {
  const FsdpSettings& s = plan.memory.settings;
  std::string y = accelerate_yaml_head("Accelerate " + std::string(kAccelerateVersion) +
                                       " config (FSDP2) for the fsdp-plan plan of " + plan.model.path + " (" +
                                       std::to_string(plan.units.size()) + " fully_shard groups)",
                                       !plan.activations.checkpointed.empty());
  y += "  fsdp_auto_wrap_policy: " + wrap.policy + "\n";
  y += "  fsdp_cpu_ram_efficient_loading: true\n";
  if (wrap.min_num_params) y += "  fsdp_min_num_params: " + std::to_string(*wrap.min_num_params) + "\n";
  y += std::string("  fsdp_offload_params: ") + (s.cpu_offload ? "true" : "false") + "\n";
  y += std::string("  fsdp_reshard_after_forward: ") + (reshard ? "true" : "false") + "\n";
  y += "  fsdp_state_dict_type: SHARDED_STATE_DICT\n";
  y += accelerate_yaml_classes(wrap.classes);
  y += "  fsdp_version: 2\n";
  y += accelerate_yaml_launch(mixed_precision, accelerate_machines(plan), s.world_size);
  const ContextParallelPlan* cp = plan.context_parallel ? &*plan.context_parallel : nullptr;
  if (s.strategy == ShardingStrategy::HybridShard || cp) {
    // FSDP2 shards over dp_shard x cp (Accelerate's "dp_shard_cp"): the plan's shard group is both.
    const int64_t c = cp ? std::max<int64_t>(1, cp->degree) : 1;
    if (cp)
      y += "# context parallelism: run each step inside accelerator.maybe_context_parallel(buffers=[input_ids, "
           "labels, position_ids], buffer_seq_dims=[1, 1, 1]); it shards them along the sequence\n";
    y += "parallelism_config:\n";
    if (cp) y += std::string("  parallelism_config_cp_comm_strategy: ") + rotate_name(cp->settings.rotate) + "\n";
    y += "  parallelism_config_cp_size: " + std::to_string(c) + "\n";
    y += "  parallelism_config_dp_replicate_size: " + std::to_string(plan.memory.replicate_size) + "\n";
    y += "  parallelism_config_dp_shard_size: " + std::to_string(plan.memory.shard_group_size / c) + "\n";
    y += "  parallelism_config_tp_size: 1\n";
  }
  y += accelerate_yaml_tail();
  return y;
}

Wrap class_wrap(std::vector<std::string> classes) {
  Wrap w;
  if (!classes.empty()) w.policy = "TRANSFORMER_BASED_WRAP";
  w.classes = std::move(classes);
  return w;
}

Wrap size_wrap(int64_t n) {
  Wrap w;
  w.policy = "SIZE_BASED_WRAP";
  w.min_num_params = n;
  return w;
}

}  // namespace

std::string plan_to_accelerate_fsdp2(const Plan& plan) {
  const Policy& p = plan.policy;
  const ModuleTree& tree = *plan.tree;
  if (!p.ignored_params.empty())
    refuse_accelerate("ignored parameters by glob (ignored_params); Accelerate's fsdp_ignored_modules names modules only");
  if (!p.ignored_modules.empty())
    refuse_accelerate("ignored modules under FSDP2 (Accelerate turns fsdp_ignored_modules into ignored_params; fsdp-plan "
                      "does not write that yet)");
  if (p.module_classes && p.min_num_params)
    refuse_accelerate("both module classes and a size threshold; Accelerate takes one fsdp_auto_wrap_policy");
  for (const Unit& u : plan.units)
    if (u.reshard_after_forward && u.reshard_after_forward->kind == ReshardAfterForward::Kind::Ranks)
      refuse_accelerate("group " + unit_text(plan, u) + " has reshard_after_forward " + std::to_string(u.reshard_after_forward->ranks) +
                        " (a number of ranks); Accelerate's fsdp_reshard_after_forward is true or false");
  std::string mixed_precision = "'no'";
  if (p.mixed_precision) {
    const MixedPrecision& mp = *p.mixed_precision;
    if (!mp.param_dtype || mp.param_dtype != mp.reduce_dtype)
      refuse_accelerate("mixed precision with param and reduce dtypes that differ (or are unset); Accelerate's mixed_precision "
                        "sets both to one dtype");
    // set_mixed_precision: MixedPrecisionPolicy(param_dtype=d, reduce_dtype=d, output_dtype=d), the
    // default cast_forward_inputs. An unset output_dtype is let through: the plan does not model it.
    if (mp.output_dtype && mp.output_dtype != mp.param_dtype)
      refuse_accelerate("mixed_precision.output_dtype " + *mp.output_dtype + " differs from param_dtype " +
                        *mp.param_dtype + "; Accelerate's MixedPrecisionPolicy sets output_dtype to the param dtype");
    if (!mp.casts_forward_inputs(FsdpVersion::V2))
      refuse_accelerate("mixed_precision.cast_forward_inputs is false; Accelerate's MixedPrecisionPolicy keeps the "
                        "default (true)");
    mixed_precision = accelerate_mixed_precision(*mp.param_dtype);
  }
  const bool reshard = p.fsdp.reshard_after_forward.kind != ReshardAfterForward::Kind::False;

  // Candidate fsdp_config wrap keys: the policy's own, then class lists from
  // the plan's one-module groups (smallest first), then no auto-wrap.
  std::vector<Wrap> wraps;
  if (p.module_classes) {
    wraps.push_back(class_wrap(bare_class_names(p)));
  } else if (p.min_num_params) {
    wraps.push_back(size_wrap(*p.min_num_params));
  }
  std::vector<std::string> seen;
  std::vector<ModuleId> singles;
  for (const Unit& u : plan.units)
    if (u.modules.size() == 1 && u.modules.front() != 0) {
      singles.push_back(u.modules.front());
      std::string c = bare_class(tree, u.modules.front());
      if (std::find(seen.begin(), seen.end(), c) == seen.end()) seen.push_back(c);
    }
  if (seen.size() <= 4) {
    for (size_t k = 0; k <= seen.size(); ++k)
      for (unsigned mask = 0; mask < (1u << seen.size()); ++mask) {
        if (static_cast<size_t>(__builtin_popcount(mask)) != k) continue;
        std::vector<std::string> classes;
        for (size_t i = 0; i < seen.size(); ++i)
          if (mask & (1u << i)) classes.push_back(seen[i]);
        wraps.push_back(class_wrap(classes));
      }
  } else {
    wraps.push_back(class_wrap(seen));
  }
  if (!singles.empty()) {  // Accelerate's size rule: whole count > threshold
    std::vector<int64_t> numel = subtree_numel(tree, std::vector<bool>(tree.num_tensors(), false));
    int64_t least = numel[static_cast<size_t>(singles.front())];
    for (ModuleId m : singles) least = std::min(least, numel[static_cast<size_t>(m)]);
    if (least > 0)
      wraps.push_back(size_wrap(least - 1));
  }

  // What to say if none gives the plan: a candidate with the plan's groups but other checkpointing,
  // else the first candidate's difference, else the first refusal Accelerate would raise.
  std::string checkpointing, first_difference, first_refusal;
  for (const auto& wrap : wraps) {
    std::string y = yaml_for(plan, wrap, mixed_precision, reshard);
    AccelerateConfig back = parse_accelerate_config(y, "(emitted config)");
    resolve_accelerate_config(back, tree);
    // Before the FSDP2 calls replace the wrap classes, as the planner reads a config (policy_file.cpp).
    std::optional<ActivationCheckpointing> ac =
        accelerate_activation_checkpointing(back, tree, FsdpVersion::V2, back.warnings);
    const auto error = std::find_if(back.warnings.begin(), back.warnings.end(),
                                    [](const Warning& w) { return w.severity == Severity::Error; });
    if (error != back.warnings.end()) {
      if (first_refusal.empty()) first_refusal = error->message;
      continue;
    }
    apply_accelerate_fsdp2(back, tree);
    Policy replan = back.policy;
    replan.activation_checkpointing = ac;
    replan.fsdp.optimizer = plan.memory.settings.optimizer;
    const Plan again = make_plan(tree, replan, plan.model.path);
    std::string diff = group_difference(plan, again);
    if (diff.empty()) {
      diff = checkpointing_difference(plan, again);
      if (diff.empty()) return y;
      if (checkpointing.empty()) checkpointing = diff;
    }
    if (first_difference.empty()) first_difference = diff;
  }
  if (!checkpointing.empty()) refuse_accelerate(checkpointing);
  if (first_difference.empty()) first_difference = first_refusal;
  refuse_accelerate(first_difference.empty() ? "no class list or size threshold gives the plan's groups" : first_difference);
}

}  // namespace fsdp_plan
