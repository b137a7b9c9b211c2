// libFuzzer target: any bytes as data.pkl, read by our unpickler. It must
// return a Pickle or throw pickle::Error; anything else (a crash, another
// exception, a sanitizer report, a hang or an allocation past libFuzzer's
// limits) is a bug. The seeds are data.pkl files of real archives.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/loaders/unpickler.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)fsdp_plan::pickle::unpickle(std::string(reinterpret_cast<const char*>(data), size));
  } catch (const fsdp_plan::pickle::Error&) {
  }
  return 0;
}
