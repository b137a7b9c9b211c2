// Activations along a memory model's training step. The FSDP1 and FSDP2
// models (fsdp1/memory.cpp, fsdp2/memory.cpp) walk units: forward in unit
// order, a unit's forward inside its ancestors', backward in reverse. The
// activation walk's runs (plan/activations.h) are in graph order, where a
// parent unit may run before and after its children (the root's embedding,
// then the layers, then its head and loss). This class hands each of the
// model's points the activation bytes live there, consuming runs as the
// model's units start and resume, so both twins apply one set of rules.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/module_tree.h"
#include "plan/activations.h"

namespace fsdp_plan {

class ActivationSchedule {
 public:
  // parents[u]: the enclosing unit of unit u (-1 for the root), as Unit::parent.
  ActivationSchedule(const ActivationPlan& acts, const std::vector<int>& parents);

  bool known() const { return source_ != ActivationSource::Unknown; }

  // Forward. What is held when `unit` starts (before its first run).
  int64_t forward_before(int unit) const;
  // The unit starts: its next run, the peak during it. The level held after
  // is held().
  int64_t forward_enter(int unit);
  // `unit` continues after a child ended, before unit `next` starts (-1: to
  // the end of the forward): the peak of its runs there, if it has any.
  std::optional<int64_t> forward_resume(int unit, int next);

  // Backward, the runs in reverse. What is held when `unit`'s backward starts.
  int64_t backward_before(int unit) const;
  int64_t backward_enter(int unit);
  std::optional<int64_t> backward_resume(int unit, int next);
  // The gradients of their own unit's parameters that the runs the last
  // backward_resume took make (ActivationRun::backward_grads): its peak counts
  // them, so a model that counts the same parameters as gradients already
  // made (LateGradients, after `next`) takes them out there.
  int64_t resumed_grads() const { return resumed_grads_; }

  // Every level above includes the batch (ActivationPlan::input_bytes).
  // The saved bytes held after the last run consumed (forward or backward).
  int64_t held() const { return held_ + batch_; }
  // What stays saved between forward and backward.
  int64_t after_forward() const;
  // What is left after the backward: the batch, held through the optimizer step.
  int64_t batch() const { return batch_; }

 private:
  ActivationSource source_;
  int64_t allowance_ = 0;
  const std::vector<ActivationRun>* runs_ = nullptr;
  std::vector<std::vector<size_t>> unit_runs_;  // run indices of each unit, ascending
  std::vector<size_t> fwd_next_;                // per unit: next run to take forward (index into unit_runs_)
  std::vector<size_t> bwd_left_;                // per unit: runs not yet taken backward, from the end
  std::vector<int64_t> subtree_first_, subtree_last_;  // run index range of each unit's subtree (-1: none)
  int64_t held_ = 0;
  int64_t after_forward_ = 0;
  int64_t resumed_grads_ = 0;
  int64_t batch_ = 0;
};

// Gradients of enclosing units' parameters that already exist while a unit's
// backward runs. Autograd makes a parameter's gradient at the backward of its
// last use in the forward, so an enclosing unit's parameters used after unit j
// (the root's final norm and head after the layers) have their gradients
// during j's backward, the others (the embedding) only after it. "After" is
// module order, as the memory models assume execution order is
// (FSDP2: _fsdp_param_group.py, FSDPParamGroup.post_backward reduces
// unsharded_param.grad that autograd accumulated per parameter; FSDP1:
// flat_param.py, the views' gradients are held until their flat parameter's
// SplitWithSizesBackward concatenates them).
class LateGradients {
 public:
  // params[u]: (tensor, gradient bytes) of each of unit u's parameters that
  // gets a gradient. A tied parameter (GPT-2's wte and lm_head) counts at the
  // last module that holds it: its gradient starts at that module's backward.
  LateGradients(const ModuleTree& tree, const std::vector<int>& parents, const std::vector<ModuleId>& unit_module,
                const std::vector<std::vector<std::pair<TensorId, int64_t>>>& params);
  // Bytes of the gradients of the parameters of `unit` and its enclosing
  // units that run after unit `after`'s subtree in the forward.
  int64_t after(int unit, int after) const;

 private:
  // A persistent segment tree over preorder positions: root_[u] holds the
  // gradient bytes of the parameters of u and its enclosing units by the
  // position of their last use, so after() is one O(log modules) walk, not one
  // per enclosing unit (a 100,000-deep chain made that quadratic).
  struct Node {
    int32_t left = 0, right = 0;  // node 0 is the empty tree, its own children
    int64_t bytes = 0;
  };
  int32_t insert(int32_t tree, int64_t lo, int64_t hi, int64_t pos, int64_t bytes);

  std::vector<int64_t> end_;  // per unit: the last preorder position of its module's subtree
  std::vector<int32_t> root_;
  std::vector<Node> nodes_;
  int64_t positions_ = 0;
};

// The memory models' note on activations: where they came from, or why they
// are not known and how to get them.
std::string activation_note(const ActivationPlan& acts);

}  // namespace fsdp_plan
