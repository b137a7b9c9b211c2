#include "report/json_writer.h"

#include <optional>

#include "fsdp2/memory.h"
#include "model/class_names.h"
#include "report/time_json.h"
#include "tp/placements.h"

namespace fsdp_plan {
namespace {

using ojson = nlohmann::ordered_json;

// An index that may be -1 ("none"): null then.
std::optional<int> index_or_null(int i) { return i < 0 ? std::nullopt : std::optional<int>(i); }

// The name -> bytes pairs as one object, in their order.
template <class Pairs>
void pairs_object(JsonSink& w, const Pairs& pairs) {
  w.object([&] {
    for (const auto& [name, value] : pairs) w.field(name, value);
  });
}

void tensor_list(JsonSink& w, const Plan& plan, const std::vector<Owned>& owned, bool params) {
  w.array([&] {
    for (const auto& o : owned) {
      const TensorInfo& t = plan.tree->tensor(o.tensor);
      w.object([&] {
        w.field("name", params ? plan.param_name(o) : plan.buffer_name(o));
        w.field("shape", t.shape);
        w.field("dtype", t.dtype);
        w.field("numel", t.numel());
        if (params) w.field("requires_grad", t.requires_grad);
        // FSDP2 shards each parameter: its local (padded) shape on rank 0.
        if (params && plan.v2()) w.field("sharded_shape", fsdp2_sharded_shape(t.shape, plan.memory.shard_group_size));
      });
    }
  });
}

// init_device_mesh's mesh_dim_names and mesh_shape for `dims` (one layout of plan.mesh).
void mesh_json(JsonSink& w, const DeviceMesh& mesh, const std::vector<MeshDim>& dims) {
  w.object_field("mesh", [&] {
    w.array_field("dim_names", [&] {
      for (MeshDim d : dims) w.value(mesh_dim_name(d));
    });
    w.array_field("shape", [&] {
      for (MeshDim d : dims) w.value(mesh.size(d));
    });
  });
}

// expert_parallel: the sparse mesh, the experts' modules and what one
// all-to-all carries, and each expert parameter's EP-local shape.
void expert_parallel_json(JsonSink& w, const Plan& plan) {
  const ExpertParallelPlan& ep = *plan.expert_parallel;
  const ModuleTree& tree = *plan.tree;
  w.object([&] {
    mesh_json(w, plan.mesh, plan.mesh.expert_dim_names());
    w.field("imbalance", ep.imbalance);
    w.array_field("modules", [&] {
      for (const ExpertModule& x : ep.modules)
        w.object([&] {
          w.field("path", tree.path(x.module));
          w.field("class", tree.module(x.module).type_name);
          w.field("fused", x.fused);
          w.field("num_experts", x.num_experts);
          w.field("local_experts", x.local_experts);
          w.field("fsdp_shard_dim", x.shard_dim);
          w.field("sizes_known", x.sizes_known);
          if (x.sizes_known) {
            w.field("tokens", x.tokens);
            w.field("top_k", x.top_k);
            w.field("hidden", x.hidden);
            w.field("dtype", x.dtype);
            w.field("all_to_all_bytes", x.dispatch_bytes());
            w.field("busiest_rows", x.busiest_rows(ep.imbalance));
          } else {
            w.field("unknown_reason", x.unknown_reason);
          }
        });
    });
    w.array_field("params", [&] {
      for (ModuleId m : tree.preorder())
        for (const auto& slot : tree.module(m).params) {
          if (!ep.is_expert(slot.tensor)) continue;
          w.object([&] {
            w.field("name", tree.qualify(m, slot.name));
            w.field("shape", tree.tensor(slot.tensor).shape);
            w.field("ep_local_shape", ep.local_shape[static_cast<size_t>(slot.tensor)]);
          });
        }
    });
    w.field("notes", ep.notes);
  });
}

// context_parallel: the dense mesh, the sequence each rank holds, and the
// attention calls the ring runs with what their K/V carry on one rank.
void context_parallel_json(JsonSink& w, const Plan& plan) {
  const ContextParallelPlan& cp = *plan.context_parallel;
  w.object([&] {
    mesh_json(w, plan.mesh, plan.mesh.dim_names());
    w.field("degree", cp.degree);
    w.field("seq_dim", cp.seq_dim);
    w.field("seq", cp.seq);
    w.field("local_seq", cp.local_seq);
    w.field("load_balancer", cp.head_tail ? std::optional<std::string>("headtail") : std::nullopt);
    w.field("rotate_method", rotate_name(cp.settings.rotate));
    w.array_field("attention", [&] {
      for (const CpAttention& a : cp.attention)
        w.object([&] {
          w.field("module", plan.tree->path(a.module));
          w.field("unit", a.unit);
          w.field("kv_numel", a.kv_numel);
          w.field("dtype", a.dtype);
          w.field("kv_bytes", a.kv_bytes());
          w.field("recomputed", a.recomputed);
        });
    });
    w.field("notes", cp.notes);
  });
}

// The mesh, the modules the plan's entries apply to, and every parameter's
// placements after parallelize_module and after fully_shard.
void tensor_parallel_json(JsonSink& w, const Plan& plan) {
  const TensorParallelPlan& tp = *plan.tensor_parallel;
  const ModuleTree& tree = *plan.tree;
  w.object([&] {
    mesh_json(w, plan.mesh, plan.mesh.dim_names());
    w.array_field("modules", [&] {
      for (const auto& m : tp.modules) {
        const auto& entry = plan.policy.tensor_parallel->plan[static_cast<size_t>(m.entry)];
        w.object([&] {
          w.field("path", tree.path(m.module));
          w.field("pattern", entry.first);
          w.field("style", tp_style_python(entry.second));
        });
      }
    });
    w.array_field("params", [&] {
      std::vector<bool> seen(tree.num_tensors(), false);
      for (ModuleId m : tree.preorder())
        for (const auto& slot : tree.module(m).params) {
          if (seen[static_cast<size_t>(slot.tensor)]) continue;  // named_parameters(): a tied weight once
          seen[static_cast<size_t>(slot.tensor)] = true;
          const TpPlacement& p = tp.placement[static_cast<size_t>(slot.tensor)];
          const Fsdp2TpParam f = fsdp2_tp_param(tp, tree, slot.tensor);
          w.object([&] {
            w.field("name", tree.qualify(m, slot.name));
            w.field("shape", tree.tensor(slot.tensor).shape);
            w.key("tp_placement");
            if (p.kind == TpPlacement::Kind::None)
              w.null();
            else
              w.value(tp_placement_repr(p));
            w.field("tp_local_shape", tp.local_shape[static_cast<size_t>(slot.tensor)]);
            w.field("placements", f.placements);
            w.field("mesh_dims", f.mesh_dims);
            w.field("local_shape", f.local_shape);
          });
        }
    });
  });
}

void unit_memory(JsonSink& w, const UnitMemory& m) {
  w.object([&] {
    w.field("flat_numel", m.flat_numel);
    w.field("sharded_numel", m.sharded_numel);
    w.field("sharded_bytes", m.sharded_bytes);
    w.field("unsharded_bytes", m.unsharded_bytes);
  });
}

// units[i]: what the unit owns, its shards, and (when computed) its
// activations, communication and time.
void unit_json(JsonSink& w, const Plan& plan, size_t i) {
  const ModuleTree& tree = *plan.tree;
  const Unit& u = plan.units[i];
  const std::string qualified = demangle(tree.module(u.module).type_name);
  w.object([&] {
    w.field("index", i);
    w.field("path", tree.path(u.module));
    w.field("class", short_name(qualified));
    w.field("qualified_class", qualified);
    w.field("depth", u.depth);
    w.field("parent", index_or_null(u.parent));
    w.field("param_numel", u.param_numel);
    w.field("param_bytes", u.param_bytes);
    w.key("params");
    tensor_list(w, plan, u.params, true);
    w.field("trainable_numel", u.trainable_numel);
    w.field("frozen_numel", u.frozen_numel);
    w.field("buffer_numel", u.buffer_numel);
    w.field("buffer_bytes", u.buffer_bytes);
    w.key("buffers");
    tensor_list(w, plan, u.buffers, false);
    w.field("mixed_precision", u.mixed_precision);
    w.key("memory");
    unit_memory(w, plan.memory.units[i]);
    // Saved by the unit's own modules, held from its forward to its backward (graph only).
    w.key("activation_bytes");
    if (plan.activations.source == ActivationSource::Graph && i < plan.activations.unit_bytes.size())
      w.value(plan.activations.unit_bytes[i]);
    else
      w.null();
    if (plan.v2()) {
      w.array_field("modules", [&] {
        for (ModuleId mod : u.modules) w.value(tree.path(mod));
      });
      w.field("call", u.call);
      w.field("reshard_after_forward", reshard_to_json(*u.reshard_after_forward));
    }
    if (plan.comm.computed) {
      w.key("comm");
      unit_comm_json(w, plan, i);
    }
    if (plan.time.computed) {
      w.key("time");
      unit_time_json(w, plan, i);
    }
  });
}

// Bytes by category at one step of a training step (MemoryStep): memory.timeline[i].
void timeline_step_json(JsonSink& w, const MemoryStep& s, bool known_activations) {
  w.object([&] {
    w.field("phase", s.phase);
    w.field("unit", index_or_null(s.unit));
    w.field("params_bytes", s.params_bytes);
    w.field("optimizer_bytes", s.optimizer_bytes);
    w.field("buffers_bytes", s.buffers_bytes);
    w.field("gathered_bytes", s.gathered_bytes);
    w.field("unsharded_grads_bytes", s.unsharded_grads_bytes);
    w.field("grads_bytes", s.grads_bytes);
    w.field("total_bytes", s.total_bytes());
    if (known_activations) w.field("activation_bytes", s.activation_bytes);
    if (!s.categories.empty()) {
      w.key("categories");
      pairs_object(w, s.categories);
    }
  });
}

// memory.activations.modules[i]: what one module saves, itself and with its submodules.
void activation_module_json(JsonSink& w, const Plan& plan, size_t i) {
  const ModuleActivations& m = plan.activations.modules[i];
  w.object([&] {
    w.field("path", plan.tree->path(m.module));
    w.field("self_bytes", m.self_bytes);
    w.field("total_bytes", m.total_bytes);
  });
}

// memory.activations: where the activations came from and what the walk found.
void activations_json(JsonSink& w, const Plan& plan) {
  const ActivationPlan& a = plan.activations;
  w.object([&] {
    w.field("source", activation_source_name(a.source));
    switch (a.source) {
      case ActivationSource::Unknown:
        w.field("reason", a.unknown_reason);
        break;
      case ActivationSource::Allowance:
        w.field("allowance_bytes", a.allowance_bytes);
        break;
      case ActivationSource::Graph:
        w.key("dims");
        pairs_object(w, a.dims);
        w.field("device", a.device);
        w.field("sdpa", a.sdpa);
        w.field("sdpa_kernels", a.sdpa_kernels);
        w.key("loss");
        if (a.loss.empty())
          w.null();
        else
          w.value(a.loss);
        w.field("saved_bytes", a.saved_bytes);
        w.field("held_after_forward_bytes", a.held_bytes);
        w.field("param_saved_bytes", a.param_saved_bytes);
        w.field("input_saved_bytes", a.input_saved_bytes);
        w.key("missing_ops");
        pairs_object(w, a.missing_ops);
        w.array_field("modules", [&] {
          for (size_t i = 0; i < a.modules.size(); ++i) activation_module_json(w, plan, i);
        });
        break;
    }
    w.array_field("checkpointed", [&] {
      for (const auto& c : a.checkpointed)
        w.object([&] {
          w.field("path", plan.tree->path(c.module));
          if (a.source == ActivationSource::Graph) {
            w.field("unit", index_or_null(c.unit));
            w.field("kept_bytes", c.kept_bytes);
            w.field("recompute_bytes", c.recompute_bytes);
            // Selective checkpointing only, so full-AC plans stay as they were.
            if (c.selective) {
              w.field("mode", "selective");
              w.field("cached_bytes", c.cached_bytes);
              w.field("recompute_peak_bytes", c.recompute_peak_bytes);
            }
          }
        });
    });
    // Compiled modules only, so plans without "compile" stay as they were.
    if (!a.compiled.empty())
      w.array_field("compiled", [&] {
        for (const CompiledModule& c : a.compiled)
          w.object([&] {
            w.field("path", plan.tree->path(c.module));
            // Inside a checkpointed module the tags decide (CompiledModule::checkpointed_calls).
            w.field("model", c.checkpointed_calls > 0 && c.checkpointed_calls == c.calls ? "checkpointed"
                                                                                         : "min_cut_partitioner");
            if (a.source != ActivationSource::Graph) return;
            w.field("unit", index_or_null(c.unit));
            w.field("calls", c.calls);
            w.field("checkpointed_calls", c.checkpointed_calls);
            w.field("saved_bytes", c.saved_bytes);
            w.field("eager_saved_bytes", c.eager_saved_bytes);
          });
      });
  });
}

// plan/memory_fit.h: the verdict and the headroom it assumed.
void fit_json(JsonSink& w, const MemoryFit& f) {
  w.field("verdict", fit_verdict_name(f.verdict));
  w.field("hardware", f.hardware);
  w.field("device_bytes", f.device_bytes);
  w.field("assumed_headroom_bytes", f.headroom_bytes);
  w.field("usable_bytes", f.usable_bytes);
  w.field("activations_known", f.activations_known);  // the peak: memory.per_rank.peak_bytes
  w.key("max_peak_bytes");
  if (f.max_peak_bytes)
    w.value(*f.max_peak_bytes);
  else
    w.null();
}

void memory_json(JsonSink& w, const Plan& plan) {
  const MemoryPlan& m = plan.memory;
  const RankMemory& r = m.per_rank;
  const ActivationPlan& acts = plan.activations;
  const auto unit_path = [&](int u) { return plan.tree->path(plan.units[static_cast<size_t>(u)].module); };
  w.object([&] {
    w.field("world_size", m.settings.world_size);
    w.field("sharding_strategy", strategy_name(m.effective_strategy));
    w.field("requested_sharding_strategy", strategy_name(m.settings.strategy));
    w.field("shard_group_size", m.shard_group_size);
    w.field("use_orig_params", m.settings.use_orig_params);
    w.field("optimizer", optimizer_name(m.settings.optimizer));
    w.field("optimizer_impl", optimizer_impl_name(m.settings.optimizer_impl.value_or(OptimizerImpl::ForLoop)));
    w.object_field("per_rank", [&] {
      w.field("params_bytes", r.params_bytes);
      w.field("grads_bytes", r.grads_bytes);
      w.field("optimizer_bytes", r.optimizer_bytes);
      w.field("buffers_bytes", r.buffers_bytes);
      w.field("steady_bytes", r.steady_bytes);
      w.field("peak_bytes", r.peak_bytes);
      w.key("activation_bytes");
      if (acts.known())
        w.value(r.activation_bytes);
      else
        w.null();
      if (plan.v2()) w.field("host_bytes", r.host_bytes);
    });
    w.object_field("peak", [&] {
      w.field("phase", r.peak_phase);
      w.field("unit", index_or_null(r.peak_unit));
      w.key("unit_path");
      if (r.peak_unit < 0)
        w.null();
      else
        w.value(unit_path(r.peak_unit));
      w.array_field("gathered_units", [&] {
        for (int u : r.peak_gathered) w.value(unit_path(u));
      });
      if (plan.v2()) {
        w.key("categories");
        pairs_object(w, r.peak_categories);
      }
    });
    if (plan.fit.computed) w.object_field("fit", [&] { fit_json(w, plan.fit); });
    if (m.accumulation.steps > 1)
      w.object_field("gradient_accumulation", [&] {
        const GradAccumulation& a = m.accumulation;
        w.field("steps", a.steps);
        w.field("no_sync", a.no_sync);
        w.field("modelled", a.modelled);
        w.field("held_grads_bytes", a.held_grads_bytes);
        w.field("micro_step_peak_bytes", a.micro_step_peak_bytes);
      });
    w.field("notes", m.notes);
    w.array_field("timeline", [&] {
      for (const MemoryStep& s : m.timeline) timeline_step_json(w, s, acts.known());
    });
    w.key("activations");
    activations_json(w, plan);
    w.field("fsdp_version", version_number(plan.version()));
    if (plan.v2()) {
      w.field("replicate_size", m.replicate_size);
      w.field("cpu_offload", m.settings.cpu_offload);
    }
  });
}

void warning_json(JsonSink& w, const Warning& x) {
  w.object([&] {
    w.field("kind", x.kind);
    w.field("severity", severity_name(x.severity));
    w.field("message", x.message);
    if (!x.modules.empty()) w.field("modules", x.modules);
    if (!x.classes.empty()) w.field("classes", x.classes);
    if (!x.params.empty()) w.field("params", x.params);
    if (!x.suggestions.empty()) w.field("suggestions", x.suggestions);
    if (!x.fix.is_null()) w.field("fix", x.fix);
  });
}

}  // namespace

void plan_json(JsonSink& w, const Plan& plan, const ojson& trailing, const PlanJsonOptions& options) {
  const ModelSummary& m = plan.model;
  w.object([&] {
    w.field("schema_version", kPlanSchemaVersion);
    w.field("fsdp_version", version_number(plan.version()));
    w.object_field("model", [&] {
      w.field("path", m.path);
      w.field("root_class", m.root_class);
      w.field("num_modules", m.num_modules);
      w.field("param_numel", m.param_numel);
      w.field("param_bytes", m.param_bytes);
      w.field("buffer_numel", m.buffer_numel);
      w.field("buffer_bytes", m.buffer_bytes);
    });
    // Only when present, so plans of models without aliases stay as they were.
    if (!plan.aliases.empty())
      w.array_field("aliases", [&] {
        for (const auto& a : plan.aliases)
          w.object([&] {
            w.field("path", a.path);
            w.field("alias_of", a.alias_of);
          });
      });
    w.field("policy", policy_to_json(plan.policy));
    w.array_field("units", [&] {
      for (size_t i = 0; i < plan.units.size(); ++i) unit_json(w, plan, i);
    });
    w.array_field("warnings", [&] {
      for (const Warning& x : plan.warnings) warning_json(w, x);
    });
    w.key("memory");
    memory_json(w, plan);
    if (plan.tensor_parallel) {
      w.key("tensor_parallel");
      tensor_parallel_json(w, plan);
    }
    if (plan.expert_parallel) {
      w.key("expert_parallel");
      expert_parallel_json(w, plan);
    }
    if (plan.context_parallel) {
      w.key("context_parallel");
      context_parallel_json(w, plan);
    }
    if (plan.comm.computed) {
      w.key("comm");
      comm_json(w, plan, options.collectives);
    }
    if (plan.time.computed) {
      w.key("time");
      time_json(w, plan, options.collectives);
    }
    for (auto it = trailing.begin(); it != trailing.end(); ++it) w.field(it.key(), it.value());
  });
}

ojson plan_to_json(const Plan& plan, const PlanJsonOptions& options) {
  JsonValueSink w;
  plan_json(w, plan, ojson::object(), options);
  return w.take();
}

}  // namespace fsdp_plan
