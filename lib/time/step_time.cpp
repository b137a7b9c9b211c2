#include "time/step_time.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "model/class_names.h"
#include "plan/plan.h"
#include "time/hardware.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

struct Segment {
  int unit;
  int64_t flops;
  double seconds;  // compute, plus tp_s
  double tp_s = 0;           // of `seconds`: tensor parallelism's blocking collectives
  double tp_backward_s = 0;  // forward segments: the TP collectives their backward will add
};

void push_merged(std::vector<Segment>& segs, int unit, int64_t flops, double seconds, double tp_s = 0,
                 double tp_backward_s = 0) {
  if (!segs.empty() && segs.back().unit == unit) {
    segs.back().flops += flops;
    segs.back().seconds += seconds + tp_s;
    segs.back().tp_s += tp_s;
    segs.back().tp_backward_s += tp_backward_s;
  } else {
    segs.push_back({unit, flops, seconds + tp_s, tp_s, tp_backward_s});
  }
}

// Without FLOPs, the modules that compute: those holding a matrix (a
// parameter of two or more dimensions) of their own, other than embeddings,
// whose lookups FlopCounterMode counts as 0 (FLOPS.md). Norms' vectors do not.
// `classes` remembers each class's answer (a 100,000-module tree has a handful of classes).
bool holds_matrix(const ModuleTree& tree, ModuleId m, std::unordered_map<std::string_view, bool>& classes) {
  const Module& mod = tree.module(m);
  bool matrix = false;
  for (const auto& slot : mod.params)
    if (tree.tensor(slot.tensor).shape.size() >= 2) matrix = true;
  if (!matrix) return false;
  const auto [it, fresh] = classes.try_emplace(mod.type_name, false);
  if (fresh) {
    const std::string cls(short_name(demangle(mod.type_name)));
    auto ends_with = [&](const char* tail) {
      const std::string t(tail);
      return cls.size() >= t.size() && cls.compare(cls.size() - t.size(), t.size(), t) == 0;
    };
    it->second = !ends_with("Embedding") && !ends_with("EmbeddingBag");
  }
  return it->second;
}

// Which positions 0..n-1 are marked, and the first marked one after a given
// one: a Fenwick tree of the marks' counts (log n a step, no allocation).
class Marks {
 public:
  explicit Marks(size_t n) : on_(n, false), tree_(n + 1, 0), top_(1) {
    while (top_ * 2 <= n) top_ *= 2;
  }
  void mark(size_t i) {
    if (on_[i]) return;
    on_[i] = true;
    for (size_t j = i + 1; j < tree_.size(); j += j & (~j + 1)) ++tree_[j];
  }
  // The first marked position after k, or size() when none is.
  size_t next_after(size_t k) const {
    size_t want = 1;  // marks in [0, k], plus one
    for (size_t j = k + 1; j > 0; j -= j & (~j + 1)) want += tree_[j];
    size_t pos = 0;  // the longest prefix with fewer marks than `want`
    for (size_t step = top_; step > 0; step /= 2)
      if (pos + step < tree_.size() && tree_[pos + step] < want) {
        pos += step;
        want -= tree_[pos];
      }
    return pos;
  }
  size_t size() const { return on_.size(); }

 private:
  std::vector<bool> on_;
  std::vector<size_t> tree_;  // tree_[j]: the marks in (j - lowbit(j), j], 1-based
  size_t top_;
};

// Segments plus an empty one for each unit that has a collective but no
// segment (so that its all-gather still gates the compute), placed before the
// next unit of `units_in_order` that has one (time_model.py _with_missing).
// The missing units go in order of first appearance, each one counting as
// having a segment for those after it. Linear-logarithmic: a 100,000-unit
// plan without FLOPs has a missing unit per collective. A linked list in
// arrays, not std::list: a node each was most of the time model's cost.
std::vector<Segment> with_missing(const std::vector<Segment>& segs, const std::vector<int>& units_in_order,
                                  size_t n) {
  constexpr long kEnd = -1;  // past the last node; also "no segment"
  std::vector<Segment> nodes(segs);
  std::vector<long> prev(segs.size()), next(segs.size());
  for (size_t i = 0; i < segs.size(); ++i) {
    prev[i] = static_cast<long>(i) - 1;
    next[i] = i + 1 < segs.size() ? static_cast<long>(i + 1) : kEnd;
  }
  long head = segs.empty() ? kEnd : 0, tail = static_cast<long>(segs.size()) - 1;
  std::vector<long> first(n, kEnd);  // a unit's first node
  for (size_t i = segs.size(); i-- > 0;) first[static_cast<size_t>(segs[i].unit)] = static_cast<long>(i);
  // Where each unit appears in units_in_order, in order: begin[u] .. begin[u + 1] of `positions`.
  std::vector<size_t> begin(n + 1, 0), positions(units_in_order.size());
  for (int u : units_in_order) ++begin[static_cast<size_t>(u) + 1];
  for (size_t u = 0; u < n; ++u) begin[u + 1] += begin[u];
  {
    std::vector<size_t> fill(begin.begin(), begin.end() - 1);
    for (size_t k = 0; k < units_in_order.size(); ++k) positions[fill[static_cast<size_t>(units_in_order[k])]++] = k;
  }
  Marks having(units_in_order.size());  // positions of units_in_order whose unit has a segment
  auto mark_unit = [&](size_t u) {
    for (size_t j = begin[u]; j < begin[u + 1]; ++j) having.mark(positions[j]);
  };
  for (size_t u = 0; u < n; ++u)
    if (first[u] != kEnd) mark_unit(u);
  for (size_t k = 0; k < units_in_order.size(); ++k) {
    const auto m = static_cast<size_t>(units_in_order[k]);
    if (first[m] != kEnd || positions[begin[m]] != k) continue;
    const size_t after = having.next_after(k);
    const long pos = after == having.size() ? kEnd : first[static_cast<size_t>(units_in_order[after])];
    // Insert a node before `pos`.
    const long node = static_cast<long>(nodes.size());
    nodes.push_back(Segment{static_cast<int>(m), 0, 0.0});
    const long before = pos == kEnd ? tail : prev[static_cast<size_t>(pos)];
    prev.push_back(before);
    next.push_back(pos);
    (before == kEnd ? head : next[static_cast<size_t>(before)]) = node;
    (pos == kEnd ? tail : prev[static_cast<size_t>(pos)]) = node;
    first[m] = node;
    mark_unit(m);
  }
  std::vector<Segment> out;
  out.reserve(nodes.size());
  for (long i = head; i != kEnd; i = next[static_cast<size_t>(i)]) out.push_back(nodes[static_cast<size_t>(i)]);
  return out;
}

std::string fmt(const char* format, double v);

bool low_precision(const std::string& dtype) { return dtype == "bfloat16" || dtype == "float16"; }

// Per module, whether its own matmuls run at the bf16 (fp16) Tensor Core peak
// or at TF32's: in its unit's param_dtype under mixed precision; else in its
// own parameters' dtype (the widest: peft's fp32 lora_A beside a bf16 base
// layer runs in fp32); a module with none (attention's SDPA, a container)
// computes on its unit's activations, in the dtype most of the unit's
// parameters are in.
std::vector<bool> low_precision_modules(const Plan& plan, const std::vector<int>& owner) {
  const ModuleTree& tree = *plan.tree;
  const auto& mp = plan.policy.mixed_precision;
  std::vector<int64_t> low_numel(plan.units.size(), 0), numel(plan.units.size(), 0);
  for (size_t u = 0; u < plan.units.size(); ++u)
    for (const auto& o : plan.units[u].params) {
      numel[u] += tree.numel(o.tensor);
      if (low_precision(tree.tensor(o.tensor).dtype)) low_numel[u] += tree.numel(o.tensor);
    }
  std::vector<bool> out(tree.num_modules(), false);
  for (size_t m = 0; m < tree.num_modules() && m < owner.size(); ++m) {
    const auto u = static_cast<size_t>(owner[m]);
    if (plan.units[u].mixed_precision.value_or(false) && mp && mp->param_dtype) {
      out[m] = low_precision(*mp->param_dtype);
      continue;
    }
    int64_t widest = 0;
    bool low = false;
    for (const auto& slot : tree.module(static_cast<ModuleId>(m)).params) {
      const TensorInfo& t = tree.tensor(slot.tensor);
      if (t.itemsize > widest) widest = t.itemsize, low = low_precision(t.dtype);
    }
    out[m] = widest > 0 ? low : numel[u] > 0 && 2 * low_numel[u] > numel[u];
  }
  return out;
}

// The assumption line on the compute's dtypes: which peak, for what share of the FLOPs.
std::string compute_dtype_note(const Plan& plan, const HardwareFigures& hw, const FlopProfile& flops,
                               const std::vector<bool>& low) {
  int64_t low_flops = 0, all = 0, tf32_modules = 0;
  std::string names;
  for (const auto& [module, f] : flops.forward_order) {
    all += f;
    if (low[static_cast<size_t>(module)]) {
      low_flops += f;
    } else if (f > 0 && ++tf32_modules <= 3) {
      names += (names.empty() ? "" : ", ") + path_or_root(plan.tree->path(module));
    }
  }
  if (tf32_modules > 3) names += ", ... (" + std::to_string(tf32_modules) + " modules)";
  const double share = all > 0 ? static_cast<double>(low_flops) / static_cast<double>(all) : 1.0;
  // Each module's matmuls at the peak of the dtype they run in (its unit's param_dtype under mixed
  // precision, else its own parameters').
  const std::string bf16 = "bf16 peak (" + fmt("%.1f", hw.bf16_flops / 1e12) + " TFLOP/s)";
  const std::string tf32 = "TF32 peak (" + fmt("%.1f", hw.tf32_flops / 1e12) + " TFLOP/s)";
  std::string out;
  if (low_flops == all)
    out = "compute dtype: bf16, at the " + bf16 + ", all FLOPs";
  else if (low_flops == 0)
    out = "compute dtype: fp32, at the " + tf32 + ", all FLOPs";
  else
    out = "compute dtypes, each module at its own: " + bf16 + " for " + fmt("%.1f", 100 * share) +
          "% of the forward FLOPs, " + tf32 + " for " + fmt("%.1f", 100 * (1 - share)) + "% (fp32: " + names + ")";
  return out;
}

// Bytes of HBM the optimizer step moves per trainable element of the fp32
// shard, op by op as torch.optim runs it (torch/optim/adam.py, sgd.py).
// AdamW's for-loop (_single_tensor_adam) and foreach (_multi_tensor_adam)
// run the same eight elementwise passes: param.mul_(1 - lr * wd) 8,
// exp_avg.lerp_(grad) 12, exp_avg_sq.mul_(beta2) 8, .addcmul_(grad, grad) 16,
// sqrt(exp_avg_sq) 8, .div_(bias_correction2_sqrt) 8, .add_(eps) 8,
// param.addcdiv_(exp_avg, denom) 16: 84 B (76 without weight decay). Fused
// (_fused_adam) is one kernel: read param, grad, exp_avg, exp_avg_sq, write
// param, exp_avg, exp_avg_sq: 28 B. Measured on an H200 (bench/gpu_check.py,
// foreach AdamW on 1.92e9 elements): 42.5 ms, 84 B at 0.79 of the HBM peak.
// SGD with momentum: buf.mul_ 8, .add_(grad) 12, param.add_(buf) 12 (fused
// 20); plain SGD: param.add_(grad) 12.
int optimizer_bytes_per_param(Optimizer o, OptimizerImpl impl) {
  const bool fused = impl == OptimizerImpl::Fused;
  switch (o) {
    case Optimizer::Adam:
    case Optimizer::AdamW: return fused ? 28 : 84;  // AdamW's weight-decay pass not counted
    case Optimizer::SgdMomentum: return fused ? 20 : 32;
    case Optimizer::Sgd: return 12;
    case Optimizer::None: return 0;
  }
  return 84;
}

int optimizer_bytes_per_param(const FsdpSettings& s) {
  return optimizer_bytes_per_param(s.optimizer, s.optimizer_impl.value_or(OptimizerImpl::ForLoop));
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::vector<std::string> assumptions(const Plan& plan, const StepTime& t) {
  const HardwareFigures& hw = t.hardware;
  std::vector<std::string> out;
  out.push_back("an ESTIMATE from published peak figures times the efficiencies below; nothing was measured on a GPU");
  std::string h = hw.name + " (--hardware " + hw.preset + "): " + (t.flops_known ? t.compute_dtype + " " : "") +
                  fmt("%.1f", (t.flops_known ? t.compute_peak_flops : hw.bf16_flops) / 1e12) + " TFLOP/s peak" +
                  (t.flops_known ? "" : " (bf16)") + ", HBM " + fmt("%.3g", hw.hbm_bytes_per_s / 1e12) +
                  " TB/s, NVLink " + fmt("%.0f", hw.intra_node_bytes_per_s / 1e9) + " GB/s and network " +
                  fmt("%.0f", hw.inter_node_bytes_per_s / 1e9) + " GB/s per GPU per direction, PCIe " +
                  fmt("%.0f", hw.host_bytes_per_s / 1e9) + " GB/s; " + std::to_string(hw.gpus_per_node) +
                  " GPUs per node, rank r on node r / " + std::to_string(hw.gpus_per_node);
  if (!hw.overridden.empty()) {
    h += "; overridden:";
    for (size_t i = 0; i < hw.overridden.size(); ++i) h += (i ? ", " : " ") + hw.overridden[i];
  }
  out.push_back(h);
  out.push_back("efficiencies (achieved / peak): compute " + fmt("%g", hw.compute_efficiency) + ", communication " +
                fmt("%g", hw.comm_efficiency) + ", memory " + fmt("%g", hw.memory_efficiency));
  out.push_back("collectives: NCCL ring, latency " + fmt("%g", hw.base_latency_s * 1e6) + " us + " +
                fmt("%g", hw.intra_step_latency_s * 1e6) + " us per NVLink step + " +
                fmt("%g", hw.inter_step_latency_s * 1e6) +
                " us per network step (Simple protocol); one channel per process group, so a group's all-gathers "
                "and reduce-scatters run one at a time, in FSDP's issue order");
  out.push_back(std::string("overlap: FSDP") + (plan.v2() ? "2" : "1") +
                "'s prefetching and reduction as docs/time-model.md section 3's rules F1-F2, B1-B4 say; the CPU "
                "issues work ahead of the GPU");
  if (t.flops_known) {
    std::string source = t.flops_source;
    if (source == "graph") {
      // lib/time/flops.h: the graph's ops at the plan's dimensions, the checkpointed modules' recompute.
      source = "the .pt2 graph's ops at ";
      std::string dims;
      for (const auto& [name, value] : plan.activations.dims)
        dims += (dims.empty() ? "" : ", ") + name + "=" + std::to_string(value);
      source += dims.empty() ? "the exported shapes" : dims;
      const size_t ac = plan.activations.checkpointed.size();
      const bool sac = ac && plan.activations.checkpointed.front().selective;
      source += ac ? ", with the " + std::string(sac ? "selective recompute (the ops its policy saves left out) of "
                                                     : "recompute of ") +
                         std::to_string(ac) + " checkpointed module" + (ac == 1 ? "" : "s")
                   : ", no activation checkpointing";
    }
    out.push_back("FLOPs: " + source +
                  ", counted as FlopCounterMode counts (matmul-like ops only, causal attention in full); compute at " +
                  fmt("%g", hw.compute_efficiency) + " of the peak");
    out.push_back(t.compute_dtype_note);
    const FsdpSettings& s = plan.memory.settings;
    if (s.cpu_offload) {
      out.push_back(std::string("optimizer: ") + optimizer_name(s.optimizer) +
                    " on the CPU (CPU offload): not modelled; the step time leaves it out");
    } else {
      out.push_back(std::string("optimizer: ") + optimizer_name(s.optimizer) + " (" +
                    optimizer_impl_name(s.optimizer_impl.value_or(OptimizerImpl::ForLoop)) +
                    ") on the shards, memory-bound (" + std::to_string(optimizer_bytes_per_param(s)) +
                    " B per trainable element at " + fmt("%g", hw.memory_efficiency) + " of the HBM peak)");
    }
    if (s.gradient_accumulation_steps > 1)
      out.push_back("gradient accumulation: the step is one micro-step and the optimizer; an optimizer step runs " +
                    std::to_string(s.gradient_accumulation_steps) + " micro-steps, " +
                    (s.no_sync ? "only the last of them reduce-scattering (no_sync): the others all-gather only"
                               : "each all-gathering and reduce-scattering") +
                    " (not modelled: their time)");
  } else {
    out.push_back("FLOPs unknown (no op graph: a TorchScript model, and no --flops): no compute time and no step "
                  "time; the exposed communication assumes every unit holding a matrix computes long enough to "
                  "hide its neighbours' collectives, so only what nothing can hide counts (docs/time-model.md "
                  "section 6)");
  }
  const TpComm& tp = plan.comm.tp;
  if (tp.planned) {
    if (!tp.sizes_known)
      out.push_back("tensor parallelism's collectives not counted: " + tp.unknown_reason);
    else
      out.push_back("tensor parallelism: " + std::to_string(tp.collectives.size()) + " collectives on the tp group (" +
                    std::to_string(tp.group.size) + " ranks, " + fmt("%.3g", t.tp_comm_s * 1e3) +
                    " ms), blocking: each runs on the compute stream's path, nothing overlaps it" +
                    (t.flops_known ? "" : " (no step to add them to without FLOPs)") +
                    (tp.not_modelled.empty() ? std::string()
                                             : "; not counted, the activations' redistributions of " +
                                                   std::to_string(tp.not_modelled.size()) + " module(s) such as " +
                                                   tp.not_modelled.front()));
  }
  const EpComm& ep = plan.comm.ep;
  if (ep.planned) {
    if (!ep.sizes_known)
      out.push_back("expert parallelism's all-to-alls not counted: " + ep.unknown_reason);
    else if (!ep.collectives.empty())
      out.push_back("expert parallelism: " + std::to_string(ep.collectives.size()) + " all-to-alls on the ep group (" +
                    std::to_string(ep.group.size) + " ranks, " + fmt("%.3g", t.ep_comm_s * 1e3) +
                    " ms), blocking (the splits need a device-to-host sync), " +
                    (plan.expert_parallel && plan.expert_parallel->imbalance != 1.0
                         ? "the busiest rank's (skewed routing: each call's time is its larger buffer's)"
                         : "routing assumed uniform") +
                    (t.flops_known ? "" : " (no step to add them to without FLOPs)"));
  }
  const CpComm& cp = plan.comm.cp;
  if (cp.planned && !cp.collectives.empty())
    out.push_back("context parallelism: " + std::to_string(cp.collectives.size()) +
                  " collectives of attention's ring on the cp group (" + std::to_string(cp.group.size) +
                  " ranks, " + fmt("%.3g", t.cp_comm_s * 1e3) +
                  " ms), blocking: the ring waits for each exchange (its overlap with the local chunk's attention "
                  "not modelled); attention's FLOPs with every rank's keys, causal skipping not counted "
                  "(FlopCounterMode's sdpa formula)" +
                  (t.flops_known ? "" : " (no step to add them to without FLOPs)"));
  out.push_back("not modelled: activation memory traffic, elementwise kernels, kernel launch and CPU overhead, NCCL "
                "algorithms other than ring, contention between process groups on shared links, stragglers, the "
                "data loader");
  return out;
}

// The step as time_model.py simulates it: each collective's time alone, the
// compute cut into segments (a unit's, in execution order), then one compute
// stream and one channel per process group, forward then backward, each
// collective gated as FSDP issues it (F1-F2, B1-B4 below).
class StepTimeModel {
 public:
  StepTimeModel(const Plan& plan, const HardwareFigures& hw, const FlopProfile* flops)
      : plan_(plan), hw_(hw), flops_(flops), tree_(*plan.tree), comm_(plan.comm), n_(plan.units.size()),
        nc_(plan.comm.collectives.size()), owner_(unit_of_modules(plan)) {
    t_.computed = true;
    t_.hardware = hw;
    t_.flops_known = flops != nullptr;
    if (flops) t_.flops_source = flops->source;
    t_.units.assign(n_, UnitTime{});
  }

  // One channel per process group: each collective's, as an index into
  // `groups_` (a step has a handful of groups, so a linear search beats a map).
  void assign_channels() {
    channel_.resize(nc_);
    for (size_t i = 0; i < nc_; ++i) {
      const RankGroup& g = comm_.collectives[i].group;
      size_t k = i > 0 && groups_[channel_[i - 1]] == g ? channel_[i - 1] : 0;
      while (k < groups_.size() && !(groups_[k] == g)) ++k;
      if (k == groups_.size()) groups_.push_back(g);
      channel_[i] = k;
    }
  }

  // Each collective's time alone (section 2), CPU offload's copy added.
  void time_collectives() {
    t_.collectives.resize(nc_);
    std::vector<double> channel_total(groups_.size(), 0.0);
    for (size_t i = 0; i < nc_; ++i) {
      const Collective& c = comm_.collectives[i];
      CollectiveTime& ct = t_.collectives[i];
      ct = collective_time(c.kind, c.bytes, c.group, hw_);
      UnitTime& u = t_.units[static_cast<size_t>(c.unit)];
      (c.kind == CollectiveKind::AllGather ? u.all_gather_s
       : c.kind == CollectiveKind::ReduceScatter ? u.reduce_scatter_s
                                                  : u.all_reduce_s) += ct.seconds;
      if (c.host_copy_bytes > 0) {
        ct.host_copy_s = static_cast<double>(c.host_copy_bytes) / (hw_.host_bytes_per_s * hw_.comm_efficiency);
        u.host_copy_s += ct.host_copy_s;
        ct.seconds += ct.host_copy_s;
      }
      t_.comm_s += ct.seconds;
      channel_total[channel_[i]] += ct.seconds;
    }
    for (const double s : channel_total) t_.channel_s = std::max(t_.channel_s, s);
  }

  // Tensor parallelism's collectives, per module and phase: they join the
  // compute of the segment their module runs in (style.py's redistributions
  // run inside the module's forward, and their backward inside its backward).
  // Expert parallelism's all-to-alls join their experts module's segments the same way.
  void time_tp_collectives() {
    tp_fwd_.assign(tree_.num_modules(), 0.0);
    tp_bwd_.assign(tree_.num_modules(), 0.0);
    t_.tp_comm_s = time_blocking(comm_.tp.collectives, t_.tp_collectives);
    t_.ep_comm_s = time_blocking(comm_.ep.collectives, t_.ep_collectives);
    t_.cp_comm_s = time_blocking(comm_.cp.collectives, t_.cp_collectives);
  }

  double time_blocking(const std::vector<Collective>& cs, std::vector<CollectiveTime>& times) {
    double total = 0;
    times.resize(cs.size());
    for (size_t i = 0; i < cs.size(); ++i) {
      times[i] = collective_time(cs[i].kind, std::max(cs[i].bytes, cs[i].recv_bytes), cs[i].group, hw_, cs[i].permute);
      total += times[i].seconds;
      (cs[i].phase == StepPhase::Forward ? tp_fwd_ : tp_bwd_)[static_cast<size_t>(cs[i].module)] += times[i].seconds;
    }
    return total;
  }

  // The forward's compute segments, in execution order. The root's
  // pre-forward precedes every op (its all-gather first), and its
  // reduce-scatter waits for the end of backward: an empty root segment first.
  void forward_segments() {
    if (flops_)
      forward_segments_from_flops();
    else
      forward_segments_without_flops();
    if (n_ > 0 && (fwd_.empty() || fwd_.front().unit != 0)) fwd_.insert(fwd_.begin(), Segment{0, 0, 0.0});
  }

  // Backward: the forward segments reversed, each with its unit's backward
  // FLOPs in proportion to the unit's forward FLOPs in it.
  void backward_segments() {
    bwd_.reserve(fwd_.size());
    if (!flops_) {
      for (size_t k = fwd_.size(); k-- > 0;) bwd_.push_back(fwd_[k]);
      return;
    }
    std::vector<int64_t> unit_forward(n_, 0), unit_backward(n_, 0);
    for (const Segment& s : fwd_) unit_forward[static_cast<size_t>(s.unit)] += s.flops;
    for (size_t m = 0; m < flops_->own.size() && m < owner_.size(); ++m)
      unit_backward[static_cast<size_t>(owner_[m])] += flops_->own[m].backward + flops_->own[m].recompute;
    for (size_t i = 0; i < n_; ++i)
      if (unit_forward[i] < 0 || unit_backward[i] < 0)
        throw std::invalid_argument("the FLOPs of unit " + std::to_string(i) + " (" +
                                    path_or_root(tree_.path(plan_.units[i].module)) +
                                    ") come out negative: the FLOP figures do not describe this model");
    std::vector<bool> placed(n_, false);
    for (size_t k = fwd_.size(); k-- > 0;) {
      const size_t u = static_cast<size_t>(fwd_[k].unit);
      int64_t f;
      if (unit_forward[u] != 0) {
        const double share = static_cast<double>(fwd_[k].flops) / static_cast<double>(unit_forward[u]);
        f = static_cast<int64_t>(std::nearbyint(static_cast<double>(unit_backward[u]) * share));
      } else {
        f = placed[u] ? 0 : unit_backward[u];  // no forward FLOPs to divide by: its first backward segment
      }
      placed[u] = true;
      // The backward at the rate its forward segment ran at (its modules' dtypes).
      const double compute_s = fwd_[k].seconds - fwd_[k].tp_s;
      const double rate = !one_rate_ && fwd_[k].flops > 0 && compute_s > 0
                              ? static_cast<double>(fwd_[k].flops) / compute_s : flop_rate_;
      bwd_.push_back({fwd_[k].unit, f, static_cast<double>(f) / rate + fwd_[k].tp_backward_s,
                      fwd_[k].tp_backward_s});
    }
  }

  // Forward. F1: a unit's segment starts after its all-gather ended. F2: the
  // j-th all-gather waits for a free buffer: FSDP2 for the start of unit
  // j-2's compute (two all-gather outputs alive, wait_for_unshard), FSDP1 for
  // the end of unit j-2's forward when that unit reshards after forward
  // (limit_all_gathers' rate limiter).
  void simulate_forward() {
    channel_free_.assign(groups_.size(), 0.0);
    done_.assign(nc_, false);
    index_forward_all_gathers();
    seg_start_.assign(n_, 0.0);
    seg_end_.assign(n_, 0.0);
    started_.assign(n_, false);
    ended_.assign(n_, false);
    for (const Segment& s : with_missing(fwd_, f_ag_units_, n_)) {
      const size_t u = static_cast<size_t>(s.unit);
      double ready = compute_free_;
      if (order_[u] >= 0) {
        schedule_forward_all_gathers(static_cast<size_t>(order_[u]));
        ready = std::max(ready, t_.collectives[f_ag_[static_cast<size_t>(order_[u])]].end);
      }
      t_.units[u].exposed_forward_s += ready - compute_free_;
      const double start = ready, end = ready + s.seconds;
      if (!started_[u]) seg_start_[u] = start, started_[u] = true;
      seg_end_[u] = end;
      ended_[u] = true;
      compute_free_ = end;
      t_.units[u].forward_flops += s.flops;
      t_.units[u].forward_compute_s += s.seconds - s.tp_s;
      t_.units[u].tp_forward_s += s.tp_s;
      if (flops_) t_.timeline.push_back({true, -1, s.unit, false, start, end});
    }
    schedule_forward_all_gathers(f_ag_.size());
    t_.forward_end_s = compute_free_;
  }

  // Backward. B1: a unit's segment starts after its backward all-gathers
  // ended. B2: a backward all-gather is issued in the pre-backward of the unit
  // computed just before it, not before that unit's compute started. B3: a
  // reduction starts when its unit's backward compute ended; HSDP's all-reduce
  // when its reduce-scatter ended.
  void simulate_backward() {
    index_backward();
    std::vector<double> rs_end(n_, 0.0);
    std::vector<bool> reduced(n_, false);
    for (size_t i : b_colls_) {
      if (done_[i]) continue;  // issued early by run_backward_segments
      const Collective& c = comm_.collectives[i];
      const size_t u = static_cast<size_t>(c.unit);
      if (c.kind == CollectiveKind::AllGather) {
        const long idx = (first_seg_[u] >= 0 ? first_seg_[u] : static_cast<long>(segs_.size())) - 1;
        double gate = 0;
        if (idx >= 0) {
          run_backward_segments(idx);
          gate = bseg_start_[static_cast<size_t>(idx)];
        }
        if (done_[i]) continue;
        run_collective(i, gate);
        done_[i] = true;
        continue;
      }
      if (c.kind == CollectiveKind::AllReduce && reduced[u]) {  // HSDP: after the reduce-scatter
        run_collective(i, rs_end[u]);
        done_[i] = true;
        continue;
      }
      run_backward_segments(last_seg_[u]);
      run_collective(i, bended_[u] ? bseg_end_[u] : compute_free_);
      done_[i] = true;
      rs_end[u] = t_.collectives[i].end;
      reduced[u] = true;
    }
    run_backward_segments(static_cast<long>(segs_.size()));
  }

  // B4: backward ends when the last collective has; the time after the last
  // compute goes to the collectives still running, in the order they end.
  void expose_tail() {
    compute_end_ = compute_free_;
    backward_end_ = compute_end_;
    for (const CollectiveTime& ct : t_.collectives) backward_end_ = std::max(backward_end_, ct.end);
    std::vector<size_t> tail;
    for (size_t i = 0; i < nc_; ++i)
      if (t_.collectives[i].end > compute_end_) tail.push_back(i);
    std::stable_sort(tail.begin(), tail.end(),
                     [&](size_t a, size_t b) { return t_.collectives[a].end < t_.collectives[b].end; });
    double covered = compute_end_;
    for (size_t i : tail) {
      const CollectiveTime& ct = t_.collectives[i];
      const double extra = ct.end - std::max({covered, ct.start, compute_end_});
      if (extra > 0) {
        t_.units[static_cast<size_t>(comm_.collectives[i].unit)].exposed_tail_s += extra;
        covered = ct.end;
      }
    }
  }

  // The optimizer step: the HBM its elementwise passes move over the
  // trainable shard (optimizer_bytes_per_param), after backward.
  void optimizer_step() {
    if (!flops_) return;
    for (const UnitComm& u : comm_.units) t_.optimizer_trainable_shard_numel += u.trainable_shard_numel;
    const int per = optimizer_bytes_per_param(plan_.memory.settings);
    // CPU offload steps the optimizer on the host, which no figure here models: left out, and said.
    t_.optimizer_modelled = !plan_.memory.settings.cpu_offload;
    t_.optimizer_s = t_.optimizer_modelled ? static_cast<double>(t_.optimizer_trainable_shard_numel * per) /
                                                 (hw_.hbm_bytes_per_s * hw_.memory_efficiency)
                                           : 0;
  }

  // The totals, and the assumptions the estimate rests on.
  StepTime totals() {
    for (const UnitTime& u : t_.units) t_.exposed_comm_s += u.exposed_s();
    if (flops_) {
      t_.backward_compute_end_s = compute_end_;
      t_.backward_end_s = backward_end_;
      for (const UnitTime& u : t_.units) t_.compute_s += u.forward_compute_s + u.backward_compute_s;
      t_.step_s = backward_end_ + t_.optimizer_s;
    } else {
      // The segments' lengths were a device: no compute, no step to report.
      for (UnitTime& u : t_.units) u.forward_compute_s = u.backward_compute_s = 0;
      t_.forward_end_s = 0;
      t_.timeline.clear();
      for (CollectiveTime& ct : t_.collectives) ct.start = ct.end = 0;
    }
    t_.assumptions = assumptions(plan_, t_);
    if (flops_)
      for (const std::string& note : flops_->notes) t_.assumptions.push_back("FLOPs: " + note);
    return std::move(t_);
  }

 private:
  // FlopCounterMode's forward FLOPs, module by module in forward order, at
  // the peak of the compute dtype (bf16 when every unit computes in a 16-bit
  // dtype); a module's TP collectives go with its first forward segment.
  void forward_segments_from_flops() {
    const std::vector<bool> low = low_precision_modules(plan_, owner_);
    int64_t low_flops = 0, all_flops = 0;
    for (const auto& [module, f] : flops_->forward_order) {
      all_flops += f;
      if (low[static_cast<size_t>(module)]) low_flops += f;
    }
    // The dtype most FLOPs run in: what a rate without a module (a backward with no forward) takes.
    t_.compute_dtype = 2 * low_flops >= all_flops && (low_flops > 0 || all_flops == 0) ? "bf16" : "tf32";
    t_.compute_peak_flops = t_.compute_dtype == "bf16" ? hw_.bf16_flops : hw_.tf32_flops;
    t_.compute_dtype_note = compute_dtype_note(plan_, hw_, *flops_, low);
    flop_rate_ = t_.compute_peak_flops * hw_.compute_efficiency;
    one_rate_ = low_flops == 0 || low_flops == all_flops;
    for (const auto& [module, f] : flops_->forward_order) {
      // A module's TP collectives go with its first forward segment.
      const auto m = static_cast<size_t>(module);
      const double rate = (low[m] ? hw_.bf16_flops : hw_.tf32_flops) * hw_.compute_efficiency;
      push_merged(fwd_, owner_[m], f, static_cast<double>(f) / rate, tp_fwd_[m], tp_bwd_[m]);
      tp_fwd_[m] = tp_bwd_[m] = 0;
    }
    // A module with TP collectives but no FLOPs of its own: its unit's last segment so far.
    for (size_t m = 0; m < tp_fwd_.size(); ++m)
      if (tp_fwd_[m] > 0 || tp_bwd_[m] > 0) push_merged(fwd_, owner_[m], 0, 0.0, tp_fwd_[m], tp_bwd_[m]);
  }

  // Section 6: without FLOPs a segment per computing module, long enough to
  // hide any neighbour: every collective's time.
  void forward_segments_without_flops() {
    const double enough = t_.comm_s > 0 ? t_.comm_s : 1.0;
    std::unordered_map<std::string_view, bool> classes;
    for (ModuleId m : tree_.preorder())
      if (holds_matrix(tree_, m, classes)) push_merged(fwd_, owner_[static_cast<size_t>(m)], 0, enough);
  }

  // Collective i on its channel, from when the channel is free and `gate` has passed.
  void run_collective(size_t i, double gate) {
    CollectiveTime& ct = t_.collectives[i];
    double& free = channel_free_[channel_[i]];
    ct.start = std::max(free, gate);
    ct.end = ct.start + ct.seconds;
    free = ct.end;
    if (flops_)  // without FLOPs the spans' times are a device (section 6): no timeline
      t_.timeline.push_back({false, static_cast<int>(i), comm_.collectives[i].unit,
                             comm_.collectives[i].phase == StepPhase::Backward, ct.start, ct.end});
  }

  // The forward all-gathers in issue order, each unit's place among them,
  // and which units reshard after forward (a backward all-gather).
  void index_forward_all_gathers() {
    order_.assign(n_, -1);
    reshards_.assign(n_, false);
    for (size_t i = 0; i < nc_; ++i) {
      const Collective& c = comm_.collectives[i];
      if (c.phase == StepPhase::Forward && c.kind == CollectiveKind::AllGather) {
        order_[static_cast<size_t>(c.unit)] = static_cast<long>(f_ag_.size());
        f_ag_.push_back(i);
        f_ag_units_.push_back(c.unit);
      } else if (c.phase == StepPhase::Backward && c.kind == CollectiveKind::AllGather) {
        reshards_[static_cast<size_t>(c.unit)] = true;
      }
    }
  }

  // Issue the forward all-gathers up to the upto-th (F2's gate).
  void schedule_forward_all_gathers(size_t upto) {
    while (scheduled_ <= upto && scheduled_ < f_ag_.size()) {
      const size_t j = scheduled_;
      double gate = 0;
      if (j >= 2) {
        const size_t prev = static_cast<size_t>(f_ag_units_[j - 2]);
        if (plan_.v2())
          gate = started_[prev] ? seg_start_[prev] : 0.0;
        else if (reshards_[prev])
          gate = ended_[prev] ? seg_end_[prev] : 0.0;
      }
      run_collective(f_ag_[j], gate);
      done_[f_ag_[j]] = true;
      ++scheduled_;
    }
  }

  // The backward collectives in issue order, each unit's backward
  // all-gathers (b_ag_[b_ag_begin_[u] .. b_ag_begin_[u + 1])), the backward
  // segments, and each unit's first and last of them.
  void index_backward() {
    b_ag_begin_.assign(n_ + 1, 0);
    for (size_t i = 0; i < nc_; ++i) {
      const Collective& c = comm_.collectives[i];
      if (c.phase != StepPhase::Backward) continue;
      b_colls_.push_back(i);
      b_units_.push_back(c.unit);
      if (c.kind == CollectiveKind::AllGather) ++b_ag_begin_[static_cast<size_t>(c.unit) + 1];
    }
    for (size_t u = 0; u < n_; ++u) b_ag_begin_[u + 1] += b_ag_begin_[u];
    b_ag_.resize(b_ag_begin_[n_]);
    std::vector<size_t> fill(b_ag_begin_.begin(), b_ag_begin_.end() - 1);
    for (size_t i : b_colls_)
      if (comm_.collectives[i].kind == CollectiveKind::AllGather)
        b_ag_[fill[static_cast<size_t>(comm_.collectives[i].unit)]++] = i;
    segs_ = with_missing(bwd_, b_units_, n_);
    first_seg_.assign(n_, -1);
    last_seg_.assign(n_, -1);
    for (size_t i = 0; i < segs_.size(); ++i) {
      const size_t u = static_cast<size_t>(segs_[i].unit);
      if (first_seg_[u] < 0) first_seg_[u] = static_cast<long>(i);
      last_seg_[u] = static_cast<long>(i);
    }
    bseg_start_.assign(segs_.size(), 0.0);
    bseg_end_.assign(n_, 0.0);
    bended_.assign(n_, false);
  }

  // Run the backward segments up to the upto-th, each after its unit's
  // backward all-gathers (B1).
  void run_backward_segments(long upto) {
    while (done_seg_ <= upto && done_seg_ < static_cast<long>(segs_.size())) {
      const Segment& s = segs_[static_cast<size_t>(done_seg_)];
      const size_t u = static_cast<size_t>(s.unit);
      double ready = compute_free_;
      for (size_t j = b_ag_begin_[u]; j < b_ag_begin_[u + 1]; ++j) {
        const size_t c = b_ag_[j];
        // A unit whose modules run out of module order (a unit with no
        // computing module of its own, placed by with_missing) can need its
        // all-gather before the issue order reaches it: FSDP unshards it in
        // its own pre-backward then, so it starts now.
        if (!done_[c]) {
          run_collective(c, compute_free_);
          done_[c] = true;
        }
        ready = std::max(ready, t_.collectives[c].end);
      }
      t_.units[u].exposed_backward_s += ready - compute_free_;
      const double start = ready, end = ready + s.seconds;
      bseg_start_[static_cast<size_t>(done_seg_)] = start;
      bseg_end_[u] = end;
      bended_[u] = true;
      compute_free_ = end;
      t_.units[u].backward_flops += s.flops;
      t_.units[u].backward_compute_s += s.seconds - s.tp_s;
      t_.units[u].tp_backward_s += s.tp_s;
      if (flops_) t_.timeline.push_back({true, -1, s.unit, true, start, end});
      ++done_seg_;
    }
  }

  const Plan& plan_;
  const HardwareFigures& hw_;
  const FlopProfile* flops_;
  const ModuleTree& tree_;
  const CommPlan& comm_;
  const size_t n_;   // units
  const size_t nc_;  // FSDP collectives
  const std::vector<int> owner_;
  StepTime t_;
  // Channels: the process groups, each collective's, and when each is free.
  std::vector<RankGroup> groups_;
  std::vector<size_t> channel_;
  std::vector<double> channel_free_;
  std::vector<double> tp_fwd_, tp_bwd_;  // per module: its TP collectives' seconds
  // Compute: the segments, the rate, when the stream is free.
  std::vector<Segment> fwd_, bwd_;
  double flop_rate_ = 1;
  bool one_rate_ = true;  // every module at one peak: the backward at flop_rate_
  double compute_free_ = 0;
  std::vector<bool> done_;  // per collective: issued
  // Forward: the all-gathers in issue order, their units, each unit's place, its segments' times.
  std::vector<size_t> f_ag_;
  std::vector<int> f_ag_units_;
  std::vector<long> order_;
  std::vector<bool> reshards_;
  std::vector<double> seg_start_, seg_end_;
  std::vector<bool> started_, ended_;
  size_t scheduled_ = 0;
  // Backward: see index_backward.
  std::vector<size_t> b_colls_;
  std::vector<int> b_units_;
  std::vector<size_t> b_ag_begin_, b_ag_;
  std::vector<Segment> segs_;
  std::vector<long> first_seg_, last_seg_;
  std::vector<double> bseg_start_, bseg_end_;
  std::vector<bool> bended_;
  long done_seg_ = 0;
  double compute_end_ = 0, backward_end_ = 0;
};

}  // namespace

StepTime estimate_step_time(const Plan& plan, const HardwareFigures& hw, const FlopProfile* flops) {
  StepTimeModel model(plan, hw, flops);
  model.assign_channels();
  model.time_collectives();
  model.time_tp_collectives();
  model.forward_segments();
  model.backward_segments();
  model.simulate_forward();
  model.simulate_backward();
  model.expose_tail();
  model.optimizer_step();
  return model.totals();
}

}  // namespace fsdp_plan
