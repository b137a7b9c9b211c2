// `fsdp-plan diff OLD.json NEW.json`: the structural difference between two plans.
#pragma once

namespace fsdp_plan {

// argv[0] is "diff". Exit codes as the plan's: 0 same plan, 1 different
// plans, 2 usage, input or output error, 3 internal error.
int diff_main(int argc, char** argv);

}  // namespace fsdp_plan
