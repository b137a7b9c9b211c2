#include "tp/model_plan.h"

#include "model/class_names.h"
#include "util/errors.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

// transformers/distributed/tensor_parallel.py (5.24): ALL_PARALLEL_STYLES.
// "colwise" is ColwiseParallel(input Replicate, output Shard(-1)) and
// "rowwise" RowwiseParallel(input Shard(-1), output Replicate), torch's
// defaults; the rest are transformers' own classes (policy/tensor_parallel.h).
bool hf_style(const std::string& name, TpStyleSpec& spec) {
  spec = TpStyleSpec{};
  if (name == "colwise") {
    spec.style = TpStyle::Colwise;
  } else if (name == "rowwise") {
    spec.style = TpStyle::Rowwise;
  } else if (name == "colwise_gather_output" || name == "colwise_rep") {
    spec.style = TpStyle::Colwise;
    spec.output_layouts = "replicate";
  } else if (name == "rowwise_split_input" || name == "rowwise_rep") {
    spec.style = TpStyle::Rowwise;
    spec.input_layouts = "replicate";
  } else if (name == "sequence_parallel") {
    spec.style = TpStyle::SequenceParallel;
    spec.use_local_output = true;
  } else if (auto s = tp_style_names().parse(name); s && transformers_only_style(*s)) {
    spec.style = *s;
  } else {
    return false;
  }
  return true;
}

bool is_embedding(const ModuleTree& tree, ModuleId m) {
  for (const auto& c : class_lineage(demangle(tree.module(m).type_name)))
    if (c == "torch.nn.modules.sparse.Embedding") return true;
  return false;
}

}  // namespace

void resolve_model_tp_plan(TensorParallel& tp, const ModuleTree& tree, const std::string& model_path) {
  const ModelRecord* r = tree.record();
  if (!r || r->tp_plan.empty() || !r->has_tp_model)
    throw InputError(model_path,
                     std::string("\"tensor_parallel.plan\": \"model\" needs the model's recorded tensor-parallel plan, "
                                 "and ") +
                         (!r ? "this file records none (TorchScript and plain torch.export archives do not)"
                             : r->tp_plan.empty() ? r->source + " has no base_model_tp_plan"
                                                  : r->source + " has no \"tp_model\" (an older fsdp-plan-export)") +
                         "; export it with fsdp-plan-export from its config, or write the plan as patterns to styles");
  tp.plan.clear();
  std::vector<std::string> unknown;
  auto add = [&](const std::string& key, const std::string& style) {
    TpStyleSpec spec;
    if (!hf_style(style, spec)) {
      unknown.push_back("'" + key + "': " + style);
      return;
    }
    tp.plan.emplace_back(key, spec);
  };
  // PreTrainedModel.tp_plan (transformers/distributed/mixin.py: init_parallel_plans):
  // the head's _tp_plan, then the base model's, which starts with
  // "embed_tokens": "embedding_rowwise" when it has a plan and an nn.Embedding
  // of that name (a key the config gives wins).
  for (const auto& [key, style] : r->head_tp_plan) add(key, style);
  const std::string prefix = r->base_model_prefix.empty() ? "" : r->base_model_prefix + ".";
  bool names_embed = false;
  for (const auto& [key, style] : r->tp_plan) names_embed = names_embed || key == "embed_tokens";
  if (!names_embed)
    for (ModuleId m = 0; m < static_cast<ModuleId>(tree.num_modules()); ++m)
      if (tree.path(m) == prefix + "embed_tokens" && is_embedding(tree, m)) add(prefix + "embed_tokens", "embedding_rowwise");
  for (const auto& [key, style] : r->tp_plan) add(prefix + key, style);
  if (!unknown.empty())
    throw InputError(model_path, "\"tensor_parallel.plan\": \"model\": the recorded plan has transformers styles "
                                 "fsdp-plan does not plan (" + join(unknown) +
                                 "); write the plan as patterns to styles");
}

}  // namespace fsdp_plan
