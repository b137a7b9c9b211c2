// Internals of the structure-only loader, exposed for tests and the fuzzer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "model/module_tree.h"

namespace fsdp_plan {
namespace zip { class Reader; }

// What load_archive read from disk, to prove it left the weights alone.
struct ArchiveReadStats {
  uint64_t file_size = 0;
  uint64_t bytes_read = 0;         // through the zip reader, central directory included
  // Persistent ids in data.pkl: the storages the unpickler asked for (none is
  // read). PyTorch's pickler writes a storage once, however many tensors share it.
  int64_t storages_requested = 0;
};

struct ArchiveOptions {
  // Refuse records whose CRC-32 differs from the zip's. Off only for the
  // fuzzer, so that its mutations reach the pickle and class parsers.
  bool verify_crc = true;
};

ModuleTree load_archive(const std::string& path, ArchiveReadStats* stats);
// The same with the file's zip already open (load_model opens it once).
ModuleTree load_archive(const std::string& path, std::unique_ptr<zip::Reader> zip);
ModuleTree load_archive(const std::string& path, ArchiveReadStats* stats,
                        const ArchiveOptions& options);

// --loader jit: the structure reader's checks (record sizes and deflate
// ratios, data.pkl through the unpickler's limits, code nesting) before
// LibTorch reads the file; throws InputError as load_archive does. `zip`: the
// file's directory if already open, or nullptr.
void check_archive_for_jit(const std::string& path, std::unique_ptr<zip::Reader> zip);

// The bytes of a model file already in memory; `name` stands for the file in
// messages. Throws InputError exactly as load_archive does.
ModuleTree load_archive_bytes(const std::string& name, const void* data, size_t size,
                              ArchiveReadStats* stats = nullptr,
                              const ArchiveOptions& options = {});

}  // namespace fsdp_plan
