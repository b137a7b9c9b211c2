// libFuzzer target: any bytes as a model file, read by the structure-only
// archive loader from memory. It must return a tree or throw InputError;
// anything else (a crash, another exception, a sanitizer report, a hang or an
// allocation past libFuzzer's limits) is a bug. CRC checks are off so that
// mutations inside records reach the pickle and class parsers.
#include <cstddef>
#include <cstdint>

#include "model/loaders/archive_loader.h"
#include "util/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fsdp_plan::ArchiveOptions options;
  options.verify_crc = false;
  try {
    (void)fsdp_plan::load_archive_bytes("fuzz.pt", data, size, nullptr, options);
  } catch (const fsdp_plan::InputError&) {
  }
  return 0;
}
