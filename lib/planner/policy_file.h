// The --policy file: a JSON policy (policies/policy.schema.json) or an
// Accelerate config (YAML or JSON, told by its content), read once, then
// resolved against the model as Accelerate resolves its config. The one
// place both commands that plan (fsdp-plan, fsdp-plan suggest) turn a file
// into the Policy they plan.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "accelerate/config.h"
#include "model/module_tree.h"
#include "policy/policy.h"

namespace fsdp_plan {

struct PolicyFile {
  Policy policy;
  std::optional<AccelerateConfig> accelerate;  // the file was an Accelerate config
};

// What the command line sets over the file's wrapping.
struct PolicyOverrides {
  // --module-classes: the policy's module_classes (its other keys stay: a
  // min_num_params still ORs with them, as FSDP's _or_policy does); for an
  // Accelerate config, fsdp_transformer_layer_cls_to_wrap as `accelerate
  // launch --fsdp_transformer_layer_cls_to_wrap` sets it over the file.
  std::optional<std::vector<std::string>> module_classes;
};

// Throws InputError naming `path`. An empty path is FSDP's default: no auto-wrap.
PolicyFile read_policy_file(const std::string& path, const PolicyOverrides& overrides = {});

// Settings from the command line override the file's: an Accelerate config
// then derives its dtypes for the FSDP version that runs it, as Accelerate's
// set_mixed_precision does.
void set_fsdp_version(PolicyFile& file, FsdpVersion version);

// Accelerate's lookups on the model (class names, fsdp_ignored_modules, the
// FSDP2 calls of fsdp2_prepare_model) fill in what the plan needs; a JSON
// policy needs none. Returns the warnings Accelerate's reading gave, which
// the plan reports first.
std::vector<Warning> resolve_policy_file(PolicyFile& file, const ModuleTree& tree);

}  // namespace fsdp_plan
