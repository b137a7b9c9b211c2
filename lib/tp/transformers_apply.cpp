// A model's own tensor-parallel plan ("plan": "model") as transformers 5.24
// applies it in from_pretrained(distributed_config=...), not as
// parallelize_module would: transformers/distributed/mixin.py
// (_resolve_parallel_plans, _expand_parallel_plan) gives every module and
// parameter whose name, layer numbers made "*", is a plan key (a parameter
// without a key of its own takes its module's) a style, and
// tensor_parallel.py: apply_tensor_parallelism shards each parameter with its
// style's shard_param and installs each module's forward hooks.
#include "tp/placements.h"

#include <set>
#include <unordered_map>

#include "model/class_names.h"
#include "plan/memory.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {
namespace hf_tp {  // the unity build puts placements.cpp's helpers beside these

// transformers/distributed/parallel_utils.py: replace_layer_number_by_wildcard,
// re.sub(r"\.\d+(\.|$)", ".*\1"): a number between dots (or a dot and the
// end) becomes "*"; the dot after it is consumed, as the regex consumes it.
std::string generic_name(const std::string& name) {
  std::string out;
  size_t i = 0;
  while (i < name.size()) {
    if (name[i] == '.') {
      size_t j = i + 1;
      while (j < name.size() && name[j] >= '0' && name[j] <= '9') ++j;
      if (j > i + 1 && (j == name.size() || name[j] == '.')) {
        out += ".*";
        if (j < name.size()) out += '.';
        i = j < name.size() ? j + 1 : j;
        continue;
      }
    }
    out += name[i++];
  }
  return out;
}

bool is_class(const ModuleTree& tree, ModuleId m, const char* cls) {
  for (const auto& c : class_lineage(demangle(tree.module(m).type_name)))
    if (c == cls) return true;
  return false;
}

// A parameter's placement under a style's shard_param (tensor_parallel.py);
// Kind::None: the style leaves it a plain tensor.
TpPlacement shard_param(TpStyle style, const std::string& name, int ndim) {
  TpPlacement p;
  auto shard = [&](int dim, int sf = 1) {
    p.kind = TpPlacement::Kind::Shard;
    p.dim = dim < 0 ? 0 : dim;
    p.split_factor = sf;
  };
  switch (style) {
    case TpStyle::Colwise: shard(ndim == 1 ? 0 : ndim - 2); break;  // Shard(ndim - 2): a bias's -1 is 0
    case TpStyle::Rowwise:                                          // bias Replicate, the rest Shard(-1)
      if (name == "bias") p.kind = TpPlacement::Kind::Replicate;
      else shard(ndim - 1);
      break;
    case TpStyle::EmbeddingRowwise: shard(0); break;  // EmbeddingParallel(shard_dim=0)
    case TpStyle::PackedColwise:                      // gate and up halves of dim ndim - 2, each split
      if (ndim == 1) shard(0);
      else shard(ndim - 2, 2);
      break;
    case TpStyle::PackedRowwise:
      if (ndim == 1) p.kind = TpPlacement::Kind::Replicate;
      else shard(ndim - 1, 2);
      break;
    default: break;  // sequence_parallel replicates in install_forward; moe_tp_experts and the rest shard nothing
  }
  return p;
}

// Rank 0's extent of a dimension of n: torch.chunk's first chunk; under
// _StridedShard(split_factor sf) the dimension's sf parts (torch.chunk) are
// each split so, and rank 0 holds the first chunk of each (measured on torch
// 2.13: 10 rows, sf 2, tp 4 -> 5 + 5 -> 2 + 2 = 4).
int64_t local_extent(int64_t n, int64_t T, int sf) {
  if (sf <= 1) return ceil_div(n, T);
  const int64_t part = ceil_div(n, sf);
  int64_t local = 0;
  for (int64_t left = n; left > 0; left -= part) local += ceil_div(std::min(part, left), T);
  return local;
}

}  // namespace hf_tp
}  // namespace

TensorParallelPlan plan_transformers_tensor_parallel(const ModuleTree& tree, const TensorParallel& tp,
                                                     const DeviceMesh& mesh, std::vector<Warning>& warnings) {
  using namespace hf_tp;
  TensorParallelPlan out = untouched_tp_plan(tree, mesh);
  const int64_t T = mesh.size(MeshDim::Tp);
  // The plan is a dict: a key given twice is its last value (dict.update).
  std::unordered_map<std::string, int> entries;
  for (size_t e = 0; e < tp.plan.size(); ++e) entries[tp.plan[e].first] = static_cast<int>(e);
  auto entry_of = [&](const std::string& key) {
    auto it = entries.find(key);
    return it == entries.end() ? -1 : it->second;
  };
  std::set<std::string> names;  // generic module and parameter names, for the keys that match nothing
  for (ModuleId m : tree.preorder(0)) {
    const std::string path = tree.path(m);
    const std::string gm = generic_name(path);
    names.insert(gm);
    const int module_entry = entry_of(gm);
    for (const auto& slot : tree.module(m).params) {
      const std::string gp = generic_name(tree.qualify(m, slot.name));
      names.insert(gp);
      // _get_parameter_plan(is_weight=True): its own key, else its module's.
      int e = entry_of(gp);
      if (e < 0) e = module_entry;
      if (e < 0) continue;
      const TensorId t = slot.tensor;
      const auto& shape = tree.tensor(t).shape;
      TpPlacement p = shard_param(tp.plan[static_cast<size_t>(e)].second.style, slot.name, static_cast<int>(shape.size()));
      if (p.kind == TpPlacement::Kind::Shard && shape.empty()) continue;  // a scalar: nothing to split
      out.placement[static_cast<size_t>(t)] = p;
      if (p.kind == TpPlacement::Kind::Shard)
        out.local_shape[static_cast<size_t>(t)][static_cast<size_t>(p.dim)] =
            local_extent(shape[static_cast<size_t>(p.dim)], T, p.split_factor);
    }
    if (module_entry < 0) continue;
    const TpStyle style = tp.plan[static_cast<size_t>(module_entry)].second.style;
    const std::string where = "'" + path_or_root(path) + "' (" + bare_class(tree, m) + ")";
    // install_forward: ColwiseParallel needs out_features, RowwiseParallel in_features.
    const bool linear = is_class(tree, m, "torch.nn.modules.linear.Linear");
    if ((style == TpStyle::Colwise || style == TpStyle::Rowwise) && !linear) {
      const char* attr = style == TpStyle::Colwise ? "out_features" : "in_features";
      warnings.push_back(make_warning(
          "tp_style_class", "module " + where + " is planned " + tp_style_names().name(style) +
                                " by the model's plan: transformers fails with ValueError: \"" + bare_class(tree, m) +
                                " has no `" + attr + "`: " + tp_style_names().name(style) +
                                " shards linear layers.\" (if the class has no " + attr + "); fix: plan its Linear "
                                "children"));
      continue;
    }
    // SequenceParallel.install_forward: the module's own parameters Replicate.
    if (style == TpStyle::SequenceParallel)
      for (const auto& slot : tree.module(m).params)
        out.placement[static_cast<size_t>(slot.tensor)] = TpPlacement{TpPlacement::Kind::Replicate, 0, 1};
    out.modules.push_back({m, module_entry});
  }
  // _validate_parallel_plan: a rule naming nothing is logged and skipped.
  std::vector<std::string> unused;
  for (const auto& [key, spec] : tp.plan)
    if (!names.count(key)) unused.push_back("'" + key + "'");
  if (!unused.empty())
    warnings.push_back(make_warning(
        "tp_unmatched_pattern", Severity::Warning,
        "the model's tensor-parallel plan has rules that match nothing in it (" + join(unused) +
            "): transformers logs \"`tp_plan` rules [...] match nothing in " +
            (tree.num_modules() ? bare_class(tree, 0) : std::string("the model")) +
            " and will not be applied.\" and goes on (the model's plan covers layers this configuration does "
            "not build)"));
  tp_heads_check(tree, tp, T, warnings);
  return out;
}

}  // namespace fsdp_plan
