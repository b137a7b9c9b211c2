// libFuzzer target: any bytes as a module tree JSON (fsdp_plan.tree's format,
// lib/model/loaders/tree_loader.cpp). The loader must return a tree or throw
// InputError; anything else (a crash, another exception, a sanitizer report)
// is a bug. A tree it returns is planned, so that what it accepted is usable.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/loaders/tree_loader.h"
#include "planner/planner.h"
#include "util/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    fsdp_plan::ModuleTree tree = fsdp_plan::parse_tree_json(text, "fuzz.tree.json");
    fsdp_plan::Policy policy;
    policy.module_classes = std::vector<std::string>{"Block"};
    (void)fsdp_plan::make_plan(tree, policy, "fuzz.tree.json");
  } catch (const fsdp_plan::InputError&) {
  }
  return 0;
}
