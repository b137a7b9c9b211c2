// The structural difference between two plans, computed from their JSON so
// that plans written by different versions of fsdp-plan can be compared.
// What does not matter is not a difference: the model's path, key order,
// unit indices (units are matched by path), warning wording, and sections or
// fields only one side has (reported as notes: an older tool did not write them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdp_plan {

struct FieldChange {
  std::string field;
  nlohmann::json old_value, new_value;
};

struct UnitSummary {
  std::string path, cls;
  int64_t param_numel = 0, param_bytes = 0, buffer_numel = 0, buffer_bytes = 0;
};

struct UnitChange {
  std::string path;
  std::vector<FieldChange> changes;
};

struct ParamMove {
  std::string name, from, to;  // unit paths
  int64_t numel = 0;
};

// A parameter owned by a unit on one side only (newly ignored, or not in the other model).
struct ParamPresence {
  std::string name, unit;
  int64_t numel = 0;
};

// Same name, different shape or dtype.
struct ParamChange {
  std::string name, unit;  // the unit on the new side
  nlohmann::json old_value, new_value;  // {"shape", "dtype", "numel"}
};

struct PlanDiff {
  int old_schema = 0, new_schema = 0;
  std::vector<FieldChange> model, policy;
  std::vector<UnitSummary> units_added, units_removed;
  std::vector<UnitChange> units_changed;
  std::vector<ParamMove> params_moved;
  std::vector<ParamPresence> params_added, params_removed;
  std::vector<ParamChange> params_changed;
  std::vector<nlohmann::json> warnings_appeared, warnings_gone;
  std::vector<FieldChange> other;  // leaves of other sections both sides have (e.g. memory)
  std::vector<std::string> notes;  // what could not be compared, and why

  bool equal() const;
};

// Whether plans of these schema versions have the fields diff compares in
// common, with one meaning: the same version, or versions 1 and 2 (which
// differ only in "comm" and "time"). Otherwise a version change alone makes
// two plans different.
bool same_compared_fields(int old_schema, int new_schema);

// Empty if `doc` has the shape of a plan (the fields the diff reads), else
// what is wrong with it.
std::string plan_shape_error(const nlohmann::json& doc);

// Both documents must pass plan_shape_error.
PlanDiff diff_plans(const nlohmann::json& old_plan, const nlohmann::json& new_plan);

// A plan file (read_text_file + parse_json), and the document must look like a plan.
nlohmann::json load_plan_file(const std::string& file);

}  // namespace fsdp_plan
