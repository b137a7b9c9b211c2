// The activation walk's rules per operator (walk.h): backward temporaries,
// view strides after a restrided kernel output, gradient pass-through.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "activations/saved_ops.h"

namespace fsdp_plan {

// Backward temporaries beyond the input gradients (walk_rules.cpp).
int64_t backward_extra(std::string_view op, const char* case_name, const CallArgs& args);

// The view's strides from its input's, where the input's were corrected
// (graph_walk.py: _view_strides); nullopt when not derivable.
std::optional<std::vector<int64_t>> view_strides(std::string_view name, const OpTensor& t, const OpTensor& o,
                                                 const CallArgs& args);

// Operators whose backward returns the output's gradient itself to an input of the same size.
bool passes_gradient(std::string_view op);

// "aten.transpose.int" -> "transpose"
std::string_view aten_op_base(std::string_view op);

}  // namespace fsdp_plan
