#include "report/time_text.h"

#include <cmath>
#include <cstdio>
#include <vector>

#include "model/module_tree.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

// Joins a figure to its unit ("292.9 KiB") so that wrapping never splits them.
constexpr char kGlue = '\x01';
std::string glued(std::string figure) {
  for (char& c : figure)
    if (c == ' ') c = kGlue;
  return figure;
}
std::string bytes(int64_t n) { return glued(format_bytes(n)); }
std::string secs(double s) { return glued(format_seconds(s)); }

// Word-wraps at spaces to 100 columns, the text plan's width; lines after
// the first indented by 10 (the continuation indent of the other sections).
std::string wrap_line(const std::string& text) {
  const size_t width = 100;
  std::string out, line;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(' ', pos);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(pos, end - pos);
    const std::string indent(10, ' ');
    if (!line.empty() && line != indent && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line = indent;
    } else if (!line.empty() && line != indent) {
      line += ' ';  // an empty word (two spaces in a row) keeps its space: "comm    per"
    }
    line += word;
    pos = end + 1;
  }
  out += line + "\n";
  for (char& c : out)
    if (c == kGlue) c = ' ';
  return out;
}

std::string efficiencies(const HardwareFigures& hw) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "efficiency %g compute, %g comm", hw.compute_efficiency,
                hw.comm_efficiency);
  return buf;
}

}  // namespace

std::string format_seconds(double s) {
  if (!(s > 0)) return "0 s";
  char buf[32];
  const char* unit = "s";
  double v = s;
  if (s < 1e-3) {
    v = s * 1e6, unit = "us";
  } else if (s < 1) {
    v = s * 1e3, unit = "ms";
  }
  std::snprintf(buf, sizeof buf, v < 10 ? "%.2f %s" : v < 100 ? "%.1f %s" : "%.0f %s", v, unit);
  return buf;
}

// Expert parallelism: where the experts went, and the all-to-alls (lib/ep/comm.h).
static std::string ep_comm_line(const Plan& plan) {
  const ExpertParallelPlan& ep = *plan.expert_parallel;
  const EpComm& c = plan.comm.ep;
  const ExpertModule& x = ep.modules.front();
  std::string line = "ep      " + std::to_string(ep.modules.size()) + " expert module(s) such as " +
                     plan.tree->path(x.module) + ": " + std::to_string(x.local_experts) + " of " +
                     std::to_string(x.num_experts) + " experts per rank, sharded over efsdp " +
                     std::to_string(plan.mesh.size(MeshDim::Efsdp)) + " (Shard(" + std::to_string(x.shard_dim) +
                     ")); all-to-all on the ep group (" + std::to_string(c.group.size) + " ranks): ";
  if (!c.sizes_known) return line + "unknown: " + c.unknown_reason;
  int64_t fwd = 0, bwd = 0;
  for (const Collective& a : c.collectives) (a.phase == StepPhase::Forward ? fwd : bwd) += a.bytes;
  line += "exact bytes per rank per step " + bytes(fwd + bwd) + " (forward " + bytes(fwd) + ", backward " +
          bytes(bwd) + "), " + std::to_string(c.collectives.size()) + " calls, " + std::to_string(x.tokens) +
          " tokens x top " + std::to_string(x.top_k) + " per layer, " +
          (ep.imbalance == 1.0 ? std::string("routing assumed uniform")
                               : "the busiest rank's: its experts receive " + std::to_string(x.busiest_rows(ep.imbalance)) +
                                     " rows (imbalance " + format_factor(ep.imbalance) + ")");
  if (plan.time.computed && !c.collectives.empty())
    line += ", ESTIMATE " + secs(plan.time.ep_comm_s) + " blocking";
  return line;
}

// Context parallelism: the sequence each rank holds, and attention's ring (lib/cp/comm.h).
static std::string cp_comm_line(const Plan& plan) {
  const ContextParallelPlan& cp = *plan.context_parallel;
  const CpComm& c = plan.comm.cp;
  int64_t ag = 0, ring = 0;
  for (const Collective& x : c.collectives) (x.kind == CollectiveKind::AllGather ? ag : ring) += x.bytes;
  std::string line = "cp      " + std::to_string(cp.local_seq) + " of " + std::to_string(cp.seq) +
                     " tokens per rank (" + (cp.head_tail ? "head-tail" : "contiguous") + "), " +
                     std::to_string(cp.attention.size()) + " attention call(s) ringed over the cp group (" +
                     std::to_string(c.group.size) + " ranks, " + rotate_name(cp.settings.rotate) +
                     "): exact bytes per rank per step ";
  line += bytes(ag + ring) + " (all-gather " + bytes(ag) + ", permutes " + bytes(ring) + "), " +
          std::to_string(c.collectives.size()) + " calls";
  if (plan.time.computed && !c.collectives.empty()) line += ", ESTIMATE " + secs(plan.time.cp_comm_s) + " blocking";
  return line;
}

// Tensor parallelism's collectives (lib/tp/comm.h): exact bytes where the
// graph gives the activations' shapes, else unknown; their time is blocking.
static std::string tp_comm_line(const Plan& plan) {
  const TpComm& tp = plan.comm.tp;
  std::string line = "tp comm on the tp group (" + std::to_string(tp.group.size) + " ranks): ";
  if (!tp.sizes_known) return line + "unknown: " + tp.unknown_reason;
  int64_t by[3][2] = {{0, 0}, {0, 0}, {0, 0}};
  for (const Collective& c : tp.collectives)
    by[static_cast<int>(c.kind)][c.phase == StepPhase::Forward ? 0 : 1] += c.bytes;
  std::vector<std::string> kinds;
  const char* names[3] = {"all-gather ", "reduce-scatter ", "all-reduce "};
  for (int k = 0; k < 3; ++k)
    if (by[k][0] + by[k][1] > 0)
      kinds.push_back(names[k] + bytes(by[k][0] + by[k][1]) + " (forward " + bytes(by[k][0]) + ", backward " +
                      bytes(by[k][1]) + ")");
  line += "exact bytes per rank per step: " + (kinds.empty() ? std::string("none") : join(kinds)) + "; " +
          std::to_string(tp.collectives.size()) + " collectives";
  if (plan.time.computed && !tp.collectives.empty())
    line += ", ESTIMATE " + secs(plan.time.tp_comm_s) + " blocking (in the step, not overlapped)";
  if (!tp.not_modelled.empty())
    line += "; not counted: " + std::to_string(tp.not_modelled.size()) + " module(s) whose styles' activation "
            "collectives are not modelled, such as " + tp.not_modelled.front();
  return line;
}

std::string comm_time_text(const Plan& plan) {
  std::string out;
  if (plan.comm.computed) {
    int64_t ag_f = 0, ag_b = 0, rs = 0, ar = 0, h2d = 0, d2h = 0;
    for (const Collective& c : plan.comm.collectives) {
      switch (c.kind) {
        case CollectiveKind::AllGather:
          (c.phase == StepPhase::Forward ? ag_f : ag_b) += c.bytes;
          h2d += c.host_copy_bytes;
          break;
        case CollectiveKind::ReduceScatter: rs += c.bytes; d2h += c.host_copy_bytes; break;
        case CollectiveKind::AllReduce: ar += c.bytes; d2h += c.host_copy_bytes; break;
        case CollectiveKind::AllToAll: break;  // expert parallelism's, in comm.expert_parallel
      }
    }
    // Bytes as nccl-tests sizes a message (the unsharded buffer): counted
    // from the units, not estimated (lib/plan/comm.h Collective::bytes).
    std::string line = "comm    per rank per step, exact bytes: ";
    std::vector<std::string> kinds;
    if (ag_f + ag_b > 0)
      kinds.push_back("all-gather " + bytes(ag_f + ag_b) + " (forward " + bytes(ag_f) + ", backward " + bytes(ag_b) + ")");
    if (rs > 0) kinds.push_back("reduce-scatter " + bytes(rs));
    if (ar > 0) kinds.push_back("all-reduce " + bytes(ar));  // NO_SHARD's gradients, HSDP's replicas
    if (h2d + d2h > 0)
      kinds.push_back("CPU offload copies " + bytes(h2d) + " to the device and " + bytes(d2h) + " back");
    const size_t n = plan.comm.collectives.size();
    bool one_rank = true;
    for (const Collective& c : plan.comm.collectives) one_rank = one_rank && c.group.size <= 1;
    line += kinds.empty() ? std::string("none") : join(kinds);
    if (n > 0)
      line += "; " + std::to_string(n) + " collective" + (n == 1 ? "" : "s") +
              (one_rank ? ", each in a one-rank group (it moves nothing)" : "");
    out += wrap_line(line);
    if (plan.comm.tp.planned) out += wrap_line(tp_comm_line(plan));
    if (plan.comm.ep.planned && plan.expert_parallel) out += wrap_line(ep_comm_line(plan));
    if (plan.comm.cp.planned && plan.context_parallel) out += wrap_line(cp_comm_line(plan));
  }
  if (plan.time.computed) {
    const StepTime& t = plan.time;
    const HardwareFigures& hw = t.hardware;
    std::string line = "time    ESTIMATE: ";
    if (t.flops_known) {
      line += "step " + secs(t.step_s) + " = compute " + secs(t.compute_s) + " + exposed communication " +
              secs(t.exposed_comm_s) + " + optimizer " +
              (t.optimizer_modelled ? secs(t.optimizer_s) : "not modelled (CPU offload steps it on the CPU; left out)");
      if (t.tp_comm_s > 0) line += " + tensor-parallel communication " + secs(t.tp_comm_s) + " (blocking)";
      if (t.ep_comm_s > 0) line += " + expert-parallel all-to-all " + secs(t.ep_comm_s) + " (blocking)";
      if (t.cp_comm_s > 0) line += " + context-parallel ring " + secs(t.cp_comm_s) + " (blocking)";
    } else {
      // docs/time-model.md section 6: without FLOPs only what no compute can hide.
      line += "exposed communication " + secs(t.exposed_comm_s) + " of " + secs(t.comm_s) +
              "; no step time: ";
      line += plan.tree && plan.tree->graph() ? "FLOPs not known (--flops FILE)"
                                              : "no FLOPs in a TorchScript file (--flops FILE)";
    }
    line += "; " + hw.name + " (--hardware " + hw.preset + "), " + efficiencies(hw);
    if (!hw.overridden.empty()) line += ", overridden: " + join(hw.overridden);
    if (t.flops_known) line += "; FLOPs from " + t.flops_source + "; " + t.compute_dtype_note;
    out += wrap_line(line);
  }
  return out;
}

std::string unit_comm_cell(const Plan& plan, size_t unit) {
  if (!plan.comm.computed || unit >= plan.comm.units.size()) return "-";
  const int64_t b = plan.comm.units[unit].total_bytes();
  return b > 0 ? format_bytes(b) : "-";
}

std::string unit_exposed_cell(const Plan& plan, size_t unit) {
  if (!plan.time.computed || unit >= plan.time.units.size()) return "-";
  return format_seconds(plan.time.units[unit].exposed_s());
}

}  // namespace fsdp_plan
