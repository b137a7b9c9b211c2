// libFuzzer target: any bytes as a policy file. The parser must either return a
// policy or throw InputError; anything else (a crash, another exception, a
// sanitizer report) is a bug. A policy it returns is planned on a small model
// (fuzz_tree.h), so that its tensor_parallel plan keys (fnmatch per token) and
// activation_checkpointing section meet modules, at world size 4 when it
// asks for tensor parallelism of degree 2.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_tree.h"
#include "mesh/device_mesh.h"
#include "planner/planner.h"
#include "policy/policy.h"
#include "util/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    fsdp_plan::Policy p = fsdp_plan::parse_policy(text, "fuzz.json");
    (void)fsdp_plan::policy_to_json(p).dump();
    // What load_policy refuses before planning (the CLI's path): not planned here either.
    if (!p.combination_error().empty() || p.fsdp.world_size > 64) return 0;
    const fsdp_plan::TensorParallel* tp = p.tensor_parallel ? &*p.tensor_parallel : nullptr;
    const fsdp_plan::ExpertParallel* ep = p.expert_parallel ? &*p.expert_parallel : nullptr;
    const fsdp_plan::ContextParallel* cp = p.context_parallel ? &*p.context_parallel : nullptr;
    if (!fsdp_plan::device_mesh_error(p.fsdp, tp, ep, cp).empty()) return 0;
    (void)fsdp_plan::make_plan(fsdp_plan::fuzz::fuzz_tree(), p, "fuzz.tree.json");
  } catch (const fsdp_plan::InputError&) {
  }
  return 0;
}
