#include "report/warning_groups.h"

#include <map>
#include <utility>

namespace fsdp_plan {

namespace {

std::string instance_path(const Warning& w) {
  if (!w.modules.empty()) return w.modules.front().empty() ? "(root)" : w.modules.front();
  return w.params.empty() ? "" : w.params.front();
}

}  // namespace

std::vector<WarningGroup> group_warnings(const std::vector<Warning>& warnings, bool (*keep)(const Warning&)) {
  std::vector<WarningGroup> out;
  std::map<std::pair<std::string, Severity>, size_t> at;  // (kind, severity) -> its group in `out`
  for (const Warning& w : warnings) {
    if (keep && !keep(w)) continue;
    const std::string path = instance_path(w);
    if (!path.empty()) {
      const auto key = std::make_pair(w.kind, w.severity);
      if (auto it = at.find(key); it != at.end()) {
        WarningGroup& g = out[it->second];
        ++g.count;
        g.paths.push_back(path);
        continue;
      }
      at[key] = out.size();
    }
    out.push_back({&w, 1, path.empty() ? std::vector<std::string>{} : std::vector<std::string>{path}});
  }
  return out;
}

std::string warning_group_text(const WarningGroup& g) {
  std::string head = g.first->kind;
  if (g.count > 1) {
    constexpr size_t kShown = 3;
    head += " (x" + std::to_string(g.count) + ": ";
    for (size_t i = 0; i < g.paths.size() && i < kShown; ++i) head += (i ? ", " : "") + g.paths[i];
    head += g.count > kShown ? ", ...; --format json lists each)" : ")";
  }
  return head + ": " + g.first->message;
}

}  // namespace fsdp_plan
