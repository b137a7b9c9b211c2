// fsdp-plan: the FSDP wrapping plan of a model file, before any GPU hour.
// A subcommand by its first word; anything else is a model to plan (a model
// file literally named "diff" or "suggest" is ./diff).
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include <spdlog/spdlog.h>

#include "command.h"
#include "diff_command.h"
#include "plan_command.h"
#include "suggest_command.h"

#if defined(__SANITIZE_ADDRESS__)
#define FSDP_PLAN_LEAK_CHECK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FSDP_PLAN_LEAK_CHECK 1
#endif
#endif

namespace {

int command(int argc, char** argv) {
  fsdp_plan::setup_logging(0, false);  // every message on stderr as "fsdp-plan: LEVEL: ..."; -v/-q adjust it
  const std::string first = argc > 1 ? argv[1] : "";
  if (first == "diff") return fsdp_plan::diff_main(argc - 1, argv + 1);
  if (first == "suggest") return fsdp_plan::suggest_main(argc - 1, argv + 1);
  return fsdp_plan::plan_main(argc, argv);
}

}  // namespace

int main(int argc, char** argv) {
  const int code = command(argc, argv);
#ifdef FSDP_PLAN_LEAK_CHECK
  return code;  // LeakSanitizer checks at exit
#else
  // The output is written (the plan's OutputWriter commits before its command
  // returns). What is left is memory the system takes back with the process:
  // freeing it piece by piece (the cached graph walk and the graph of a 70B
  // export: some 14M instructions, 6% of its plan) is skipped.
  spdlog::default_logger()->flush();
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(code);
#endif
}
