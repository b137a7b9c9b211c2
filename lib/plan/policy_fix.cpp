#include "plan/policy_fix.h"

#include <algorithm>
#include <map>

#include "model/class_names.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

}  // namespace

PolicyFix wrap_classes(const Policy& policy, const std::vector<std::string>& classes) {
  PolicyFix f;
  f.policy = policy;
  if (!f.policy.module_classes) f.policy.module_classes.emplace();
  for (const auto& c : classes)
    if (std::find(f.policy.module_classes->begin(), f.policy.module_classes->end(), c) ==
        f.policy.module_classes->end())
      f.policy.module_classes->push_back(c);
  f.fragment = {{"module_classes", classes}};
  f.text = "wrap " + join(classes) + " separately (add to module_classes)";
  return f;
}

PolicyFix ignore_params(const Policy& policy, const std::vector<std::string>& names) {
  PolicyFix f;
  f.policy = policy;
  for (const auto& n : names) f.policy.ignored_params.push_back(n);
  f.fragment = {{"ignored_params", names}};
  f.text = "ignore " + join(names) + " (add to ignored_params)";
  return f;
}

PolicyFix use_orig_params(const Policy& policy) {
  PolicyFix f;
  f.policy = policy;
  f.policy.fsdp.use_orig_params = true;
  f.fragment = {{"fsdp", {{"use_orig_params", true}}}};
  f.text = "set fsdp.use_orig_params true";
  return f;
}

bool fix_works(const Plan& before, const Plan& after, const std::string& kind, Severity at_least) {
  std::map<std::string, int> errors_before;
  int split_before = 0, split_after = 0;
  for (const auto& w : before.warnings) {
    if (w.severity == Severity::Error) errors_before[w.kind]++;
    split_before += w.kind == "shared_param_across_units";
  }
  for (const auto& w : after.warnings) {
    // Severity orders Error < Warning < Info: "at least" means as bad or worse.
    if (w.kind == kind && static_cast<int>(w.severity) <= static_cast<int>(at_least)) return false;
    if (w.severity == Severity::Error && !errors_before.count(w.kind)) return false;
    split_after += w.kind == "shared_param_across_units";
  }
  return split_after <= split_before;
}

std::vector<std::string> wrappable_classes(const ModuleTree& tree, const std::vector<ModuleId>& modules) {
  std::vector<std::string> out;
  for (ModuleId m : modules) {
    std::string cls = demangle(tree.module(m).type_name);
    if (is_container(cls, true)) continue;
    if (std::find(out.begin(), out.end(), cls) == out.end()) out.push_back(cls);
  }
  return out;
}

}  // namespace fsdp_plan
