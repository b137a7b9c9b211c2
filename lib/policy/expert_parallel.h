// The policy's "expert_parallel" section: routed experts split over an "ep"
// mesh dimension and FSDP-sharded over "efsdp", as torchtitan builds it
// (torchtitan/distributed/parallel_dims.py: the sparse mesh (dp_replicate,
// efsdp, ep) with efsdp x ep == dp_shard x cp x tp; torchtitan/distributed/
// fsdp.py apply_fsdp_to_decoder: expert parameters on the efsdp mesh through
// shard_placement_fn). docs/expert-parallel.md describes it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdp_plan {

struct ExpertParallel {
  int64_t degree = 1;  // the "ep" mesh dimension
  // The classes of the routed-expert modules (fully_shard's expert parameters
  // are theirs); empty: every module whose class name ends in "Experts" and
  // whose parameters all hold the experts on dim 0 (transformers 5's fused
  // experts, torchtitan's GroupedExperts).
  std::vector<std::string> module_classes;
  // How many experts each token goes to (the router's top-k): the all-to-all's
  // rows are tokens x top_k. nullopt: read from the graph, where the experts'
  // routing indices are an input of the expert module.
  std::optional<int64_t> top_k;
  // Skewed routing: the busiest ep rank's routed rows over the mean (tokens x
  // top_k); the plan is that rank's. 1: uniform. At most the degree (one rank
  // receiving every rank's rows).
  double imbalance = 1.0;
};

// Parses the "expert_parallel" object; throws InputError naming `file`.
ExpertParallel parse_expert_parallel(const nlohmann::json& v, const std::string& file);
// "" where `f` can be expert_parallel.imbalance (--moe-imbalance), else why not.
std::string imbalance_error(double f);
// "" where ep.imbalance is at most ep.degree, else why it cannot be.
std::string imbalance_over_degree(const ExpertParallel& ep);
// The section as written (policy_file_json reads back the same).
nlohmann::ordered_json expert_parallel_json(const ExpertParallel& ep);

}  // namespace fsdp_plan
