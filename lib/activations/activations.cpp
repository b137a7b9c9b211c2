#include "activations/activations.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <unordered_map>

#include "activations/graph_input.h"
#include "activations/walk.h"
#include "model/dtype.h"
#include "model/graph.h"
#include "util/errors.h"
#include "util/strings.h"

namespace fsdp_plan {

std::vector<ModuleId> checkpointed_modules(const ModuleTree& tree, const Policy& policy, const ClassMatcher& matcher,
                                           std::vector<Warning>* warnings) {
  std::vector<ModuleId> out;
  if (!policy.activation_checkpointing) return out;
  const ActivationCheckpointing& ac = *policy.activation_checkpointing;
  std::vector<bool> marked(tree.num_modules(), false);
  if (!ac.module_classes.empty()) {
    // isinstance, as apply_activation_checkpointing's check_fn and Accelerate's policy test it.
    ClassSet set(tree, matcher, ac.module_classes);
    for (ModuleId m = 0; m < static_cast<ModuleId>(tree.num_modules()); ++m)
      if (set.contains(m)) marked[static_cast<size_t>(m)] = true;
  }
  if (!ac.modules.empty()) {
    std::vector<std::string> missing;
    const std::vector<std::string> paths = tree.paths();
    // By a table: a search per listed path was 100,000 x the tree's modules (issue 39).
    std::unordered_map<std::string, ModuleId> by_path;
    for (ModuleId m = 0; m < static_cast<ModuleId>(tree.num_modules()); ++m)
      by_path.emplace(paths[static_cast<size_t>(m)], m);
    for (const auto& want : ac.modules) {
      auto it = by_path.find(want);
      if (it == by_path.end()) {
        missing.push_back(want);
        continue;
      }
      marked[static_cast<size_t>(it->second)] = true;
    }
    if (warnings) {
      // Near misses (an edit distance to every path each) for the first few only.
      constexpr size_t kSuggested = 16;
      for (size_t i = 0; i < missing.size(); ++i) {
        const std::string& p = missing[i];
        Warning w = make_warning("unmatched_checkpoint", "\"activation_checkpointing.modules\" names \"" + p +
                                                             "\", which is no module path in the model");
        if (i < kSuggested) w.suggestions = closest(p, paths);
        warnings->push_back(std::move(w));
      }
    }
  }
  // Outermost only: a module under a checkpointed one is run by that one's recompute.
  std::vector<bool> inside(tree.num_modules(), false);
  for (ModuleId m : tree.preorder()) {
    const ModuleId parent = tree.module(m).parent;
    const bool under = parent >= 0 && (inside[static_cast<size_t>(parent)] || marked[static_cast<size_t>(parent)]);
    inside[static_cast<size_t>(m)] = under;
    if (marked[static_cast<size_t>(m)] && !under) out.push_back(m);
  }
  return out;
}

std::vector<ModuleId> compiled_modules(const ModuleTree& tree, const Policy& policy, const ClassMatcher& matcher) {
  std::vector<ModuleId> out;
  if (!policy.compile) return out;
  // isinstance, as torchtitan's parallelize picks its blocks; outermost only:
  // a module inside a compiled one is traced into the outer one's graph.
  ClassSet set(tree, matcher, policy.compile->module_classes);
  std::vector<bool> inside(tree.num_modules(), false);
  for (ModuleId m : tree.preorder()) {
    const ModuleId parent = tree.module(m).parent;
    const bool under = parent >= 0 && inside[static_cast<size_t>(parent)];
    inside[static_cast<size_t>(m)] = under || set.contains(m);
    if (set.contains(m) && !under) out.push_back(m);
  }
  return out;
}

namespace {

const DtypeInfo* dtype_named(const std::string& name) {
  for (const std::string& stem : dtype_stems())
    if (const DtypeInfo* d = dtype_from_stem(stem); d && name == d->name) return d;
  return nullptr;
}

// FSDP1 flattens a unit's parameters into one FlatParameter; with
// use_orig_params a unit mixing frozen and trainable parameters has a flat
// parameter that requires grad, whose views the original parameters are, so
// autograd saves for the frozen ones as if trainable
// (torch/distributed/fsdp/_flat_param.py: FlatParamHandle._use_unsharded_views;
// measured: tests/activations/README.md, LoRA llama under FSDP1 +37%).
// Empty: as the graph records (FSDP2 keeps each parameter's own flag).
std::vector<bool> fsdp1_trainable(const Plan& plan) {
  std::vector<bool> out;
  if (plan.v2()) return out;
  const ModuleTree& tree = *plan.tree;
  out.assign(tree.num_tensors(), false);
  for (TensorId t = 0; t < static_cast<TensorId>(tree.num_tensors()); ++t) out[static_cast<size_t>(t)] = tree.tensor(t).requires_grad;
  for (const Unit& u : plan.units) {
    if (u.trainable_numel == 0 || u.frozen_numel == 0) continue;
    for (const Owned& o : u.params) out[static_cast<size_t>(o.tensor)] = true;
  }
  return out;
}

// The policy's selective checkpointing, resolved against the model. torchtitan
// 0.3.0 (SelectiveAC._wrap_block) looks, in each block, for the Linear
// modules whose path contains one of force_recompute_mm_shapes_by_fqns and
// forces every mm of their weight's shape (in, out) to be recomputed.
std::optional<SacPolicy> sac_policy(const Plan& plan, const std::vector<CheckpointedModule>& checkpointed) {
  const auto& ac = plan.policy.activation_checkpointing;
  if (!ac || !ac->selective()) return std::nullopt;
  SacPolicy p;
  p.torchtitan = ac->torchtitan_policy;
  p.save_ops = ac->save_ops;
  const ModuleTree& tree = *plan.tree;
  std::vector<bool> inside(tree.num_modules(), false);
  for (const CheckpointedModule& c : checkpointed) inside[static_cast<size_t>(c.module)] = true;
  for (ModuleId m : tree.preorder()) {
    const ModuleId parent = tree.module(m).parent;
    if (parent >= 0 && inside[static_cast<size_t>(parent)]) inside[static_cast<size_t>(m)] = true;
    if (!inside[static_cast<size_t>(m)] || ac->recompute_mm_fqns.empty()) continue;
    const std::string path = tree.path(m);
    if (std::none_of(ac->recompute_mm_fqns.begin(), ac->recompute_mm_fqns.end(),
                     [&](const std::string& f) { return path.find(f) != std::string::npos; }))
      continue;
    for (const TensorSlot& slot : tree.module(m).params) {
      const std::vector<int64_t>& shape = tree.tensor(slot.tensor).shape;
      if (slot.name != "weight" || shape.size() != 2) continue;
      const std::pair<int64_t, int64_t> in_out{shape[1], shape[0]};
      if (std::find(p.recompute_mm_shapes.begin(), p.recompute_mm_shapes.end(), in_out) == p.recompute_mm_shapes.end())
        p.recompute_mm_shapes.push_back(in_out);
    }
  }
  return p;
}

void walk_plan(const Plan& plan, const std::shared_ptr<const Graph>& shared, ActivationPlan& acts,
               std::vector<Warning>* warnings, const RankLocal& local) {
  const Graph& graph = *shared;
  const ActivationSettings& settings = plan.policy.activations;
  const std::vector<std::pair<std::string, int64_t>> given = rank_walk_dims(plan, graph);
  const DimValues dims = DimValues::hints(graph, given);
  const std::shared_ptr<const WalkGraph> walked = shared_walk_input(shared, given, dims);
  std::optional<WalkGraph> rewritten;
  const WalkGraph& input = local.graph ? rewritten.emplace(local.graph(*walked)) : *walked;
  WalkOptions opt;
  if (local.tensors) opt.local_tensors = local.tensors(input);
  opt.env.device = settings.device;
  opt.env.sdpa = settings.sdpa;
  opt.unit_of_module = unit_of_modules(plan);
  for (const CheckpointedModule& c : acts.checkpointed) opt.checkpointed.push_back(c.module);
  for (const CompiledModule& c : acts.compiled) opt.compiled.push_back(c.module);
  if (plan.policy.compile) opt.compile_memory_budget = plan.policy.compile->memory_budget;
  opt.trainable_params = fsdp1_trainable(plan);
  opt.unit_of_param.assign(plan.tree->num_tensors(), -1);
  for (size_t u = 0; u < plan.units.size(); ++u)
    for (const Owned& o : plan.units[u].params) opt.unit_of_param[static_cast<size_t>(o.tensor)] = static_cast<int>(u);
  // Mixed precision: the root casts the floating forward inputs to param_dtype
  // (FSDP2 MixedPrecisionPolicy.cast_forward_inputs, FSDP1 cast_root_forward_inputs).
  if (const auto& mp = plan.policy.mixed_precision; mp && mp->param_dtype &&
      (plan.v2() ? mp->casts_forward_inputs(FsdpVersion::V2) : mp->casts_root_forward_inputs()))
    opt.input_cast = dtype_named(*mp->param_dtype);
  // The forward then runs in param_dtype where the export computed in its parameters' dtype.
  if (const auto& mp = plan.policy.mixed_precision; mp && mp->param_dtype) {
    opt.compute_dtype = dtype_named(*mp->param_dtype);
    for (const GraphInput& in : graph.inputs())
      if (in.kind == InputKind::Parameter && in.value != kNone && graph.is_tensor(in.value))
        if (const DtypeInfo* d = dtype_from_export_code(graph.tensor(in.value).dtype); d && is_floating_dtype(d->name)) {
          opt.export_dtype = d;
          break;
        }
  }
  // Context parallelism: SDPA runs as torch's ring (its buffers beside each call).
  if (const auto& cp = plan.policy.context_parallel; cp && plan.mesh.size(MeshDim::Cp) > 1) {
    opt.ring.cp = plan.mesh.size(MeshDim::Cp);
    opt.ring.all_gather = cp->rotate == ContextParallel::Rotate::AllGather;
    // torch balances only where 2 x cp divides the sequence, cp x the walk's (cp/attention.cpp warns).
    opt.ring.head_tail = cp->head_tail;
    for (const DimSetting& d : dims.settings())
      if (d.name == "seq") opt.ring.head_tail = cp->head_tail && d.value % 2 == 0;
  }
  const std::optional<SacPolicy> sac = sac_policy(plan, acts.checkpointed);
  if (sac) opt.sac = &*sac;
  // The walk fills in what each checkpointed module keeps and recomputes.
  acts.source = ActivationSource::Graph;
  for (const DimSetting& d : dims.settings()) acts.dims.emplace_back(d.name, d.value);
  walk_graph(input, *plan.tree, plan.units.size(), opt, acts, warnings);
}

}  // namespace

std::vector<bool> plan_trainable_params(const Plan& plan) { return fsdp1_trainable(plan); }

std::vector<std::pair<std::string, int64_t>> rank_walk_dims(const Plan& plan, const Graph& graph) {
  std::vector<std::pair<std::string, int64_t>> given = plan.policy.activations.dims;
  const int64_t cp = plan.mesh.size(MeshDim::Cp);
  if (!plan.mesh.context_parallel() || cp <= 1) return given;
  const std::optional<SymbolId> seq = graph.find_symbol("seq");
  if (!seq)
    throw InputError(graph.file(), "context_parallel splits the sequence over cp " + std::to_string(cp) +
                                       " ranks, and this program has no dynamic seq dimension to split; export it "
                                       "with one (fsdp-plan-export --dynamic seq, or torch.export.Dim(\"seq\"))");
  const std::optional<int64_t> whole = DimValues::hints(graph, given).value(*seq);
  if (!whole) throw InputError(graph.file(), "context_parallel: give the sequence to split with --dim seq=N");
  // torch checks nothing here: DTensor shards the buffers like torch.chunk,
  // and the ring's K/V exchange assumes every rank's shard the same size.
  if (*whole % cp != 0)
    throw InputError(graph.file(), "context_parallel: the sequence (" + std::to_string(*whole) +
                                       ") must be divisible by cp (" + std::to_string(cp) +
                                       "): the ring exchanges equal K/V shards, and torch does not check it; set "
                                       "--dim seq to a multiple of " + std::to_string(cp) + " (of " +
                                       std::to_string(2 * cp) + " for head-tail load balancing)");
  const std::string name = graph.symbol(*seq).dim;
  given.erase(std::remove_if(given.begin(), given.end(),
                             [&](const auto& d) { return graph.find_symbol(d.first) == seq; }),
              given.end());
  given.emplace_back(name, *whole / cp);
  return given;
}

ActivationPlan plan_activations(const Plan& plan, const ClassMatcher& matcher, std::vector<Warning>* warnings,
                                const RankLocal& local) {
  ActivationPlan acts;
  const ActivationSettings& settings = plan.policy.activations;
  acts.device = device_name(settings.device);
  acts.sdpa = sdpa_name(settings.sdpa);
  acts.unit_bytes.assign(plan.units.size(), 0);
  // The checkpointed modules are listed whatever the source; only the graph sizes what they keep.
  for (ModuleId m : checkpointed_modules(*plan.tree, plan.policy, matcher, warnings)) {
    CheckpointedModule c;
    c.module = m;
    acts.checkpointed.push_back(c);
  }
  // So are the compiled ones (the walk sizes what their calls save).
  for (ModuleId m : compiled_modules(*plan.tree, plan.policy, matcher)) {
    CompiledModule c;
    c.module = m;
    acts.compiled.push_back(c);
  }
  if (settings.allowance_bytes) {
    acts.source = ActivationSource::Allowance;
    acts.allowance_bytes = *settings.allowance_bytes;
    return acts;
  }
  if (const auto& graph = plan.tree->graph()) {
    walk_plan(plan, graph, acts, warnings, local);
    return acts;
  }
  if (!settings.dims.empty()) {
    // Silently planning a TorchScript file at no shape would hide that --dim did nothing.
    throw InputError(plan.model.path, "--dim " + settings.dims.front().first +
                                          ": a TorchScript file records no tensor shapes, so it has no dimensions; "
                                          "export a .pt2 (fsdp-plan-export --dynamic batch,seq)");
  }
  acts.source = ActivationSource::Unknown;
  acts.unknown_reason =
      "a TorchScript file records no tensor shapes; export a .pt2 at the training shapes, with labels "
      "(fsdp-plan-export, docs/install.md), or give --activation-bytes";
  return acts;
}

}  // namespace fsdp_plan
