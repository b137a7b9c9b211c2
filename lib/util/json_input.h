// JSON that users hand us (policies, reviewed plans): every way it can be
// malformed becomes one InputError naming the file.
#pragma once

#include <cstddef>
#include <string>

#include <nlohmann/json.hpp>

namespace fsdp_plan {

// Limits of every JSON file read (policies, plans; docs/limits.md): a plan is
// 7 deep; one of 50,000 units holds 3.1 million values (70 MB).
constexpr size_t kMaxJsonDepth = 100;
constexpr size_t kMaxJsonValues = size_t{4} << 20;

// Any nlohmann error (syntax, a number beyond a double, bad UTF-8) becomes
// InputError(file, "invalid JSON: <what nlohmann says, without its tag>"), and
// so do a key given twice in one object (with its line), nesting past
// kMaxJsonDepth and more than kMaxJsonValues values.
nlohmann::json parse_json(const std::string& text, const std::string& file);

// What a value is, for messages: "an integer", "a number", "a string", "a
// boolean", "null", "a list" or "an object".
std::string json_type_name(const nlohmann::json& v);

}  // namespace fsdp_plan
