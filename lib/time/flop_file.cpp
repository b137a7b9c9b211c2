#include "time/flop_file.h"

#include <unordered_map>

#include "util/errors.h"
#include "util/file_io.h"
#include "util/json_input.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

int64_t flop_count(const nlohmann::json& v, const std::string& where, const std::string& file) {
  if (v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0)) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > (uint64_t{1} << 62))
      throw InputError(file, where + " is too large: " + v.dump());
    return v.get<int64_t>();
  }
  throw InputError(file, where + " must be a whole number of FLOPs, 0 or more, not " + v.dump());
}

// The field a --flops key names ("forward", "backward", "recompute").
int64_t ModuleFlops::*field_of(const char* key) {
  const std::string k = key;
  return k == "forward" ? &ModuleFlops::forward : k == "backward" ? &ModuleFlops::backward : &ModuleFlops::recompute;
}

}  // namespace

FlopProfile parse_flop_file(const std::string& text, const std::string& file, const ModuleTree& tree) {
  const nlohmann::json doc = parse_json(text, file);
  if (!doc.is_object() || !doc.contains("modules") || !doc["modules"].is_object())
    throw InputError(file, "not a FLOP file: no \"modules\" object (module path -> {\"forward\": FLOPs, "
                           "\"backward\": FLOPs}; see fsdp-plan --help, --flops)");
  std::unordered_map<std::string, ModuleId> by_path;
  const std::vector<std::string> all = tree.paths();
  std::vector<std::string> paths;
  for (ModuleId m : tree.preorder()) {
    by_path.emplace(all[static_cast<size_t>(m)], m);
    paths.push_back(all[static_cast<size_t>(m)]);
  }
  const size_t n = tree.num_modules();
  std::vector<ModuleFlops> total(n);
  std::vector<bool> listed(n, false);
  for (const auto& [path, v] : doc["modules"].items()) {
    auto it = by_path.find(path);
    if (it == by_path.end()) {
      auto near = closest(path, paths, 1);
      throw InputError(file, "\"modules\" names \"" + path + "\", which is not a module of the model" +
                                 (near.empty() ? "" : "; did you mean \"" + near[0] + "\"?"));
    }
    const std::string where = "\"modules\".\"" + path + "\"";
    if (!v.is_object()) throw InputError(file, where + " must be an object with \"forward\" and \"backward\"");
    ModuleFlops& f = total[static_cast<size_t>(it->second)];
    for (const char* key : {"forward", "backward"}) {
      if (!v.contains(key)) throw InputError(file, where + " has no \"" + key + "\"");
    }
    f.forward = flop_count(v["forward"], where + ".forward", file);
    f.backward = flop_count(v["backward"], where + ".backward", file);
    if (v.contains("recompute")) f.recompute = flop_count(v["recompute"], where + ".recompute", file);
    listed[static_cast<size_t>(it->second)] = true;
  }
  if (!listed[0])
    throw InputError(file, "\"modules\" has no \"\" (the root: the whole step's FLOPs, its submodules' included)");
  // Each listed module's own figures: its total minus those of the nearest
  // listed modules below it (a module the counter did not see, a ModuleList, has none).
  // Every sum is checked (each figure is at most 2^62). Forward and recompute of the
  // children may not pass the parent's; backward may: FlopCounterMode's module tracker
  // (torch/utils/module_tracker.py) enters a module's backward at its first gradient, so
  // real profiles give a child more backward FLOPs than its parent (tests/timing/reference).
  FlopProfile out;
  out.source = "--flops " + file;
  out.own = total;
  std::vector<ModuleFlops> below(n);  // the nearest listed modules' totals, summed
  auto add_to = [&](int64_t& sum, int64_t v, ModuleId p, const char* field) {
    const bool bounded = std::string_view(field) != "backward";
    if (__builtin_add_overflow(sum, v, &sum) || (bounded && sum > total[static_cast<size_t>(p)].*(field_of(field))))
      throw InputError(file, "\"modules\".\"" + tree.path(p) + "\": its submodules' " + field +
                                 " FLOPs add up to more than its own figure");
  };
  for (size_t m = 1; m < n; ++m) {
    if (!listed[m]) continue;
    ModuleId p = tree.module(static_cast<ModuleId>(m)).parent;
    while (p > 0 && !listed[static_cast<size_t>(p)]) p = tree.module(p).parent;
    ModuleFlops& sum = below[static_cast<size_t>(p)];
    add_to(sum.forward, total[m].forward, p, "forward");
    add_to(sum.backward, total[m].backward, p, "backward");
    add_to(sum.recompute, total[m].recompute, p, "recompute");
  }
  for (size_t m = 0; m < n; ++m) {
    out.own[m].forward -= below[m].forward;
    out.own[m].backward -= below[m].backward;
    out.own[m].recompute -= below[m].recompute;
  }
  // Forward: module order stands for execution order, as FSDP assumes.
  for (ModuleId m : tree.preorder()) {
    const int64_t f = out.own[static_cast<size_t>(m)].forward;
    if (f > 0) out.forward_order.emplace_back(m, f);
  }
  if (auto c = doc.find("config"); c != doc.end() && c->is_object()) {
    if (auto b = c->find("batch"); b != c->end() && b->is_number_integer()) out.batch = b->get<int64_t>();
    if (auto s = c->find("seq"); s != c->end() && s->is_number_integer()) out.seq = s->get<int64_t>();
  }
  if (out.batch > 0 && out.seq > 0)
    out.source += " (batch " + std::to_string(out.batch) + " x sequence " + std::to_string(out.seq) + ")";
  out.notes.push_back("module order stands for the forward's execution order");
  return out;
}

FlopProfile load_flop_file(const std::string& file, const ModuleTree& tree) {
  return parse_flop_file(read_text_file(file, kMaxPlanFileBytes, "a FLOP profile"), file, tree);
}

}  // namespace fsdp_plan
