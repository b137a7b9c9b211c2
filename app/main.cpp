#include <CLI/CLI.hpp>
#include <iostream>

#include "errors.h"
#include "loaders/loader.h"
#include "tree_json.h"

int main(int argc, char** argv) {
  CLI::App app{"fsdp-plan"};
  std::string model;
  bool dump_tree = false;
  app.add_option("model", model)->required();
  app.add_flag("--dump-tree", dump_tree);
  CLI11_PARSE(app, argc, argv);
  try {
    auto tree = fsdp_plan::load_model(model, fsdp_plan::LoaderKind::Jit);
    std::cout << fsdp_plan::tree_to_json(tree).dump(1) << "\n";
  } catch (const fsdp_plan::InputError& e) {
    std::cerr << "fsdp-plan: " << e.file() << ": " << e.what() << "\n";
    return 2;
  }
}
