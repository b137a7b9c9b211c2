#include "cp/attention.h"

#include <algorithm>

#include "activations/activations.h"
#include "activations/graph_input.h"
#include "model/dtype.h"
#include "model/graph.h"
#include "tp/local.h"
#include "util/errors.h"
#include "util/strings.h"
#include "util/warnings.h"

namespace fsdp_plan {
namespace {

constexpr const char* kSdpa = "aten.scaled_dot_product_attention.default";

const WalkArg* arg_named(const WalkNode& n, const char* name) {
  for (const WalkArg& a : n.args)
    if (a.name == name) return &a;
  return nullptr;
}

int32_t tensor_arg(const WalkNode& n, const char* name) {
  const WalkArg* a = arg_named(n, name);
  return a && !a->tensors.empty() ? a->tensors.front() : -1;
}

bool bool_arg(const WalkNode& n, const char* name) {
  const WalkArg* a = arg_named(n, name);
  return a && a->value.kind == ArgValue::Kind::Bool && a->value.b;
}

int64_t numel(const WalkTensor& t) {
  int64_t n = 1;
  for (int64_t s : t.sizes) n *= s;
  return n;
}

// What torch's ring refuses, in its words (_scaled_dot_product_ring_efficient_attention,
// _templated_ring_attention): checked per call.
void check_call(const Plan& plan, const WalkGraph& g, const WalkNode& n, bool head_tail) {
  const std::string where = "the attention in " + path_or_root(plan.tree->path(std::max<ModuleId>(0, n.module)));
  if (tensor_arg(n, "attn_mask") >= 0)
    throw InputError(plan.model.path, "context_parallel: " + where +
                                          " takes an attn_mask, and torch's ring attention refuses one "
                                          "(NotImplementedError for an attn_bias); it runs causal SDPA "
                                          "(is_causal=True) without a mask");
  const bool causal = bool_arg(n, "is_causal");
  if (!causal && head_tail)
    throw InputError(plan.model.path, "context_parallel: " + where +
                                          " is not causal, and the head-tail load balancer needs it (\"Load "
                                          "balancing requires `is_causal=True`.\"); set \"load_balancer\": null");
  const int32_t q = tensor_arg(n, "query"), k = tensor_arg(n, "key");
  if (causal && q >= 0 && k >= 0 &&
      g.tensors[static_cast<size_t>(q)].sizes.size() >= 2 && g.tensors[static_cast<size_t>(k)].sizes.size() >= 2 &&
      g.tensors[static_cast<size_t>(q)].sizes.end()[-2] != g.tensors[static_cast<size_t>(k)].sizes.end()[-2])
    throw InputError(plan.model.path, "context_parallel: " + where +
                                          " attends over a key sequence of another length, and torch's ring "
                                          "refuses it (\"is_causal requires the same query and context sequence "
                                          "lengths\")");
}

// Whether the call runs again in backward: inside a fully checkpointed
// module, unless the selective policy saved it.
bool recomputed(const Plan& plan, ModuleId m, int32_t node) {
  const auto& regions = plan.activations.checkpointed;
  const bool inside = std::any_of(regions.begin(), regions.end(),
                                  [&](const CheckpointedModule& c) { return plan.tree->within(m, c.module); });
  if (!inside) return false;
  const auto& saved = plan.activations.sac_saved_nodes;
  return std::find(saved.begin(), saved.end(), node) == saved.end();
}

// The K/V dtype the call sees: mixed precision's param_dtype where FSDP2 casts, else as exported.
void set_dtype(const Plan& plan, const WalkTensor& k, CpAttention& a) {
  const auto& mp = plan.policy.mixed_precision;
  if (mp && mp->param_dtype && dtype_itemsize(*mp->param_dtype) > 0) {
    a.dtype = *mp->param_dtype;
    a.itemsize = dtype_itemsize(*mp->param_dtype);
  } else if (k.dtype) {
    a.dtype = k.dtype->name;
    a.itemsize = k.dtype->itemsize;
  }
}

}  // namespace

ContextParallelPlan plan_context_parallel(const Plan& plan) {
  ContextParallelPlan out;
  out.settings = *plan.policy.context_parallel;
  out.degree = plan.mesh.size(MeshDim::Cp);
  const std::shared_ptr<const Graph>& graph = plan.tree->graph();
  if (!graph)
    throw InputError(plan.model.path, "context_parallel splits the sequence the graph's attention runs over, and a "
                                      "TorchScript file records no graph: export a .pt2 (fsdp-plan-export --dynamic seq)");
  const std::vector<std::pair<std::string, int64_t>> given = rank_walk_dims(plan, *graph);
  const DimValues dims = DimValues::hints(*graph, given);
  if (const std::optional<SymbolId> seq = graph->find_symbol("seq")) {
    out.seq_dim = graph->symbol(*seq).dim;
    out.local_seq = dims.value(*seq).value_or(0);
    out.seq = out.local_seq * out.degree;
  }
  out.head_tail = out.settings.head_tail && out.seq % (2 * out.degree) == 0;
  const std::shared_ptr<const WalkGraph> walked = shared_walk_input(graph, given, dims);
  const WalkGraph& g = *walked;
  const std::vector<bool> tp_local = tp_local_tensors(g, plan);
  const int64_t tp = plan.mesh.size(MeshDim::Tp);
  const std::vector<int> unit_of = unit_of_modules(plan);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const WalkNode& n = g.nodes[i];
    if (n.op != kSdpa) continue;
    check_call(plan, g, n, out.head_tail);
    const int32_t k = tensor_arg(n, "key");
    if (k < 0) continue;
    CpAttention a;
    a.module = std::max<ModuleId>(0, n.module);
    a.unit = unit_of.empty() ? 0 : std::max(0, unit_of[static_cast<size_t>(a.module)]);
    a.kv_numel = numel(g.tensors[static_cast<size_t>(k)]);
    if (!tp_local.empty() && tp_local[static_cast<size_t>(k)]) a.kv_numel /= std::max<int64_t>(1, tp);
    set_dtype(plan, g.tensors[static_cast<size_t>(k)], a);
    a.recomputed = recomputed(plan, a.module, static_cast<int32_t>(i));
    out.attention.push_back(a);
  }
  if (out.attention.empty())
    throw InputError(plan.model.path, "context_parallel: the graph has no scaled_dot_product_attention call, and "
                                      "torch's context_parallel rings only those (attention written as matmul and "
                                      "softmax would attend within each rank's shard); export with SDPA "
                                      "(attn_implementation=\"sdpa\")");
  out.notes.push_back("each rank runs the model on " + std::to_string(out.local_seq) + " of " +
                      std::to_string(out.seq) + " tokens (" +
                      (out.head_tail ? "head-tail load balancing: chunks i and 2cp-1-i" : "contiguous shards") +
                      "); attention's K/V travel the ring (" + rotate_name(out.settings.rotate) + ")");
  return out;
}

std::optional<Warning> load_balance_warning(const ContextParallelPlan& cp) {
  if (!cp.settings.head_tail || cp.head_tail) return std::nullopt;
  return make_warning("cp_load_balance_dropped",
                      "the sequence (" + std::to_string(cp.seq) + ") is not divisible by 2 x cp (" +
                          std::to_string(2 * cp.degree) +
                          "), so torch's context_parallel drops the head-tail load balancer without a word "
                          "(_create_default_load_balancer returns None): rank 0 holds the first contiguous shard and "
                          "the ring's causal steps fall unevenly on the ranks; make the sequence a multiple of " +
                          std::to_string(2 * cp.degree));
}

}  // namespace fsdp_plan
