// `fsdp-plan suggest MODEL --budget SIZE`: the wrapping policies that fit a
// per-rank memory budget, ranked (lib/suggest/suggest.h).
#pragma once

namespace fsdp_plan {

// argv[0] is "suggest". Exit codes: 0 a policy fits the budget; 1 none fits
// (the report says by how much, and what would); 2 usage, input or output
// error; 3 internal error.
int suggest_main(int argc, char** argv);

}  // namespace fsdp_plan
