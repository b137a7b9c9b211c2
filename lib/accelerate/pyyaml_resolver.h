// PyYAML's implicit resolvers and its int constructor (yaml/resolver.py,
// constructor.py, 6.0.4): what a plain YAML scalar becomes under yaml.safe_load
// (YAML 1.1: yes/no/on/off are booleans, "1e8" without a dot is a string).
#pragma once

#include <string>

#include "accelerate/py_value.h"

namespace fsdp_plan {

// A scalar resolved as PyYAML's resolver does: a plain one by its text; quoted
// and block scalars (plain false) are strings. *error is set where PyYAML's
// constructor would raise (an int it cannot read, as "0b_": "ValueError: ...")
// or an int in another base is past 2^63.
PyValue resolve_yaml_scalar(std::string text, bool plain, std::string& error);

}  // namespace fsdp_plan
