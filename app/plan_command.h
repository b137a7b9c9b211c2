// `fsdp-plan MODEL [--policy FILE]`: the plan (text, JSON, HTML), or what
// applies it (--emit), gated by budgets and a reviewed plan (gate.h).
#pragma once

namespace fsdp_plan {

// argv[0] is the program. Exit codes (README "Exit codes"): 0 plan produced;
// 1 FSDP would refuse the model, a budget is violated, or the plan differs
// from --expect; 2 usage, input or output error; 3 internal error.
int plan_main(int argc, char** argv);

}  // namespace fsdp_plan
