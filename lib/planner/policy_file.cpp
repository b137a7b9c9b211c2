#include "planner/policy_file.h"

#include "util/errors.h"
#include "util/file_io.h"
#include "util/json_input.h"

namespace fsdp_plan {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// How the file is read. Accelerate's load_config_from_file (commands/config/
// config_args.py) goes by the name: json.load for *.json, yaml.safe_load for
// any other. A policy is JSON. So *.json is JSON, and any other name (.yaml,
// a pipe, /dev/stdin) goes by its first character: a JSON document starts
// with { or [, an Accelerate config in YAML with neither. (A .yaml holding
// JSON is read as JSON: what yaml.safe_load gives for it but for floats
// spelt 1e8, which YAML 1.1 takes as strings.)
bool starts_as_json(const std::string& text) {
  const size_t bom = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
  const size_t first = text.find_first_not_of(" \t\r\n", bom);
  return first != std::string::npos && (text[first] == '{' || text[first] == '[');
}
bool read_as_json(const std::string& text, const std::string& path) {
  return ends_with(path, ".json") || starts_as_json(text);
}

}  // namespace

PolicyFile read_policy_file(const std::string& path, const PolicyOverrides& overrides) {
  PolicyFile out;
  if (path.empty()) {
    if (overrides.module_classes) out.policy.module_classes = overrides.module_classes;
    return out;
  }
  std::string text = read_text_file(path, kMaxPolicyFileBytes, "a policy");
  reject_model_file(text, path);
  if (text.find_first_not_of(" \t\r\n") == std::string::npos)
    throw InputError(path, "is empty: give a policy JSON (policies/policy.schema.json) or an Accelerate config");
  if (!read_as_json(text, path)) {
    // YAML: an Accelerate config, or its reader says what the file is instead.
    out.accelerate = parse_accelerate_config(text, path, {overrides.module_classes});
    out.policy = out.accelerate->policy;
    return out;
  }
  nlohmann::json doc;
  try {
    doc = parse_json(text, path);
  } catch (const InputError& e) {
    if (starts_as_json(text)) throw;
    throw InputError(path, std::string(e.what()) + " (a file named *.json is JSON, to Accelerate too: an Accelerate "
                                                   "config in YAML needs a .yaml name)");
  }
  if (is_accelerate_config_json(doc)) {
    out.accelerate = parse_accelerate_config_json(doc, path, {overrides.module_classes});
    out.policy = out.accelerate->policy;
    return out;
  }
  out.policy = parse_policy(text, path);
  if (overrides.module_classes) out.policy.module_classes = overrides.module_classes;
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
  // Before the FSDP2 calls replace the wrap classes; by the version that runs (--fsdp-version may override).
  file.policy.activation_checkpointing =
      accelerate_activation_checkpointing(a, tree, file.policy.fsdp.version, a.warnings);
  if (a.policy.fsdp.v2()) apply_accelerate_fsdp2(a, tree);
  file.policy.module_classes = a.policy.module_classes;
  file.policy.min_num_params = a.policy.min_num_params;
  file.policy.groups = a.policy.groups;
  file.policy.ignored_modules = a.policy.ignored_modules;
  return a.warnings;
}

}  // namespace fsdp_plan
