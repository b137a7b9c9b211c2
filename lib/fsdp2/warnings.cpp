#include "fsdp2/warnings.h"

#include <algorithm>
#include <map>
#include <set>

#include "fsdp2/memory.h"
#include "mesh/device_mesh.h"
#include "model/module_tree.h"
#include "plan/policy_fix.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

class Refusals {
 public:
  Refusals(Plan& plan, const Fsdp2Calls& calls, const ClassMatcher& matcher, const Replan* replan)
      : plan_(plan), tree_(*plan.tree), calls_(calls), matcher_(matcher), replan_(replan) {}

  void run() {
    // FSDP2 has no BatchNorm exception: the one policy applies to every group.
    if (plan_.policy.mixed_precision)
      for (Unit& u : plan_.units) u.mixed_precision = true;
    group_paths();
    containers();
    scalars();
    dtypes();
    shared();
    reshard_ranks();
    container_fix();  // last: a fix must bring no error the plan lacks
  }

 private:
  void add(const std::string& kind, Severity sev, std::string message, std::vector<std::string> modules = {},
           std::vector<std::string> params = {}) {
    Warning w = make_warning(kind, sev, std::move(message));
    w.modules = std::move(modules);
    w.params = std::move(params);
    plan_.warnings.push_back(std::move(w));
  }

  std::string unit_name(const Unit& u) const { return fsdp_plan::unit_name(tree_, u, true); }

  void group_paths() {
    for (const auto& p : calls_.unknown_paths)
      add("unmatched_group", Severity::Error,
          "\"groups\" names " + (p.empty() ? std::string("the root") : "\"" + p + "\"") +
              (p.empty() ? ", which fully_shard is always called on last by itself; leave it out"
                         : ", which is no module of the model; name a module by its dotted path"),
          {p});
    for (const auto& p : calls_.named_twice)
      add("fsdp2_applied_twice", Severity::Error,
          "\"groups\" names '" + p +
              "' twice: fully_shard refuses a module it was applied to already (\"Each distinct composable "
              "distributed API can only be applied to a module once\"); name it in one group",
          {p});
  }

  // _fsdp_init.py: _validate_module refuses a ModuleList/ModuleDict (no
  // forward of its own). A .pt2 records a class only for modules whose
  // forward ran during torch.export; the loader guesses ModuleList/ModuleDict
  // for the rest from their children (export_program.cpp: infer_class). A
  // Sequential the parent iterates over, or peft's LoraModel (PeftModel.forward
  // calls the model inside it), looks the same and has a forward, so a guess
  // only warns. What the guess cannot change: FSDP2 all-gathers a group in the
  // forward pre-hook of its module (_fsdp_state.py: FSDPState.init registers
  // _pre_forward), so a module that is never called leaves the parameters it
  // manages sharded, and the first module using them fails on a DTensor.
  void containers() {
    const TreeClasses& classes = matcher_.classes(tree_);
    std::vector<int8_t> container(classes.size(), -1);  // per class, once asked
    static const std::string kRefusal = "\"fully_shard does not support containers that do not implement forward\"";
    static const std::string kSharded =
        "FSDP2 all-gathers a group's parameters in the forward pre-hook of its module, so if training does not "
        "call that forward either, they stay sharded and the first module that uses them fails on a DTensor "
        "(\"got mixed torch.Tensor and DTensor\")";
    for (const Unit& u : plan_.units) {
      bool warned = false, called = false;
      for (ModuleId m : u.modules) {
        called = called || m == 0 || tree_.module(m).class_source == ClassSource::Recorded;
        if (m == 0) continue;
        const int32_t c = classes.of(static_cast<size_t>(m));
        int8_t& known = container[static_cast<size_t>(c)];
        if (known < 0) known = matcher_.is_instance(classes.qualified(c), module_container_classes());
        if (!known) continue;
        const std::string cls(short_name(classes.qualified(c)));
        if (tree_.module(m).class_source != ClassSource::Inferred) {  // Recorded or Listed: exact
          add("fsdp2_container", Severity::Error,
              "fully_shard is called on " + quoted_path(tree_.path(m)) + " (" + cls + "), and PyTorch refuses it: " +
                  kRefusal + "; shard its elements instead, or name them in one group (fully_shard([a, b]))",
              {tree_.path(m)});
          refused_.push_back(plan_.warnings.size() - 1);
          refused_modules_.push_back(m);
          const std::string& q = classes.qualified(c);  // torch.nn.modules.container.ModuleList: torch.nn.ModuleList
          const std::string named = q.rfind("torch.nn.modules.", 0) == 0 ? "torch.nn." + cls : q;
          if (std::find(refused_classes_.begin(), refused_classes_.end(), named) == refused_classes_.end())
            refused_classes_.push_back(named);
          warned = true;  // refused: that its forward never ran adds nothing
          continue;
        }
        const bool alone = u.modules.size() == 1 && !u.params.empty();
        add("fsdp2_container", Severity::Warning,
            "fully_shard is called on " + quoted_path(tree_.path(m)) + ", whose class is inferred as " + cls +
                " (not recorded: its forward never ran during torch.export): if it is a ModuleList or ModuleDict, "
                "PyTorch refuses it (" + kRefusal + "); if it has a forward that its parent iterates over or skips " +
                "(a Sequential, peft's LoraModel), fully_shard accepts it" + (alone ? ", but " + kSharded : "") +
                ". Shard its elements instead, or name them in one group (fully_shard([a, b]))",
            {tree_.path(m)});
        warned = true;
      }
      if (warned || called || u.params.empty()) continue;
      add("fsdp2_not_called", Severity::Warning,
          "fully_shard is called on " + unit_name(u) + ", whose forward never ran during torch.export" +
              (u.modules.size() == 1 ? "" : " (none of the group's modules ran)") + ": " + kSharded +
              "; shard the module that uses its parameters instead",
          {tree_.path(u.module)});
    }
  }

  // A size policy selects every module over the threshold, containers too
  // (Accelerate's rule; Accelerate 1.15's fsdp2_prepare_model then stops at
  // fully_shard(ModuleList) with the same ValueError). Two fixes, each checked
  // by planning again: the containers' classes in exclude_wrap_modules, which
  // fsdp-plan's size rule then skips (Accelerate has no such setting), and a
  // threshold no refused container is over, which Accelerate can say.
  void container_fix() {
    const std::vector<size_t>& refused = refused_;
    const std::vector<ModuleId>& modules = refused_modules_;
    const std::vector<std::string>& classes = refused_classes_;
    if (!replan_ || refused.empty() || !plan_.policy.min_num_params) return;
    auto calls = [](const Plan& p) {
      return std::to_string(p.units.size()) + " fully_shard call" + (p.units.size() == 1 ? "" : "s");
    };
    Policy excluded = plan_.policy;
    if (!excluded.exclude_wrap_given) excluded.exclude_wrap_modules.clear();
    for (const auto& c : classes)
      if (std::find(excluded.exclude_wrap_modules.begin(), excluded.exclude_wrap_modules.end(), c) ==
          excluded.exclude_wrap_modules.end())
        excluded.exclude_wrap_modules.push_back(c);
    excluded.exclude_wrap_given = true;
    const nlohmann::ordered_json fragment = {{"exclude_wrap_modules", classes}};
    const Plan skipped = (*replan_)(excluded);
    const bool skip_works = fix_works(plan_, skipped, "fsdp2_container", Severity::Error);
    // sum(p.numel() for p in module.parameters()), as the rule counts.
    const std::vector<int64_t> numel = subtree_numel(tree_, std::vector<bool>(tree_.num_tensors(), false));
    int64_t threshold = 0;
    for (ModuleId m : modules) threshold = std::max(threshold, numel[static_cast<size_t>(m)]);
    Policy raised = plan_.policy;
    raised.min_num_params = threshold;
    const Plan above = (*replan_)(raised);
    // Worth saying only if it shards more than the root.
    const bool raise_works = threshold > *plan_.policy.min_num_params && above.units.size() > 1 &&
                             fix_works(plan_, above, "fsdp2_container", Severity::Error);
    std::string text = ". Accelerate does the same with this threshold: its fsdp2_prepare_model calls fully_shard on "
                       "every module over fsdp_min_num_params and stops with this ValueError";
    if (skip_works)
      text += ". Fix: add " + fragment.dump() + " to the policy; fsdp-plan's size rule then skips them (" +
              calls(skipped) + "; Accelerate has no such setting: --emit torch writes the calls)";
    if (raise_works)
      text += std::string(skip_works ? "; or" : ". Fix:") + " \"min_num_params\": " + std::to_string(threshold) +
              " (Accelerate's fsdp_min_num_params), which no container is over (" + calls(above) +
              ", the modules above the containers only)";
    for (size_t i : refused) {
      Warning& w = plan_.warnings[i];
      w.message += text;
      if (skip_works) w.fix = fragment;
    }
  }

  void scalars() {
    for (const Unit& u : plan_.units)
      for (const auto& o : u.params)
        if (tree_.tensor(o.tensor).shape.empty()) {
          const std::string name = plan_.param_name(o);
          add("fsdp2_scalar_param", Severity::Error,
              "parameter " + name + " is 0-dim, and fully_shard refuses it: \"fully_shard doesn't support scalar "
                  "parameters. Change " + name + " to a 1D tensor with numel equal to 1.\"",
              {tree_.path(o.module)}, {name});
        }
  }

  // Python for a module path: model.layers.3.mlp.gate -> model.layers[3].mlp.gate, on `model`.
  std::string python_path(ModuleId m) const {
    std::string out = "model";
    const std::string path = tree_.path(m);
    size_t start = 0;
    while (start < path.size() && m != 0) {
      size_t dot = path.find('.', start);
      if (dot == std::string::npos) dot = path.size();
      const std::string part = path.substr(start, dot - start);
      const bool index = !part.empty() && part.find_first_not_of("0123456789") == std::string::npos;
      out += index ? "[" + part + "]" : "." + part;
      start = dot + 1;
    }
    return out;
  }

  // The code that splits a group's trainable parameters of the smaller dtypes
  // (by elements) off into calls of their own, made first (bottom-up, as
  // fully_shard wants: a module already sharded is left out of its parent's
  // group): "fully_shard(model.layers[3].mlp.gate) before fully_shard(model.layers[3])"
  // (DeepSeek-V3's router, which transformers keeps in float32). "" when a module
  // holds parameters of two dtypes itself, so no call can separate them.
  std::string minority_calls(const Unit& u) const {
    std::map<std::string, int64_t> numel;
    for (const auto& o : u.params)
      if (tree_.tensor(o.tensor).requires_grad) numel[tree_.tensor(o.tensor).dtype] += tree_.numel(o.tensor);
    std::string major;
    for (const auto& [d, n] : numel)
      if (major.empty() || n > numel[major]) major = d;
    std::map<ModuleId, std::set<std::string>> dtypes_of;
    for (const auto& o : u.params) dtypes_of[o.module].insert(tree_.tensor(o.tensor).dtype);
    std::vector<ModuleId> split;
    for (const auto& [m, ds] : dtypes_of) {
      if (!ds.count(major) && m != u.module) split.push_back(m);
      if (ds.count(major) && ds.size() > 1) return "";
    }
    if (split.empty()) return "";
    std::string out;
    for (size_t i = 0; i < split.size() && i < 3; ++i)
      out += (i ? ", " : "") + std::string("fully_shard(") + python_path(split[i]) + ")";
    if (split.size() > 3) out += " (and " + std::to_string(split.size() - 3) + " more)";
    return out + " before fully_shard(" + python_path(u.module) + ")";
  }

  // _init_mp_dtypes at the first forward: one original dtype among the
  // group's trainable parameters (2.8+; 2.6 and 2.7 check all parameters).
  void dtypes() {
    for (const Unit& u : plan_.units) {
      if (one_dtype(tree_, u.params)) continue;
      std::set<std::string> trainable, frozen;
      for (const auto& o : u.params) {
        const TensorInfo& t = tree_.tensor(o.tensor);
        (t.requires_grad ? trainable : frozen).insert(t.dtype);
      }
      const std::string where = "group " + unit_name(u);
      if (trainable.size() > 1) {
        const std::string code = minority_calls(u);
        add("fsdp2_mixed_dtype", Severity::Error,
            where + " has trainable parameters of dtypes " + join({trainable.begin(), trainable.end()}) +
                ", and PyTorch fails at the first forward: \"FSDP expects uniform original parameter dtype\"; " +
                (code.empty() ? "cast them to one dtype before fully_shard, or shard the modules of each dtype in "
                                "groups of their own"
                              : "fix: " + code + ", so each group's trainable parameters share one dtype (or "
                                "cast them to one dtype before fully_shard)"),
            {tree_.path(u.module)});
        continue;
      }
      std::set<std::string> all = trainable;
      all.insert(frozen.begin(), frozen.end());
      if (all.size() > 1)
        add("fsdp2_frozen_dtype", Severity::Warning,
            where + " has frozen parameters of another dtype than its trainable ones (" +
                join({all.begin(), all.end()}) +
                "): PyTorch 2.8 and later accept it (only trainable parameters must share a dtype, and the "
                "all-gather runs in bytes), 2.6 and 2.7 refuse it at the first forward (\"FSDP expects uniform "
                "original parameter dtype\"); with those, shard the frozen modules in a group of their own",
            {tree_.path(u.module)});
    }
  }

  // The same tensor managed by two calls: two sharded copies.
  void shared() {
    std::vector<int32_t> uses(tree_.num_tensors(), 0);  // most tensors have one: only the others are listed
    for (const Unit& u : plan_.units)
      for (const auto& o : u.params) ++uses[static_cast<size_t>(o.tensor)];
    std::map<TensorId, std::vector<size_t>> units_of;
    for (size_t i = 0; i < plan_.units.size(); ++i)
      for (const auto& o : plan_.units[i].params)
        if (uses[static_cast<size_t>(o.tensor)] > 1) units_of[o.tensor].push_back(i);
    for (const auto& [t, list] : units_of) {
      if (list.size() < 2) continue;
      std::vector<std::string> names, modules, groups;
      for (size_t i : list) {
        for (const auto& o : plan_.units[i].params)
          if (o.tensor == t) names.push_back(plan_.param_name(o));
        groups.push_back(unit_name(plan_.units[i]));
        modules.push_back(tree_.path(plan_.units[i].module));
      }
      add("fsdp2_shared_param", Severity::Error,
          "one tensor (" + join(names) + ") is managed by " + std::to_string(list.size()) + " fully_shard groups (" +
              join(groups) + "): PyTorch 2.13 and later fail at the first forward (\"Parameter '" + names[0] +
              "' is shared with a parameter already managed by another FSDP group\"), 2.6 silently unties it "
              "into separately trained copies; put the modules that share it in one call, e.g. a \"groups\" "
              "entry (fully_shard([a, b]))",
          modules, names);
    }
  }

  void reshard_ranks() {
    const int64_t shard = plan_.mesh.fsdp_shard_size();
    for (const Unit& u : plan_.units) {
      const auto& r = u.reshard_after_forward;
      if (!r || r->kind != ReshardAfterForward::Kind::Ranks || shard % r->ranks == 0) continue;
      add("fsdp2_reshard_ranks", Severity::Error,
          "group " + unit_name(u) + " has reshard_after_forward " + std::to_string(r->ranks) +
              ", and fully_shard refuses it: \"If passing reshard_after_forward as an int, it should be a factor "
              "of " + std::to_string(shard) + ", not " + std::to_string(r->ranks) + "\"",
          {tree_.path(u.module)});
    }
  }

  Plan& plan_;
  const ModuleTree& tree_;
  const Fsdp2Calls& calls_;
  const ClassMatcher& matcher_;
  const Replan* replan_;
  // containers(): the fsdp2_container errors (warning index, module, class as a policy names it).
  std::vector<size_t> refused_;
  std::vector<ModuleId> refused_modules_;
  std::vector<std::string> refused_classes_;
};

}  // namespace

void analyse_fsdp2(Plan& plan, const Fsdp2Calls& calls, const ClassMatcher& matcher, const Replan* replan) {
  Refusals(plan, calls, matcher, replan).run();
}

}  // namespace fsdp_plan
