// What the tree and the graph read of a .pt2's records, as written, before
// either checks it: tensor metadata (from the program or a config), the
// graph signature's input specs, and the parts of models/model.json the
// module tree is built from.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "model/graph.h"
#include "model/loaders/export_program.h"

namespace fsdp_plan::pt2 {

// One entry of a sizes / strides list, or a storage offset, as written.
struct RawDim {
  enum Kind : uint8_t { Int, Expr, Bad } kind = Bad;
  int64_t value = 0;
  std::string expr;  // Expr: the srepr text
  int64_t hint = kNoHint;
};

// A TensorMeta as written (schema.py: TensorMeta), from either parser: the
// tree's checks and the graph both read it.
struct RawMeta {
  bool has_dtype = false;
  int64_t dtype = 0;
  bool sizes_array = false, strides_array = false, has_offset = false;
  std::vector<RawDim> sizes, strides;
  RawDim offset;
  std::optional<bool> requires_grad;
  std::string device_type;
  std::optional<int64_t> device_index;
  int64_t layout = 0;
};

// What the module tree reads of an input_specs entry.
struct RawSpec {
  bool parameter = false, buffer = false;
  std::optional<std::string> parameter_name, buffer_name;
  std::string parameter_arg, buffer_arg;  // arg.name
  std::optional<bool> persistent;
};

// What the module tree reads of models/model.json; the graph goes to the builder.
struct RawProgram {
  bool object = false;
  bool schema = false, major_ok = false, minor_ok = false;
  int64_t major = 0, minor = 0;
  std::optional<std::string> torch_version;
  bool graph_module = false, graph = false, tensor_values = false;
  bool calls = false;
  std::vector<std::optional<std::string>> call_fqns;
  bool nodes = false;
  std::vector<std::optional<std::string_view>> node_stacks;
  bool specs = false;
  std::vector<RawSpec> input_specs;
  std::unordered_map<std::string_view, RawMeta> metas;  // tensor_values, by name
};

// The message for a damaged record of the archive.
inline std::string damaged_record(const std::string& record, const std::string& what) {
  return "record " + record + " is damaged (" + what + "); " + kSaveExportAgain;
}

}  // namespace fsdp_plan::pt2
