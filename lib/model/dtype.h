// Element types by the name PyTorch gives their storage class ("Float" in
// torch.FloatStorage, also c10::toString(ScalarType)): our dtype name and
// itemsize, and torch.export's code for it. One table for all loaders, torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp_plan {

struct DtypeInfo {
  const char* stem;      // "Float"
  const char* name;      // "float32", as torch prints it without "torch."
  int64_t itemsize = 0;  // bytes per element
  int export_code = 0;   // ScalarType in torch.export's schema; 0: it has none
};

// nullptr for a name PyTorch does not have.
const DtypeInfo* dtype_from_stem(const std::string& stem);
// By our name ("bfloat16"); nullptr for a name PyTorch does not have.
const DtypeInfo* dtype_from_name(const std::string& name);
// nullptr for a code torch.export's schema does not have (or 0, UNKNOWN).
const DtypeInfo* dtype_from_export_code(int code);
std::vector<std::string> dtype_stems();

// Bytes per element of a floating dtype a MixedPrecision can name (float32,
// float16, bfloat16, float64: "bfloat16" -> 2); 0 for any other name.
int64_t dtype_itemsize(const std::string& dtype);
// torch.is_floating_point by dtype name: float16/32/64, bfloat16, the float8 kinds.
bool is_floating_dtype(std::string_view dtype);

}  // namespace fsdp_plan
