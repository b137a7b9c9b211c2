// Torch dtypes as the plan names them ("float32", "bfloat16", ...).
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

namespace fsdp_plan {

// Python's name for the dtype without "torch.": float32, int64, qint8, ...
std::string dtype_name(c10::ScalarType t);

}  // namespace fsdp_plan
