#include "plan/analysis.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "model/aliases.h"
#include "model/class_names.h"
#include "model/module_tree.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

class Analysis {
 public:
  Analysis(Plan& plan, const Ignored& ignored, const ClassMatcher& matcher)
      : plan_(plan), tree_(*plan.tree), ignored_(ignored), matcher_(matcher), classes_(matcher.classes(tree_)) {}

  void run() {
    summarise_model();
    size_units();
    nested_wrap();
    if (!plan_.v2()) {  // FSDP2's own rules: fsdp2/warnings.cpp
      mixed_precision();
      shared_params();
    }
    mixed_precision_noop();
    not_modelled();
    empty_units();
    unmatched_classes();
    unmatched_globs();
    unrecorded_classes();
  }

 private:
  void add(std::string kind, Severity sev, std::string message, std::vector<std::string> modules = {},
           std::vector<std::string> classes = {}) {
    Warning w = make_warning(kind, sev, std::move(message));
    w.modules = std::move(modules);
    w.classes = std::move(classes);
    plan_.warnings.push_back(std::move(w));
  }

  // Demangled once per tree (ClassMatcher::classes).
  const std::string& short_class(ModuleId m) const {
    return classes_.short_name(classes_.of(static_cast<size_t>(m)));
  }

  void summarise_model() {
    ModelSummary& s = plan_.model;
    s.root_class = short_class(0);
    s.num_modules = static_cast<int64_t>(tree_.num_modules());
    std::vector<bool> param_seen(tree_.num_tensors(), false), buffer_seen(tree_.num_tensors(), false);
    for (const auto& m : tree_.modules()) {
      for (const auto& p : m.params) {
        if (param_seen[static_cast<size_t>(p.tensor)]) continue;
        param_seen[static_cast<size_t>(p.tensor)] = true;
        s.param_numel += tree_.numel(p.tensor);
        s.param_bytes += tree_.bytes(p.tensor);
      }
      for (const auto& b : m.buffers) {
        if (buffer_seen[static_cast<size_t>(b.tensor)]) continue;
        buffer_seen[static_cast<size_t>(b.tensor)] = true;
        s.buffer_numel += tree_.numel(b.tensor);
        s.buffer_bytes += tree_.bytes(b.tensor);
      }
    }
  }

  void size_units() {
    for (Unit& u : plan_.units) {
      for (const auto& o : u.params) {
        u.param_numel += tree_.numel(o.tensor);
        u.param_bytes += tree_.bytes(o.tensor);
        (tree_.tensor(o.tensor).requires_grad ? u.trainable_numel : u.frozen_numel) += tree_.numel(o.tensor);
      }
      for (const auto& o : u.buffers) {
        u.buffer_numel += tree_.numel(o.tensor);
        u.buffer_bytes += tree_.bytes(o.tensor);
      }
    }
    // The unit whose walk covers each module: its own, or its nearest unit ancestor's.
    unit_of_.assign(tree_.num_modules(), -1);
    for (size_t i = 0; i < plan_.units.size(); ++i) unit_of_[static_cast<size_t>(plan_.units[i].module)] = static_cast<int>(i);
    for (size_t m = 1; m < tree_.num_modules(); ++m)
      if (unit_of_[m] < 0) unit_of_[m] = unit_of_[static_cast<size_t>(tree_.modules()[m].parent)];
  }

  // FSDP refuses a model that already has FSDP applied (_check_nested_wrapping).
  void nested_wrap() {
    std::vector<std::string> modules;
    std::vector<bool> wrapper_class(classes_.size());  // once per class
    for (size_t c = 0; c < classes_.size(); ++c) {
      const std::string& cls = classes_.short_name(static_cast<int32_t>(c));
      wrapper_class[c] = cls == "FullyShardedDataParallel" || cls == "FlattenParamsWrapper" || cls.rfind("FSDP", 0) == 0;
    }
    // string_view: compared by length first (every module and parameter, every plan suggest makes).
    using namespace std::string_view_literals;
    for (ModuleId m : tree_.preorder()) {
      const Module& mod = tree_.module(m);
      bool wrapper = wrapper_class[static_cast<size_t>(classes_.of(static_cast<size_t>(m)))] ||
                     mod.name == "_fsdp_wrapped_module"sv || mod.name == "_fpw_module"sv;
      for (const auto& p : mod.params) wrapper = wrapper || p.name == "_flat_param"sv || p.name == "flat_param"sv;
      if (wrapper) modules.push_back(tree_.path(m));
    }
    if (modules.empty()) return;
    add("nested_wrap", Severity::Error,
        "the model already has FSDP applied (at " + listing(modules) +
            "); FSDP auto wrapping would refuse it. Save the model before wrapping it with FSDP.",
        modules);
  }

  // A param_dtype every trainable parameter already has casts nothing: FSDP
  // shards parameters in it, and their gradients and the optimizer state are
  // in it too (issue 41, item 2). torchtitan builds its model in float32 and
  // Accelerate casts to float32 (plan/master_weights.h): both keep fp32 masters.
  void mixed_precision_noop() {
    const auto& mp = plan_.policy.mixed_precision;
    if (!mp || !mp->param_dtype) return;
    int64_t trainable = 0;
    for (TensorId t = 0; t < static_cast<TensorId>(tree_.num_tensors()); ++t) {
      if (!tree_.is_param(t) || !tree_.tensor(t).requires_grad) continue;
      if (tree_.tensor(t).dtype != *mp->param_dtype) return;
      ++trainable;
    }
    if (trainable == 0) return;
    const std::string& d = *mp->param_dtype;
    add("mixed_precision_noop", Severity::Warning,
        "mixed_precision.param_dtype " + d + " is the dtype every trainable parameter already has, so it casts "
            "nothing: FSDP shards " + d + " parameters, and their gradients and optimizer state are " + d +
            " too (no fp32 master weights; torchtitan builds its model in float32, Accelerate casts it to "
            "float32); to plan fp32 masters, export the model in float32 (fsdp-plan-export --dtype float32) or "
            "set \"fsdp\": {\"fp32_master_weights\": true}");
  }

  // What the model suggests and the plan does not model (issue 41, item 10;
  // docs/limits.md): torchao's float8 linears (Float8Linear: an fp8
  // all-gather carries half a bf16 one's bytes) and MoE experts (expert
  // parallelism: an ep plan would hold 1/ep of them; here FSDP shards them
  // like every other parameter).
  void not_modelled() {
    std::string float8, experts;
    for (ModuleId m = 0; m < static_cast<ModuleId>(tree_.num_modules()); ++m) {
      const std::string& cls = short_class(m);
      // path() only for the first hit: it is as long as the module is deep.
      if (float8.empty() && cls.rfind("Float8", 0) == 0) float8 = tree_.path(m) + " (" + cls + ")";
      if (experts.empty() && tree_.module(m).name == "experts") experts = tree_.path(m);
    }
    if (!float8.empty())
      add("not_modelled", Severity::Info,
          "float8 training (" + float8 + "): not modelled: its parameters are counted, gathered and reduced in "
              "their stored dtype, not float8 (torchao's float8 all-gather carries half a bf16 one's bytes), and "
              "its matmuls at the bf16 peak");
    if (!experts.empty() && !plan_.policy.expert_parallel)
      add("not_modelled", Severity::Info,
          "MoE experts at " + experts + ", ...: planned without expert parallelism: FSDP shards the experts "
              "like every other parameter over the whole FSDP mesh; \"expert_parallel\": {\"degree\": N} plans "
              "torchtitan's (1/ep of them per rank, all-to-all dispatch; docs/expert-parallel.md)");
  }

  void mixed_precision() {
    const auto& mp = plan_.policy.mixed_precision;
    if (!mp) return;
    // FSDP overrides ignored classes only when it auto-wraps (_auto_wrap).
    const bool overrides = plan_.policy.auto_wrap();
    ClassSet ignore(tree_, matcher_, overrides ? mp->ignore_classes : std::vector<std::string>{});
    for (Unit& u : plan_.units) u.mixed_precision = !ignore.contains(u.module);
    if (!overrides) return;
    std::set<std::string> classes;
    std::vector<std::string> modules;
    for (ModuleId m : tree_.preorder()) {
      if (!ignore.contains(m)) continue;
      classes.insert(short_class(m));
      modules.push_back(tree_.path(m));
    }
    if (modules.empty()) return;
    std::vector<std::string> cls(classes.begin(), classes.end());
    add("mixed_precision_override", Severity::Warning,
        "mixed precision and an auto-wrap policy are both set: " + std::to_string(modules.size()) +
            " module(s) of class " + join(cls) +
            " are wrapped as separate FSDP units with mixed precision disabled",
        modules, cls);
  }

  // Units from each of `units` up to, not including, their lowest common
  // enclosing unit: unwrapping them puts every use in that one unit.
  int common_unit(const std::set<int>& units) const {
    auto chain = [&](int u) {
      std::vector<int> c;
      for (; u >= 0; u = plan_.units[static_cast<size_t>(u)].parent) c.push_back(u);
      return std::vector<int>(c.rbegin(), c.rend());  // root first
    };
    std::vector<int> common = chain(*units.begin());
    for (int u : units) {
      std::vector<int> c = chain(u);
      size_t n = 0;
      while (n < common.size() && n < c.size() && common[n] == c[n]) ++n;
      common.resize(n);
    }
    return common.back();
  }
  std::string common_unit_name(const std::set<int>& units) const {
    return quoted_path(tree_.path(plan_.units[static_cast<size_t>(common_unit(units))].module));
  }
  std::vector<int> units_below_common(const std::set<int>& units) const {
    const int top = common_unit(units);
    std::set<int> out;
    for (int u : units)
      for (; u != top; u = plan_.units[static_cast<size_t>(u)].parent) out.insert(u);
    return {out.begin(), out.end()};
  }

  // A tensor used by modules in different units (a tied weight split). FSDP1
  // builds units bottom-up; without use_orig_params each unit flattens its
  // own copy, with it the first unit built holds the tensor (fsdp1/units.h).
  void shared_params() {
    struct Use {
      ModuleId module;
      const std::string* name;
    };
    const std::vector<ModuleId> preorder = tree_.preorder();
    // Most tensors have one use; only those with more can be shared.
    std::vector<int> count(tree_.num_tensors(), 0);
    for (ModuleId m : preorder)
      for (const auto& p : tree_.module(m).params) ++count[static_cast<size_t>(p.tensor)];
    std::map<TensorId, std::vector<Use>> uses;  // ordered: stable output
    for (ModuleId m : preorder)
      for (const auto& p : tree_.module(m).params)
        if (count[static_cast<size_t>(p.tensor)] > 1 && !ignored_.tensor[static_cast<size_t>(p.tensor)])
          uses[p.tensor].push_back({m, &p.name});

    struct Found {
      size_t first_use;  // ordinal of the first use, for a stable order
      TensorId tensor;
      std::set<int> units;  // units reaching it, in module order
    };
    std::vector<Found> found;
    std::vector<size_t> order(tree_.num_modules());
    size_t ordinal = 0;
    for (ModuleId m : preorder) order[static_cast<size_t>(m)] = ordinal++;
    for (const auto& [t, list] : uses) {
      std::set<int> units;
      for (const auto& u : list) units.insert(unit_of_[static_cast<size_t>(u.module)]);
      if (units.size() > 1) found.push_back({order[static_cast<size_t>(list.front().module)], t, std::move(units)});
    }
    if (found.empty()) return;
    std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) { return a.first_use < b.first_use; });
    std::vector<std::vector<int>> holders(tree_.num_tensors());
    for (const Found& f : found) holders[static_cast<size_t>(f.tensor)].clear();
    for (size_t i = 0; i < plan_.units.size(); ++i)
      for (const auto& o : plan_.units[i].params)
        if (count[static_cast<size_t>(o.tensor)] > 1) holders[static_cast<size_t>(o.tensor)].push_back(static_cast<int>(i));
    const bool orig = plan_.policy.fsdp.use_orig_params;
    for (const auto& f : found) {
      const auto& list = uses[f.tensor];
      std::vector<std::string> names, modules, units;
      for (const auto& u : list) {
        names.push_back(tree_.qualify(u.module, *u.name));
        modules.push_back(tree_.path(u.module));
      }
      for (int u : f.units) units.push_back(quoted_path(tree_.path(plan_.units[static_cast<size_t>(u)].module)));
      const auto& held = holders[static_cast<size_t>(f.tensor)];
      const TensorInfo& t = tree_.tensor(f.tensor);
      std::string message = "one tensor (" + std::to_string(t.numel()) + " elements) is used as " +
                            join(names) + " in units " + join(units) + ": ";
      if (!orig) {
        message += "FSDP1 (use_orig_params=False) flattens a copy into each, so it is held " +
                   std::to_string(held.size()) +
                   " times and the tie breaks at the first optimizer step (each copy gets its own gradient)";
      } else {
        const std::string owner =
            held.empty() ? "none" : quoted_path(tree_.path(plan_.units[static_cast<size_t>(held.front())].module));
        const FsdpSettings& fsdp = plan_.policy.fsdp;
        const bool sharded = fsdp.world_size > 1 && fsdp.strategy != ShardingStrategy::NoShard;
        message += "FSDP1 (use_orig_params=True) flattens it into the first unit built, " + owner +
                   " (units are built bottom-up); ";
        message += sharded ? "the others see only this rank's shard of it outside the forward of " + owner +
                                 ", so their forward fails (torch 2.13: \"size mismatch\")"
                           : "the others can use it only because parameters stay whole here (NO_SHARD); with "
                             "sharded parameters their forward fails (torch 2.13: \"size mismatch\")";
      }
      // The fix: no unit boundary between the uses and their lowest common enclosing unit.
      std::vector<std::string> to_unwrap;
      for (int u : units_below_common(f.units)) to_unwrap.push_back(quoted_path(tree_.path(plan_.units[static_cast<size_t>(u)].module)));
      message += "; fix: let " + common_unit_name(f.units) + " hold every use by not wrapping " +
                 join(to_unwrap);
      Warning w = make_warning("shared_param_across_units", std::move(message) + alias_hint(list));
      w.modules = std::move(modules);
      w.params = std::move(names);
      plan_.warnings.push_back(std::move(w));
    }
  }

  // When a user of the tensor has exactly the tensors of an earlier module,
  // it may be that module under a second name (a Python alias), which the
  // file cannot tell from a weight tie: say how to plan it as an alias.
  template <typename Uses>
  std::string alias_hint(const Uses& list) {
    if (plan_.policy.module_aliases) return "";
    if (alias_of_.empty()) alias_of_ = find_aliases(tree_);
    for (const auto& u : list) {
      for (ModuleId m = u.module; m > 0; m = tree_.module(m).parent) {
        const ModuleId first = alias_of_[static_cast<size_t>(m)];
        if (first < 0) continue;
        return "; if " + quoted_path(tree_.path(m)) + " is the very module object " + quoted_path(tree_.path(first)) +
               " under a second name (transformers 4's T5/BART), FSDP visits it once: plan with --aliases";
      }
    }
    return "";
  }

  void empty_units() {
    for (const Unit& u : plan_.units) {
      if (!u.params.empty()) continue;
      const bool root = u.module == 0;
      add("empty_unit", root ? Severity::Info : Severity::Warning,
          "unit " + quoted_path(tree_.path(u.module)) + " (" + short_class(u.module) +
              ") owns no parameters" + (root ? "" : ": it adds an FSDP unit that shards nothing"),
          {tree_.path(u.module)}, {short_class(u.module)});
    }
  }

  // The name that matches when `pattern` differs from a class of the model
  // only by case ("bottleneck" -> "Bottleneck") or by its dotted prefix
  // ("nn.Linear" -> "torch.nn.Linear"); "" if there is none.
  std::string exact_fix(const std::string& pattern, const std::set<std::string>& types) const {
    auto lower = [](std::string_view v) {
      std::string out(v);
      for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return out;
    };
    const std::string_view want = short_name(pattern);
    const std::string prefix = pattern.substr(0, pattern.size() - want.size());  // "nn." or ""
    for (const auto& t : types) {
      for (const auto& cls : matcher_.lineage(t)) {
        const std::string_view have = short_name(cls);
        if (have != want && lower(have) == lower(want)) {
          std::string fixed = prefix + std::string(have);
          return matcher_.is_instance(t, {fixed}) ? fixed : std::string(have);
        }
        if (have == want && !prefix.empty()) {
          // Put each package of the class in front: "torch" + "nn.Linear".
          const std::string module = cls.substr(0, cls.size() - have.size());
          for (size_t dot = module.find('.'); dot != std::string::npos; dot = module.find('.', dot + 1)) {
            std::string fixed = module.substr(0, dot) + "." + pattern;
            if (matcher_.is_instance(t, {fixed})) return fixed;
          }
          return std::string(have);
        }
      }
    }
    return "";
  }

  void unmatched_classes() {
    const std::set<std::string> types(classes_.all_qualified().begin(), classes_.all_qualified().end());
    // Class names the model has, its modules' bases included, for suggestions.
    std::set<std::string> known;
    for (const auto& t : types)
      for (const auto& c : matcher_.lineage(t)) known.insert(std::string(short_name(c)));
    const std::vector<std::string> candidates(known.begin(), known.end());

    // Suggestions are for a person reading the first few: past them a flood of unknown names
    // (100,000 classes in a policy) would cost an edit distance each, for every suggest candidate.
    constexpr size_t kSuggested = 16;
    size_t unmatched = 0;
    auto check = [&](const std::vector<std::string>& patterns, const std::string& key) {
      for (const auto& p : patterns) {
        // name_matches needs the short names equal: a name no lineage has matches nothing.
        bool hit = false;
        if (known.count(std::string(short_name(p))))
          for (const auto& t : types) hit = hit || matcher_.is_instance(t, {p});
        if (hit) continue;
        const bool suggest = unmatched++ < kSuggested;
        auto near = suggest ? closest(std::string(short_name(p)), candidates) : std::vector<std::string>{};
        const std::string exact = suggest ? exact_fix(p, types) : std::string();
        if (!exact.empty()) {
          near.erase(std::remove(near.begin(), near.end(), exact), near.end());
          near.insert(near.begin(), exact);
        }
        Warning w = make_warning("unmatched_class", "\"" + key + "\" names " + p + ", which matches no module in the model" +
                    (!exact.empty() ? "; did you mean " + exact + "?"
                     : near.empty() ? ""
                                    : "; closest class names in the model: " + join(near)));
        w.classes = {p};
        w.suggestions = std::move(near);
        plan_.warnings.push_back(std::move(w));
      }
    };
    const Policy& pol = plan_.policy;
    if (pol.module_classes) check(*pol.module_classes, "module_classes");
    if (pol.force_leaf_given) check(pol.force_leaf_modules, "force_leaf_modules");
    if (pol.exclude_wrap_given) check(pol.exclude_wrap_modules, "exclude_wrap_modules");
    if (pol.mixed_precision && pol.mixed_precision->ignore_classes_given)
      check(pol.mixed_precision->ignore_classes, "mixed_precision.ignore_classes");
    if (pol.activation_checkpointing)
      check(pol.activation_checkpointing->module_classes, "activation_checkpointing.module_classes");
    if (pol.compile) check(pol.compile->module_classes, "compile.module_classes");
  }

  void unmatched_globs() {
    for (const auto& g : ignored_.unmatched_module_globs)
      add("unmatched_ignore", Severity::Warning, "\"ignored_modules\" pattern \"" + g + "\" matches no module");
    for (const auto& g : ignored_.unmatched_param_globs)
      add("unmatched_ignore", Severity::Warning, "\"ignored_params\" pattern \"" + g + "\" matches no parameter");
    if (ignored_.root_ignored())
      add("ignored_root", Severity::Warning,
          "the root module is ignored, so every parameter is ignored; FSDP warns that this is not well supported",
          {""});
  }

  // A torch.export archive records the class only of modules whose forward
  // ran; policies decide by class, so say which modules they cannot see.
  void unrecorded_classes() {
    std::vector<std::string> unknown, inferred;
    for (ModuleId m = 0; m < static_cast<ModuleId>(tree_.num_modules()); ++m) {
      const ClassSource src = tree_.module(m).class_source;
      if (src == ClassSource::Unrecorded) unknown.push_back(tree_.path(m));
      if (src == ClassSource::Inferred) inferred.push_back(tree_.path(m));
    }
    auto shown = [](const std::vector<std::string>& paths) {
      std::vector<std::string> q;
      for (const auto& p : paths) q.push_back(quoted_path(p));
      return listing(q);
    };
    if (!unknown.empty()) {
      const bool one = unknown.size() == 1;
      add("unrecorded_class", Severity::Warning,
          std::to_string(unknown.size()) + (one ? " module has" : " modules have") + " no recorded class (" +
              (one ? "its" : "their") + " forward never ran during torch.export): " + shown(unknown) +
              "; no policy class but Module matches " + (one ? "it" : "them") +
              ", and a size policy treats " + (one ? "it as a plain module" : "them as plain modules"),
          unknown);
    }
    if (!inferred.empty()) {
      std::set<std::string> classes;
      for (ModuleId m = 0; m < static_cast<ModuleId>(tree_.num_modules()); ++m)
        if (tree_.module(m).class_source == ClassSource::Inferred) classes.insert(short_class(m));
      add("inferred_class", Severity::Info,
          std::to_string(inferred.size()) + (inferred.size() == 1 ? " module has" : " modules have") +
              " no recorded class (never called during torch.export), taken from " +
              (inferred.size() == 1 ? "its" : "their") + " contents: " + shown(inferred) + " as " +
              join({classes.begin(), classes.end()}),
          inferred, {classes.begin(), classes.end()});
    }
  }

  Plan& plan_;
  const ModuleTree& tree_;
  const Ignored& ignored_;
  const ClassMatcher& matcher_;
  std::vector<int> unit_of_;
  std::vector<ModuleId> alias_of_;  // find_aliases(tree_), when first needed
  const TreeClasses& classes_;
};

}  // namespace

void analyse(Plan& plan, const Ignored& ignored, const ClassMatcher& matcher) {
  Analysis(plan, ignored, matcher).run();
}

}  // namespace fsdp_plan
