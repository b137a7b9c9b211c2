#include "text_writer.h"

#include <algorithm>

#include "class_names.h"
#include "string_util.h"

namespace fsdp_plan {
namespace {

constexpr size_t kUnitWidth = 38;
constexpr size_t kClassWidth = 20;

// Keeps the end of a long path, where the distinguishing part usually is.
std::string fit_left(const std::string& s, size_t width) {
  if (s.size() <= width) return s;
  return "..." + s.substr(s.size() - (width - 3));
}

std::string fit_right(const std::string& s, size_t width) {
  if (s.size() <= width) return s;
  return s.substr(0, width - 3) + "...";
}

std::string pad(const std::string& s, size_t width, bool right_align = false) {
  if (s.size() >= width) return s;
  std::string fill(width - s.size(), ' ');
  return right_align ? fill + s : s + fill;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string describe_policy(const Policy& p) {
  std::vector<std::string> parts;
  if (p.module_classes) parts.push_back("module_classes [" + join(*p.module_classes) + "]");
  if (p.min_num_params) parts.push_back("min_num_params " + format_count(*p.min_num_params));
  if (p.mixed_precision) {
    const auto& mp = *p.mixed_precision;
    parts.push_back("mixed precision " + mp.param_dtype.value_or("(param dtype unchanged)") +
                    (p.auto_wrap() ? ", full precision for [" + join(mp.ignore_classes) + "]" : ""));
  }
  if (!p.ignored_modules.empty()) parts.push_back("ignored modules [" + join(p.ignored_modules) + "]");
  if (!p.ignored_params.empty()) parts.push_back("ignored params [" + join(p.ignored_params) + "]");
  if (!p.auto_wrap()) parts.insert(parts.begin(), "no auto-wrap (one root unit)");
  return join(parts);
}

std::string percent(int64_t part, int64_t whole) {
  if (whole <= 0) return "0%";
  char buf[16];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return buf;
}

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

std::string memory_text(const Plan& plan) {
  const MemoryPlan& m = plan.memory;
  const RankMemory& r = m.per_rank;
  std::string strategy = strategy_name(m.effective_strategy);
  if (m.effective_strategy == ShardingStrategy::HybridShard)
    strategy += " (groups of " + std::to_string(m.shard_group_size) + ")";
  if (m.effective_strategy != m.settings.strategy)
    strategy += std::string(", from ") + strategy_name(m.settings.strategy);
  std::string out = wrap("memory  per rank, world size " + std::to_string(m.settings.world_size) + ", " + strategy +
                             ", " + optimizer_name(m.settings.optimizer) +
                             (m.settings.use_orig_params ? ", use_orig_params" : "") + "; activations not included",
                         100, std::string(8, ' '));
  out += "        params " + format_bytes(r.params_bytes) + " + grads " + format_bytes(r.grads_bytes) +
         " + optimizer " + format_bytes(r.optimizer_bytes) + " + buffers " + format_bytes(r.buffers_bytes) +
         " = steady " + format_bytes(r.steady_bytes) + "\n";
  std::string peak = "peak " + format_bytes(r.peak_bytes) + " in " + r.peak_phase;
  if (r.peak_unit >= 0) {
    std::string path = plan.tree->path(plan.units[static_cast<size_t>(r.peak_unit)].module);
    peak += " at unit " + std::to_string(r.peak_unit) + " " + (path.empty() ? "(root)" : path) + ", " +
            std::to_string(r.peak_gathered.size()) + " unit" + (r.peak_gathered.size() == 1 ? "" : "s") + " gathered";
  }
  return out + wrap(peak, 100, std::string(10, ' '), std::string(8, ' '));
}

}  // namespace

std::string plan_to_text(const Plan& plan) {
  const ModuleTree& tree = *plan.tree;
  const ModelSummary& m = plan.model;
  std::string out;
  out += "model   " + m.path + "  (" + m.root_class + ", " + std::to_string(m.num_modules) + " modules)\n";
  out += "params  " + format_count(m.param_numel) + " (" + format_bytes(m.param_bytes) + "), buffers " +
         format_count(m.buffer_numel) + " (" + format_bytes(m.buffer_bytes) + ")\n";
  out += wrap("policy  " + describe_policy(plan.policy), 100, std::string(8, ' ')) + "\n";

  // Frozen parameters (requires_grad=False) get a column only in models that have them.
  const bool frozen = std::any_of(plan.units.begin(), plan.units.end(), [](const Unit& u) { return u.frozen_numel > 0; });
  out += pad("#", 4, true) + "  " + pad("unit", kUnitWidth) + "  " + pad("class", kClassWidth) + pad("params", 8, true) +
         (frozen ? pad("frozen", 9, true) : "") + pad("size", 11, true) + pad("buffers", 11, true) + pad("mp", 4, true) +
         "\n";
  int64_t owned_numel = 0;
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const Unit& u = plan.units[i];
    std::string path = tree.path(u.module);
    std::string indent(static_cast<size_t>(std::min(u.depth, 10)) * 2, ' ');
    std::string name = indent + fit_left(path.empty() ? "(root)" : path, kUnitWidth - indent.size());
    std::string cls = fit_right(std::string(short_name(demangle(tree.module(u.module).type_name))), kClassWidth - 1);
    std::string mp = !u.mixed_precision ? "-" : *u.mixed_precision ? "on" : "off";
    out += pad(std::to_string(i), 4, true) + "  " + pad(name, kUnitWidth) + "  " + pad(cls, kClassWidth) +
           pad(format_count(u.param_numel), 8, true) +
           (frozen ? pad(u.frozen_numel ? format_count(u.frozen_numel) : "-", 9, true) : "") +
           pad(format_bytes(u.param_bytes), 11, true) +
           pad(u.buffers.empty() ? "-" : format_bytes(u.buffer_bytes), 11, true) + pad(mp, 4, true) + "\n";
    owned_numel += u.param_numel;
  }

  out += "\n";
  const Unit* largest = &plan.units.front();
  for (const auto& u : plan.units)
    if (u.param_numel > largest->param_numel) largest = &u;
  std::string largest_path = tree.path(largest->module);
  out += std::to_string(plan.units.size()) + " unit" + (plan.units.size() == 1 ? "" : "s") + ", " +
         format_count(owned_numel) + " params sharded";
  if (owned_numel != m.param_numel) out += " (" + format_count(m.param_numel - owned_numel) + " ignored)";
  out += "; largest unit " + (largest_path.empty() ? "(root)" : largest_path) + " " +
         percent(largest->param_numel, owned_numel) + "; root unit " +
         percent(plan.units.front().param_numel, owned_numel) + "\n";

  out += "\n" + memory_text(plan);

  if (!plan.warnings.empty()) {
    out += "\n";
    for (const auto& w : plan.warnings)
      out += wrap(pad(severity_name(w.severity), 8) + w.kind + ": " + w.message, 100, std::string(10, ' '));
  }
  return out;
}

}  // namespace fsdp_plan
