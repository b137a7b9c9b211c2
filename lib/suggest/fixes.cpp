#include "suggest/fixes.h"

#include <algorithm>
#include <set>

#include "model/class_names.h"
#include "suggest/groups.h"
#include "suggest/suggest.h"

namespace fsdp_plan {
namespace {

// Arrays add to the policy's, objects merge into it (Warning::fix).
void merge(nlohmann::ordered_json& into, const nlohmann::ordered_json& fragment) {
  for (auto it = fragment.begin(); it != fragment.end(); ++it) {
    auto& slot = into[it.key()];
    if (it->is_array()) {
      if (!slot.is_array()) slot = nlohmann::ordered_json::array();
      for (const auto& v : *it)
        if (std::find(slot.begin(), slot.end(), v) == slot.end()) slot.push_back(v);
    } else if (it->is_object()) {
      if (!slot.is_object()) slot = nlohmann::ordered_json::object();
      merge(slot, *it);
    } else {
      slot = *it;
    }
  }
}

std::string fix_text(const Warning& w) {
  if (w.kind == "mixed_requires_grad")
    return w.fix.contains("module_classes") ? "frozen parameters in units of their own" : "use_orig_params";
  if (w.kind == "mixed_dtype") return "each dtype in units of its own";
  if (w.kind == "scalar_param" || w.kind == "integer_param") return "non-flattenable parameters ignored";
  return "fix for " + w.kind;
}

// The modules at `paths` (one pass over the tree), in module order.
std::vector<ModuleId> modules_at(const ModuleTree& tree, const std::vector<std::string>& paths) {
  std::vector<ModuleId> out;
  for (ModuleId m : tree.preorder())
    if (std::find(paths.begin(), paths.end(), tree.path(m)) != paths.end()) out.push_back(m);
  return out;
}

std::string owner(const std::string& param) {
  auto dot = param.rfind('.');
  return dot == std::string::npos ? "" : param.substr(0, dot);
}

// FSDP1: the units holding the users of a tied weight, below the users' lowest
// common unit; not wrapping them lets that unit hold every use.
std::set<std::string> classes_to_unwrap(const Plan& plan, const std::vector<std::string>& users) {
  const ModuleTree& tree = *plan.tree;
  std::vector<int> unit_at(tree.num_modules(), -1);
  for (size_t i = 0; i < plan.units.size(); ++i) unit_at[static_cast<size_t>(plan.units[i].module)] = static_cast<int>(i);
  std::vector<int> holders;
  for (ModuleId m : modules_at(tree, users)) {
    while (unit_at[static_cast<size_t>(m)] < 0 && tree.module(m).parent >= 0) m = tree.module(m).parent;
    holders.push_back(unit_at[static_cast<size_t>(m)]);
  }
  if (holders.empty()) return {};
  auto chain = [&](int u) {  // u and its enclosing units, innermost first
    std::vector<int> out;
    for (; u >= 0; u = plan.units[static_cast<size_t>(u)].parent) out.push_back(u);
    return out;
  };
  std::vector<int> common = chain(holders.front());
  for (int h : holders) {
    auto c = chain(h);
    common.erase(std::remove_if(common.begin(), common.end(),
                                [&](int u) { return std::find(c.begin(), c.end(), u) == c.end(); }),
                 common.end());
  }
  const int lowest = common.empty() ? 0 : common.front();
  std::set<std::string> out;
  for (int h : holders)
    for (int u : chain(h)) {
      if (u == lowest) break;
      out.insert(demangle(tree.module(plan.units[static_cast<size_t>(u)].module).type_name));
    }
  return out;
}

bool tie_fsdp1(Policy& p, const Plan& plan, const std::vector<std::string>& users) {
  std::set<std::string> classes = classes_to_unwrap(plan, users);
  if (classes.empty()) return false;
  const ClassMatcher matcher(*plan.tree);
  if (p.module_classes) {
    auto& list = *p.module_classes;
    const size_t before = list.size();
    list.erase(std::remove_if(list.begin(), list.end(), [&](const std::string& pattern) {
                 return std::any_of(classes.begin(), classes.end(),
                                    [&](const std::string& c) { return matcher.is_instance(c, {pattern}); });
               }),
               list.end());
    if (list.size() == before) return false;
    if (list.empty()) p.module_classes.reset();
    return true;
  }
  if (!p.min_num_params) return false;
  for (const auto& c : classes)
    if (std::find(p.exclude_wrap_modules.begin(), p.exclude_wrap_modules.end(), c) == p.exclude_wrap_modules.end())
      p.exclude_wrap_modules.push_back(c);
  p.exclude_wrap_given = true;
  return true;
}

}  // namespace

std::optional<FixedPolicy> fix_refusals(const Plan& plan) {
  std::vector<std::string> what;
  // Fix fragments first: they are policy JSON.
  nlohmann::ordered_json fragment = nlohmann::ordered_json::object();
  for (const auto& w : plan.warnings) {
    if (w.severity != Severity::Error || w.fix.is_null()) continue;
    merge(fragment, w.fix);
    std::string t = fix_text(w);
    if (std::find(what.begin(), what.end(), t) == what.end()) what.push_back(t);
  }
  Policy p = plan.policy;
  if (!fragment.empty()) {
    nlohmann::ordered_json j = policy_file_json(p);  // only the keys the policy sets: reads back as p
    merge(j, fragment);
    Policy fixed = parse_policy(j.dump(), "<fix>");
    fixed.checks = p.checks;
    fixed.module_aliases = p.module_aliases;
    p = std::move(fixed);
  }
  bool tied = false;
  for (const auto& w : plan.warnings) {
    if (w.kind != "shared_param_across_units" && w.kind != "fsdp2_shared_param") continue;
    std::vector<std::string> users;
    for (const auto& name : w.params) {
      std::string o = owner(name);
      if (std::find(users.begin(), users.end(), o) == users.end()) users.push_back(o);
    }
    if (users.size() < 2) continue;
    std::vector<ModuleId> ids = modules_at(*plan.tree, users);  // module order
    users.clear();
    for (ModuleId m : ids) users.push_back(plan.tree->path(m));
    if (users.size() < 2) continue;
    tied = (plan.v2() ? tie_in_one_group(p, users) : tie_fsdp1(p, plan, users)) || tied;
  }
  if (tied) what.push_back("tied weights in one unit");
  if (what.empty()) return std::nullopt;
  std::string text;
  for (const auto& t : what) text += (text.empty() ? "" : " + ") + t;
  return FixedPolicy{std::move(p), std::move(text)};
}

}  // namespace fsdp_plan
