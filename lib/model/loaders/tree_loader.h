// Loader for module-tree JSON: a live module's structure as fsdp_plan.tree
// writes it (python/fsdp_plan/tree.py, docs/export-metadata.md), the
// `fsdp-plan --dump-tree` format plus each class's bases and each buffer's
// `persistent`, recognised by its "tree_format" key. What fsdp_plan.plan()
// hands the binary when it has no example inputs to export with. Torch-free.
#pragma once

#include <cstdint>
#include <string>

#include "model/module_tree.h"

namespace fsdp_plan {

// The tree format this reads.
inline constexpr int kTreeFormat = 1;
// Far past any model's tree (a 50,000-module traced model writes ~30 MB).
inline constexpr uint64_t kMaxTreeFile = uint64_t{1} << 28;

// Whether the file's first byte past white space opens a JSON object: a
// model file is a zip or a pickle, never that; load_model then asks this loader.
bool looks_like_json_object(const std::string& path);

// Throws InputError naming `file`: not JSON, not a module tree, a format
// version this does not read, or a tree that cannot be (a module under a
// parent not listed before it, a tensor number reused with another shape,
// impossible shapes, unknown dtypes), each in one line.
ModuleTree load_tree_json(const std::string& path);
ModuleTree parse_tree_json(const std::string& text, const std::string& file);

}  // namespace fsdp_plan
