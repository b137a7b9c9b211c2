// `fsdp-plan suggest --maximize DIM`: the largest value of a dynamic dimension
// of a .pt2 (its sequence length, say) at which some candidate policy fits the
// budget, and the suggestion there. "What sequence length fits on 8 x 80 GiB?"
#pragma once

#include <cstdint>
#include <string>

#include "model/module_tree.h"
#include "policy/policy.h"
#include "suggest/suggest.h"

namespace fsdp_plan {

struct Maximized {
  std::string dim;          // the dimension's name in the graph (GraphSymbol::dim)
  bool found = false;       // some value in the range fits
  int64_t value = 0;        // the largest value that fits (found), else the smallest tried
  bool at_ceiling = false;  // it fits at the search's ceiling: the range allows more than was searched
  int64_t ceiling = 0;      // the range's maximum, or kMaximizeCeiling where the export recorded none
  int64_t next_needed_bytes = 0;  // at value + 1 (found, not at the ceiling): the nearest candidate's need
  int probes = 0;           // suggestions planned to find it
  Suggestion suggestion;    // at `value`: the report's ranking
};

// Where the export recorded no upper bound (torch 2.13 records none): 2^24.
constexpr int64_t kMaximizeCeiling = int64_t{1} << 24;

// Every candidate's peak grows with the dimension (activations are sized by
// it), so "some candidate fits" holds up to one value and not past it: doubled
// from the value planned (--dim, else the traced one) until it fails, then
// halved between the last fit and the first failure. Throws InputError (naming
// the file) without a graph, or for a name the graph has no dimension for.
Maximized maximize_dim(const ModuleTree& tree, const Policy& base, const SuggestOptions& opt,
                       const std::string& dim, const std::string& model_path);

}  // namespace fsdp_plan
