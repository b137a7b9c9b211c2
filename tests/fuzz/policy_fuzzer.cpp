// libFuzzer target: any bytes as a policy file. The parser must either return a
// policy or throw InputError; anything else (a crash, another exception, a
// sanitizer report) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "policy/policy.h"
#include "util/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    fsdp_plan::Policy p = fsdp_plan::parse_policy(text, "fuzz.json");
    (void)fsdp_plan::policy_to_json(p).dump();
  } catch (const fsdp_plan::InputError&) {
  }
  return 0;
}
