// Element types by the name PyTorch gives their storage class ("Float" in
// torch.FloatStorage, also c10::toString(ScalarType)): our dtype name and
// itemsize. One table for both loaders, torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp_plan {

struct DtypeInfo {
  const char* stem;      // "Float"
  const char* name;      // "float32", as torch prints it without "torch."
  int64_t itemsize = 0;  // bytes per element
};

// nullptr for a name PyTorch does not have.
const DtypeInfo* dtype_from_stem(const std::string& stem);
std::vector<std::string> dtype_stems();

}  // namespace fsdp_plan
