// The policy's "context_parallel" section: every sequence split over a "cp"
// mesh dimension, attention run as a ring over it, as torch's
// context_parallel builds it (torch/distributed/tensor/experimental/
// _context_parallel/_attention.py) and torchtitan configures it
// (parallelism.context_parallel_degree, context_parallel_load_balancer).
// docs/context-parallel.md describes it.
#pragma once

#include <cstdint>

#include <nlohmann/json.hpp>

namespace fsdp_plan {

struct ContextParallel {
  int64_t degree = 1;  // the "cp" mesh dimension
  // torch's _HeadTailLoadBalancer (causal attention; the sequence in 2 x cp
  // chunks, rank i holding chunks i and 2cp-1-i), or none (contiguous shards).
  bool head_tail = true;
  // How K/V travel around the ring: torch's _cp_options.rotate_method,
  // ALL_GATHER by default (one all-gather per attention call), or ALL_TO_ALL
  // (cp - 1 permutes). The gradients' ring is always all-to-all.
  enum class Rotate : uint8_t { AllGather, AllToAll } rotate = Rotate::AllGather;
};

// Parses the "context_parallel" object; throws InputError naming `file`.
ContextParallel parse_context_parallel(const nlohmann::json& v, const std::string& file);
// The section as written (parse_context_parallel reads back the same).
nlohmann::ordered_json context_parallel_json(const ContextParallel& cp);
const char* rotate_name(ContextParallel::Rotate r);

}  // namespace fsdp_plan
