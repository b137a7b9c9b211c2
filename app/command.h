// What every fsdp-plan command shares: its exit codes, its logging, and how a
// parse error or an exception becomes one line on stderr and one of them.
#pragma once

#include <functional>
#include <optional>
#include <string>

namespace CLI { class App; }

namespace fsdp_plan {

// README "Exit codes"; each command's --help says what 1 means for it.
constexpr int kExitOk = 0;
constexpr int kExitRefused = 1;     // the plan: FSDP would refuse it, or a gate failed; diff: they differ; suggest: none fits
constexpr int kExitInputError = 2;  // usage, input or output error
constexpr int kExitInternal = 3;    // a bug

// Logs go to stderr as "fsdp-plan: LEVEL: message": warnings and errors by
// default, info with -v, debug with -vv, errors only with -q.
void setup_logging(int verbosity, bool quiet);

// Parses argv into app. Returns the exit code when the command is done:
// --help printed (0), or a usage error printed as
// "fsdp-plan: error: <command>: <what> (see fsdp-plan <command> --help)" (2).
std::optional<int> parse_command(CLI::App& app, int argc, char** argv, const std::string& command);

// "unknown option --polcy; did you mean --policy?" for the first option the
// parser does not know, if one is close to a known option.
std::optional<std::string> unknown_option_hint(const CLI::App& app, int argc, char** argv);

// body(), with an InputError printed as "fsdp-plan: error: FILE: what" (2) and
// any other exception as an internal error (3).
int run_guarded(const std::function<int()>& body);

}  // namespace fsdp_plan
