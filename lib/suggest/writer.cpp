#include "suggest/writer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <vector>

#include "fsdp1/memory.h"
#include "model/class_names.h"
#include "plan/memory_fit.h"
#include "time/hardware.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

int64_t model_param_numel(const ModuleTree& tree) {
  std::vector<bool> seen(tree.num_tensors(), false);
  int64_t n = 0;
  for (const auto& m : tree.modules())
    for (const auto& p : m.params)
      if (!seen[static_cast<size_t>(p.tensor)]) {
        seen[static_cast<size_t>(p.tensor)] = true;
        n += tree.numel(p.tensor);
      }
  return n;
}

std::string mixed_precision_name(const Policy& p) {
  return p.mixed_precision && p.mixed_precision->param_dtype ? *p.mixed_precision->param_dtype : "none";
}

const Candidate* best_fit(const Suggestion& s) {
  return !s.ranked.empty() && s.ranked.front().fits ? &s.ranked.front() : nullptr;
}

// Seconds of the step-time estimate as milliseconds, or "-" when unknown.
std::string ms(bool known, double seconds) {
  if (!known) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f ms", seconds * 1e3);
  return buf;
}

bool any_step(const Suggestion& s) {
  return std::any_of(s.ranked.begin(), s.ranked.end(), [](const Candidate& c) { return c.step_known; });
}

// Why the best fitting candidate ranks above the next fitting one, in the
// order better_if_fitting (suggest.cpp) decides.
std::string why_best(const Candidate& best, const Candidate& next) {
  const std::string vs = " than " + next.label;
  if (best.coarse != next.coarse)
    return "finer than " + next.label + (next.units <= 1 ? " (the root unit alone)" : " (root-dominated)") +
           ": a fitting per-block plan ranks ahead of it whatever the estimate";
  if (best.per_block != next.per_block)
    return "wraps each block (the model's repeated class) with nothing inside it; " + next.label +
           " splits finer, which the estimate would count as free (it has no per-unit overhead)";
  if (best.checkpointed != next.checkpointed)
    return "fits without activation checkpointing, which " + next.label +
           " adds: its recompute costs about one more forward of each block";
  if (best.compiled != next.compiled)
    return "fits without compiling its blocks, which " + next.label +
           " adds: where both fit the eager step ranks first (the estimate does not see compiled kernels' speed)";
  if (best.selective != next.selective)
    return "fits with selective checkpointing, which keeps the matmul and attention outputs and recomputes "
           "the rest; " + next.label + " checkpoints fully and recomputes every op of each block";
  const double a = rank_seconds(best), b = rank_seconds(next);
  if (best.step_known == next.step_known && std::abs(a - b) > 1e-9 && best.cp != next.cp)
    return std::string(best.step_known ? "estimated step " : "estimated exposed communication ") +
           ms(true, a / static_cast<double>(best.tp * best.cp)) + " at cp " + std::to_string(best.cp) + ", " +
           ms(true, b / static_cast<double>(next.tp * next.cp)) + " at cp " + std::to_string(next.cp) +
           " (for the same samples, step x cp: a cp group of c ranks trains one sequence: " + ms(true, a) +
           " against " + ms(true, b) + ")" + vs;
  if (best.step_known == next.step_known && std::abs(a - b) > 1e-9 && best.tp != next.tp)
    return std::string(best.step_known ? "estimated step " : "estimated exposed communication ") +
           ms(true, a / static_cast<double>(best.tp * best.cp)) + " at tp " + std::to_string(best.tp) + ", " +
           ms(true, b / static_cast<double>(next.tp * next.cp)) + " at tp " + std::to_string(next.tp) +
           " (for the same samples, step x tp: a step at tp t trains world / t micro-batches: " + ms(true, a) +
           " against " + ms(true, b) + ")" + vs;
  if (best.step_known == next.step_known && std::abs(a - b) > 1e-9)
    return std::string(best.step_known ? "estimated step " : "estimated exposed communication ") +
           ms(true, a) + ", " + ms(true, b - a) + " less" + vs;
  if (best.units != next.units) return "as fast by the estimate, fewer units" + vs;
  if (best.peak_bytes != next.peak_bytes) return "as fast by the estimate, a lower peak" + vs;
  if (best.regathered != next.regathered) return "as fast by the estimate, fewer groups gathered again in backward" + vs;
  return "as fast by the estimate, same units and peak; root share or label decide against " + next.label;
}

std::map<std::string, int> drop_reasons(const Suggestion& s) {
  std::map<std::string, int> out;
  for (const auto& c : s.dropped) ++out[c.dropped];
  return out;
}

}  // namespace

// What --budget does not count and the plan ASSUMES (plan/memory_fit.h), on
// the policy's --hardware: the budget that leaves it room.
std::string headroom_text(const Policy& base, int64_t budget_bytes) {
  const HardwareFigures hw = resolve_hardware(base.hardware);
  const int64_t headroom = assumed_headroom_bytes(hw.memory_bytes);
  const int64_t usable = hw.memory_bytes - headroom;
  std::string line = "headroom the budget is for the memory model's peak; a process needs more: on an " + hw.name +
                     " (--hardware " + hw.preset + (base.hardware.preset_given ? "" : ", the default") +
                     ") the plan ASSUMES " + format_bytes(headroom) +
                     " for the CUDA context, NCCL buffers and allocator fragmentation (docs/memory-model.md): " +
                     format_bytes(usable) + " usable";
  line += budget_bytes > usable ? "; --budget " + format_bytes(budget_bytes) +
                                      " is over that: a plan that fits it may not fit the GPU"
                                : "; --budget " + format_bytes(budget_bytes) + " is within it";
  return wrap_words(line, 100, std::string(9, ' '));
}

std::string suggestion_to_text(const Suggestion& s, const SuggestContext& ctx) {
  const ModuleTree& tree = *ctx.tree;
  const Policy& base = *ctx.base;
  const SuggestOptions& o = ctx.options;
  int64_t total = model_param_numel(tree);
  std::string out;
  out += "model   " + ctx.model_path + "  (" + bare_class(tree, 0) + ", " +
         std::to_string(tree.num_modules()) + " modules, " + format_count(total) + " params)\n";
  out += "budget  " + format_bytes(o.budget_bytes) + " per rank for the memory model's peak + activations " +
         format_bytes(o.activation_bytes) + " (--activation-bytes)\n";
  out += std::string("        ") + (base.fsdp.v2() ? "FSDP2 (fully_shard)" : "FSDP1") + ", world size " +
         std::to_string(base.fsdp.world_size) + ", " + strategy_name(base.fsdp.strategy) +
         ", " + optimizer_name(base.fsdp.optimizer) + ", mixed precision " + mixed_precision_name(base) + "\n";
  out += headroom_text(base, o.budget_bytes);
  if (o.pin_wrapping) out += "pinned  --pin-wrapping: the --policy's wrapping as given, the only candidate (no search)\n";
  size_t fitting = 0;
  for (const auto& c : s.ranked) fitting += c.fits;
  out += "tried   " + std::to_string(s.tried) + " policies, " + std::to_string(s.tried - s.duplicates) +
         " distinct plans: " + std::to_string(s.ranked.size()) + " ranked, " +
         std::to_string(fitting) + " fit; " + std::to_string(s.dropped.size()) + " dropped";
  if (!s.dropped.empty()) {
    std::string reasons;
    for (const auto& [why, n] : drop_reasons(s)) reasons += (reasons.empty() ? "" : ", ") + std::to_string(n) + " " + why;
    out += " (" + reasons + ")";
  }
  out += "\n";
  if (s.ranked.empty()) {
    out += "\nno policy FSDP would accept: every candidate was dropped\n";
    return out;
  }

  size_t label_w = 6, path_w = 12;
  size_t shown = std::min(ctx.top, s.ranked.size());
  for (size_t i = 0; i < shown; ++i) {
    label_w = std::max(label_w, s.ranked[i].label.size());
    path_w = std::max(path_w, (s.ranked[i].largest_unit_path.empty() ? 6 : s.ranked[i].largest_unit_path.size()) + 9);
  }
  const bool step = any_step(s);
  out += "\n   #  " + pad("policy", label_w) + "  units  " + pad("largest unit", path_w) +
         "   root   peak/rank      needed  fits     exposed" + (step ? "        step" : "") + "\n";
  for (size_t i = 0; i < shown; ++i) {
    const Candidate& c = s.ranked[i];
    std::string largest = path_or_root(c.largest_unit_path) + " " +
                          percent(total ? static_cast<double>(c.largest_unit_numel) / static_cast<double>(total) : 0);
    out += pad(std::to_string(i + 1), 4, true) + "  " + pad(c.label, label_w) + "  " +
           pad(std::to_string(c.units), 5, true) + "  " + pad(largest, path_w) + "  " + pad(percent(c.root_share), 6, true) +
           "  " + pad(format_bytes(c.peak_bytes), 10, true) + "  " + pad(format_bytes(c.needed_bytes), 10, true) + "  " +
           pad(c.fits ? "yes" : "no", 4) + pad(ms(true, c.exposed_comm_s), 12, true) +
           (step ? pad(ms(c.step_known, c.step_s), 12, true) : "") + "\n";
  }
  if (shown < s.ranked.size()) out += "      ... " + std::to_string(s.ranked.size() - shown) + " more (--top)\n";

  out += "\n";
  if (const Candidate* best = best_fit(s)) {
    out += "best    " + best->label + ": " + std::to_string(best->units) + " units, needs " +
           format_bytes(best->needed_bytes) + " per rank, " + format_bytes(o.budget_bytes - best->needed_bytes) +
           " under the budget\n";
    out += "        " + policy_file_json(best->policy).dump() + "\n";
    const Candidate* next = nullptr;
    for (size_t i = 1; i < s.ranked.size() && !next; ++i)
      if (s.ranked[i].fits) next = &s.ranked[i];
    if (next) out += "why     " + why_best(*best, *next) + "\n";
    const std::string& source = best->plan->time.flops_source;
    const std::string basis =
        !step ? "the communication compute cannot hide (no FLOPs: every unit's compute assumed long enough to hide "
                "its neighbours' collectives)"
        : source == "graph" ? "step time from the .pt2 graph's FLOPs"
                            : "step time from the --flops figures (" + source + ")";
    out += "time    an ESTIMATE (docs/time-model.md): " + basis +
           ", " + best->plan->time.hardware.name + ", " + std::to_string(best->plan->time.hardware.gpus_per_node) +
           " GPUs per node\n";
    return out;
  }
  const Candidate* lowest = &s.ranked.front();
  for (const auto& c : s.ranked)
    if (c.needed_bytes < lowest->needed_bytes) lowest = &c;
  out += "nothing fits: the lowest, " + lowest->label + ", needs " + format_bytes(lowest->needed_bytes) + ", " +
         format_bytes(lowest->needed_bytes - o.budget_bytes) + " over the budget\n";
  if (s.advice.empty()) {
    out += "no single change of world size, mixed precision or optimizer makes any candidate fit\n";
  } else {
    const bool nodes = std::any_of(s.advice.begin(), s.advice.end(), [&](const FitAdvice& a) {
      return a.setting == "world_size" && o.gpus_per_node > 1 && std::stoll(a.value) > o.gpus_per_node;
    });
    out += std::string("it fits with one change") +
           (nodes ? " (world sizes in whole nodes of " + std::to_string(o.gpus_per_node) + " GPUs, --gpus-per-node)"
                  : "") +
           ":\n";
    size_t width = 34;  // the changes line up, however long the longest
    for (const auto& a : s.advice) width = std::max(width, a.policy_change.size());
    for (const auto& a : s.advice)
      out += "  " + pad(a.policy_change, width + 2) + "needs " + pad(format_bytes(a.needed_bytes), 10, true) +
             "  with " + a.candidate + "\n";
  }
  return out;
}

nlohmann::ordered_json suggestion_to_json(const Suggestion& s, const SuggestContext& ctx) {
  using json = nlohmann::ordered_json;
  const ModuleTree& tree = *ctx.tree;
  const Policy& base = *ctx.base;
  json out;
  out["schema_version"] = 1;
  out["model"] = {{"path", ctx.model_path},
                  {"root_class", bare_class(tree, 0)},
                  {"num_modules", tree.num_modules()},
                  {"param_numel", model_param_numel(tree)}};
  out["settings"] = {{"budget_bytes", ctx.options.budget_bytes},
                     {"activation_bytes", ctx.options.activation_bytes},
                     {"world_size", base.fsdp.world_size},
                     {"gpus_per_node", ctx.options.gpus_per_node},
                     {"fsdp_version", version_number(base.fsdp.version)},
                     {"sharding_strategy", strategy_name(base.fsdp.strategy)},
                     {"optimizer", optimizer_name(base.fsdp.optimizer)},
                     {"mixed_precision", base.mixed_precision && base.mixed_precision->param_dtype
                                             ? json(*base.mixed_precision->param_dtype)
                                             : json(nullptr)}};
  // What the budget leaves out, ASSUMED (headroom_text); the wrapping pinned or searched.
  const HardwareFigures hw = resolve_hardware(base.hardware);
  out["settings"]["hardware"] = hw.preset;
  out["settings"]["assumed_headroom_bytes"] = assumed_headroom_bytes(hw.memory_bytes);
  out["settings"]["usable_bytes"] = hw.memory_bytes - assumed_headroom_bytes(hw.memory_bytes);
  out["settings"]["pin_wrapping"] = ctx.options.pin_wrapping;
  size_t fitting = 0;
  for (const auto& c : s.ranked) fitting += c.fits;
  out["tried"] = s.tried;
  out["duplicates"] = s.duplicates;
  out["ranked_count"] = s.ranked.size();
  out["fitting_count"] = fitting;
  json candidates = json::array();
  for (size_t i = 0; i < s.ranked.size() && i < ctx.top; ++i) {
    const Candidate& c = s.ranked[i];
    candidates.push_back({{"rank", i + 1},
                          {"label", c.label},
                          {"origin", c.origin},
                          {"policy", policy_file_json(c.policy)},
                          {"units", c.units},
                          {"largest_unit", {{"path", c.largest_unit_path}, {"param_numel", c.largest_unit_numel}}},
                          {"root_share", c.root_share},
                          {"peak_bytes", c.peak_bytes},
                          {"peak_phase", c.peak_phase},
                          {"needed_bytes", c.needed_bytes},
                          {"fits", c.fits},
                          {"coarse", c.coarse},
                          {"per_block", c.per_block},
                          {"checkpointed", c.checkpointed},
                          {"checkpoint_mode", !c.checkpointed ? "none" : c.selective ? "selective" : "full"},
                          {"compiled", c.compiled},
                          {"time", {{"estimate", true},
                                    {"exposed_comm_s", c.exposed_comm_s},
                                    {"comm_s", c.comm_s},
                                    {"step_s", c.step_known ? json(c.step_s) : json(nullptr)}}}});
  }
  out["candidates"] = candidates;
  json dropped = json::array();
  for (const auto& c : s.dropped) dropped.push_back({{"label", c.label}, {"reason", c.dropped}});
  out["dropped"] = dropped;
  const Candidate* best = best_fit(s);
  out["best"] = best ? json{{"label", best->label}, {"policy", policy_file_json(best->policy)}} : json(nullptr);
  json advice = json::array();
  for (const auto& a : s.advice)
    advice.push_back({{"setting", a.setting},
                      {"value", a.value},
                      {"needed_bytes", a.needed_bytes},
                      {"policy_change", a.policy_change},
                      {"candidate", a.candidate}});
  out["advice"] = advice;
  return out;
}

std::string maximized_text(const Maximized& m, int64_t budget_bytes) {
  const std::string at = m.dim + " " + std::to_string(m.value);
  std::string line = "maximize  ";
  if (!m.found) {
    line += m.dim + ": no policy fits " + format_bytes(budget_bytes) + " per rank even at " + at;
  } else if (m.at_ceiling) {
    line += at + " fits " + format_bytes(budget_bytes) + " per rank, the most searched (" +
            (m.ceiling == kMaximizeCeiling ? "2^24: the export records no bound" : "the export's bound") + ")";
  } else {
    line += at + " is the largest that fits " + format_bytes(budget_bytes) + " per rank (" + m.dim + " " +
            std::to_string(m.value + 1) + ": the nearest needs " + format_bytes(m.next_needed_bytes) + ")";
  }
  if (m.found && !m.suggestion.ranked.empty() && m.suggestion.ranked.front().fits) {
    const int64_t need = m.suggestion.ranked.front().needed_bytes;
    line += "; there the best needs " + format_bytes(need) + ", " + format_bytes(budget_bytes - need) +
            " under the budget (headroom for what the peak leaves out: the headroom line below)";
  }
  return line + "; " + std::to_string(m.probes) + " suggestions planned; the ranking below is at " + at + "\n";
}

nlohmann::ordered_json maximized_json(const Maximized& m) {
  nlohmann::ordered_json j;
  j["dim"] = m.dim;
  j["found"] = m.found;
  j["value"] = m.value;
  j["at_ceiling"] = m.at_ceiling;
  j["ceiling"] = m.ceiling;
  j["next_needed_bytes"] = m.found && !m.at_ceiling ? nlohmann::ordered_json(m.next_needed_bytes) : nullptr;
  j["probes"] = m.probes;
  return j;
}

}  // namespace fsdp_plan
