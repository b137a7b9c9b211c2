// Accelerate 1.15.0's FSDP2 unit choice (utils/fsdp_utils.py::fsdp2_prepare_model).
#include <set>

#include "accelerate/config.h"
#include "model/class_names.h"
#include "model/module_tree.h"

namespace fsdp_plan {
namespace {


ModuleId child(const ModuleTree& tree, ModuleId parent, const std::string& name) {
  if (parent < 0) return -1;
  for (ModuleId c : tree.module(parent).children)
    if (tree.module(c).name == name) return c;
  return -1;
}

// get_module_children_bottom_up(model): a stack walk, children pushed in
// order, then the visit order reversed. The root comes last.
std::vector<ModuleId> bottom_up(const ModuleTree& tree) {
  std::vector<ModuleId> order, stack{0};
  while (!stack.empty()) {
    ModuleId m = stack.back();
    stack.pop_back();
    order.push_back(m);
    for (ModuleId c : tree.module(m).children) stack.push_back(c);
  }
  return {order.rbegin(), order.rend()};
}

}  // namespace

std::vector<ShardCall> accelerate_fsdp2_calls(const AccelerateConfig& config, const ModuleTree& tree,
                                              std::vector<Warning>& notes) {
  std::vector<ShardCall> calls;
  std::vector<bool> sharded(tree.num_modules(), false);
  auto shard = [&](std::vector<ModuleId> modules, std::optional<bool> reshard, std::string why) {
    for (ModuleId m : modules) sharded[static_cast<size_t>(m)] = true;
    calls.push_back({std::move(modules), reshard, std::move(why)});
  };
  const Policy& p = config.policy;

  // 1. The policy, bottom-up, root excluded.
  if (config.auto_wrap_policy != "NO_WRAP") {
    ClassMatcher matcher(tree);
    ClassSet classes(tree, matcher, p.module_classes.value_or(std::vector<std::string>{}));
    const bool by_size = config.auto_wrap_policy == "SIZE_BASED_WRAP";
    // sum(p.numel() for p in module.parameters()), tied tensors once; nothing ignored.
    std::vector<int64_t> numel = subtree_numel(tree, std::vector<bool>(tree.num_tensors(), false));
    std::vector<ModuleId> order = bottom_up(tree);
    order.pop_back();
    for (ModuleId m : order) {
      if (sharded[static_cast<size_t>(m)]) continue;
      bool wrap = by_size ? numel[static_cast<size_t>(m)] > p.min_num_params.value_or(0) : classes.contains(m);
      if (wrap) shard({m}, config.reshard_after_forward, "policy");
    }
  }

  // 2. Embeddings and the tail, found the way Transformers' methods find them.
  ModuleId base = 0;
  for (ModuleId c : tree.module(0).children) {
    std::string k = bare_class(tree, c);
    if (k.size() > 5 && k.compare(k.size() - 5, 5, "Model") == 0) {
      base = c;
      break;
    }
  }
  ModuleId input = -1;
  for (ModuleId where : {ModuleId{0}, child(tree, 0, "embeddings"), child(tree, 0, "model"), base})
    for (const char* name : {"embed_tokens", "wte", "word_embeddings"})
      if (input < 0) input = child(tree, where, name);
  ModuleId output = input >= 0 ? child(tree, 0, "lm_head") : -1;
  auto weight = [&](ModuleId m) -> TensorId {
    if (m < 0) return -1;
    for (const auto& s : tree.module(m).params)
      if (s.name == "weight") return s.tensor;
    return -1;
  };
  const bool tied = weight(input) >= 0 && weight(input) == weight(output);
  if (!tied && input >= 0 && !sharded[static_cast<size_t>(input)]) shard({input}, config.reshard_after_forward, "input embedding");
  ModuleId norm = -1;  // _find_final_norm: the last direct child of the base model with "Norm" in its class name
  for (ModuleId c : tree.module(base).children)
    if (bare_class(tree, c).find("Norm") != std::string::npos) norm = c;
  std::vector<ModuleId> tail;
  for (ModuleId m : tied ? std::vector<ModuleId>{norm, input, output} : std::vector<ModuleId>{norm, output})
    if (m >= 0 && !sharded[static_cast<size_t>(m)]) tail.push_back(m);
  if (!tail.empty()) shard(tail, false, "tail");

  // 3. The root, with PyTorch's default reshard_after_forward.
  if (!sharded[0]) shard({0}, std::nullopt, "root");

  auto path = [&](ModuleId m) { return m < 0 ? std::string("none") : m == 0 ? std::string("(root)") : tree.path(m); };
  notes.push_back(make_warning(
      "accelerate_config",
      std::string("Accelerate 1.15.0's FSDP2 units need Transformers' get_input_embeddings, get_output_embeddings "
                  "and base_model_prefix, which ") +
              (tree.graph() ? "a .pt2" : "a TorchScript file") +
              " does not keep; taken from module names: input embedding " +
              path(input) + ", output embedding " + path(output) + (tied ? " (tied)" : "") + ", base model " +
              path(base) + ", final norm " + path(norm)));
  return calls;
}

void apply_accelerate_fsdp2(AccelerateConfig& config, const ModuleTree& tree) {
  std::vector<ShardCall> calls = accelerate_fsdp2_calls(config, tree, config.warnings);
  Policy& p = config.policy;
  p.module_classes.reset();
  p.min_num_params.reset();
  p.groups.clear();
  for (const auto& c : calls) {
    if (c.modules == std::vector<ModuleId>{0}) continue;
    Fsdp2Group g;
    for (ModuleId m : c.modules) g.modules.push_back(tree.path(m));
    if (c.reshard_after_forward)
      g.reshard_after_forward = ReshardAfterForward{*c.reshard_after_forward ? ReshardAfterForward::Kind::True
                                                                             : ReshardAfterForward::Kind::False,
                                                    0};
    p.groups.push_back(std::move(g));
  }
}

}  // namespace fsdp_plan
