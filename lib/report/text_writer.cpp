#include "report/text_writer.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "model/class_names.h"
#include "report/time_text.h"
#include "report/warning_groups.h"
#include "tp/placements.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

// The narrowest columns: the table keeps its shape for short paths and names.
constexpr size_t kUnitWidth = 38;
constexpr size_t kClassWidth = 20;
constexpr size_t kShortestUnitWidth = 20;  // when paths must be shortened to fit
// "#", the gaps and the number columns around unit and class.
constexpr size_t kOtherColumns = 4 + 2 + 2 + 8 + 11 + 11 + 4;

bool is_index(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// A unit as the plan names it: its module's path, "(root)", or an FSDP2
// call on several modules as "[a, b]".
std::string unit_label(const ModuleTree& tree, const Unit& u) {
  if (u.modules.size() < 2) return path_or_root(tree.path(u.module));
  std::vector<std::string> names;
  for (ModuleId m : u.modules) names.push_back(tree.path(m));
  return "[" + join(names) + "]";
}

std::pair<std::string, long> split_index(const std::string& path);

// FSDP2 groups as the policy line names them. Without -v, a run of six or more
// one-module groups whose paths count up by one (an Accelerate config's 48
// decoder layers) is one part: "groups [model.layers.0] .. [model.layers.47] x48".
void describe_groups(const std::vector<Fsdp2Group>& groups, bool unfold, std::vector<std::string>& parts) {
  constexpr size_t kFoldRun = 6;
  auto next = [&](size_t a, size_t b) {
    if (groups[a].modules.size() != 1 || groups[b].modules.size() != 1) return false;
    const auto [pa, ia] = split_index(groups[a].modules[0]);
    const auto [pb, ib] = split_index(groups[b].modules[0]);
    return ia >= 0 && pa == pb && ib == ia + 1;
  };
  for (size_t i = 0; i < groups.size();) {
    size_t j = i + 1;
    while (!unfold && j < groups.size() && next(j - 1, j)) ++j;
    if (j - i >= kFoldRun) {
      parts.push_back("groups [" + groups[i].modules[0] + "] .. [" + groups[j - 1].modules[0] + "] x" +
                      std::to_string(j - i));
      i = j;
      continue;
    }
    parts.push_back("group [" + join(groups[i].modules) + "]");
    ++i;
  }
}

std::string describe_policy(const Policy& p, bool unfold) {
  const bool v2 = p.fsdp.v2();
  std::vector<std::string> parts;
  if (p.module_classes) parts.push_back("module_classes [" + join(*p.module_classes) + "]");
  if (p.min_num_params) parts.push_back("min_num_params " + format_count(*p.min_num_params));
  if (p.mixed_precision) {
    const auto& mp = *p.mixed_precision;
    parts.push_back("mixed precision " + mp.param_dtype.value_or("(param dtype unchanged)") +
                    (p.auto_wrap() && !v2 ? ", full precision for [" + join(mp.ignore_classes) + "]"
                                                        : ""));
    // PyTorch's defaults go unsaid; what differs from them is shown.
    if (mp.output_dtype) parts.back() += ", output " + *mp.output_dtype;
    if (mp.keep_low_grads()) parts.back() += ", keep_low_precision_grads";
    if (mp.casts_forward_inputs(p.fsdp.version) != v2)
      parts.back() += std::string(", cast_forward_inputs ") + (v2 ? "false" : "true");
    if (!mp.casts_root_forward_inputs()) parts.back() += ", cast_root_forward_inputs false";
  }
  if (!p.ignored_modules.empty()) parts.push_back("ignored modules [" + join(p.ignored_modules) + "]");
  if (!p.ignored_params.empty()) parts.push_back("ignored params [" + join(p.ignored_params) + "]");
  if (v2) {
    describe_groups(p.groups, unfold, parts);
    if (!p.auto_wrap() && p.groups.empty()) parts.insert(parts.begin(), "no calls but the root's");
  } else if (!p.auto_wrap()) {
    parts.insert(parts.begin(), "no auto-wrap (one root unit)");
  }
  return join(parts);
}

}  // namespace

std::string shorten_path(const std::string& path, size_t width) {
  if (path.size() <= width) return path;
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  std::vector<bool> dropped(parts.size(), false);
  auto render = [&] {
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (dropped[i] && i > 0 && dropped[i - 1]) continue;
      out += (i == 0 ? "" : ".") + (dropped[i] ? std::string("*") : parts[i]);
    }
    return out;
  };
  std::string out = path;
  while (out.size() > width) {
    // The longest name in the middle goes first; indices tell siblings apart, so they stay.
    size_t pick = 0;
    for (size_t i = 1; i + 1 < parts.size(); ++i)
      if (!dropped[i] && !is_index(parts[i]) && (pick == 0 || parts[i].size() > parts[pick].size())) pick = i;
    if (pick == 0) break;
    dropped[pick] = true;
    out = render();
  }
  return out;
}

namespace {

// Word-wraps `text` to `width` columns; lines after the first start with `indent`.
std::string wrap(const std::string& text, size_t width, const std::string& indent, const std::string& first = "") {
  std::string out, line = first;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(' ', pos);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(pos, end - pos);
    if (!line.empty() && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line = indent;
    }
    if (!line.empty() && line != indent && line != first) line += ' ';
    line += word;
    pos = end + 1;
  }
  return out + line + "\n";
}

std::string reshard_text(const ReshardAfterForward& r) {
  switch (r.kind) {
    case ReshardAfterForward::Kind::True: return "true";
    case ReshardAfterForward::Kind::False: return "false";
    case ReshardAfterForward::Kind::Ranks: return std::to_string(r.ranks);
  }
  return "true";
}

// Under the memory header when nothing set the world size (--world-size, fsdp.world_size,
// num_processes): the 1 it defaults to plans a single rank, which shards nothing.
std::string world_size_note(const FsdpSettings& s) {
  if (s.world_size_given) return "";
  return "        world size not given, so 1: a single rank shards nothing; set it with --world-size N\n";
}

// The memory header's last words: what the figures below leave out.
std::string activations_clause(const Plan& plan) {
  return plan.activations.known() ? "" : "; activations not included";
}

// Selective checkpointing (issue 42): the policy, what its caches hold over
// the forward, and the largest recompute working set of one module.
std::string selective_text(const Plan& plan) {
  const auto& ac = plan.policy.activation_checkpointing;
  if (!ac || !ac->selective()) return "";
  int64_t cached = 0, peak = 0;
  for (const CheckpointedModule& c : plan.activations.checkpointed) {
    cached += c.cached_bytes;
    peak = std::max(peak, c.recompute_peak_bytes);
  }
  return std::string(" (selective, ") + (ac->torchtitan_policy ? "torchtitan's policy" : "listed ops") + ": " +
         format_bytes(cached) + " of saved ops' outputs, recompute working set up to " + format_bytes(peak) + ")";
}

// Compiled blocks (issue 42): what their calls save under the partitioner's cut, beside eager's.
std::string compiled_text(const Plan& plan) {
  const ActivationPlan& a = plan.activations;
  if (a.compiled.empty()) return "";
  int64_t calls = 0, checkpointed = 0, saved = 0, eager = 0;
  for (const CompiledModule& c : a.compiled) {
    calls += c.calls;
    checkpointed += c.checkpointed_calls;
    saved += c.saved_bytes;
    eager += c.eager_saved_bytes;
  }
  const auto plural = [](int64_t n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); };
  std::string out;
  if (calls > checkpointed)
    out += ", " + plural(calls - checkpointed, "compiled call") + " saving " + format_bytes(saved) + " where eager saves " +
           format_bytes(eager) + " (AOTAutograd's min-cut partitioner as modelled" +
           (plan.policy.compile && plan.policy.compile->memory_budget < 1
                ? ", activation_memory_budget " + format_factor(plan.policy.compile->memory_budget)
                : "") +
           ")";
  if (checkpointed > 0)
    out += ", " + plural(checkpointed, "compiled call") + " inside checkpointed modules (saving what checkpointing " +
           "keeps: its tags drive the partitioner)";
  return out;
}

// Activations as their own category: from the graph (what forward saves, what
// AC keeps), an allowance, or not known and how to get them.
std::string activations_text(const Plan& plan) {
  const ActivationPlan& a = plan.activations;
  std::string line;
  switch (a.source) {
    case ActivationSource::Unknown: line = "activations not known: " + a.unknown_reason; break;
    case ActivationSource::Allowance:
      line = "activations " + format_bytes(a.allowance_bytes) + " (allowance, --activation-bytes), held through "
             "forward and backward";
      break;
    case ActivationSource::Graph: {
      std::vector<std::string> dims;
      for (const auto& [name, value] : a.dims) {
        dims.push_back(name + "=" + std::to_string(value));
        // Context parallelism: the walk ran at one rank's share of the sequence.
        if (plan.context_parallel && name == plan.context_parallel->seq_dim)
          dims.back() += " of " + std::to_string(plan.context_parallel->seq) + " per cp rank";
      }
      line = "activations " + format_bytes(a.saved_bytes) + " saved in forward";
      if (!a.checkpointed.empty())
        line += ", " + format_bytes(a.held_bytes) + " held with " + std::to_string(a.checkpointed.size()) +
                " checkpointed module" + (a.checkpointed.size() == 1 ? "" : "s") + selective_text(plan);
      line += compiled_text(plan);
      line += " (graph" + (dims.empty() ? std::string() : ", " + join(dims, " ")) + ", " + a.device + ", sdpa " +
              a.sdpa + (a.sdpa_kernels.empty() ? "" : ": " + join(a.sdpa_kernels)) + ")";
      if (a.loss.empty()) line += "; no loss in the export";
      if (!a.missing_ops.empty()) line += "; " + std::to_string(a.missing_ops.size()) + " operators without a row";
      break;
    }
  }
  return wrap(line, 100, std::string(10, ' '), std::string(8, ' '));
}

// fsdp.gradient_accumulation_steps (plan/grad_accumulation.h): what the micro-steps hold.
std::string accumulation_text(const Plan& plan) {
  const GradAccumulation& a = plan.memory.accumulation;
  if (a.steps <= 1) return "";
  std::string line = "grad accumulation " + std::to_string(a.steps) + " micro-steps" + (a.no_sync ? ", no_sync" : "");
  if (!a.modelled)
    line += ": not modelled with CPU offload (the gradients live on the host); the peak is one micro-step's";
  else
    line += ": the peak above holds " + format_bytes(a.held_grads_bytes) +
            (a.no_sync ? " of UNSHARDED gradients (kept until the last micro-step reduce-scatters)"
                       : " of sharded gradients (every micro-step reduce-scatters)") +
            " through the later micro-steps, an ESTIMATE (upper bound); one micro-step alone peaks at " +
            format_bytes(a.micro_step_peak_bytes);
  return wrap(line, 100, std::string(10, ' '), std::string(8, ' '));
}

// The verdict on the peak against the --hardware GPU (plan/memory_fit.h): its
// memory less the headroom the plan ASSUMES for what it does not model, and
// against --max-peak-bytes when set.
std::string fit_text(const Plan& plan) {
  const MemoryFit& f = plan.fit;
  if (!f.computed) return "";
  std::string line = std::string("verdict ") + fit_verdict_name(f.verdict) + ": peak " + format_bytes(f.peak_bytes);
  const std::string gpu = f.hardware_name + " (--hardware " + f.hardware + (f.hardware_given ? "" : ", the default") + ")";
  switch (f.verdict) {
    case FitVerdict::Fits:
      line += " of " + format_bytes(f.usable_bytes) + " usable on an " + gpu + ", " +
              format_bytes(f.usable_bytes - f.peak_bytes) + " spare";
      break;
    case FitVerdict::Tight:
      line += " is over the " + format_bytes(f.usable_bytes) + " usable on an " + gpu +
              " but under its whole memory: it fits only if the process needs less than the headroom assumed";
      break;
    case FitVerdict::DoesNotFit:
      line += " is over the whole memory of an " + gpu + " by " + format_bytes(f.peak_bytes - f.device_bytes);
      break;
  }
  // The headroom's parts are in docs/memory-model.md and the JSON (memory.fit): here its total.
  line += "; usable: its " + format_bytes(f.device_bytes) + " less " + format_bytes(f.headroom_bytes) +
          " ASSUMED for the CUDA context, NCCL buffers and allocator fragmentation (docs/memory-model.md)";
  if (!f.activations_known) line += "; the peak has no activations: a lower bound";
  if (f.max_peak_bytes)
    line += "; --max-peak-bytes " + format_bytes(*f.max_peak_bytes) +
            (f.peak_bytes <= *f.max_peak_bytes ? ": within, " + format_bytes(*f.max_peak_bytes - f.peak_bytes) + " spare"
                                               : ": over by " + format_bytes(f.peak_bytes - *f.max_peak_bytes));
  return wrap(line, 100, std::string(10, ' '), std::string(8, ' '));
}

// FSDP2: the mesh, then the peak by category.
std::string fsdp2_memory_text(const Plan& plan) {
  const MemoryPlan& m = plan.memory;
  const RankMemory& r = m.per_rank;
  std::string mesh = m.replicate_size > 1 ? "HSDP mesh (" + std::to_string(m.replicate_size) + " replicate, " +
                                                std::to_string(m.shard_group_size) + " shard)"
                                          : "mesh (" + std::to_string(m.shard_group_size) + ")";
  if (plan.tensor_parallel) {
    // The 2-D (or 3-D) mesh, and how many parameters the tp dimension splits.
    const TensorParallelPlan& tp = *plan.tensor_parallel;
    int64_t split = 0, replicated = 0;
    for (const auto& p : tp.placement) {
      split += p.kind == TpPlacement::Kind::Shard;
      replicated += p.kind == TpPlacement::Kind::Replicate;
    }
    mesh = "mesh " + plan.mesh.text() + " with tensor parallelism: " + std::to_string(tp.modules.size()) +
           " modules planned, " + std::to_string(split) + " parameters split on tp, " + std::to_string(replicated) +
           " replicated";
  }
  if (plan.expert_parallel) mesh = "mesh " + plan.mesh.text();  // the experts' (efsdp, ep) beside it
  if (plan.context_parallel && !plan.tensor_parallel)  // FSDP over dp_shard x cp, activations per cp rank
    mesh = "mesh " + plan.mesh.text() + ", FSDP over dp_shard x cp (" + std::to_string(m.shard_group_size) +
           "), activations of " + std::to_string(plan.context_parallel->local_seq) + " of " +
           std::to_string(plan.context_parallel->seq) + " tokens";
  // Skewed routing: rank 0 stands for the busiest ep rank (ep/activations.h).
  std::string rank = "(rank 0)";
  if (plan.expert_parallel && plan.expert_parallel->imbalance != 1.0)
    rank = "(rank 0 as the busiest ep rank, routing imbalance " + format_factor(plan.expert_parallel->imbalance) + ")";
  std::string out = wrap("memory  per rank " + rank + ", FSDP2, world size " + std::to_string(m.settings.world_size) +
                             ", " + mesh + ", " + optimizer_name(m.settings.optimizer) +
                             (m.settings.cpu_offload ? ", CPU offload" : "") + activations_clause(plan),
                         100, std::string(8, ' ')) +
                    world_size_note(m.settings);
  out += "        params " + format_bytes(r.params_bytes) + " + grads " + format_bytes(r.grads_bytes) +
         " + optimizer " + format_bytes(r.optimizer_bytes) + " + buffers " + format_bytes(r.buffers_bytes) +
         " = steady " + format_bytes(r.steady_bytes) + (m.settings.cpu_offload ? " (on the host)" : "") + "\n";
  out += activations_text(plan);
  std::string peak = "peak " + format_bytes(r.peak_bytes) + (m.settings.cpu_offload ? " on the device" : "") +
                     " in " + r.peak_phase;
  if (r.peak_unit >= 0)
    peak += " at unit " + std::to_string(r.peak_unit) + " " +
            unit_label(*plan.tree, plan.units[static_cast<size_t>(r.peak_unit)]);
  std::vector<std::string> parts;
  for (const auto& [name, bytes] : r.peak_categories)
    if (bytes > 0) parts.push_back(name + " " + format_bytes(bytes));
  peak += ": " + join(parts);
  return out + wrap(peak, 100, std::string(10, ' '), std::string(8, ' ')) + accumulation_text(plan) + fit_text(plan);
}

std::string memory_text(const Plan& plan) {
  if (plan.v2()) return fsdp2_memory_text(plan);
  const MemoryPlan& m = plan.memory;
  const RankMemory& r = m.per_rank;
  std::string strategy = strategy_name(m.effective_strategy);
  if (m.effective_strategy == ShardingStrategy::HybridShard)
    strategy += " (groups of " + std::to_string(m.shard_group_size) +
                (m.settings.shard_group_size == 0 ? ", assumed GPUs per node" : "") + ")";
  if (m.effective_strategy != m.settings.strategy)
    strategy += std::string(", from ") + strategy_name(m.settings.strategy);
  std::string out = wrap("memory  per rank, world size " + std::to_string(m.settings.world_size) + ", " + strategy +
                             ", " + optimizer_name(m.settings.optimizer) +
                             (m.settings.use_orig_params ? ", use_orig_params" : "") + activations_clause(plan),
                         100, std::string(8, ' ')) +
                    world_size_note(m.settings);
  out += "        params " + format_bytes(r.params_bytes) + " + grads " + format_bytes(r.grads_bytes) +
         " + optimizer " + format_bytes(r.optimizer_bytes) + " + buffers " + format_bytes(r.buffers_bytes) +
         " = steady " + format_bytes(r.steady_bytes) + "\n";
  out += activations_text(plan);
  std::string peak = "peak " + format_bytes(r.peak_bytes) + " in " + r.peak_phase;
  if (plan.activations.known()) peak += ", activations " + format_bytes(r.activation_bytes) + " of it";
  if (r.peak_unit >= 0) {
    std::string path = plan.tree->path(plan.units[static_cast<size_t>(r.peak_unit)].module);
    peak += " at unit " + std::to_string(r.peak_unit) + " " + path_or_root(path) + ", " +
            std::to_string(r.peak_gathered.size()) + " unit" + (r.peak_gathered.size() == 1 ? "" : "s") + " gathered";
  }
  return out + wrap(peak, 100, std::string(10, ' '), std::string(8, ' ')) + accumulation_text(plan) + fit_text(plan);
}

// "layers.7" -> ("layers.", 7); -1 when the last name is no index.
std::pair<std::string, long> split_index(const std::string& path) {
  const size_t dot = path.rfind('.');
  const std::string last = dot == std::string::npos ? path : path.substr(dot + 1);
  if (last.empty() || last.size() > 9 || last.find_first_not_of("0123456789") != std::string::npos) return {"", -1};
  return {path.substr(0, path.size() - last.size()), std::stol(last)};
}

// Without --wide or -v, a run of kFoldRun or more consecutive unit rows that differ
// only in their index (a 70B's 80 decoder layers) is one row,
// "layers.0 .. layers.79  x80": same class, sizes, mixed precision and
// reshard_after_forward, indices counting up by one. Row is UnitTableRow.
template <class Row>
void fold_identical_rows(const Plan& plan, std::vector<Row>& rows) {
  constexpr size_t kFoldRun = 6;
  auto same = [&](const Row& a, const Row& b) {
    if (a.unit < 0 || b.unit < 0 || a.group || b.group) return false;
    const Unit& ua = plan.units[static_cast<size_t>(a.unit)];
    const Unit& ub = plan.units[static_cast<size_t>(b.unit)];
    const auto [pa, ia] = split_index(a.path);
    const auto [pb, ib] = split_index(b.path);
    return ia >= 0 && pa == pb && ib == ia + 1 && a.indent == b.indent && a.cls == b.cls && a.numel == b.numel &&
           a.frozen == b.frozen && a.bytes == b.bytes && a.buffer_bytes == b.buffer_bytes && a.buffers == b.buffers &&
           ua.mixed_precision == ub.mixed_precision && ua.reshard_after_forward == ub.reshard_after_forward;
  };
  std::vector<Row> out;
  for (size_t i = 0; i < rows.size();) {
    size_t j = i + 1;
    while (j < rows.size() && same(rows[j - 1], rows[j])) ++j;
    if (j - i >= kFoldRun) {
      Row r = rows[i];
      r.count = static_cast<int>(j - i);
      r.last_unit = rows[j - 1].unit;
      r.path = rows[i].path + " .. " + rows[j - 1].path + "  x" + std::to_string(j - i);
      r.group = true;  // not shortened
      out.push_back(std::move(r));
    } else {
      for (size_t k = i; k < j; ++k) out.push_back(std::move(rows[k]));
    }
    i = j;
  }
  rows = std::move(out);
}

}  // namespace

namespace {

// What the plan is of: the model, its parameters, the policy, FSDP2's calls,
// aliased modules and a class name that matches nothing (it explains the
// whole plan below, so it comes first).
std::string plan_header_text(const Plan& plan, bool unfold) {
  const ModelSummary& m = plan.model;
  std::string out;
  out += "model   " + m.path + "  (" + m.root_class + ", " + std::to_string(m.num_modules) + " modules)\n";
  out += "params  " + format_count(m.param_numel) + " (" + format_bytes(m.param_bytes) + "), buffers " +
         format_count(m.buffer_numel) + " (" + format_bytes(m.buffer_bytes) + ")\n";
  out += wrap("policy  " + describe_policy(plan.policy, unfold), 100, std::string(8, ' '));
  if (plan.v2()) {
    int calls = static_cast<int>(plan.units.size());
    out += "fsdp    FSDP2: " + std::to_string(calls) + " fully_shard call" + (calls == 1 ? "" : "s") +
           ", bottom-up, the root last; units in forward order\n";
  }
  if (!plan.aliases.empty()) {
    std::vector<std::string> parts;
    for (const auto& a : plan.aliases) parts.push_back(a.path + " = " + path_or_root(a.alias_of));
    out += wrap("aliases " + join(parts) + " (one module under two names; FSDP visits the first)", 100,
                std::string(8, ' '));
  }
  for (const auto& w : plan.warnings)
    if (w.kind == "unmatched_class")
      out += wrap(pad(severity_name(w.severity), 8) + w.kind + ": " + w.message, 100, std::string(10, ' '));
  return out + "\n";
}

// A row of the units table: a unit, or one module of an FSDP2 call on several.
struct UnitTableRow {
  int unit = -1;  // index into plan.units for a unit's row, -1 for a module of a group
  std::string indent, path, cls;
  bool group = false;  // "[a, b]": not shortened
  int64_t numel = 0, frozen = 0, bytes = 0, buffer_bytes = 0;
  bool buffers = false;
  int count = 1;  // a fold of identical consecutive units (layers.0 .. layers.79): how many
  int last_unit = -1;
};

// A call on several modules (fully_shard([a, b]) manages the subtrees of a
// and b): a row per module under the call's own, with each tensor the call
// manages counted at the module of the call that holds it.
void add_group_member_rows(const ModuleTree& tree, const Unit& u, const std::string& indent,
                           std::vector<UnitTableRow>& rows) {
  const size_t first = rows.size();
  for (ModuleId m : u.modules) {
    UnitTableRow k;
    k.indent = indent;
    k.path = tree.path(m);
    k.cls = bare_class(tree, m);
    rows.push_back(std::move(k));
  }
  auto member = [&](ModuleId m) -> UnitTableRow* {
    for (; m >= 0; m = tree.module(m).parent)
      for (size_t k = 0; k < u.modules.size(); ++k)
        if (u.modules[k] == m) return &rows[first + k];
    return nullptr;
  };
  for (const auto& o : u.params)
    if (UnitTableRow* k = member(o.module)) {
      k->numel += tree.numel(o.tensor);
      k->bytes += tree.bytes(o.tensor);
      if (!tree.tensor(o.tensor).requires_grad) k->frozen += tree.numel(o.tensor);
    }
  for (const auto& o : u.buffers)
    if (UnitTableRow* k = member(o.module)) {
      k->buffer_bytes += tree.bytes(o.tensor);
      k->buffers = true;
    }
}

// The table's rows: one per unit, and under an FSDP2 call on several modules
// ("[a, b]" with the call's totals) one per module with what it holds.
std::vector<UnitTableRow> unit_table_rows(const Plan& plan) {
  const ModuleTree& tree = *plan.tree;
  std::vector<UnitTableRow> rows;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const Unit& u = plan.units[i];
    UnitTableRow r;
    r.unit = static_cast<int>(i);
    r.indent = std::string(static_cast<size_t>(std::min(u.depth, 10)) * 2, ' ');
    r.numel = u.param_numel, r.frozen = u.frozen_numel, r.bytes = u.param_bytes, r.buffer_bytes = u.buffer_bytes;
    r.buffers = !u.buffers.empty();
    if (u.modules.size() < 2) {
      r.path = path_or_root(tree.path(u.module));
      r.cls = bare_class(tree, u.module);
      rows.push_back(std::move(r));
      continue;
    }
    std::vector<std::string> names;
    for (ModuleId m : u.modules) names.push_back(tree.path(m));
    r.path = "[" + join(names) + "]";
    r.cls = "group of " + std::to_string(u.modules.size());
    r.group = true;
    const std::string indent = r.indent + "  ";
    rows.push_back(std::move(r));
    add_group_member_rows(tree, u, indent, rows);
  }
  return rows;
}

// Paths shortened to `unit_width` (they lose their middle), rows whose
// shortenings collide given more room, one column at a time, until they
// differ (whole paths always do). A row is shortened only if its whole path
// would not fit the column. Returns the column's width: what could not be
// shortened enough still aligns.
size_t shorten_unit_paths(std::vector<UnitTableRow>& rows, size_t unit_width) {
  const size_t n = rows.size();
  std::vector<std::string> shortened(n);
  std::vector<size_t> room(n);
  for (size_t i = 0; i < n; ++i) {
    room[i] = unit_width > rows[i].indent.size() ? unit_width - rows[i].indent.size() : 1;
    shortened[i] = rows[i].group ? rows[i].path : shorten_path(rows[i].path, room[i]);
  }
  for (bool collided = true; collided;) {
    collided = false;
    std::map<std::string, int> seen;
    for (const auto& s : shortened) ++seen[s];
    for (size_t i = 0; i < n; ++i) {
      if (seen[shortened[i]] < 2 || shortened[i] == rows[i].path) continue;
      collided = true;
      shortened[i] = shorten_path(rows[i].path, ++room[i]);
    }
  }
  size_t widest = 0;
  for (size_t i = 0; i < n; ++i) widest = std::max(widest, rows[i].indent.size() + shortened[i].size());
  unit_width = std::max(unit_width, widest);
  for (size_t i = 0; i < n; ++i)
    if (rows[i].indent.size() + rows[i].path.size() > unit_width) rows[i].path = shortened[i];
  return unit_width;
}

// The units table. Columns as wide as their content: whole class names,
// whole paths unless the terminal is too narrow. Frozen parameters
// (requires_grad=False) get a column only in models that have them; FSDP2
// the call's position among the fully_shard calls and its
// reshard_after_forward; --wide each unit's communication per step (exact)
// and what compute leaves exposed (estimate).
std::string units_table_text(const Plan& plan, const TextOptions& options) {
  const bool frozen = std::any_of(plan.units.begin(), plan.units.end(), [](const Unit& u) { return u.frozen_numel > 0; });
  const size_t other_columns = kOtherColumns + (frozen ? 9 : 0);
  std::vector<UnitTableRow> rows = unit_table_rows(plan);
  if (!options.wide && !options.unfold) fold_identical_rows(plan, rows);
  size_t unit_width = kUnitWidth, class_width = kClassWidth;
  for (const UnitTableRow& r : rows) {
    unit_width = std::max(unit_width, r.indent.size() + r.path.size());
    class_width = std::max(class_width, r.cls.size() + 1);
  }
  if (!options.wide && other_columns + class_width + unit_width > options.width)
    unit_width = shorten_unit_paths(rows, std::max(kShortestUnitWidth, options.width > other_columns + class_width
                                                                           ? options.width - other_columns - class_width
                                                                           : size_t{0}));
  size_t call_width = 4;
  for (const Unit& u : plan.units)
    if (u.reshard_after_forward) call_width = std::max(call_width, std::to_string(u.call).size() + 2);
  auto call_text = [&](const UnitTableRow& r, const Unit& u) {
    return r.count > 1 ? "[" + std::to_string(u.call) + ".." + std::to_string(plan.units[static_cast<size_t>(r.last_unit)].call) + "]"
                       : "[" + std::to_string(u.call) + "]";
  };
  for (const UnitTableRow& r : rows)
    if (r.count > 1 && plan.units[static_cast<size_t>(r.unit)].reshard_after_forward)
      call_width = std::max(call_width, call_text(r, plan.units[static_cast<size_t>(r.unit)]).size());
  const bool calls = plan.v2();
  const bool wide_time = options.wide && plan.comm.computed && plan.time.computed;
  std::string out = pad("#", 4, true) + "  " + pad("unit", unit_width) + "  " + pad("class", class_width) +
                    pad("params", 8, true) + (frozen ? pad("frozen", 9, true) : "") + pad("size", 11, true) +
                    pad("buffers", 11, true) + pad("mp", 4, true) +
                    (wide_time ? pad("comm/step", 11, true) + pad("exposed est", 13, true) : "") +
                    (calls ? "  " + pad("call", call_width) + "  reshard_after_forward" : "") + "\n";
  for (const UnitTableRow& r : rows) {
    std::string line = pad(r.unit >= 0 ? std::to_string(r.unit) : "", 4, true) + "  " + pad(r.indent + r.path, unit_width) +
                       "  " + pad(r.cls, class_width) + pad(format_count(r.numel), 8, true) +
                       (frozen ? pad(r.frozen ? format_count(r.frozen) : "-", 9, true) : "") +
                       pad(format_bytes(r.bytes), 11, true) + pad(r.buffers ? format_bytes(r.buffer_bytes) : "-", 11, true);
    if (r.unit >= 0) {
      const Unit& u = plan.units[static_cast<size_t>(r.unit)];
      line += pad(!u.mixed_precision ? "-" : *u.mixed_precision ? "on" : "off", 4, true);
      if (wide_time)
        line += pad(unit_comm_cell(plan, static_cast<size_t>(r.unit)), 11, true) +
                pad(unit_exposed_cell(plan, static_cast<size_t>(r.unit)), 13, true);
      if (u.reshard_after_forward)
        line += "  " + pad(call_text(r, u), call_width) + "  " + reshard_text(*u.reshard_after_forward);
    }
    out += line + "\n";
  }
  return out;
}

// The units in one line: how many, what they shard, the largest and the root's share.
std::string units_summary_text(const Plan& plan) {
  const ModelSummary& m = plan.model;
  int64_t owned_numel = 0;
  for (const Unit& u : plan.units) owned_numel += u.param_numel;
  const Unit* largest = &plan.units.front();
  for (const auto& u : plan.units)
    if (u.param_numel > largest->param_numel) largest = &u;
  std::string out = std::to_string(plan.units.size()) + " unit" + (plan.units.size() == 1 ? "" : "s") + ", " +
                    format_count(owned_numel) + " params sharded";
  if (owned_numel < m.param_numel) out += " (" + format_count(m.param_numel - owned_numel) + " ignored)";
  if (owned_numel > m.param_numel) out += " (tied tensors counted in each group that holds them)";
  out += "; largest unit " + unit_label(*plan.tree, *largest) + " " + percent(largest->param_numel, owned_numel) +
         "; root unit " + percent(plan.units.front().param_numel, owned_numel) + "\n";
  return out;
}

// The warnings, after a blank line; unmatched_class is in the header.
std::string plan_warnings_text(const Plan& plan) {
  if (std::none_of(plan.warnings.begin(), plan.warnings.end(), [](const Warning& w) { return w.kind != "unmatched_class"; }))
    return "";
  std::string out = "\n";
  // One line per kind of per-module warning, with the count and the first paths (JSON keeps each).
  const auto others = [](const Warning& w) { return w.kind != "unmatched_class"; };
  for (const WarningGroup& g : group_warnings(plan.warnings, others))
    out += wrap(pad(severity_name(g.first->severity), 8) + warning_group_text(g), 100, std::string(10, ' '));
  return out;
}

}  // namespace

std::string plan_to_text(const Plan& plan, const TextOptions& options) {
  std::string out = plan_header_text(plan, options.wide || options.unfold);
  out += units_table_text(plan, options);
  out += "\n" + units_summary_text(plan);
  out += "\n" + memory_text(plan) + comm_time_text(plan);
  out += plan_warnings_text(plan);
  return out;
}


}  // namespace fsdp_plan
