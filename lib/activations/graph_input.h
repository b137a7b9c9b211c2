// The walk's input (walk.h: WalkGraph) from a .pt2's graph (model/graph.h),
// every size, stride and symbolic int evaluated at the plan's dimensions.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "activations/walk.h"
#include "model/graph.h"

namespace fsdp_plan {

// The most bytes one graph tensor may hold at the given dimensions, and all of
// them together (docs/limits.md): far past any accelerator, and low enough
// that no sum the walk and the memory model make of them (each storage counted
// a few times, retyped to at most 16 bytes an element) reaches 2^63.
inline constexpr int64_t kMaxGraphTensorBytes = int64_t{1} << 48;
inline constexpr int64_t kMaxGraphBytes = int64_t{1} << 52;

// Throws InputError (naming the file and the dimension) where a size needs a
// dimension `dims` has no value for, or a size or stride is negative there;
// TooLargeError where a tensor or all of them pass the limits above.
WalkGraph walk_input(const Graph& graph, const DimValues& dims);

// walk_input of `graph` at `dims`, the values DimValues::hints(*graph, given)
// gave, kept for the next call with the same graph and `given`: a plan's
// activations and its FLOPs walk the same input (the two builds were 9% of a
// 70B plan's instructions, callgrind), and suggest plans one graph many times. One entry
// per thread; a new graph or new dimensions replace it.
std::shared_ptr<const WalkGraph> shared_walk_input(const std::shared_ptr<const Graph>& graph,
                                                   const std::vector<std::pair<std::string, int64_t>>& given,
                                                   const DimValues& dims);

}  // namespace fsdp_plan
