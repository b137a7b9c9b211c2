#include "planner/policy_file.h"

#include "util/file_io.h"

namespace fsdp_plan {

PolicyFile read_policy_file(const std::string& path) {
  PolicyFile out;
  if (path.empty()) return out;
  std::string text = read_text_file(path, kMaxPolicyFileBytes, "a policy");
  reject_model_file(text, path);
  if (is_accelerate_config(text)) {
    out.accelerate = parse_accelerate_config(text, path);
    out.policy = out.accelerate->policy;
  } else {
    out.policy = parse_policy(text, path);
  }
  return out;
}

void set_fsdp_version(PolicyFile& file, FsdpVersion version) {
  file.policy.fsdp.version = version;
  if (file.accelerate) file.policy.mixed_precision = accelerate_dtypes(file.accelerate->mixed_precision, version);
}

std::vector<Warning> resolve_policy_file(PolicyFile& file, const ModuleTree& tree) {
  if (!file.accelerate) return {};
  AccelerateConfig& a = *file.accelerate;
  resolve_accelerate_config(a, tree);
  if (a.policy.fsdp.v2()) apply_accelerate_fsdp2(a, tree);
  file.policy.module_classes = a.policy.module_classes;
  file.policy.min_num_params = a.policy.min_num_params;
  file.policy.groups = a.policy.groups;
  file.policy.ignored_modules = a.policy.ignored_modules;
  return a.warnings;
}

}  // namespace fsdp_plan
