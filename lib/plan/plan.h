// The plan: FSDP units in FSDP's order, what each owns, and what to warn about.
// Produced by make_plan (planner.h), read by the writers.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/aliases.h"
#include "model/module_tree.h"
#include "mesh/device_mesh.h"
#include "plan/activations.h"
#include "plan/comm.h"
#include "plan/memory.h"
#include "plan/memory_fit.h"
#include "plan/step_time.h"
#include "plan/context_parallel.h"
#include "plan/expert_parallel.h"
#include "plan/tensor_parallel.h"
#include "policy/policy.h"
#include "util/warnings.h"

namespace fsdp_plan {

// One tensor a unit owns: module.params[slot] (or .buffers[slot]).
struct Owned {
  ModuleId module;
  int32_t slot;
  TensorId tensor;
};

struct Unit {
  ModuleId module;
  int parent = -1;  // index of the nearest enclosing unit; -1 for the root
  int depth = 0;    // number of enclosing units
  std::vector<Owned> params, buffers;
  int64_t param_numel = 0, param_bytes = 0, buffer_numel = 0, buffer_bytes = 0;
  int64_t trainable_numel = 0, frozen_numel = 0;  // by requires_grad; they sum to param_numel
  std::optional<bool> mixed_precision;  // nullopt: the policy configures none
  // FSDP2 only. A call's modules (fully_shard([a, b]) has two; module is the
  // first), the call's position among the fully_shard calls (bottom-up, root
  // last) and its reshard_after_forward.
  std::vector<ModuleId> modules;
  int call = -1;
  std::optional<ReshardAfterForward> reshard_after_forward;
};

// Whether all of `owned` share one dtype, as most units' parameters do (true
// when empty): the dtype checks have nothing to say about those.
// A unit as messages and reports name it: its module's path, or an FSDP2
// group's paths in brackets; with `quoted`, each as quoted_path writes it
// ('blocks.0', (root)).
std::string unit_name(const ModuleTree& tree, const Unit& u, bool quoted = false);

// Unit indices in post-order (a unit after every unit it encloses, the root
// last): the order FSDP1 builds its units, and FSDP2's post-forward hooks.
std::vector<int> unit_postorder(const std::vector<Unit>& units);

bool one_dtype(const ModuleTree& tree, const std::vector<Owned>& owned);

struct ModelSummary {
  std::string path;
  std::string root_class;
  int64_t num_modules = 0;
  int64_t param_numel = 0, param_bytes = 0, buffer_numel = 0, buffer_bytes = 0;
};

struct Plan {
  const ModuleTree* tree = nullptr;
  // The loaded tree without module aliases (aliases.h), when it had any: `tree` points here.
  std::shared_ptr<const ModuleTree> dealiased_tree;
  std::vector<Alias> aliases;
  // That tree with fsdp.fp32_master_weights' casts (plan/master_weights.h), when any: `tree` points here.
  std::shared_ptr<const ModuleTree> master_weights_tree;
  Policy policy;
  // Every parallelism dimension and its groups, built once from the policy
  // (mesh/device_mesh.h device_mesh) before any stage reads it.
  DeviceMesh mesh;
  ModelSummary model;
  std::vector<Unit> units;
  std::vector<Warning> warnings;
  // FSDP2: trainable parameters the graph never reads, sorted; they get no
  // gradient (plan/unused_params.h: receives_gradient).
  std::vector<TensorId> ungraded_params;
  ActivationPlan activations;  // read by the memory models
  MemoryPlan memory;
  std::optional<TensorParallelPlan> tensor_parallel;  // policy.tensor_parallel's placements
  std::optional<ExpertParallelPlan> expert_parallel;  // policy.expert_parallel's experts and placements
  std::optional<ContextParallelPlan> context_parallel;  // policy.context_parallel's sequence and attention calls
  CommPlan comm;   // per step, what each unit's collectives carry (fsdp1/comm.h, fsdp2/comm.h)
  StepTime time;   // the step-time ESTIMATE built on it (time/step_time.h)
  MemoryFit fit;   // the peak against the --hardware GPU's memory, with an assumed headroom

  // FSDP1: FullyShardedDataParallel units; FSDP2: fully_shard groups.
  FsdpVersion version() const { return policy.fsdp.version; }
  bool v2() const { return policy.fsdp.v2(); }
  bool has_errors() const;
  // Full dotted name of an owned parameter or buffer.
  std::string param_name(const Owned& o) const;
  std::string buffer_name(const Owned& o) const;
};

// Per ModuleId, the unit its forward runs in: the innermost unit whose
// module(s) hold it (FSDP1: the unit's module; FSDP2: a call's modules), the
// root unit for modules outside every other. The activations, the step time
// and tensor parallelism's collectives attribute graph ops by it.
std::vector<int> unit_of_modules(const Plan& plan);

}  // namespace fsdp_plan
