#include "activations/schedule.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

#include "util/strings.h"

namespace fsdp_plan {

ActivationSchedule::ActivationSchedule(const ActivationPlan& acts, const std::vector<int>& parents)
    : source_(acts.source), allowance_(acts.allowance_bytes) {
  const size_t n = parents.size();
  unit_runs_.assign(n, {});
  fwd_next_.assign(n, 0);
  bwd_left_.assign(n, 0);
  subtree_first_.assign(n, -1);
  subtree_last_.assign(n, -1);
  if (source_ == ActivationSource::Allowance) {
    held_ = after_forward_ = allowance_;
    return;
  }
  if (source_ != ActivationSource::Graph) return;
  runs_ = &acts.runs;
  batch_ = acts.input_bytes;
  for (size_t r = 0; r < acts.runs.size(); ++r) {
    const int u = acts.runs[r].unit;
    if (u < 0 || static_cast<size_t>(u) >= n) continue;
    unit_runs_[static_cast<size_t>(u)].push_back(r);
    // Every enclosing unit's subtree spans this run too.
    for (int p = u; p >= 0; p = parents[static_cast<size_t>(p)]) {
      auto& first = subtree_first_[static_cast<size_t>(p)];
      auto& last = subtree_last_[static_cast<size_t>(p)];
      if (first < 0 || static_cast<int64_t>(r) < first) first = static_cast<int64_t>(r);
      last = std::max(last, static_cast<int64_t>(r));
    }
  }
  for (size_t u = 0; u < n; ++u) bwd_left_[u] = unit_runs_[u].size();
  if (!acts.runs.empty()) after_forward_ = acts.runs.back().forward_end;
}

int64_t ActivationSchedule::after_forward() const { return after_forward_ + batch_; }

int64_t ActivationSchedule::forward_before(int unit) const {
  if (source_ != ActivationSource::Graph) return held_;
  const auto& mine = unit_runs_[static_cast<size_t>(unit)];
  const size_t k = fwd_next_[static_cast<size_t>(unit)];
  return k < mine.size() ? (*runs_)[mine[k]].forward_start + batch_ : held();
}

int64_t ActivationSchedule::forward_enter(int unit) {
  if (source_ != ActivationSource::Graph) return held_;
  const auto& mine = unit_runs_[static_cast<size_t>(unit)];
  size_t& k = fwd_next_[static_cast<size_t>(unit)];
  if (k >= mine.size()) return held();
  const ActivationRun& run = (*runs_)[mine[k++]];
  held_ = run.forward_end;
  return run.forward_peak + batch_;
}

std::optional<int64_t> ActivationSchedule::forward_resume(int unit, int next) {
  if (source_ != ActivationSource::Graph) return std::nullopt;
  const auto& mine = unit_runs_[static_cast<size_t>(unit)];
  size_t& k = fwd_next_[static_cast<size_t>(unit)];
  // Up to the next unit's first run; a next unit without runs gives no bound yet.
  const int64_t bound = next < 0 ? INT64_MAX : subtree_first_[static_cast<size_t>(next)];
  if (bound < 0) return std::nullopt;
  std::optional<int64_t> peak;
  while (k < mine.size() && static_cast<int64_t>(mine[k]) < bound) {
    const ActivationRun& run = (*runs_)[mine[k++]];
    peak = std::max(peak.value_or(0), run.forward_peak + batch_);
    held_ = run.forward_end;
  }
  return peak;
}

int64_t ActivationSchedule::backward_before(int unit) const {
  if (source_ != ActivationSource::Graph) return held_;
  const auto& mine = unit_runs_[static_cast<size_t>(unit)];
  const size_t left = bwd_left_[static_cast<size_t>(unit)];
  return left > 0 ? (*runs_)[mine[left - 1]].backward_start + batch_ : held();
}

int64_t ActivationSchedule::backward_enter(int unit) {
  if (source_ != ActivationSource::Graph) return held_;
  const auto& mine = unit_runs_[static_cast<size_t>(unit)];
  size_t& left = bwd_left_[static_cast<size_t>(unit)];
  if (left == 0) return held();
  const ActivationRun& run = (*runs_)[mine[--left]];
  held_ = run.backward_end;
  return run.backward_peak + batch_;
}

std::optional<int64_t> ActivationSchedule::backward_resume(int unit, int next) {
  if (source_ != ActivationSource::Graph) return std::nullopt;
  const auto& mine = unit_runs_[static_cast<size_t>(unit)];
  size_t& left = bwd_left_[static_cast<size_t>(unit)];
  const int64_t bound = next < 0 ? -1 : subtree_last_[static_cast<size_t>(next)];
  resumed_grads_ = 0;
  if (next >= 0 && bound < 0) return std::nullopt;
  std::optional<int64_t> peak;
  while (left > 0 && static_cast<int64_t>(mine[left - 1]) > bound) {
    const ActivationRun& run = (*runs_)[mine[--left]];
    peak = std::max(peak.value_or(0), run.backward_peak + batch_);
    held_ = run.backward_end;
    resumed_grads_ += run.backward_grads;
  }
  return peak;
}

LateGradients::LateGradients(const ModuleTree& tree, const std::vector<int>& parents,
                             const std::vector<ModuleId>& unit_module,
                             const std::vector<std::vector<std::pair<TensorId, int64_t>>>& params) {
  const std::vector<ModuleId> order = tree.preorder(0);
  std::vector<int64_t> pos(tree.num_modules(), 0), end(tree.num_modules(), 0);
  for (size_t i = 0; i < order.size(); ++i) pos[static_cast<size_t>(order[i])] = end[static_cast<size_t>(order[i])] =
      static_cast<int64_t>(i);
  // Children have larger ids than their parents: a backward sweep closes subtrees.
  for (size_t m = tree.num_modules(); m-- > 1;) {
    const auto p = static_cast<size_t>(tree.module(static_cast<ModuleId>(m)).parent);
    end[p] = std::max(end[p], end[m]);
  }
  std::vector<int64_t> tensor_pos(tree.num_tensors(), -1);
  for (size_t m = 0; m < tree.num_modules(); ++m)
    for (const auto& slot : tree.module(static_cast<ModuleId>(m)).params) {
      auto& tp = tensor_pos[static_cast<size_t>(slot.tensor)];
      tp = std::max(tp, pos[m]);
    }
  positions_ = static_cast<int64_t>(std::max<size_t>(order.size(), 1));
  const size_t n = parents.size();
  end_.resize(n);
  root_.assign(n, 0);
  nodes_.assign(1, Node{});
  // Units are in pre-order: a parent's tree is built before its children's.
  for (size_t u = 0; u < n; ++u) {
    end_[u] = end[static_cast<size_t>(unit_module[u])];
    const int p = parents[u];
    if (p >= 0 && static_cast<size_t>(p) >= u) throw std::logic_error("LateGradients: units not in pre-order");
    int32_t root = p >= 0 ? root_[static_cast<size_t>(p)] : 0;
    for (const auto& [t, bytes] : params[u])
      if (bytes != 0) root = insert(root, 0, positions_, tensor_pos[static_cast<size_t>(t)], bytes);
    root_[u] = root;
  }
}

// A copy of the path to `pos` with `bytes` added; every other node is shared.
int32_t LateGradients::insert(int32_t tree, int64_t lo, int64_t hi, int64_t pos, int64_t bytes) {
  const auto made = static_cast<int32_t>(nodes_.size());
  Node node = nodes_[static_cast<size_t>(tree)];
  node.bytes += bytes;
  nodes_.push_back(node);
  if (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    // Depth is log2(positions): the recursion is shallow.
    if (pos < mid)
      nodes_[static_cast<size_t>(made)].left = insert(node.left, lo, mid, pos, bytes);
    else
      nodes_[static_cast<size_t>(made)].right = insert(node.right, mid, hi, pos, bytes);
  }
  return made;
}

int64_t LateGradients::after(int unit, int after) const {
  if (after < 0 || static_cast<size_t>(after) >= end_.size() || unit < 0 || static_cast<size_t>(unit) >= root_.size())
    return 0;
  // Bytes at positions past `end`: down the tree, the right halves wholly past it.
  const int64_t end = end_[static_cast<size_t>(after)];
  int64_t total = 0, lo = 0, hi = positions_;
  int32_t node = root_[static_cast<size_t>(unit)];
  while (node != 0 && end < hi - 1) {
    const Node& n = nodes_[static_cast<size_t>(node)];
    const int64_t mid = lo + (hi - lo) / 2;
    if (end < mid) {
      total += nodes_[static_cast<size_t>(n.right)].bytes;
      node = n.left;
      hi = mid;
    } else {
      node = n.right;
      lo = mid;
    }
  }
  return total;
}

std::string activation_note(const ActivationPlan& acts) {
  switch (acts.source) {
    case ActivationSource::Unknown:
      return "activations not included: " + acts.unknown_reason;
    case ActivationSource::Allowance:
      return "activations: an allowance of " + format_bytes(acts.allowance_bytes) +
             " (--activation-bytes), held through forward and backward";
    case ActivationSource::Graph: break;
  }
  std::vector<std::string> dims;
  for (const auto& [name, value] : acts.dims) dims.push_back(name + "=" + std::to_string(value));
  std::string out = "activations from the graph: what autograd saves per operator on " + acts.device +
                    " (sdpa " + acts.sdpa + (acts.sdpa_kernels.empty() ? "" : ": " + join(acts.sdpa_kernels)) + ")";
  if (!dims.empty()) out += " at " + join(dims, " ");
  out += ", their gradients in backward";
  if (!acts.checkpointed.empty()) out += ", and the recompute of checkpointed modules";
  if (acts.loss.empty()) out += "; the export has no loss: the loss is not counted (export with labels)";
  return out;
}

}  // namespace fsdp_plan
