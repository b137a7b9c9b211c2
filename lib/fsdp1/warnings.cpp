// FSDP1 refusals: what FlatParamHandle._validate_tensors_to_flatten and
// _init_utils._verify_managed_params (torch 2.13) raise for one unit's
// parameters, and what _wrap_utils._validate_frozen_params warns about.
#include <algorithm>
#include <map>
#include <set>

#include "fsdp1/memory.h"
#include "model/class_names.h"
#include "model/dtype.h"
#include "plan/policy_fix.h"
#include "plan/refusals.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

class FlatParamChecks {
 public:
  FlatParamChecks(Plan& plan, const Replan* replan) : plan_(plan), tree_(*plan.tree), replan_(replan) {}

  void run() {
    scalar_params();
    integer_params();
    mixed_dtypes();
    mixed_requires_grad();
  }

 private:
  const TensorInfo& info(const Owned& o) const { return tree_.tensor(o.tensor); }
  std::string unit_name(const Unit& u) const { return fsdp_plan::unit_name(tree_, u, true); }
  std::string unit_class(const Unit& u) const {
    return bare_class(tree_, u.module);
  }
  // The parameter's name as FSDP's messages give it: relative to the unit's module.
  std::string local_name(const Unit& u, const Owned& o) const {
    std::string full = plan_.param_name(o), prefix = tree_.path(u.module);
    return prefix.empty() ? full : full.substr(prefix.size() + 1);
  }

  // Tries fixes in order; the first that planning again shows to work wins.
  std::optional<PolicyFix> first_working(const std::vector<PolicyFix>& fixes, const std::string& kind,
                                         Severity at_least) const {
    if (!replan_) return std::nullopt;
    for (const auto& f : fixes)
      if (fix_works(plan_, (*replan_)(f.policy), kind, at_least)) return f;
    return std::nullopt;
  }

  // Wrapping the owners of one side of a split separately, then the other's.
  std::vector<PolicyFix> separate(const std::vector<ModuleId>& side_a, const std::vector<ModuleId>& side_b) const {
    std::vector<PolicyFix> out;
    for (const auto* side : {&side_a, &side_b}) {
      auto classes = wrappable_classes(tree_, *side);
      if (!classes.empty()) out.push_back(wrap_classes(plan_.policy, classes));
    }
    return out;
  }

  void add(std::string kind, Severity sev, std::string message, std::vector<std::string> units,
           std::vector<std::string> params, const std::optional<PolicyFix>& fix) {
    Warning w = make_warning(kind, sev, std::move(message));
    w.modules = std::move(units);
    w.params = std::move(params);
    if (fix) w.fix = fix->fragment;
    plan_.warnings.push_back(std::move(w));
  }

  // _verify_managed_params runs before any flat parameter is made.
  void scalar_params() {
    std::vector<std::string> units, params, quotes;
    for (const Unit& u : plan_.units) {
      const Owned* first = nullptr;
      for (const auto& o : u.params)
        if (info(o).shape.empty()) {
          if (!first) first = &o;
          params.push_back(plan_.param_name(o));
        }
      if (!first) continue;
      units.push_back(tree_.path(u.module));
      quotes.push_back(unit_name(u) + ": \"FSDP doesn't support scalar parameters. Change " + local_name(u, *first) +
                       " to a 1D tensor with numel equal to 1.\"");
    }
    if (units.empty()) return;
    auto fix = first_working({ignore_params(plan_.policy, params)}, "scalar_param", Severity::Error);
    add("scalar_param", Severity::Error,
        std::to_string(params.size()) + " scalar (0-dim) parameter(s) " + listing(params) +
            "; FSDP refuses them: " + listing(quotes, 2) +
            ". Fix: make each a 1-element 1D tensor in the model" +
            (fix ? ", or " + fix->text + "; FSDP then neither shards them nor reduces their gradients" : ""),
        units, params, fix);
  }

  // The first parameter's dtype must be floating; every later one must equal
  // the one before (so a later integer one fails the uniform-dtype check).
  void integer_params() {
    std::vector<std::string> units, params, quotes;
    for (const Unit& u : plan_.units) {
      if (u.params.empty()) continue;
      std::vector<std::string> here;
      for (const auto& o : u.params)
        if (!is_floating_dtype(info(o).dtype)) here.push_back(plan_.param_name(o));
      if (here.empty()) continue;
      units.push_back(tree_.path(u.module));
      params.insert(params.end(), here.begin(), here.end());
      quotes.push_back(unit_name(u) + ": \"" + dtype_message(u) + "\"");
    }
    if (units.empty()) return;
    auto fix = first_working({ignore_params(plan_.policy, params)}, "integer_param", Severity::Error);
    add("integer_param", Severity::Error,
        std::to_string(params.size()) + " parameter(s) of a non-floating dtype (" + listing(params) +
            ") in " + std::to_string(units.size()) + " unit(s); FSDP1 cannot flatten them: " + listing(quotes, 2) +
            ". Fix: " + (fix ? fix->text + " (they cannot train anyway)" : "register them as buffers in the model"),
        units, params, fix);
  }

  // What _validate_tensors_to_flatten raises first for a unit's dtypes, or "".
  std::string dtype_message(const Unit& u) const {
    const std::string* prev = nullptr;
    for (const auto& o : u.params) {
      const std::string& d = info(o).dtype;
      if (!prev && !is_floating_dtype(d)) return "Cannot flatten integer dtype tensors";
      if (prev && d != *prev) return "Must flatten tensors with uniform dtype but got torch." + *prev + " and torch." + d;
      prev = &d;
    }
    return "";
  }

  void mixed_dtypes() {
    std::vector<std::string> units, params, quotes;
    std::vector<ModuleId> minority_owners, majority_owners;
    for (const Unit& u : plan_.units) {
      if (one_dtype(tree_, u.params)) continue;
      std::map<std::string, int64_t> numel;  // floating dtypes only: integers are integer_param's
      for (const auto& o : u.params)
        if (is_floating_dtype(info(o).dtype)) numel[info(o).dtype] += tree_.numel(o.tensor);
      if (numel.size() < 2) continue;
      // The dtype most of the unit is in stays; the others are the odd ones.
      std::string main_dtype =
          std::max_element(numel.begin(), numel.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
      std::vector<std::string> counts;
      for (const auto& [d, n] : numel) counts.push_back(format_count(n) + " " + d);
      units.push_back(tree_.path(u.module));
      quotes.push_back(unit_name(u) + " (" + join(counts) + ")");
      for (const auto& o : u.params) {
        if (!is_floating_dtype(info(o).dtype)) continue;
        if (info(o).dtype == main_dtype) {
          majority_owners.push_back(o.module);
        } else {
          minority_owners.push_back(o.module);
          params.push_back(plan_.param_name(o));
        }
      }
    }
    if (units.empty()) return;
    std::string first = dtype_message(*unit_of(units.front()));
    auto fix = first_working(separate(minority_owners, majority_owners), "mixed_dtype", Severity::Error);
    add("mixed_dtype", Severity::Error,
        std::to_string(units.size()) + " unit(s) mix floating dtypes: " + listing(quotes) +
            "; FSDP1 flattens each unit into one tensor and refuses: \"" + first + "\". Fix: " +
            (fix ? fix->text + ", or " : "") +
            "keep every parameter in one dtype and set mixed_precision.param_dtype for lower-precision compute",
        units, params, fix);
  }

  const Unit* unit_of(const std::string& path) const {
    for (const Unit& u : plan_.units)
      if (tree_.path(u.module) == path) return &u;
    return nullptr;
  }

  void mixed_requires_grad() {
    const bool orig = plan_.policy.fsdp.use_orig_params;
    std::vector<std::string> units, params, details;
    std::vector<ModuleId> trainable_owners, frozen_owners;
    int64_t total = 0, trainable = 0;
    for (const Unit& u : plan_.units) {
      if (u.trainable_numel == 0 || u.frozen_numel == 0) continue;
      units.push_back(tree_.path(u.module));
      details.push_back(unit_name(u) + " (" + unit_class(u) + ": " + format_count(u.trainable_numel) + " trainable, " +
                        format_count(u.frozen_numel) + " frozen)");
      total += u.param_numel;
      trainable += u.trainable_numel;
      // The parameters named are the fewer side of each unit.
      const bool name_trainable = u.trainable_numel <= u.frozen_numel;
      for (const auto& o : u.params) {
        (info(o).requires_grad ? trainable_owners : frozen_owners).push_back(o.module);
        if (info(o).requires_grad == name_trainable) params.push_back(plan_.param_name(o));
      }
    }
    if (units.empty()) return;
    const Severity sev = orig ? Severity::Warning : Severity::Error;
    std::vector<PolicyFix> fixes = separate(trainable_owners, frozen_owners);
    if (!orig) fixes.push_back(use_orig_params(plan_.policy));
    auto fix = first_working(fixes, "mixed_requires_grad", sev);
    const std::string grads = std::to_string(total) + " numel instead of " + std::to_string(trainable) +
                              " numel before sharding via reduce-scatter";
    std::string message = std::to_string(units.size()) + " unit(s) mix trainable and frozen parameters: " +
                          listing(details) + "; ";
    if (orig)
      message += "FSDP1 with use_orig_params=True accepts them but keeps gradients for the whole flat parameter, "
                 "\"the gradient memory usage will be higher than expected (" + grads +
                 ")\" (counted in the memory estimate).";
    else
      message += "FSDP1 with use_orig_params=False refuses them: \"Must flatten tensors with uniform "
                 "`requires_grad` when `use_orig_params=False`\" (with ModuleWrapPolicy: \"<unit> has both parameters "
                 "with requires_grad=True and False. FSDP does not support wrapping such modules when "
                 "use_orig_params=False.\").";
    message += " Fix: " + (fix ? fix->text : std::string("wrap the frozen parameters with FSDP separately"));
    if (!orig && (!fix || fix->fragment.contains("module_classes")))
      message += ", or set fsdp.use_orig_params true (gradients for whole units: " + grads + ")";
    add("mixed_requires_grad", sev, message, units, params, fix);
  }

  Plan& plan_;
  const ModuleTree& tree_;
  const Replan* replan_;
};

}  // namespace

void flat_param_refusals(Plan& plan, const Replan* replan) { FlatParamChecks(plan, replan).run(); }

}  // namespace fsdp_plan
