// tree_dump <archive|jit> <model.pt> [--stats]: prints the module tree JSON one
// loader reads, without the CLI, so tests can compare loaders byte for byte.
// Exit 2 with "InputError: <message>" on stderr for bad input.
#include <cstring>
#include <iostream>

#include "errors.h"
#include "loaders/archive_loader.h"
#include "loaders/loader.h"
#include "tree_json.h"

int main(int argc, char** argv) {
  if (argc < 3 || (std::strcmp(argv[1], "archive") != 0 && std::strcmp(argv[1], "jit") != 0)) {
    std::cerr << "usage: tree_dump archive|jit MODEL [--stats]\n";
    return 1;
  }
  const bool archive = std::strcmp(argv[1], "archive") == 0;
  const bool stats = argc > 3 && std::strcmp(argv[3], "--stats") == 0;
  try {
    fsdp_plan::ArchiveReadStats s;
    auto tree = archive ? fsdp_plan::load_archive(argv[2], &s)
                        : fsdp_plan::load_model(argv[2], fsdp_plan::LoaderKind::Jit);
    std::cout << fsdp_plan::tree_to_json(tree).dump() << "\n";
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
