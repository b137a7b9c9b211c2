// A Hugging Face Accelerate config file (the YAML `accelerate config` writes)
// read as `accelerate launch` of Accelerate 1.15.0 reads it: keys missing from
// the file take the launcher's argparse defaults (not the plugin's), each
// fsdp_config value goes through the environment variable the launcher sets,
// and FullyShardedDataParallelPlugin parses it from there. The result is our
// Policy plus warnings about keys Accelerate ignores; class names are resolved
// against the model afterwards, by Accelerate's own rule.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/module_tree.h"
#include "plan/plan.h"
#include "policy/policy.h"

namespace fsdp_plan {

// The Accelerate release whose launcher and plugin this module follows.
constexpr const char* kAccelerateVersion = "1.15.0";

struct AccelerateConfig {
  Policy policy;  // module_classes still holds Accelerate's bare names (see resolve)
  std::vector<Warning> warnings;
  std::string auto_wrap_policy = "NO_WRAP";  // TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP
  // fsdp_transformer_layer_cls_to_wrap split at commas as Accelerate splits it;
  // nullopt: not set, so Accelerate takes model._no_split_modules.
  std::optional<std::vector<std::string>> class_names;
  std::optional<std::string> ignored_modules_regex;  // fsdp_ignored_modules, fullmatch on module paths
  int64_t num_machines = 1;
  bool reshard_after_forward = true;  // FSDP2: fsdp_reshard_after_forward
  std::string mixed_precision = "no";  // no, fp8, fp16 or bf16; policy.mixed_precision holds its dtypes
  bool activation_checkpointing = false;          // fsdp_activation_checkpointing
  bool activation_checkpointing_offload = false;  // fsdp_activation_checkpointing_offload (FSDP2)
  std::vector<std::string> effective;  // "key value (where it came from)", for the info warning
};

// True if a JSON document is an Accelerate config (one `accelerate config`
// saved as .json): an object with distributed_type, fsdp_config or
// compute_environment. A --policy file that is not JSON is YAML, and so an
// Accelerate config or nothing (planner/policy_file.cpp).
bool is_accelerate_config_json(const nlohmann::json& doc);

// The dtypes set_mixed_precision gives Accelerate's `mixed_precision` mode
// under FSDP `fsdp_version`: param, reduce and buffer dtype alike (fp8 trains
// with bf16), and under FSDP2 the output dtype too. nullopt for "no". The
// CLI asks again when --fsdp-version overrides the config's version.
std::optional<MixedPrecision> accelerate_dtypes(const std::string& mode, FsdpVersion version);

// What the command line sets over the file, as `accelerate launch --fsdp_KEY
// VALUE` overrides the config's fsdp_config.KEY (accelerate/commands/launch.py:
// _validate_launch_command copies a config value only onto an argument not
// in args.nondefault).
struct AccelerateOverrides {
  // --module-classes A,B: --fsdp_transformer_layer_cls_to_wrap A,B.
  std::optional<std::vector<std::string>> transformer_layer_cls_to_wrap;
};

// Parses and validates; throws InputError naming `file` where `accelerate
// launch` would refuse the file (or the overrides with it). A YAML error says
// its line and column; a file that is no mapping says what it is instead
// (empty, a list, ...).
AccelerateConfig parse_accelerate_config(const std::string& text, const std::string& file,
                                         const AccelerateOverrides& overrides = {});
// The same config written as JSON, as ClusterConfig.from_json_file reads it
// (json.load: its values are never YAML-resolved).
AccelerateConfig parse_accelerate_config_json(const nlohmann::json& doc, const std::string& file,
                                              const AccelerateOverrides& overrides = {});

// Accelerate's lookups on the model: each class name by
// get_module_class_from_name (exact bare class name, first module in
// pre-order), fsdp_ignored_modules by re.fullmatch over module paths. Fills
// policy.module_classes and policy.ignored_modules with what matched and adds
// the error Accelerate raises for a missing class (with the nearest names).
// TRANSFORMER_BASED_WRAP without a class list takes model._no_split_modules
// where the file records it (fsdp-plan-export's record, a live module's
// tree), and warns that it is unknown otherwise.
void resolve_accelerate_config(AccelerateConfig& config, const ModuleTree& tree);

// The modules Accelerate 1.15.0 checkpoints with fsdp_activation_checkpointing
// under FSDP `version` (call after resolve_accelerate_config, before
// apply_accelerate_fsdp2), or nullopt when it checkpoints none.
//  - FSDP2 (accelerator.py: prepare_model -> fsdp2_apply_ac): every module but
//    the root, bottom-up, for which the FSDP2 auto-wrap policy holds
//    (fsdp_utils.py: fsdp2_prepare_auto_wrap_policy), the layer itself since
//    PR 4172: its class for TRANSFORMER_BASED_WRAP, more than min_num_params
//    parameters for SIZE_BASED_WRAP. Without a policy (NO_WRAP, or min 0) the
//    policy is None and fsdp2_apply_ac raises TypeError: an error warning.
//  - FSDP1 (prepare_model, FSDP1 branch): apply_activation_checkpointing on the
//    wrapped model with the plugin's auto_wrap_policy: the wrap classes; by
//    size on the sharded model, which the plan takes as the units' modules (a
//    warning says so); with no policy, check_fn's default (always true) wraps
//    the root's only child, the whole model.
std::optional<ActivationCheckpointing> accelerate_activation_checkpointing(const AccelerateConfig& config,
                                                                          const ModuleTree& tree,
                                                                          FsdpVersion version,
                                                                          std::vector<Warning>& warnings);

// One fully_shard call of Accelerate's FSDP2 preparation.
struct ShardCall {
  std::vector<ModuleId> modules;              // several: one group (fully_shard([a, b]))
  std::optional<bool> reshard_after_forward;  // nullopt: PyTorch's default (False for the root)
  std::string why;                            // "policy", "input embedding", "tail", "root"
};

// The fully_shard calls fsdp2_prepare_model of Accelerate 1.15.0 makes, in
// order: the policy's modules bottom-up (get_module_children_bottom_up), the
// input embedding if untied, the tail [final norm, (input embedding,) output
// embedding] with reshard_after_forward=False, then the root. Call after
// resolve_accelerate_config. Transformers' get_input_embeddings,
// get_output_embeddings and base_model_prefix are not in a TorchScript file:
// they are guessed from module names (embed_tokens / wte / word_embeddings,
// lm_head, a root child whose class ends in "Model"), and an info note in
// `notes` says what was taken.
std::vector<ShardCall> accelerate_fsdp2_calls(const AccelerateConfig& config, const ModuleTree& tree,
                                              std::vector<Warning>& notes);

// fsdp_version 2: config.policy becomes those calls as explicit FSDP2 groups
// (the root excepted: the planner always makes it the last call).
void apply_accelerate_fsdp2(AccelerateConfig& config, const ModuleTree& tree);

}  // namespace fsdp_plan
