// What fsdp-plan says about a plan besides its units: every warning kind, in
// one table (warnings.cpp) with its severity and the FSDP version it concerns,
// and the one way to raise one. docs/warnings.md documents each kind (a unit
// test checks the two agree); --fail-on and the policy's checks.fail_on accept
// exactly these kinds.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdp_plan {

enum class Severity { Error, Warning, Info };
const char* severity_name(Severity s);

struct Warning {
  std::string kind;
  Severity severity;
  std::string message;
  std::vector<std::string> modules;  // module paths concerned
  std::vector<std::string> classes;  // class names concerned
  std::vector<std::string> params;   // parameter names concerned
  std::vector<std::string> suggestions;
  // A policy fragment that removes the warning, checked by planning again:
  // arrays add to the policy's, objects merge into it. Null when none is known.
  nlohmann::ordered_json fix;
};

// Which plans a kind can appear in.
enum class WarningScope { Any, Fsdp1, Fsdp2, Accelerate };

struct WarningKind {
  const char* kind;
  Severity severity;                // what it is raised as
  std::optional<Severity> also;     // the other severity some cases get (empty_unit: info for the root)
  WarningScope scope;
};

// Every kind, in the order the docs list them.
const std::vector<WarningKind>& warning_table();
// The table's row for `kind`; nullptr if there is none.
const WarningKind* find_warning_kind(std::string_view kind);
// The kinds' names, in table order ("fail_on" accepts them and "any").
std::vector<std::string> warning_kinds();

// A warning of `kind` with the table's severity, or with `severity` where the
// table allows that kind two. Throws std::logic_error for a kind or a
// severity the table does not have: a bug, never an input error.
Warning make_warning(std::string_view kind, std::string message);
Warning make_warning(std::string_view kind, Severity severity, std::string message);

}  // namespace fsdp_plan
