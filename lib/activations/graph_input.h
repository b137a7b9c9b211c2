// The walk's input (walk.h: WalkGraph) from a .pt2's graph (model/graph.h),
// every size, stride and symbolic int evaluated at the plan's dimensions.
#pragma once

#include "activations/walk.h"
#include "model/graph.h"

namespace fsdp_plan {

// Throws InputError (naming the file and the dimension) where a size needs a
// dimension `dims` has no value for.
WalkGraph walk_input(const Graph& graph, const DimValues& dims);

}  // namespace fsdp_plan
