// Warnings of one kind folded into one line for the outputs people read (the
// text plan, stderr; report.js does the same in the HTML): a LoRA plan's 36
// fsdp2_frozen_dtype warnings, DeepSeek-V3's 58 fsdp2_mixed_dtype errors. The
// JSON keeps every instance.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "util/warnings.h"

namespace fsdp_plan {

struct WarningGroup {
  const Warning* first = nullptr;  // its message stands for the group
  size_t count = 0;
  std::vector<std::string> paths;  // each instance's first module (or parameter), in order
};

// In order of first appearance. Instances fold when they are of one kind and
// severity and each names a module or parameter (the per-module kinds); others
// (an Accelerate key warning, say) stay one per line. `keep` filters first.
std::vector<WarningGroup> group_warnings(const std::vector<Warning>& warnings, bool (*keep)(const Warning&) = nullptr);

// "kind: message" for one instance; for several, "kind (x58: 'layers.3', 'layers.4',
// 'layers.5', ...; --format json lists each): " and the first one's message.
std::string warning_group_text(const WarningGroup& group);

}  // namespace fsdp_plan
