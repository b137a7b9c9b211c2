// Version-neutral warnings about the root unit: FSDP keeps the root gathered
// from forward to backward, so whatever the policy leaves there costs its
// full size on every rank; a big model as one unit is not sharded at compute
// time at all.
#include <algorithm>
#include <cstdio>
#include <map>

#include "model/class_names.h"
#include "plan/policy_fix.h"
#include "plan/refusals.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

// A module whose parameters stay in the root unit: a whole subtree without
// units (whole), or a module's own parameters beside its wrapped children.
struct Held {
  ModuleId module;
  int64_t numel;
  bool whole;
};

std::vector<Held> held_by_root(const Plan& plan) {
  const ModuleTree& tree = *plan.tree;
  const size_t n = tree.num_modules();
  std::vector<int64_t> own(n, 0), sub(n, 0);
  std::vector<bool> is_unit(n, false);
  for (const auto& u : plan.units) {
    is_unit[static_cast<size_t>(u.module)] = u.module != 0;
    for (ModuleId m : u.modules) is_unit[static_cast<size_t>(m)] = m != 0;  // FSDP2: fully_shard([a, b])
  }
  std::vector<bool> has_unit = is_unit;
  for (const auto& o : plan.units.front().params) own[static_cast<size_t>(o.module)] += tree.numel(o.tensor);
  for (size_t m = n; m-- > 0;) {  // children have larger ids than their parent
    sub[m] += own[m];
    if (m == 0) break;
    const auto p = static_cast<size_t>(tree.module(static_cast<ModuleId>(m)).parent);
    sub[p] += sub[m];
    if (has_unit[m]) has_unit[p] = true;
  }
  std::vector<Held> out;
  if (own[0] > 0) out.push_back({0, own[0], false});
  std::vector<ModuleId> stack(tree.module(0).children.rbegin(), tree.module(0).children.rend());
  while (!stack.empty()) {
    ModuleId m = stack.back();
    stack.pop_back();
    const auto i = static_cast<size_t>(m);
    if (sub[i] == 0 || is_unit[i]) continue;
    if (!has_unit[i]) {
      out.push_back({m, sub[i], true});
      continue;
    }
    if (own[i] > 0) out.push_back({m, own[i], false});
    const auto& ch = tree.module(m).children;
    for (auto it = ch.rbegin(); it != ch.rend(); ++it) stack.push_back(*it);
  }
  std::stable_sort(out.begin(), out.end(), [](const Held& a, const Held& b) { return a.numel > b.numel; });
  return out;
}

class RootChecks {
 public:
  RootChecks(Plan& plan, const Replan* replan) : plan_(plan), tree_(*plan.tree), replan_(replan) {}

  void run() {
    if (plan_.units.empty()) return;
    int64_t owned = 0;
    for (const auto& u : plan_.units) owned += u.param_numel;
    const int64_t root = plan_.units.front().param_numel;
    if (owned == 0 || root == 0) return;
    const double share = static_cast<double>(root) / static_cast<double>(owned);
    const double limit = plan_.policy.checks.warn_root_share.value_or(kDefaultWarnRootShare);
    if (plan_.units.size() == 1 && root > kSingleUnitNumel)
      single_unit(root);
    else if (plan_.units.size() > 1 && share > limit)
      root_too_large(root, share, limit);
  }

 private:
  std::string describe(const Held& h) const {
    std::string path = tree_.path(h.module);
    std::string cls = bare_class(tree_, h.module);
    return path_or_root(path) + " (" + cls + (h.whole ? "" : ", own parameters") + ") " +
           format_count(h.numel);
  }

  std::string contents(const std::vector<Held>& held, std::vector<std::string>& modules) const {
    std::string out;
    for (size_t i = 0; i < held.size(); ++i) {
      modules.push_back(tree_.path(held[i].module));
      if (i < 5) out += (i ? ", " : "") + describe(held[i]);
    }
    if (held.size() > 5) out += " and " + std::to_string(held.size() - 5) + " more";
    return out;
  }

  void add(std::string kind, std::string message, std::vector<std::string> modules,
           const std::optional<PolicyFix>& fix) {
    Warning w = make_warning(kind, std::move(message));
    w.modules = std::move(modules);
    if (fix) w.fix = fix->fragment;
    plan_.warnings.push_back(std::move(w));
  }

  // Wraps the biggest classes left in the root one by one, dropping any that
  // splits tied weights or causes a refusal, until the root is small enough.
  std::optional<PolicyFix> shrink_root(const std::vector<Held>& held) const {
    if (!replan_) return std::nullopt;
    std::vector<ModuleId> whole;
    for (const auto& h : held)
      if (h.whole) whole.push_back(h.module);
    std::vector<std::string> chosen;
    int tries = 0;
    for (const auto& cls : wrappable_classes(tree_, whole)) {
      if (++tries > 6) break;
      std::vector<std::string> next = chosen;
      next.push_back(cls);
      PolicyFix f = wrap_classes(plan_.policy, next);
      Plan after = (*replan_)(f.policy);
      if (!fix_works(plan_, after, "", Severity::Error)) continue;  // trouble: leave this class out
      chosen = std::move(next);
      if (fix_works(plan_, after, "root_too_large", Severity::Warning)) return f;
    }
    return std::nullopt;
  }

  void root_too_large(int64_t root, double share, double limit) {
    std::vector<std::string> modules;
    auto held = held_by_root(plan_);
    std::string what = contents(held, modules);
    auto fix = shrink_root(held);
    add("root_too_large",
        "the root unit holds " + format_count(root) + " parameters, " + percent(share) + " of the model (over " +
            percent(limit) + ", checks.warn_root_share); FSDP keeps the root gathered from forward through "
            "backward, so all of it is on every rank: " + what + ". Fix: " +
            (fix ? fix->text : "wrap the biggest of these separately"),
        std::move(modules), fix);
  }

  // The class with at least two instances covering the most parameters: the
  // repeated block a transformer or ResNet is made of.
  std::vector<std::string> repeated_classes() const {
    std::map<std::string, std::pair<int, int64_t>> seen;  // class -> instances, parameters
    std::vector<int64_t> sub(tree_.num_modules(), 0);
    for (size_t m = tree_.num_modules(); m-- > 0;) {
      for (const auto& p : tree_.modules()[m].params) sub[m] += tree_.numel(p.tensor);
      if (m > 0) sub[static_cast<size_t>(tree_.modules()[m].parent)] += sub[m];
    }
    for (size_t m = 1; m < tree_.num_modules(); ++m) {
      if (tree_.modules()[m].children.empty() || sub[m] == 0) continue;
      auto& s = seen[demangle(tree_.modules()[m].type_name)];
      s.first++;
      s.second += sub[m];
    }
    std::vector<std::pair<int64_t, std::string>> ranked;
    for (const auto& [cls, s] : seen)
      if (s.first >= 2) ranked.push_back({s.second, cls});
    std::stable_sort(ranked.begin(), ranked.end(), [](auto& a, auto& b) { return a.first > b.first; });
    std::vector<ModuleId> none;
    std::vector<std::string> out;
    for (const auto& r : ranked) {
      // Containers have no forward to wrap.
      std::string s(short_name(r.second));
      if (s == "ModuleList" || s == "ModuleDict" || s == "Sequential") continue;
      out.push_back(r.second);
    }
    return out;
  }

  void single_unit(int64_t root) {
    std::vector<std::string> modules;
    auto held = held_by_root(plan_);
    std::string what = contents(held, modules);
    std::optional<PolicyFix> fix;
    if (replan_) {
      int tries = 0;
      for (const auto& cls : repeated_classes()) {
        if (++tries > 3) break;
        PolicyFix f = wrap_classes(plan_.policy, {cls});
        if (fix_works(plan_, (*replan_)(f.policy), "single_unit", Severity::Warning)) {
          fix = f;
          break;
        }
      }
    }
    add("single_unit",
        "the whole model (" + format_count(root) + " parameters) is one FSDP unit" +
            (plan_.policy.auto_wrap() ? ": the policy wraps no module" : ": no auto-wrap policy") +
            ", so every rank gathers all of it for forward and backward and sharding saves nothing at compute "
            "time: " + what + ". Fix: " + (fix ? fix->text : "set module_classes to the model's repeated block"),
        std::move(modules), fix);
  }

  Plan& plan_;
  const ModuleTree& tree_;
  const Replan* replan_;
};

}  // namespace

void root_warnings(Plan& plan, const Replan* replan) { RootChecks(plan, replan).run(); }

}  // namespace fsdp_plan
