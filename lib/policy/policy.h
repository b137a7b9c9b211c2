// The auto-wrap policy as the user writes it in JSON, after validation and
// FSDP's defaults. policies/policy.schema.json documents the format.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "policy/budgets.h"
#include "policy/settings.h"
#include "policy/context_parallel.h"
#include "policy/expert_parallel.h"
#include "policy/tensor_parallel.h"

namespace fsdp_plan {

struct MixedPrecision {
  std::optional<std::string> param_dtype, reduce_dtype, buffer_dtype;
  std::optional<std::string> output_dtype;  // FSDP2's MixedPrecisionPolicy only
  // nullopt: not given, so PyTorch's default for the FSDP version (the accessors below).
  std::optional<bool> keep_low_precision_grads;  // FSDP1 only; default False
  std::optional<bool> cast_forward_inputs;       // FSDP1 default False, FSDP2 default True
  std::optional<bool> cast_root_forward_inputs;  // FSDP1 only; default True
  // Modules of these classes become their own unit and run in full precision.
  std::vector<std::string> ignore_classes{"torch.nn.modules.batchnorm._BatchNorm"};
  bool ignore_classes_given = false;

  bool keep_low_grads() const { return keep_low_precision_grads.value_or(false); }
  bool casts_forward_inputs(FsdpVersion v) const { return cast_forward_inputs.value_or(v == FsdpVersion::V2); }
  bool casts_root_forward_inputs() const { return cast_root_forward_inputs.value_or(true); }
  // The first field given that the FSDP version's class lacks, or "".
  std::string field_not_in(FsdpVersion version) const;
};

// FSDP2: one fully_shard([modules...]) call the user names ("groups").
struct Fsdp2Group {
  std::vector<std::string> modules;  // module paths, exact
  std::optional<ReshardAfterForward> reshard_after_forward;  // nullopt: fsdp.reshard_after_forward
};

// Activation checkpointing (torch's checkpoint_wrapper, non-reentrant, as
// apply_activation_checkpointing and Accelerate apply it): each module of
// these classes (isinstance, as module_classes) or at these paths keeps only
// its inputs through the forward and runs again in the backward. A module
// inside another checkpointed one adds nothing the outer one does not cover.
// mode "selective" (issue 42): per-op selective checkpointing in eager mode,
// torch/utils/checkpoint.py create_selective_checkpoint_contexts as the
// context_fn: ops the policy saves keep their outputs until the module's
// backward, the rest are recomputed there (activations/selective.h).
enum class CheckpointMode : uint8_t { Full, Selective };
struct ActivationCheckpointing {
  std::vector<std::string> module_classes;
  std::vector<std::string> modules;  // exact module paths ("" is the whole model)
  CheckpointMode mode = CheckpointMode::Full;
  // Selective only. save_ops "torchtitan" (torchtitan's SelectiveAC policy:
  // its save list, every second mm recomputed), or a list of ATen overloads
  // (MUST_SAVE for these, PREFER_RECOMPUTE for the rest, as a list given to
  // create_selective_checkpoint_contexts).
  bool torchtitan_policy = true;
  std::vector<std::string> save_ops;
  // torchtitan's force_recompute_mm_shapes_by_fqns: a Linear whose path
  // contains one of these; every mm of its weight's shape is recomputed.
  std::vector<std::string> recompute_mm_fqns;
  bool recompute_mm_fqns_given = false;

  bool selective() const { return mode == CheckpointMode::Selective; }
};

// Compiled blocks (issue 42): modules of these classes run as torch.compile
// compiles them (`module.compile()`, after activation checkpointing's wrap and
// before fully_shard, as torchtitan's parallelize does), FSDP's hooks outside
// the compiled code. What each call saves is what AOTAutograd's min-cut
// partitioner saves (activations/partitioner.h).
struct CompileConfig {
  std::vector<std::string> module_classes;
  // torch._functorch.config.activation_memory_budget (0 to 1): below 1 the
  // partitioner recomputes more to save less (0: each call's inputs only).
  double memory_budget = 1;
  bool memory_budget_given = false;
};

// How activations are counted (command line only; not part of a policy file):
// --activation-bytes, --device, --sdpa. The dynamic dimensions are the graph's (--dim).
struct ActivationSettings {
  std::optional<int64_t> allowance_bytes;  // --activation-bytes: a flat allowance in place of the graph's
  // The most --activation-bytes may be (docs/limits.md): 4 PiB, past any
  // accelerator, and low enough that peak + allowance cannot pass 2^63.
  static constexpr int64_t kMaxAllowanceBytes = int64_t{1} << 52;
  ComputeDevice device = ComputeDevice::Cuda;
  SdpaKernel sdpa = SdpaKernel::Default;
  // --dim NAME=VALUE: the graph's dynamic dimensions (model/graph.h DimValues::bind); the rest at
  // the values torch traced them at.
  std::vector<std::pair<std::string, int64_t>> dims;
};

struct Policy {
  std::optional<std::vector<std::string>> module_classes;  // ModuleWrapPolicy
  std::optional<int64_t> min_num_params;                   // size_based_auto_wrap_policy
  // size_based_auto_wrap_policy's FORCE_LEAF_MODULES / EXCLUDE_WRAP_MODULES.
  std::vector<std::string> force_leaf_modules{"torch.nn.MultiheadAttention"};
  std::vector<std::string> exclude_wrap_modules{"torch.nn.ModuleList", "torch.nn.ModuleDict"};
  bool force_leaf_given = false, exclude_wrap_given = false;
  std::optional<MixedPrecision> mixed_precision;
  std::vector<std::string> ignored_modules;  // module path globs
  std::vector<std::string> ignored_params;   // parameter path globs
  // FSDP and training settings for the memory model ("fsdp" in JSON).
  FsdpSettings fsdp;
  Budgets checks;                            // CI budgets; not part of the wrapping
  HardwareSettings hardware;                 // the step-time estimate's GPU ("hardware"); not part of the wrapping
  // --aliases: a module with exactly the tensors of an earlier one is that
  // module under a second name (aliases.h). A saved file cannot tell this from
  // two modules tied by weight (transformers 5's T5), so only when asked.
  bool module_aliases = false;
  std::vector<Fsdp2Group> groups;            // FSDP2 only: explicit fully_shard calls
  std::optional<TensorParallel> tensor_parallel;  // FSDP2 only: a (dp_shard, tp) mesh
  std::optional<ExpertParallel> expert_parallel;  // FSDP2 only: routed experts on (efsdp, ep)
  std::optional<ContextParallel> context_parallel;  // FSDP2 only: the sequence split over cp
  std::optional<ActivationCheckpointing> activation_checkpointing;
  std::optional<CompileConfig> compile;
  ActivationSettings activations;            // not in the policy file

  // FSDP auto-wraps only when a wrapping policy is given; mixed precision
  // alone changes no unit.
  bool auto_wrap() const { return module_classes.has_value() || min_num_params.has_value(); }
  // Why these settings cannot be planned together ("groups" need FSDP2), or "";
  // the mesh's own checks are mesh/device_mesh.h device_mesh_error.
  std::string combination_error() const;
};

// Parse and validate policy JSON text. Throws InputError naming `file`.
Policy parse_policy(const std::string& text, const std::string& file);
// The "fsdp" settings the memory model runs with: the optimizer's implementation
// resolved to PyTorch's default for --device where the policy leaves it open.
FsdpSettings memory_settings(const Policy& policy);
Policy load_policy_file(const std::string& file);
// Throws InputError when `text` is a model file (zip or pickle) given as a policy.
void reject_model_file(const std::string& text, const std::string& file);

// Why `kind` cannot be a "fail_on" entry ("names \"x\", not a warning kind;
// did you mean ...?"), or "" if it can.
std::string fail_on_error(const std::string& kind);

// The effective policy, defaults filled in, as the plan reports it.
nlohmann::ordered_json policy_to_json(const Policy& policy);
// A policy as a user would write it: only the keys it sets; parse_policy reads it back.
nlohmann::ordered_json policy_file_json(const Policy& policy);
// true, false or the rank count, as fully_shard takes it.
nlohmann::ordered_json reshard_to_json(const ReshardAfterForward& r);

}  // namespace fsdp_plan
