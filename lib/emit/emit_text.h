// Small text helpers shared by the --emit writers (Python literals, regexes).
#pragma once

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "model/module_tree.h"
#include "plan/plan.h"
#include "policy/ignored.h"

namespace fsdp_plan {

inline std::string py_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) {  // a newline or other control character: an escape, so the line still parses
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

inline std::string py_dtype(const std::optional<std::string>& d) { return d ? "torch." + *d : "None"; }

// A Python list of strings, one per line below `indent`.
inline std::string py_list(const std::vector<std::string>& items, const std::string& indent) {
  if (items.empty()) return "[]";
  std::string out = "[\n";
  for (const auto& s : items) out += indent + "    " + py_string(s) + ",\n";
  return out + indent + "]";
}

// re.escape for module paths (names are identifiers and digits; dots matter).
inline std::string regex_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string("\\.^$|?*+()[]{}-").find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

// The ignored modules' paths, top-most ones only (pre-order).
inline std::vector<std::string> top_ignored_modules(const ModuleTree& tree, const Ignored& ignored) {
  std::vector<std::string> out;
  for (ModuleId m : tree.preorder()) {
    const Module& mod = tree.module(m);
    if (ignored.module[static_cast<size_t>(m)] && (m == 0 || !ignored.module[static_cast<size_t>(mod.parent)]))
      out.push_back(tree.path(m));
  }
  return out;
}

// The ignored parameters by their first name in pre-order (a tied one once).
inline std::vector<std::string> ignored_param_names(const ModuleTree& tree, const Ignored& ignored) {
  std::vector<std::string> out;
  std::vector<bool> seen(tree.num_tensors(), false);
  for (ModuleId m : tree.preorder())
    for (const auto& s : tree.module(m).params)
      if (ignored.tensor[static_cast<size_t>(s.tensor)] && !seen[static_cast<size_t>(s.tensor)]) {
        seen[static_cast<size_t>(s.tensor)] = true;
        out.push_back(tree.qualify(m, s.name));
      }
  return out;
}

// The paths of the modules the plan checkpoints (outermost only).
// The outermost compiled modules' paths (policy "compile"), in pre-order.
inline std::vector<std::string> compiled_paths(const Plan& plan) {
  std::vector<std::string> out;
  for (const CompiledModule& c : plan.activations.compiled) out.push_back(plan.tree->path(c.module));
  return out;
}

inline std::vector<std::string> checkpointed_paths(const Plan& plan) {
  std::vector<std::string> out;
  for (const CheckpointedModule& c : plan.activations.checkpointed) out.push_back(plan.tree->path(c.module));
  return out;
}

// torch's checkpoint_wrapper import, as ruff's isort writes it (one name a line: the line is long).
inline constexpr char kCheckpointImport[] =
    "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (\n"
    "    apply_activation_checkpointing,\n"
    "    checkpoint_wrapper,\n"
    ")\n";

// fully_shard's reshard_after_forward as Python: True, False or a rank count.
inline std::string py_reshard(const std::optional<ReshardAfterForward>& r) {
  if (!r) return "True";
  switch (r->kind) {
    case ReshardAfterForward::Kind::True: return "True";
    case ReshardAfterForward::Kind::False: return "False";
    case ReshardAfterForward::Kind::Ranks: return std::to_string(r->ranks);
  }
  return "True";
}

// CALLS, the plan's fully_shard calls in call order (module paths, reshard_after_forward), as the
// 1-D and 2-D FSDP2 forms write them; the root keeps PyTorch's default, None.
inline std::string fully_shard_calls_text(const Plan& plan) {
  std::vector<const Unit*> calls;
  for (const Unit& u : plan.units) calls.push_back(&u);
  std::stable_sort(calls.begin(), calls.end(), [](const Unit* a, const Unit* b) { return a->call < b->call; });
  std::string out =
      "# One fully_shard call per group, in call order: (module paths, reshard_after_forward).\n"
      "# The root (\"\") keeps PyTorch's default, None, which is False for the root.\n"
      "CALLS = [\n";
  for (const Unit* u : calls) {
    const bool root = u->modules.size() == 1 && u->modules.front() == 0;
    std::string list;
    for (ModuleId m : u->modules) list += (list.empty() ? "" : ", ") + py_string(plan.tree->path(m));
    out += "    ([" + list + "], " + (root ? "None" : py_reshard(u->reshard_after_forward)) + "),\n";
  }
  return out + "]\n";
}

// The body of apply_fsdp's loop over the groups (`modules`, `reshard_after_forward` bound) and the
// check after it, as the 1-D and 2-D FSDP2 forms write them.
inline constexpr char kFullyShardCallsAndCheck[] =
    "        call = dict(kwargs)\n"
    "        if reshard_after_forward is not None:\n"
    "            call[\"reshard_after_forward\"] = reshard_after_forward\n"
    "        call.update(fully_shard_kwargs)\n"
    "        fully_shard(modules if len(modules) > 1 else modules[0], **call)\n"
    "    want = sorted(path for paths, _ in CALLS for path in paths)\n"
    "    if built_groups(model) != want:\n"
    "        raise RuntimeError(f\"fully_shard was applied to {built_groups(model)}, the plan has {want}\")\n"
    "    return model\n";

}  // namespace fsdp_plan
