// tree_dump <archive|jit> <model.pt> [--stats|--summary]: prints the module tree
// JSON one loader reads, without the CLI, so tests can compare loaders byte for
// byte. --stats adds what the archive loader read (stderr); --summary prints
// only counts (for trees too deep for the JSON's per-module paths).
// Exit 2 with "InputError: <message>" on stderr for bad input.
#include <algorithm>
#include <cstring>
#include <iostream>

#include "model/loaders/archive_loader.h"
#include "model/loaders/loader.h"
#include "model/tree_json.h"
#include "util/errors.h"

namespace {

void print_summary(const fsdp_plan::ModuleTree& tree) {
  // Parents have smaller ids, so one forward sweep gives every depth.
  std::vector<int> depth(tree.num_modules(), 0);
  size_t params = 0;
  int max_depth = 0;
  for (size_t m = 0; m < tree.num_modules(); ++m) {
    const auto& mod = tree.modules()[m];
    if (mod.parent >= 0) depth[m] = depth[static_cast<size_t>(mod.parent)] + 1;
    max_depth = std::max(max_depth, depth[m]);
    params += mod.params.size();
  }
  std::cout << "modules=" << tree.num_modules() << " tensors=" << tree.num_tensors()
            << " max_depth=" << max_depth << " params=" << params << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || (std::strcmp(argv[1], "archive") != 0 && std::strcmp(argv[1], "jit") != 0)) {
    std::cerr << "usage: tree_dump archive|jit MODEL [--stats|--summary]\n";
    return 1;
  }
  const bool archive = std::strcmp(argv[1], "archive") == 0;
  const bool stats = argc > 3 && std::strcmp(argv[3], "--stats") == 0;
  const bool summary = argc > 3 && std::strcmp(argv[3], "--summary") == 0;
  try {
    fsdp_plan::ArchiveReadStats s;
    auto tree = archive ? fsdp_plan::load_archive(argv[2], &s)
                        : fsdp_plan::load_model(argv[2], fsdp_plan::LoaderKind::Jit);
    if (summary) {
      print_summary(tree);
    } else {
      std::cout << fsdp_plan::tree_to_json(tree).dump() << "\n";
    }
    if (stats && archive) {
      std::cerr << "file_size=" << s.file_size << " bytes_read=" << s.bytes_read
                << " storages_requested=" << s.storages_requested << "\n";
    }
  } catch (const fsdp_plan::InputError& e) {
    std::cerr << "InputError: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
