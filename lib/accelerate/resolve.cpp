// Accelerate's rules on the model a config is planned for (config.h):
// its class and ignored-module lookups, and what it checkpoints.
#include "accelerate/config.h"

#include <re2/re2.h>

#include <map>
#include <memory>
#include <set>

#include "accelerate/python_regex.h"
#include "model/class_names.h"
#include "model/loaders/printable.h"
#include "util/errors.h"
#include "util/strings.h"

namespace fsdp_plan {

void resolve_accelerate_config(AccelerateConfig& config, const ModuleTree& tree) {
  const std::vector<ModuleId> order = tree.preorder();
  if (config.auto_wrap_policy == "TRANSFORMER_BASED_WRAP" && !config.class_names) {
    // FullyShardedDataParallelPlugin.set_auto_wrap_policy (FSDP2: fsdp_utils.py:
    // fsdp2_prepare_auto_wrap_policy): list(model._no_split_modules), or [] for None, then the
    // same lookup as a class list in the config.
    const ModelRecord* record = tree.record();
    if (record && record->no_split_modules) {
      config.class_names = *record->no_split_modules;
      Warning w = make_warning("accelerate_config",
                               "fsdp_transformer_layer_cls_to_wrap not set: Accelerate wraps the classes in "
                               "model._no_split_modules, which " + record->source + " records: " +
                                   (config.class_names->empty() ? std::string("[] (none)") : join(*config.class_names)));
      w.classes = *config.class_names;
      config.warnings.push_back(std::move(w));
    } else {
      config.class_names = std::vector<std::string>{};
      config.warnings.push_back(make_warning(
          "accelerate_config_key",
          record ? "fsdp_transformer_layer_cls_to_wrap: not set: Accelerate wraps the classes in "
                   "model._no_split_modules, and " + record->source + " records that the model has none (None); "
                   "planned with no class, as Accelerate does (only the root unit). Name the classes in "
                   "fsdp_transformer_layer_cls_to_wrap or with --module-classes"
                 : "fsdp_transformer_layer_cls_to_wrap: not set: Accelerate wraps the classes in "
                   "model._no_split_modules, which this file does not record (fsdp-plan-export writes it into a "
                   ".pt2); planned with no class, as Accelerate does for a model without _no_split_modules (only "
                   "the root unit). Name the classes in fsdp_transformer_layer_cls_to_wrap or with "
                   "--module-classes"));
    }
    config.policy.module_classes = config.class_names;
  }
  if (config.class_names) {
    // get_module_class_from_name: the first module in pre-order whose bare
    // class name equals the name; then isinstance() against that class.
    std::vector<std::string> resolved;
    std::set<std::string> model_classes;
    std::map<std::string, std::set<std::string>> by_short;  // bare name -> qualified classes
    for (ModuleId m : order) {
      std::string q = demangle(tree.module(m).type_name);
      model_classes.insert(std::string(short_name(q)));
      by_short[std::string(short_name(q))].insert(q);
    }
    for (const auto& name : *config.class_names) {
      std::string found;
      for (ModuleId m : order) {
        std::string q = demangle(tree.module(m).type_name);
        if (short_name(q) == name) {
          found = q;
          break;
        }
      }
      if (found.empty()) {
        std::vector<std::string> candidates(model_classes.begin(), model_classes.end());
        auto near = closest(name, candidates);
        Warning w = make_warning("accelerate_class_missing",
                                 "Accelerate would stop: ValueError: Could not find the transformer layer class " +
                                     name + " in the model." +
                                     (near.empty() ? "" : " Closest class names in the model: " + join(near) + "."));
        w.classes = {name};
        w.suggestions = std::move(near);
        config.warnings.push_back(std::move(w));
        continue;
      }
      // The bare name is exact unless another class in the model shares it.
      resolved.push_back(by_short[name].size() > 1 ? found : name);
    }
    config.policy.module_classes = resolved;
  }
  if (config.ignored_modules_regex) {
    // Accelerate: [m for name, m in named_modules() if re.fullmatch(regex, name)].
    std::string why;
    const std::unique_ptr<RE2> re = compile_python_regex(*config.ignored_modules_regex, why);
    if (!re) throw InputError("fsdp_ignored_modules", why);  // parse_accelerate_config checked it
    std::vector<std::string> paths;
    for (ModuleId m : order) {
      std::string path = tree.path(m);
      if (RE2::FullMatch(path, *re)) paths.push_back(path);
    }
    if (paths.empty()) {
      config.warnings.push_back(make_warning("accelerate_config_key",
                                             "fsdp_ignored_modules: \"" + quoted_input(*config.ignored_modules_regex) +
                                                 "\" fully matches no module path, so Accelerate ignores no module"));
    }
    config.policy.ignored_modules = paths;
  }
}

std::optional<ActivationCheckpointing> accelerate_activation_checkpointing(const AccelerateConfig& config,
                                                                          const ModuleTree& tree,
                                                                          FsdpVersion version,
                                                                          std::vector<Warning>& warnings) {
  if (!config.activation_checkpointing) return std::nullopt;
  if (config.activation_checkpointing_offload)
    warnings.push_back(make_warning(
        "accelerate_config_key",
        "fsdp_activation_checkpointing_offload: offload_wrapper moves each checkpointed layer's saved input to "
        "pinned host memory; the plan counts it on the device (an upper bound by those inputs)"));
  const bool v2 = version == FsdpVersion::V2;
  ActivationCheckpointing ac;
  if (config.auto_wrap_policy == "TRANSFORMER_BASED_WRAP") {
    // The classes resolve_accelerate_config found (the policy's module_classes).
    if (config.policy.module_classes) ac.module_classes = *config.policy.module_classes;
    if (ac.module_classes.empty()) {
      warnings.push_back(make_warning("accelerate_config_key",
                                      "fsdp_activation_checkpointing: no transformer layer class to checkpoint, so "
                                      "Accelerate checkpoints no module"));
      return std::nullopt;
    }
    return ac;
  }
  const int64_t min_params = config.policy.min_num_params.value_or(0);
  const bool sized = config.auto_wrap_policy == "SIZE_BASED_WRAP" && min_params > 0;
  if (v2) {
    if (!sized) {
      warnings.push_back(make_warning(
          "accelerate_ac_refused",
          "Accelerate would stop: TypeError: 'NoneType' object is not callable (fsdp2_apply_ac calls the FSDP2 "
          "auto-wrap policy, which " +
              std::string(config.auto_wrap_policy == "NO_WRAP" ? "fsdp_auto_wrap_policy NO_WRAP"
                                                               : "fsdp_min_num_params 0") +
              " leaves None); set fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP with the layer class, or turn "
              "fsdp_activation_checkpointing off. Planned without activation checkpointing"));
      return std::nullopt;
    }
    // fsdp2_prepare_auto_wrap_policy, size: sum(p.numel() for p in module.parameters()) > min_num_params,
    // on every module but the root; an inner one adds nothing to its checkpointed parent.
    const std::vector<int64_t> numel = subtree_numel(tree, std::vector<bool>(tree.num_tensors(), false));
    std::vector<bool> inside(tree.num_modules(), false);
    for (ModuleId m : tree.preorder()) {
      if (m == 0) continue;
      const ModuleId parent = tree.module(m).parent;
      if (parent >= 0 && inside[static_cast<size_t>(parent)]) {
        inside[static_cast<size_t>(m)] = true;
        continue;
      }
      if (numel[static_cast<size_t>(m)] > min_params) {
        ac.modules.push_back(tree.path(m));
        inside[static_cast<size_t>(m)] = true;
      }
    }
    if (ac.modules.empty()) return std::nullopt;
    return ac;
  }
  if (!sized) {
    // apply_activation_checkpointing(model, auto_wrap_policy=None): check_fn's default wraps
    // every child, first the FullyShardedDataParallel root's own child: the whole model.
    warnings.push_back(make_warning(
        "accelerate_config_key",
        "fsdp_activation_checkpointing with " +
            std::string(config.auto_wrap_policy == "NO_WRAP" ? "fsdp_auto_wrap_policy NO_WRAP"
                                                             : "fsdp_min_num_params 0") +
            ": apply_activation_checkpointing gets no policy and checkpoints the whole model (the FSDP root's "
            "child), which saves nothing: its recompute in backward holds what a plain forward does"));
    ac.modules.push_back("");
    return ac;
  }
  warnings.push_back(make_warning(
      "accelerate_config_key",
      "fsdp_activation_checkpointing with SIZE_BASED_WRAP: Accelerate checkpoints by size on the already sharded "
      "model (size_based_auto_wrap_policy over the flat parameters' local shards); the plan checkpoints the FSDP "
      "units' modules instead (an estimate)"));
  // The recursive size rule FSDP1 wrapped the unsharded model by (wrap.py: _recursive_wrap with
  // size_based_auto_wrap_policy): children first; a module is wrapped when what its wrapped
  // descendants leave is at least min_num_params; ModuleList and ModuleDict never are.
  const std::vector<int64_t> numel = subtree_numel(tree, std::vector<bool>(tree.num_tensors(), false));
  std::vector<int64_t> wrapped_below(tree.num_modules(), 0);
  std::vector<bool> wrapped(tree.num_modules(), false);
  for (ModuleId m : tree.postorder()) {
    const Module& mod = tree.module(m);
    for (ModuleId c : mod.children)
      wrapped_below[static_cast<size_t>(m)] +=
          wrapped[static_cast<size_t>(c)] ? numel[static_cast<size_t>(c)] : wrapped_below[static_cast<size_t>(c)];
    const std::string cls(short_name(demangle(mod.type_name)));
    if (m != 0 && numel[static_cast<size_t>(m)] - wrapped_below[static_cast<size_t>(m)] >= min_params &&
        cls != "ModuleList" && cls != "ModuleDict")
      wrapped[static_cast<size_t>(m)] = true;
  }
  std::vector<bool> inside(tree.num_modules(), false);
  for (ModuleId m : tree.preorder()) {
    const ModuleId parent = tree.module(m).parent;
    if (parent >= 0 && (inside[static_cast<size_t>(parent)] || wrapped[static_cast<size_t>(parent)]))
      inside[static_cast<size_t>(m)] = true;
    if (wrapped[static_cast<size_t>(m)] && !inside[static_cast<size_t>(m)]) ac.modules.push_back(tree.path(m));
  }
  if (ac.modules.empty()) return std::nullopt;
  return ac;
}

}  // namespace fsdp_plan
