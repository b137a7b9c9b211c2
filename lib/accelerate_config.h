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

#include "module_tree.h"
#include "plan.h"
#include "policy.h"

namespace fsdp_plan {

// The Accelerate release whose launcher and plugin this module follows.
constexpr const char* kAccelerateVersion = "1.15.0";

struct AccelerateConfig {
  Policy policy;  // module_classes still holds Accelerate's bare names (see resolve)
  std::vector<Warning> warnings;
  int fsdp_version = 1;
  std::string auto_wrap_policy = "NO_WRAP";  // TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP
  // fsdp_transformer_layer_cls_to_wrap split at commas as Accelerate splits it;
  // nullopt: not set, so Accelerate takes model._no_split_modules.
  std::optional<std::vector<std::string>> class_names;
  std::optional<std::string> ignored_modules_regex;  // fsdp_ignored_modules, fullmatch on module paths
  int64_t num_machines = 1;
  std::vector<std::string> effective;  // "key value (where it came from)", for the info warning
};

// True if `text` is YAML (not a JSON object) whose top level is a mapping with
// an Accelerate key (distributed_type, fsdp_config or compute_environment).
bool is_accelerate_config(const std::string& text);

// Parses and validates; throws InputError naming `file` where `accelerate
// launch` would refuse the file.
AccelerateConfig parse_accelerate_config(const std::string& text, const std::string& file);

// Accelerate's lookups on the model: each class name by
// get_module_class_from_name (exact bare class name, first module in
// pre-order), fsdp_ignored_modules by re.fullmatch over module paths. Fills
// policy.module_classes and policy.ignored_modules with what matched and adds
// the error Accelerate raises for a missing class (with the nearest names).
void resolve_accelerate_config(AccelerateConfig& config, const ModuleTree& tree);

}  // namespace fsdp_plan
