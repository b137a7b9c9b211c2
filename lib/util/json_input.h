// JSON that users hand us (policies, reviewed plans): every way it can be
// malformed becomes one InputError naming the file.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace fsdp_plan {

// Any nlohmann error (syntax, a number beyond a double, bad UTF-8) becomes
// InputError(file, "invalid JSON: <what nlohmann says, without its tag>").
nlohmann::json parse_json(const std::string& text, const std::string& file);

}  // namespace fsdp_plan
