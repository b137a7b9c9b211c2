// libFuzzer target: any bytes as a .pt2 file, read by the torch.export loader
// from memory. It must return a tree or throw InputError; anything else (a
// crash, another exception, a sanitizer report, a hang or an allocation past
// libFuzzer's limits) is a bug. CRC checks are off so that mutations inside
// the stored JSON records reach the JSON reader and the tree builder.
#include <cstddef>
#include <cstdint>

#include "model/loaders/export_loader.h"
#include "util/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fsdp_plan::ExportOptions options;
  options.verify_crc = false;
  try {
    (void)fsdp_plan::load_export_bytes("fuzz.pt2", data, size, nullptr, options);
  } catch (const fsdp_plan::InputError&) {
  }
  return 0;
}
