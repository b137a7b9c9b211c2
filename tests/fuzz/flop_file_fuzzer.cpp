// libFuzzer target: any bytes as a --flops file (lib/time/flop_file.cpp) for a
// small model. The reader must return a profile or throw InputError; anything
// else (a crash, another exception, a sanitizer report, signed overflow under
// UBSan) is a bug. A profile it returns has no negative forward or recompute
// figure; a module's own backward may be negative (its children's backward, as
// FlopCounterMode's module tracker attributes it, can pass its own), but the
// owns still add up to the root's figure.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_tree.h"
#include "time/flop_file.h"
#include "util/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fsdp_plan::ModuleTree& tree = fsdp_plan::fuzz::fuzz_tree();
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const fsdp_plan::FlopProfile p = fsdp_plan::parse_flop_file(text, "fuzz.flops.json", tree);
    __int128 backward = 0;
    for (const auto& f : p.own) {
      if (f.forward < 0 || f.recompute < 0) std::abort();  // a child's figure past its parent's
      backward += f.backward;
    }
    // The owns telescope to the root's figure, which is a count: 0 .. 2^62.
    if (backward < 0 || backward > (static_cast<__int128>(1) << 62)) std::abort();
  } catch (const fsdp_plan::InputError&) {
  }
  return 0;
}
