// Internals of the structure-only loader, exposed for tests.
#pragma once

#include <cstdint>
#include <string>

#include "../module_tree.h"

namespace fsdp_plan {

// What load_archive read from disk, to prove it left the weights alone.
struct ArchiveReadStats {
  uint64_t file_size = 0;
  uint64_t bytes_read = 0;         // through the zip reader, central directory included
  int64_t storages_requested = 0;  // tensor storages the unpickler asked for (none is read)
};

ModuleTree load_archive(const std::string& path, ArchiveReadStats* stats);

}  // namespace fsdp_plan
