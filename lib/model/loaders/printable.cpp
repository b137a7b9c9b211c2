// printable() and quoted_input() are inline in printable.h, so that the
// planner's readers (policy, Accelerate config, plan files) share the rule
// without linking the loaders; this file only checks that the header builds alone.
#include "model/loaders/printable.h"
