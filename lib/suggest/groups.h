// What `suggest` adds for FSDP2 and for refused candidates: fully_shard
// groups for the modules before the first block (the input embeddings) and
// after the last (the final norm and the output head), as torchtitan shards
// them (torchtitan/models/llama3/infra/parallelize.py: apply_fsdp), and the groups that keep a tied
// weight in one call.
#pragma once

#include <string>
#include <vector>

#include "model/module_tree.h"
#include "policy/policy.h"

namespace fsdp_plan {

// Module paths outside every block: the largest subtrees holding parameters
// that neither contain a block nor lie in one, before the first block
// (`input`) or after the last (`output`), in module order.
struct EdgeModules {
  std::vector<std::string> input, output;
};
// `block[m]`: m is an instance of the block class; `skip[m]`: m is ignored;
// `numel`: parameters per subtree (fsdp1/select.h subtree_numel).
EdgeModules edge_modules(const ModuleTree& tree, const std::vector<bool>& block, const std::vector<bool>& skip,
                         const std::vector<int64_t>& numel);

// The groups tried with the block class: the input alone, the output alone,
// both as two calls, both in one call; each group holding the output also
// with reshard_after_forward false (kept gathered from the end of forward to
// its backward, which comes first), torchtitan's default for it.
struct GroupVariant {
  std::string label;  // "groups [model.embed_tokens], [model.norm, lm_head] kept after forward"
  std::vector<Fsdp2Group> groups;
};
std::vector<GroupVariant> edge_group_variants(const EdgeModules& edges);

// "[a, b]", with " kept after forward" for reshard_after_forward false.
std::string group_label(const Fsdp2Group& g);

// The policy with every module in `users` (paths) in one fully_shard call:
// the groups already naming any of them merged into it. False if a user is
// the root (always a call of its own).
bool tie_in_one_group(Policy& policy, const std::vector<std::string>& users);

}  // namespace fsdp_plan
