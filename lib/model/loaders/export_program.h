// The module tree of a torch.export program, from the JSON records of a .pt2
// archive alone: models/NAME.json (the serialized ExportedProgram) and the
// weights and constants configs under data/. No weight record is needed:
// shapes, dtypes and requires_grad are in the tensor metadata, and tied
// tensors share one weight file with the same view of it.
// Torch-free, so unit tests and the fuzzer use it directly.
#pragma once

#include <string>
#include <string_view>

#include "model/module_tree.h"

namespace fsdp_plan {

// What every message about a damaged .pt2 file advises.
inline constexpr char kSaveExportAgain[] = "save the model again with torch.export.save";

// The records' texts; `file` names the archive in InputErrors. An empty
// constants text means the archive has no constants config.
struct ExportRecords {
  std::string model;      // models/NAME.json
  std::string weights;    // data/weights/NAME_weights_config.json
  std::string constants;  // data/constants/NAME_constants_config.json, or ""
  std::string model_name = "model";
  // Or, when its data() is set, models/NAME.json where it lies (in the
  // archive's mapping), with kModelPadding readable bytes after it.
  std::string_view model_in_place;
};

// What simdjson may read past the end of the model text (its SIMDJSON_PADDING).
inline constexpr size_t kModelPadding = 64;

// The schema major version this reads, as torch.export.load checks it.
inline constexpr int kExportSchemaMajor = 8;

// The tree, and the graph it holds (tree.graph()). The model text is taken
// (simdjson reads it in place, with room for its padding).
ModuleTree build_export_tree(const std::string& file, ExportRecords records);

}  // namespace fsdp_plan
