#include "ep/experts.h"

#include <algorithm>
#include <optional>

#include "ep/dispatch.h"
#include "util/errors.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

// "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeExperts" -> "Qwen3MoeExperts".
std::string experts_class_stem(const std::string& qualified) {
  const size_t dot = qualified.rfind('.');
  return dot == std::string::npos ? qualified : qualified.substr(dot + 1);
}

bool class_ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Fused experts: every parameter of the subtree at least 2-D with one dim 0,
// the number of experts (transformers 5's *Experts: gate_up_proj [E, 2I, H];
// torchtitan's GroupedExperts: w1 [E, F, D]). 0 when it is not.
int64_t fused_experts(const ModuleTree& tree, ModuleId m) {
  int64_t e = 0;
  for (ModuleId d : tree.preorder(m))
    for (const auto& slot : tree.module(d).params) {
      const TensorInfo& t = tree.tensor(slot.tensor);
      if (t.shape.size() < 2 || (e != 0 && t.shape[0] != e)) return 0;
      e = t.shape[0];
    }
  return e >= 2 ? e : 0;
}

// One module per expert: two or more children of one class whose parameters
// have the same shapes (an nn.ModuleList of expert MLPs). 0 when it is not.
int64_t expert_container(const ModuleTree& tree, ModuleId m) {
  const auto& kids = tree.module(m).children;
  if (kids.size() < 2) return 0;
  auto shapes = [&](ModuleId k) {
    std::vector<std::vector<int64_t>> out;
    for (ModuleId d : tree.preorder(k))
      for (const auto& slot : tree.module(d).params) out.push_back(tree.tensor(slot.tensor).shape);
    return out;
  };
  const auto first = shapes(kids[0]);
  if (first.empty()) return 0;
  for (ModuleId k : kids)
    if (tree.module(k).type_name != tree.module(kids[0]).type_name || shapes(k) != first) return 0;
  return static_cast<int64_t>(kids.size());
}

// The routed-expert modules: the policy's classes, or by shape (a fused
// "*Experts" module, or a child list named "experts"); none inside another.
std::vector<ExpertModule> find_experts(const ModuleTree& tree, const ExpertParallel& ep, const ClassMatcher& matcher) {
  std::vector<ExpertModule> out;
  const bool listed = !ep.module_classes.empty();
  std::optional<ClassSet> classes;
  if (listed) classes.emplace(tree, matcher, ep.module_classes);
  for (ModuleId m : tree.preorder()) {
    if (!out.empty() && tree.within(m, out.back().module)) continue;
    const Module& mod = tree.module(m);
    ExpertModule x;
    x.module = m;
    if (listed && !classes->contains(m)) continue;
    if (int64_t e = fused_experts(tree, m); e > 0 && (listed || class_ends_with(experts_class_stem(mod.type_name), "Experts"))) {
      x.num_experts = e;
    } else if (int64_t n = expert_container(tree, m); n > 0 && (listed || mod.name == "experts")) {
      x.fused = false;
      x.num_experts = n;
    } else {
      continue;
    }
    x.moe = mod.parent >= 0 ? mod.parent : m;
    out.push_back(x);
  }
  return out;
}

// What rank 0 keeps: ceil(E / ep) experts (torch.chunk, as DTensor's Shard(0)
// places them), and fully_shard's dim on efsdp for them.
void place_experts(const ModuleTree& tree, const DeviceMesh& mesh, ExpertParallelPlan& plan) {
  const int64_t ep = mesh.size(MeshDim::Ep), efsdp = mesh.size(MeshDim::Efsdp);
  plan.expert_of.assign(tree.num_tensors(), -1);
  plan.local_shape.assign(tree.num_tensors(), {});
  for (size_t i = 0; i < plan.modules.size(); ++i) {
    ExpertModule& x = plan.modules[i];
    x.local_experts = (x.num_experts + ep - 1) / ep;
    // torchtitan: Shard(1) on efsdp when efsdp * ep > num_experts (fsdp.py, "to avoid padding").
    x.shard_dim = x.fused && efsdp * ep > x.num_experts ? 1 : 0;
    const auto& kids = tree.module(x.module).children;
    for (ModuleId d : tree.preorder(x.module)) {
      for (const auto& slot : tree.module(d).params) {
        std::vector<int64_t> shape = tree.tensor(slot.tensor).shape;
        if (x.fused) {
          shape[0] = x.local_experts;
        } else if (d != x.module) {  // the container's own parameters (none in a ModuleList) stay whole
          ModuleId k = d;
          while (tree.module(k).parent != x.module) k = tree.module(k).parent;
          const auto pos = static_cast<int64_t>(std::find(kids.begin(), kids.end(), k) - kids.begin());
          if (pos >= x.local_experts) shape = {0};
        }
        plan.expert_of[static_cast<size_t>(slot.tensor)] = static_cast<int>(i);
        plan.local_shape[static_cast<size_t>(slot.tensor)] = std::move(shape);
      }
    }
  }
}

// The engines' refusals, before launch.
void check_split(const ModuleTree& tree, const ExpertParallelPlan& plan, const std::string& model_path) {
  const int64_t ep = plan.mesh.size(MeshDim::Ep);
  for (const ExpertModule& x : plan.modules)
    if (x.num_experts % ep != 0)
      throw InputError(model_path, "expert parallelism " + std::to_string(ep) + " does not divide the " +
                                       std::to_string(x.num_experts) + " experts of " + tree.path(x.module) +
                                       " (torchtitan's all-to-all dispatcher views the per-expert token counts as [ep, "
                                       "num_experts / ep]); choose an ep that divides " +
                                       std::to_string(x.num_experts));
}

}  // namespace

std::vector<int64_t> routed_expert_counts(const ModuleTree& tree, const ExpertParallel& ep, const ClassMatcher& matcher) {
  std::vector<int64_t> out;
  for (const ExpertModule& x : find_experts(tree, ep, matcher)) out.push_back(x.num_experts);
  return out;
}

ExpertParallelPlan plan_expert_parallel(const ModuleTree& tree, const Policy& policy,
                                        const std::vector<std::pair<std::string, int64_t>>& rank_dims,
                                        const DeviceMesh& mesh, const ClassMatcher& matcher,
                                        const std::string& model_path) {
  const ExpertParallel& ep = *policy.expert_parallel;
  ExpertParallelPlan plan;
  plan.mesh = mesh;
  plan.modules = find_experts(tree, ep, matcher);
  if (plan.modules.empty())
    throw InputError(model_path,
                     ep.module_classes.empty()
                         ? "\"expert_parallel\": no routed experts in this model (a module whose class ends in "
                           "\"Experts\" holding every expert's weights on dim 0, or a list of expert modules named "
                           "\"experts\"); name their class in \"expert_parallel.module_classes\""
                         : "\"expert_parallel.module_classes\" names no module holding routed experts (fused "
                           "weights with the experts on dim 0, or a list of identical expert modules)");
  check_split(tree, plan, model_path);
  place_experts(tree, mesh, plan);
  size_dispatch(tree, policy, rank_dims, plan);
  plan.imbalance = ep.imbalance;
  if (ep.imbalance == 1.0)
    plan.notes.push_back("routing assumed uniform: each rank sends tokens x top_k / ep rows to every rank of its ep "
                         "group and receives as many (torchtitan's all-to-all splits are the routing's)");
  else
    plan.notes.push_back("routing skewed (imbalance " + format_factor(ep.imbalance) +
                         "): the plan is the busiest ep rank's, whose experts receive " +
                         format_factor(ep.imbalance) +
                         " x tokens x top_k rows (rounded up) and compute on them; every rank sends its own tokens "
                         "x top_k rows");
  return plan;
}

}  // namespace fsdp_plan
