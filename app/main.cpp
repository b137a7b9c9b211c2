// fsdp-plan: the FSDP wrapping plan of a model file, before any GPU hour.
// A subcommand by its first word; anything else is a model to plan (a model
// file literally named "diff" or "suggest" is ./diff).
#include <string>

#include "command.h"
#include "diff_command.h"
#include "plan_command.h"
#include "suggest_command.h"

int main(int argc, char** argv) {
  fsdp_plan::setup_logging(0, false);  // every message on stderr as "fsdp-plan: LEVEL: ..."; -v/-q adjust it
  const std::string first = argc > 1 ? argv[1] : "";
  if (first == "diff") return fsdp_plan::diff_main(argc - 1, argv + 1);
  if (first == "suggest") return fsdp_plan::suggest_main(argc - 1, argv + 1);
  return fsdp_plan::plan_main(argc, argv);
}
