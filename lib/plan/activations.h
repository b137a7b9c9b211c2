// Activation memory of a plan (issue 30): the bytes autograd saves for
// backward, per module and per FSDP unit, and how they rise and fall over a
// training step. From the .pt2 graph (activations/walk.h), from an allowance
// given by hand (--activation-bytes), or unknown (a TorchScript file records
// no shapes). The memory models (fsdp1/memory, fsdp2/memory) read it through
// activations/schedule.h; docs/memory-model.md "Activations" gives the rules.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/module_tree.h"

namespace fsdp_plan {

enum class ActivationSource : uint8_t { Unknown, Allowance, Graph };
const char* activation_source_name(ActivationSource s);  // "unknown", "allowance", "graph"

// A run of consecutive graph nodes (execution order) whose modules belong to
// one unit. A unit's forward is one or more runs: the root's embedding before
// the layers and its head and loss after them are two. Levels are absolute
// bytes of activations (saved tensors) plus temporaries, per rank.
struct ActivationRun {
  int unit = 0;
  int64_t forward_start = 0;  // saved bytes held when the run starts
  int64_t forward_peak = 0;   // the most live during its forward: saved so far + outputs not yet consumed
  int64_t forward_end = 0;    // saved bytes held when it ends
  // Backward runs the runs in reverse. backward_start is what is still saved
  // when this run's backward starts; the peak adds the activation gradients
  // live and, under activation checkpointing, what the recompute saves again.
  int64_t backward_start = 0;
  int64_t backward_peak = 0;
  int64_t backward_end = 0;
  // Gradients of the unit's own parameters this run's backward makes (those
  // whose last use in the forward is in the run). Autograd makes each at that
  // use's backward and keeps it until the unit's post-backward hook, so
  // backward_peak counts the ones made by its point; backward_start and
  // backward_end do not (the memory models count them after the run).
  int64_t backward_grads = 0;
};

// A module run under activation checkpointing (checkpoint_wrapper): its
// forward keeps only its inputs; in backward it runs again, saving what it
// saves without checkpointing, one checkpointed module at a time.
struct CheckpointedModule {
  ModuleId module = 0;
  int unit = -1;                // the unit its forward runs in
  int64_t kept_bytes = 0;       // its inputs made outside it (each storage once)
  int64_t recompute_bytes = 0;  // what its recompute saves
  // Selective checkpointing (policy mode "selective", activations/selective.h):
  // the outputs its saved ops keep from the forward to its recompute, and the
  // most its recompute has live at once (its saves so far and the op's
  // transients), on top of what is live when it starts.
  bool selective = false;
  int64_t cached_bytes = 0;
  int64_t recompute_peak_bytes = 0;
};

// A module compiled with torch.compile (policy "compile"): its calls save
// what AOTAutograd's min-cut partitioner saves (activations/partitioner.h),
// beside what eager autograd would save for them. A call inside a
// checkpointed module keeps checkpointing's saves.
struct CompiledModule {
  ModuleId module = 0;
  int unit = -1;
  int64_t calls = 0;
  // Calls inside a checkpointed module: the partitioner follows checkpointing's
  // tags there (PREFER_RECOMPUTE acts as MUST_RECOMPUTE), so they keep what
  // checkpointing keeps, eager or selective; the bytes below leave them out.
  int64_t checkpointed_calls = 0;
  int64_t eager_saved_bytes = 0;  // what its other calls' ops save in eager mode (each storage once per call)
  int64_t saved_bytes = 0;        // what the partitioner's cut saves for them
};

// Saved bytes of one module (graph source): by the module's own nodes, and
// with every module below it.
struct ModuleActivations {
  ModuleId module = 0;
  int64_t self_bytes = 0;
  int64_t total_bytes = 0;
};

struct ActivationPlan {
  ActivationSource source = ActivationSource::Unknown;
  std::string unknown_reason;  // Unknown: why, and how to get them
  int64_t allowance_bytes = 0;  // Allowance: held through forward and backward
  // Graph: what the walk was evaluated at.
  std::vector<std::pair<std::string, int64_t>> dims;  // dynamic dimensions: name -> value
  std::string device = "cuda";   // whose kernels decide what is saved
  std::vector<CompiledModule> compiled;
  std::string sdpa = "default";  // the attention kernel asked for
  std::vector<std::string> sdpa_kernels;  // the SDPA cases that ran ("CUDA flash ..."), each once
  std::string loss;              // the operator the backward starts from ("" if none: no loss in the export)
  // Saved for backward over the whole forward (without AC), per rank; under
  // AC, held_bytes is what stays saved after the forward.
  int64_t saved_bytes = 0;
  int64_t held_bytes = 0;
  int64_t param_saved_bytes = 0;  // parameters and buffers saved (held anyway: not activations)
  int64_t input_saved_bytes = 0;  // user inputs saved (held by the caller)
  // The user inputs themselves (the batch, as the export's user inputs
  // record them, before any mixed-precision cast): device memory the training
  // loop holds through the whole step, forward, backward and optimizer step
  // (FSDPMemTracker.track_inputs files them as "Inputs"). The memory models
  // count them with the activations.
  int64_t input_bytes = 0;
  std::vector<int64_t> unit_bytes;  // per unit: saved by its own modules (not nested units'), as held after forward
  std::vector<ModuleActivations> modules;  // modules with saved bytes in their subtree, in pre-order
  std::vector<ActivationRun> runs;          // forward order
  std::vector<CheckpointedModule> checkpointed;
  // Selective checkpointing: the graph nodes whose dispatched op the policy
  // saves (not recomputed: the time model leaves their FLOPs out of the recompute).
  std::vector<int32_t> sac_saved_nodes;
  // Compiled calls (CompiledModule): the graph nodes their backward runs again
  // (the partitioner's recompute; matmuls only under a memory budget), ascending.
  std::vector<int32_t> compiled_recomputed_nodes;
  // Operators without a row in the table, counted conservatively (all their tensor inputs): name -> nodes.
  std::vector<std::pair<std::string, int64_t>> missing_ops;
  int64_t nodes = 0;  // graph nodes walked

  bool known() const { return source != ActivationSource::Unknown; }
};

}  // namespace fsdp_plan
