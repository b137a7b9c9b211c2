// FLOPs of one training step, per module: what the step-time model (time/)
// computes with. Counted as torch.utils.flop_counter.FlopCounterMode counts
// (tests/timing/FLOPS.md): a multiply-add is 2 FLOPs, only matmul-like ops
// count. They come from a file (--flops) or, once the graph reader lands, the
// .pt2 graph; a TorchScript model alone has none (docs/time-model.md section 6).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/module_tree.h"

namespace fsdp_plan {

struct ModuleFlops {
  int64_t forward = 0;
  int64_t backward = 0;   // with activation checkpointing: the recompute included, or in `recompute`
  int64_t recompute = 0;  // activation checkpointing's forward again in backward, when given apart
};

struct FlopProfile {
  std::string source;  // where the figures come from, as the outputs say it ("flops.json", ...)
  int64_t batch = 0, seq = 0;  // the step they were counted on (0: not said)
  // Per module (ModuleId), its own ops, not its submodules'. Within one FSDP
  // unit the parts may be negative where the counter's backward attribution
  // overlaps between siblings (FLOPS.md): only unit totals are used.
  std::vector<ModuleFlops> own;
  // Forward execution order of the modules with forward FLOPs: (module,
  // forward FLOPs of its own ops there). From a file, module order stands for
  // execution order, as FSDP itself assumes before its first step.
  std::vector<std::pair<ModuleId, int64_t>> forward_order;
  std::vector<std::string> notes;  // what the counts leave out
};

}  // namespace fsdp_plan
