// Loader for torch.export archives (.pt2, torch.export.save in the pt2 archive
// format of torch 2.13): reads the zip's directory and three JSON records, never a weight.
// Torch-free.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/module_tree.h"

namespace fsdp_plan {
namespace zip { class Reader; }

// What load_export read from disk, to prove it left the weights alone.
struct ExportReadStats {
  uint64_t file_size = 0;
  uint64_t bytes_read = 0;                // zip directory and headers included
  std::vector<std::string> records_read;  // whole records, in the order read
};

struct ExportOptions {
  // Refuse records whose CRC-32 differs from the zip's. Off only for the
  // fuzzer, so that its mutations reach the JSON reader.
  bool verify_crc = true;
};

// Whether a zip is laid out as a torch.export archive (whatever the file's
// extension). load_model reads a directory once for this check and the
// loader (150,000 records take longer than a plan).
bool is_export_archive(const zip::Reader& zip);
ModuleTree load_export(const std::string& path, std::unique_ptr<zip::Reader> zip);

ModuleTree load_export(const std::string& path, ExportReadStats* stats = nullptr,
                       const ExportOptions& options = {});

// The bytes of a .pt2 already in memory; `name` stands for the file in messages.
ModuleTree load_export_bytes(const std::string& name, const void* data, size_t size,
                             ExportReadStats* stats = nullptr, const ExportOptions& options = {});

}  // namespace fsdp_plan
