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

  // The saved bytes held after the last run consumed (forward or backward).
  int64_t held() const { return held_; }
  // What stays saved between forward and backward.
  int64_t after_forward() const;

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
};

// The memory models' note on activations: where they came from, or why they
// are not known and how to get them.
std::string activation_note(const ActivationPlan& acts);

}  // namespace fsdp_plan
