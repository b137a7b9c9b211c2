#include "report/json_writer.h"

#include "fsdp2/memory.h"
#include "model/class_names.h"
#include "report/time_json.h"
#include "tp/placements.h"

namespace fsdp_plan {
namespace {

using ojson = nlohmann::ordered_json;

ojson tensor_list(const Plan& plan, const std::vector<Owned>& owned, bool params) {
  ojson out = ojson::array();
  for (const auto& o : owned) {
    const TensorInfo& t = plan.tree->tensor(o.tensor);
    ojson j = {{"name", params ? plan.param_name(o) : plan.buffer_name(o)},
               {"shape", t.shape},
               {"dtype", t.dtype},
               {"numel", t.numel()}};
    if (params) j["requires_grad"] = t.requires_grad;
    // FSDP2 shards each parameter: its local (padded) shape on rank 0.
    if (params && plan.v2())
      j["sharded_shape"] = fsdp2_sharded_shape(t.shape, plan.memory.shard_group_size);
    out.push_back(std::move(j));
  }
  return out;
}

// The mesh, the modules the plan's entries apply to, and every parameter's
// placements after parallelize_module and after fully_shard.
ojson tensor_parallel_json(const Plan& plan) {
  const TensorParallelPlan& tp = *plan.tensor_parallel;
  const ModuleTree& tree = *plan.tree;
  ojson names = ojson::array(), shape = ojson::array();
  if (tp.mesh.dp_replicate > 1) names.push_back("dp_replicate"), shape.push_back(tp.mesh.dp_replicate);
  names.push_back("dp_shard"), shape.push_back(tp.mesh.dp_shard);
  names.push_back("tp"), shape.push_back(tp.mesh.tp);
  ojson modules = ojson::array();
  for (const auto& m : tp.modules) {
    const auto& entry = plan.policy.tensor_parallel->plan[static_cast<size_t>(m.entry)];
    modules.push_back({{"path", tree.path(m.module)}, {"pattern", entry.first}, {"style", tp_style_python(entry.second)}});
  }
  ojson params = ojson::array();
  std::vector<bool> seen(tree.num_tensors(), false);
  for (ModuleId m : tree.preorder())
    for (const auto& slot : tree.module(m).params) {
      if (seen[static_cast<size_t>(slot.tensor)]) continue;  // named_parameters(): a tied weight once
      seen[static_cast<size_t>(slot.tensor)] = true;
      const TpPlacement& p = tp.placement[static_cast<size_t>(slot.tensor)];
      const Fsdp2TpParam f = fsdp2_tp_param(tp, tree, slot.tensor);
      params.push_back({{"name", tree.qualify(m, slot.name)},
                        {"shape", tree.tensor(slot.tensor).shape},
                        {"tp_placement", p.kind == TpPlacement::Kind::None ? ojson(nullptr) : ojson(tp_placement_repr(p))},
                        {"tp_local_shape", tp.local_shape[static_cast<size_t>(slot.tensor)]},
                        {"placements", f.placements},
                        {"mesh_dims", f.mesh_dims},
                        {"local_shape", f.local_shape}});
    }
  return {{"mesh", {{"dim_names", names}, {"shape", shape}}}, {"modules", modules}, {"params", params}};
}

ojson optional_bool(const std::optional<bool>& b) { return b ? ojson(*b) : ojson(nullptr); }

ojson unit_memory(const UnitMemory& m) {
  return {{"flat_numel", m.flat_numel},
          {"sharded_numel", m.sharded_numel},
          {"sharded_bytes", m.sharded_bytes},
          {"unsharded_bytes", m.unsharded_bytes}};
}

// units[i]: what the unit owns, its shards, and (when computed) its
// activations, communication and time.
ojson unit_json(const Plan& plan, size_t i) {
  const ModuleTree& tree = *plan.tree;
  const Unit& u = plan.units[i];
  const std::string qualified = demangle(tree.module(u.module).type_name);
  ojson out = {{"index", i},
               {"path", tree.path(u.module)},
               {"class", std::string(short_name(qualified))},
               {"qualified_class", qualified},
               {"depth", u.depth},
               {"parent", u.parent < 0 ? ojson(nullptr) : ojson(u.parent)},
               {"param_numel", u.param_numel},
               {"param_bytes", u.param_bytes},
               {"params", tensor_list(plan, u.params, true)},
               {"trainable_numel", u.trainable_numel},
               {"frozen_numel", u.frozen_numel},
               {"buffer_numel", u.buffer_numel},
               {"buffer_bytes", u.buffer_bytes},
               {"buffers", tensor_list(plan, u.buffers, false)},
               {"mixed_precision", optional_bool(u.mixed_precision)},
               {"memory", unit_memory(plan.memory.units[i])}};
  // Saved by the unit's own modules, held from its forward to its backward (graph only).
  out["activation_bytes"] = plan.activations.source == ActivationSource::Graph && i < plan.activations.unit_bytes.size()
                                ? ojson(plan.activations.unit_bytes[i])
                                : ojson(nullptr);
  if (plan.v2()) {
    ojson modules = ojson::array();
    for (ModuleId mod : u.modules) modules.push_back(tree.path(mod));
    out["modules"] = std::move(modules);
    out["call"] = u.call;
    out["reshard_after_forward"] = reshard_to_json(*u.reshard_after_forward);
  }
  if (plan.comm.computed) out["comm"] = unit_comm_json(plan, i);
  if (plan.time.computed) out["time"] = unit_time_json(plan, i);
  return out;
}

// Bytes by category at one step of a training step (MemoryStep): memory.timeline[i].
ojson timeline_step_json(const MemoryStep& s, bool known_activations) {
  ojson out = {{"phase", s.phase},
               {"unit", s.unit < 0 ? ojson(nullptr) : ojson(s.unit)},
               {"params_bytes", s.params_bytes},
               {"optimizer_bytes", s.optimizer_bytes},
               {"buffers_bytes", s.buffers_bytes},
               {"gathered_bytes", s.gathered_bytes},
               {"unsharded_grads_bytes", s.unsharded_grads_bytes},
               {"grads_bytes", s.grads_bytes},
               {"total_bytes", s.total_bytes()}};
  if (known_activations) out["activation_bytes"] = s.activation_bytes;
  if (!s.categories.empty()) {
    ojson categories = ojson::object();
    for (const auto& [name, bytes] : s.categories) categories[name] = bytes;
    out["categories"] = std::move(categories);
  }
  return out;
}

// memory.activations.modules[i]: what one module saves, itself and with its submodules.
ojson activation_module_json(const Plan& plan, size_t i) {
  const ModuleActivations& m = plan.activations.modules[i];
  return {{"path", plan.tree->path(m.module)}, {"self_bytes", m.self_bytes}, {"total_bytes", m.total_bytes}};
}

// memory.activations: where the activations came from and what the walk found.
ojson activations_json(const Plan& plan) {
  const ActivationPlan& a = plan.activations;
  ojson out = {{"source", activation_source_name(a.source)}};
  ojson checkpointed = ojson::array();
  for (const auto& c : a.checkpointed) {
    ojson j = {{"path", plan.tree->path(c.module)}};
    if (a.source == ActivationSource::Graph) {
      j["unit"] = c.unit < 0 ? ojson(nullptr) : ojson(c.unit);
      j["kept_bytes"] = c.kept_bytes;
      j["recompute_bytes"] = c.recompute_bytes;
    }
    checkpointed.push_back(std::move(j));
  }
  switch (a.source) {
    case ActivationSource::Unknown:
      out["reason"] = a.unknown_reason;
      break;
    case ActivationSource::Allowance:
      out["allowance_bytes"] = a.allowance_bytes;
      break;
    case ActivationSource::Graph: {
      ojson dims = ojson::object();
      for (const auto& [name, value] : a.dims) dims[name] = value;
      out["dims"] = std::move(dims);
      out["device"] = a.device;
      out["sdpa"] = a.sdpa;
      out["sdpa_kernels"] = a.sdpa_kernels;
      out["loss"] = a.loss.empty() ? ojson(nullptr) : ojson(a.loss);
      out["saved_bytes"] = a.saved_bytes;
      out["held_after_forward_bytes"] = a.held_bytes;
      out["param_saved_bytes"] = a.param_saved_bytes;
      out["input_saved_bytes"] = a.input_saved_bytes;
      ojson missing = ojson::object();
      for (const auto& [op, count] : a.missing_ops) missing[op] = count;
      out["missing_ops"] = std::move(missing);
      out["modules"] = ojson::array();  // streamed: activation_module_json
      break;
    }
  }
  out["checkpointed"] = std::move(checkpointed);
  return out;
}

ojson memory_json(const Plan& plan) {
  const MemoryPlan& m = plan.memory;
  const RankMemory& r = m.per_rank;
  ojson gathered = ojson::array();
  for (int u : r.peak_gathered) gathered.push_back(plan.tree->path(plan.units[static_cast<size_t>(u)].module));
  ojson peak = {{"phase", r.peak_phase},
                {"unit", r.peak_unit < 0 ? ojson(nullptr) : ojson(r.peak_unit)},
                {"unit_path", r.peak_unit < 0 ? ojson(nullptr)
                                              : ojson(plan.tree->path(plan.units[static_cast<size_t>(r.peak_unit)].module))},
                {"gathered_units", std::move(gathered)}};
  if (plan.v2()) {
    ojson categories = ojson::object();
    for (const auto& [name, bytes] : r.peak_categories) categories[name] = bytes;
    peak["categories"] = std::move(categories);
  }
  ojson out = {{"world_size", m.settings.world_size},
          {"sharding_strategy", strategy_name(m.effective_strategy)},
          {"requested_sharding_strategy", strategy_name(m.settings.strategy)},
          {"shard_group_size", m.shard_group_size},
          {"use_orig_params", m.settings.use_orig_params},
          {"optimizer", optimizer_name(m.settings.optimizer)},
          {"per_rank", {{"params_bytes", r.params_bytes},
                        {"grads_bytes", r.grads_bytes},
                        {"optimizer_bytes", r.optimizer_bytes},
                        {"buffers_bytes", r.buffers_bytes},
                        {"steady_bytes", r.steady_bytes},
                        {"peak_bytes", r.peak_bytes}}},
          {"peak", std::move(peak)},
          {"notes", m.notes},
          {"timeline", ojson::array()}};  // streamed: timeline_step_json
  const ActivationPlan& acts = plan.activations;
  out["per_rank"]["activation_bytes"] = acts.known() ? ojson(r.activation_bytes) : ojson(nullptr);
  out["activations"] = activations_json(plan);
  out["fsdp_version"] = version_number(plan.version());
  if (plan.v2()) {
    out["replicate_size"] = m.replicate_size;
    out["cpu_offload"] = m.settings.cpu_offload;
    out["per_rank"]["host_bytes"] = r.host_bytes;
  }
  return out;
}

}  // namespace

JsonDocument plan_json(const Plan& plan) {
  const ModelSummary& m = plan.model;
  JsonDocument doc;
  ojson& out = doc.skeleton;
  out["schema_version"] = kPlanSchemaVersion;
  out["fsdp_version"] = version_number(plan.version());
  out["model"] = {{"path", m.path},
                  {"root_class", m.root_class},
                  {"num_modules", m.num_modules},
                  {"param_numel", m.param_numel},
                  {"param_bytes", m.param_bytes},
                  {"buffer_numel", m.buffer_numel},
                  {"buffer_bytes", m.buffer_bytes}};
  // Only when present, so plans of models without aliases stay as they were.
  if (!plan.aliases.empty()) {
    ojson aliases = ojson::array();
    for (const auto& a : plan.aliases) aliases.push_back({{"path", a.path}, {"alias_of", a.alias_of}});
    out["aliases"] = std::move(aliases);
  }
  out["policy"] = policy_to_json(plan.policy);

  out["units"] = ojson::array();  // streamed: unit_json

  ojson warnings = ojson::array();
  for (const auto& w : plan.warnings) {
    ojson j = {{"kind", w.kind}, {"severity", severity_name(w.severity)}, {"message", w.message}};
    if (!w.modules.empty()) j["modules"] = w.modules;
    if (!w.classes.empty()) j["classes"] = w.classes;
    if (!w.params.empty()) j["params"] = w.params;
    if (!w.suggestions.empty()) j["suggestions"] = w.suggestions;
    if (!w.fix.is_null()) j["fix"] = w.fix;
    warnings.push_back(std::move(j));
  }
  out["warnings"] = std::move(warnings);
  out["memory"] = memory_json(plan);
  if (plan.tensor_parallel) out["tensor_parallel"] = tensor_parallel_json(plan);
  if (plan.comm.computed) out["comm"] = comm_json(plan);
  if (plan.time.computed) out["time"] = time_json(plan);

  // The arrays as long as the model (units, steps, collectives): made one element at a time.
  auto stream = [&](std::vector<std::string> path, size_t size, std::function<ojson(size_t)> element) {
    doc.arrays.push_back({std::move(path), size, std::move(element)});
  };
  const Plan* p = &plan;
  stream({"units"}, plan.units.size(), [p](size_t i) { return unit_json(*p, i); });
  stream({"memory", "timeline"}, plan.memory.timeline.size(),
         [p](size_t i) { return timeline_step_json(p->memory.timeline[i], p->activations.known()); });
  if (plan.activations.source == ActivationSource::Graph)
    stream({"memory", "activations", "modules"}, plan.activations.modules.size(),
           [p](size_t i) { return activation_module_json(*p, i); });
  if (plan.comm.computed)
    stream({"comm", "collectives"}, plan.comm.collectives.size(), [p](size_t i) { return comm_collective_json(*p, i); });
  if (plan.time.computed) {
    stream({"time", "collectives"}, plan.time.collectives.size(), [p](size_t i) { return time_collective_json(*p, i); });
    stream({"time", "timeline"}, plan.time.timeline.size(), [p](size_t i) { return time_span_json(*p, i); });
  }
  return doc;
}

nlohmann::ordered_json plan_to_json(const Plan& plan) { return plan_json(plan).filled(); }

}  // namespace fsdp_plan
