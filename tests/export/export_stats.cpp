// export_stats MODEL.pt2: loads a torch.export archive with the .pt2 loader
// alone and prints, as one JSON object, what it read (file size, bytes read,
// records read) and what it found (modules, tensors, load time in ms), so
// tests can prove no weight record was opened. Exit 2 on bad input.
#include <chrono>
#include <iostream>

#include <nlohmann/json.hpp>

#include "model/loaders/export_loader.h"
#include "util/errors.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: export_stats MODEL.pt2\n";
    return 1;
  }
  fsdp_plan::ExportReadStats stats;
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const fsdp_plan::ModuleTree tree = fsdp_plan::load_export(argv[1], &stats);
    const auto t1 = std::chrono::steady_clock::now();
    nlohmann::ordered_json out;
    out["file_size"] = stats.file_size;
    out["bytes_read"] = stats.bytes_read;
    out["records_read"] = stats.records_read;
    out["modules"] = tree.num_modules();
    out["tensors"] = tree.num_tensors();
    out["load_ms"] = std::chrono::duration<double, std::milli>(t1 - t0).count();
    std::cout << out.dump() << "\n";
  } catch (const fsdp_plan::InputError& e) {
    std::cerr << "InputError: " << e.file() << ": " << e.what() << "\n";
    return 2;
  }
  return 0;
}
