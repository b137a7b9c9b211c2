#include "util/warnings.h"

#include <stdexcept>

namespace fsdp_plan {

const char* severity_name(Severity s) {
  switch (s) {
    case Severity::Error: return "error";
    case Severity::Warning: return "warning";
    case Severity::Info: return "info";
  }
  return "warning";
}

const std::vector<WarningKind>& warning_table() {
  using S = Severity;
  using W = WarningScope;
  static const std::vector<WarningKind> table = {
      // Either version: plan/analysis.cpp, the planner (fsdp1/ for the tied-weight rank check).
      {"nested_wrap", S::Error, std::nullopt, W::Any},
      {"mixed_precision_override", S::Warning, std::nullopt, W::Fsdp1},
      {"shared_param_across_units", S::Warning, std::nullopt, W::Fsdp1},
      {"empty_unit", S::Warning, S::Info, W::Any},
      {"unmatched_class", S::Warning, std::nullopt, W::Any},
      {"unmatched_ignore", S::Warning, std::nullopt, W::Any},
      {"ignored_root", S::Warning, std::nullopt, W::Any},
      {"unrecorded_class", S::Warning, std::nullopt, W::Any},
      {"inferred_class", S::Info, std::nullopt, W::Any},
      {"fp32_master_weights", S::Info, std::nullopt, W::Any},  // plan/master_weights.cpp
      {"mixed_precision_noop", S::Warning, std::nullopt, W::Any},
      {"not_modelled", S::Info, std::nullopt, W::Any},  // plan/analysis.cpp, accelerate/config.cpp
      // Read from an Accelerate config (accelerate/).
      {"accelerate_config", S::Info, std::nullopt, W::Accelerate},
      {"accelerate_config_key", S::Warning, std::nullopt, W::Accelerate},
      {"accelerate_class_missing", S::Error, std::nullopt, W::Accelerate},
      {"accelerate_ac_refused", S::Error, std::nullopt, W::Accelerate},
      {"accelerate_tp_refused", S::Error, std::nullopt, W::Accelerate},
      // FSDP1's flat parameter (fsdp1/warnings.cpp), and the root (plan/root_warnings.cpp).
      {"mixed_requires_grad", S::Error, S::Warning, W::Fsdp1},
      {"mixed_dtype", S::Error, std::nullopt, W::Fsdp1},
      {"integer_param", S::Error, std::nullopt, W::Fsdp1},
      {"scalar_param", S::Error, std::nullopt, W::Fsdp1},
      {"root_too_large", S::Warning, std::nullopt, W::Any},
      {"single_unit", S::Warning, std::nullopt, W::Any},
      // FSDP2 (fsdp2/warnings.cpp).
      {"unmatched_group", S::Error, std::nullopt, W::Fsdp2},
      {"fsdp2_applied_twice", S::Error, std::nullopt, W::Fsdp2},
      {"fsdp2_container", S::Error, S::Warning, W::Fsdp2},  // a warning on a class a .pt2 only infers
      {"fsdp2_scalar_param", S::Error, std::nullopt, W::Fsdp2},
      {"fsdp2_mixed_dtype", S::Error, std::nullopt, W::Fsdp2},
      {"fsdp2_frozen_dtype", S::Warning, std::nullopt, W::Fsdp2},
      {"fsdp2_shared_param", S::Error, std::nullopt, W::Fsdp2},
      {"fsdp2_reshard_ranks", S::Error, std::nullopt, W::Fsdp2},
      {"fsdp2_not_called", S::Warning, std::nullopt, W::Fsdp2},  // a .pt2 module whose forward never ran
      {"fsdp2_unused_param", S::Warning, std::nullopt, W::Fsdp2},  // plan/unused_params.cpp
      // Tensor parallelism on the mesh's tp dimension (tp/placements.cpp).
      {"tp_unmatched_pattern", S::Error, S::Warning, W::Fsdp2},  // a warning in a model's own plan
      {"tp_style_class", S::Error, std::nullopt, W::Fsdp2},
      {"tp_applied_twice", S::Error, std::nullopt, W::Fsdp2},
      {"tp_uneven_split", S::Error, std::nullopt, W::Fsdp2},
      {"tp_sequence_rotary", S::Error, std::nullopt, W::Fsdp2},
      // Context parallelism (cp/attention.cpp).
      {"cp_load_balance_dropped", S::Warning, std::nullopt, W::Fsdp2},
      // Activations from the .pt2 graph (activations/walk.cpp).
      {"activation_op_unknown", S::Warning, std::nullopt, W::Any},
      {"unmatched_checkpoint", S::Warning, std::nullopt, W::Any},  // activation_checkpointing.modules
  };
  return table;
}

const WarningKind* find_warning_kind(std::string_view kind) {
  for (const WarningKind& k : warning_table())
    if (kind == k.kind) return &k;
  return nullptr;
}

std::vector<std::string> warning_kinds() {
  std::vector<std::string> out;
  for (const WarningKind& k : warning_table()) out.emplace_back(k.kind);
  return out;
}

Warning make_warning(std::string_view kind, std::string message) {
  const WarningKind* k = find_warning_kind(kind);
  if (!k) throw std::logic_error("warning kind '" + std::string(kind) + "' is not in the warning table");
  return make_warning(kind, k->severity, std::move(message));
}

Warning make_warning(std::string_view kind, Severity severity, std::string message) {
  const WarningKind* k = find_warning_kind(kind);
  if (!k || (severity != k->severity && severity != k->also))
    throw std::logic_error("warning kind '" + std::string(kind) + "' is not raised as " + severity_name(severity) +
                           " in the warning table");
  Warning w;
  w.kind = k->kind;
  w.severity = severity;
  w.message = std::move(message);
  return w;
}

}  // namespace fsdp_plan
