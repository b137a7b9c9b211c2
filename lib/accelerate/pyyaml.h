// YAML as Accelerate reads a config file: open(file, encoding="utf-8") and
// yaml.safe_load (PyYAML 6.0.4), on libyaml's event parser.
#pragma once

#include <string>

#include "accelerate/py_value.h"

namespace fsdp_plan {

// The one document of `text`, as yaml.safe_load gives it. Throws InputError
// naming `file` where PyYAML would raise (its exception class, message, line
// and column: "not valid YAML, so accelerate launch would stop: ..."), where
// Python cannot decode the text as UTF-8, and past our bounds (docs/limits.md:
// nesting, values and text once aliases are expanded, a recursive alias).
PyValue pyyaml_safe_load(const std::string& text, const std::string& file);

}  // namespace fsdp_plan
