#include "command.h"

#include <CLI/CLI.hpp>

#include <iostream>

#include "util/errors.h"

namespace fsdp_plan {

std::optional<int> parse_command(CLI::App& app, int argc, char** argv, const std::string& command) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "fsdp-plan: error: " << command << ": " << e.what() << " (see fsdp-plan " << command
              << " --help)\n";
    return kExitInputError;
  }
  return std::nullopt;
}

int run_guarded(const std::function<int()>& body) {
  try {
    return body();
  } catch (const InputError& e) {
    std::cerr << "fsdp-plan: error: " << e.file() << ": " << e.what() << "\n";
    return kExitInputError;
  } catch (const std::exception& e) {
    std::cerr << "fsdp-plan: internal error: " << e.what() << "\n";
    return kExitInternal;
  }
}

}  // namespace fsdp_plan
