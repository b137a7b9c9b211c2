// --emit accelerate: the plan as an Accelerate config file. Accelerate can say
// one class list or one size threshold, one dtype for all of mixed precision,
// and modules to ignore by regex; anything else is refused with the reason.
// The config is read back the way Accelerate reads it and must give the same
// plan before it is written.
#include <set>

#include "accelerate/config.h"
#include "emit/accelerate_yaml.h"
#include "emit/emit.h"
#include "emit/emit_text.h"
#include "model/class_names.h"
#include "planner/planner.h"
#include "policy/ignored.h"

namespace fsdp_plan {
namespace {

std::string mixed_precision_key(const Policy& p) {
  if (!p.mixed_precision) return "'no'";
  const MixedPrecision& mp = *p.mixed_precision;
  if (mp.ignore_classes_given)
    refuse_accelerate("mixed_precision.ignore_classes is set; Accelerate keeps FSDP's default (_BatchNorm)");
  if (!mp.param_dtype || mp.param_dtype != mp.reduce_dtype || mp.param_dtype != mp.buffer_dtype)
    refuse_accelerate("mixed precision with param, reduce and buffer dtypes that differ (or are unset); Accelerate's "
                      "mixed_precision sets all three to one dtype");
  // set_mixed_precision passes the three dtypes only: the rest keep MixedPrecision's defaults.
  if (mp.keep_low_grads())
    refuse_accelerate("mixed_precision.keep_low_precision_grads is true; Accelerate's MixedPrecision keeps the default "
                      "(false)");
  if (mp.casts_forward_inputs(FsdpVersion::V1))
    refuse_accelerate("mixed_precision.cast_forward_inputs is true; Accelerate's MixedPrecision keeps the default (false)");
  if (!mp.casts_root_forward_inputs())
    refuse_accelerate("mixed_precision.cast_root_forward_inputs is false; Accelerate's MixedPrecision keeps the default "
                      "(true)");
  return accelerate_mixed_precision(*mp.param_dtype);
}

// Where two plans of one tree differ, or "".
std::string unit_difference(const Plan& want, const Plan& got) {
  if (want.units.size() != got.units.size() ||
      !std::equal(want.units.begin(), want.units.end(), got.units.begin(),
                  [](const Unit& a, const Unit& b) { return a.module == b.module; }))
    return "Accelerate would make the units " + units_text(got) + ", the plan has " + units_text(want);
  for (size_t i = 0; i < want.units.size(); ++i)
    if (want.units[i].mixed_precision != got.units[i].mixed_precision)
      return "mixed precision differs on unit " + want.tree->path(want.units[i].module);
  const FsdpSettings &a = want.memory.settings, &b = got.memory.settings;
  if (a.world_size != b.world_size || a.strategy != b.strategy ||
      want.memory.shard_group_size != got.memory.shard_group_size || a.use_orig_params != b.use_orig_params)
    return "the FSDP settings differ";
  return "";
}

}  // namespace

std::string plan_to_accelerate(const Plan& plan) {
  // Accelerator.maybe_context_parallel: torch's context_parallel with its default head-tail balancer.
  if (plan.context_parallel && !plan.context_parallel->settings.head_tail)
    throw EmitError("Accelerate runs context parallelism with torch's head-tail load balancer and has no setting "
                    "to turn it off: plan \"context_parallel.load_balancer\": \"headtail\" to emit an Accelerate "
                    "config");
  // accelerate/accelerator.py (1.15), FSDP2's prepare: after AC, compile_regions_fsdp2
  // (utils/other.py) compiles each block of every ModuleList of one class and every other child
  // subtree whole (embeddings, the final norm, the head); FSDP1 compiles the wrapped model.
  if (!plan.activations.compiled.empty())
    throw EmitError("Accelerate compiles at prepare either the whole model or, with dynamo_use_regional_compilation "
                    "under FSDP2, every repeated block and every other child module too (embeddings, norms, the "
                    "head), not only the plan's \"compile\" modules: use --emit torch, or plan without \"compile\"");
  if (plan.expert_parallel)
    throw EmitError("Accelerate 1.15's config has no expert parallelism (its ParallelismConfig names dp, cp and tp "
                    "only): plan without \"expert_parallel\" to emit an Accelerate config");
  if (plan.tensor_parallel)
    // accelerate/accelerator.py (1.15): Accelerator._prepare_tp builds the mesh from
    // parallelism_config but applies no plan; the model must come split by
    // transformers (from_pretrained(tp_plan=...)), and the FSDP2 branch imports
    // transformers.integrations.tensor_parallel.ReplicateParallel, gone in 5.24.
    throw EmitError("Accelerate 1.15 cannot say a 2-D plan: its config's parallelism_config_tp_size only sizes the "
                    "mesh, and Accelerator.prepare applies no tensor-parallel plan (it expects a model transformers "
                    "already split, from_pretrained(..., tp_plan=\"auto\") with the model's own plan, and skips TP "
                    "with a warning when no parameter is a DTensor); with FSDP2 it then imports transformers' "
                    "ReplicateParallel, which transformers 5.24 no longer has (ImportError); use --emit torch");
  if (plan.v2()) return plan_to_accelerate_fsdp2(plan);
  const Policy& p = plan.policy;
  const ModuleTree& tree = *plan.tree;
  if (!p.ignored_params.empty())
    refuse_accelerate("ignored parameters by glob (ignored_params); Accelerate's fsdp_ignored_modules names modules only");
  if (p.force_leaf_given || p.exclude_wrap_given)
    refuse_accelerate("force_leaf_modules / exclude_wrap_modules are set; Accelerate's size policy keeps PyTorch's defaults");
  if (p.module_classes && p.min_num_params)
    refuse_accelerate("both module classes and a size threshold; Accelerate takes one fsdp_auto_wrap_policy");
  if (p.min_num_params && *p.min_num_params == 0)
    refuse_accelerate("min_num_params 0 wraps every module in PyTorch, but Accelerate reads fsdp_min_num_params: 0 as no "
                      "auto-wrap at all");
  const FsdpSettings& s = plan.memory.settings;
  const std::string mixed_precision = mixed_precision_key(p);

  const std::vector<std::string> classes = bare_class_names(p);
  Ignored ignored = resolve_ignored(tree, p);
  std::vector<std::string> ignored_paths = top_ignored_modules(tree, ignored);
  if (!ignored_paths.empty() && ignored_paths.front().empty())
    refuse_accelerate("the root module is ignored");

  // The strategy asked for: FSDP itself falls back to NO_SHARD on one rank.
  // HYBRID_SHARD shards within a machine: one machine per shard group.
  const bool hybrid = s.strategy == ShardingStrategy::HybridShard;
  const char* strategy = strategy_name(s.strategy);
  int64_t machines = hybrid ? plan.mesh.size(MeshDim::DpReplicate) : accelerate_machines(plan);

  std::string y = accelerate_yaml_head("Accelerate " + std::string(kAccelerateVersion) +
                                           " config for the fsdp-plan plan of " + plan.model.path + " (" +
                                           std::to_string(plan.units.size()) + " FSDP units)",
                                       !plan.activations.checkpointed.empty());
  y += std::string("  fsdp_auto_wrap_policy: ") +
       (p.module_classes ? "TRANSFORMER_BASED_WRAP" : p.min_num_params ? "SIZE_BASED_WRAP" : "NO_WRAP") + "\n";
  y += "  fsdp_backward_prefetch: BACKWARD_PRE\n";
  y += "  fsdp_cpu_ram_efficient_loading: true\n";
  y += "  fsdp_forward_prefetch: false\n";
  if (!ignored_paths.empty()) {
    std::string re;
    for (const auto& path : ignored_paths) re += (re.empty() ? "" : "|") + regex_escape(path);
    y += "  fsdp_ignored_modules: '" + re + "'\n";
  }
  if (p.min_num_params) y += "  fsdp_min_num_params: " + std::to_string(*p.min_num_params) + "\n";
  y += "  fsdp_offload_params: false\n";
  // accelerate config writes the FSDP1 strategy under fsdp_reshard_after_forward,
  // but accelerate launch reads fsdp_sharding_strategy: write both.
  y += std::string("  fsdp_reshard_after_forward: ") + strategy + "\n";
  y += std::string("  fsdp_sharding_strategy: ") + strategy + "\n";
  y += "  fsdp_state_dict_type: SHARDED_STATE_DICT\n";
  y += "  fsdp_sync_module_states: true\n";
  if (p.module_classes && classes.empty()) refuse_accelerate("an empty class list");
  y += accelerate_yaml_classes(classes);
  y += std::string("  fsdp_use_orig_params: ") + (s.use_orig_params ? "true" : "false") + "\n";
  y += "  fsdp_version: 1\n";
  y += accelerate_yaml_launch(mixed_precision, machines, s.world_size);
  y += accelerate_yaml_tail();

  // Read it back as Accelerate would, on this model: the plan must come back.
  AccelerateConfig back = parse_accelerate_config(y, "(emitted config)");
  resolve_accelerate_config(back, tree);
  Policy replan = back.policy;
  replan.activation_checkpointing = accelerate_activation_checkpointing(back, tree, FsdpVersion::V1, back.warnings);
  for (const auto& w : back.warnings)
    if (w.severity == Severity::Error) refuse_accelerate(w.message);
  replan.fsdp.optimizer = s.optimizer;
  Plan again = make_plan(tree, replan, plan.model.path);
  if (std::string diff = unit_difference(plan, again); !diff.empty())
    refuse_accelerate(diff + (p.module_classes ? " (Accelerate matches exact bare class names of modules in the model)" : ""));
  if (std::string diff = checkpointing_difference(plan, again); !diff.empty()) refuse_accelerate(diff);
  return y;
}

}  // namespace fsdp_plan
