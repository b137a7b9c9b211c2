// fsdp-plan-export's record in a .pt2: <archive>/extra/fsdp_plan.json
// (docs/export-metadata.md), what the program alone cannot say (the model's
// _no_split_modules, its dtype, the config's tensor-parallel plan). Read in a
// file of its own, apart from the program's reader (export_program.cpp).
// Torch-free.
#pragma once

#include <string>

#include "model/module_tree.h"

namespace fsdp_plan {

// Where torch.export.save(..., extra_files={"fsdp_plan.json": ...}) puts it,
// under the archive's root folder (torch/export/pt2_archive/_package.py:
// _package_extra_files writes extra files under EXTRA_DIR).
inline constexpr char kExportRecordName[] = "extra/fsdp_plan.json";
// The record is a few KB; a bigger claim is a damaged or hostile file.
inline constexpr uint64_t kMaxExportRecord = uint64_t{1} << 24;
// The record format this reads (the record's "format_version").
inline constexpr int kExportRecordFormat = 1;

// The record's text as a ModelRecord. Throws InputError naming `file`: not
// JSON, not this record, a version this reader does not know, a value of the
// wrong type. Keys it does not use are left alone.
ModelRecord parse_export_record(const std::string& text, const std::string& file);

// The classes the record lists for modules the graph names none for (their
// forward never ran: a ModuleList, a skipped block) become ClassSource::Listed,
// replacing an inferred or unrecorded class. A class the graph recorded stays.
void adopt_listed_classes(ModuleTree& tree);

}  // namespace fsdp_plan
