#include "command.h"

#include <CLI/CLI.hpp>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <iostream>
#include <vector>

#include "model/loaders/printable.h"
#include "util/errors.h"
#include "util/strings.h"

namespace fsdp_plan {

void setup_logging(int verbosity, bool quiet) {
  auto logger = spdlog::get("fsdp-plan");
  if (!logger) {
    logger = spdlog::stderr_color_st("fsdp-plan");
    logger->set_pattern("fsdp-plan: %l: %v");
    spdlog::set_default_logger(logger);
  }
  logger->set_level(quiet ? spdlog::level::err
                    : verbosity >= 2 ? spdlog::level::debug
                    : verbosity == 1 ? spdlog::level::info
                                     : spdlog::level::warn);
}

std::optional<int> parse_command(CLI::App& app, int argc, char** argv, const std::string& command) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    spdlog::error("{}: {} (see fsdp-plan {} --help)", command, printable(e.what(), kMaxMessage), command);
    return kExitInputError;
  }
  return std::nullopt;
}

std::optional<std::string> unknown_option_hint(const CLI::App& app, int argc, char** argv) {
  std::vector<std::string> known;
  for (const CLI::Option* o : app.get_options())
    for (const auto& name : o->get_lnames()) known.push_back("--" + name);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") break;
    if (arg.rfind("--", 0) != 0) continue;
    arg = arg.substr(0, arg.find('='));
    if (std::find(known.begin(), known.end(), arg) != known.end()) continue;
    auto near = closest(arg, known, 1);
    if (!near.empty()) return "unknown option " + arg + "; did you mean " + near[0] + "?";
    return std::nullopt;
  }
  return std::nullopt;
}

int run_guarded(const std::function<int()>& body) {
  try {
    return body();
  } catch (const InputError& e) {
    // Every message may quote the input: one line of ASCII, bounded (printable.h).
    spdlog::error("{}: {}", printable(e.file(), 1024), printable(e.what(), kMaxMessage));
    return kExitInputError;
  } catch (const std::exception& e) {
    // Not a log line: the one message of a crash, printed however logging is set.
    std::cerr << "fsdp-plan: internal error: " << printable(e.what(), kMaxMessage) << "\n";
    return kExitInternal;
  }
}

}  // namespace fsdp_plan
