// Small string helpers shared by the policy parser, the analysis and the writers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp_plan {

// Shell-style glob over a whole string: `*` matches any run of characters,
// dots included; every other character matches itself.
bool glob_match(std::string_view pattern, std::string_view text);

// Levenshtein distance, case-insensitive.
size_t edit_distance(std::string_view a, std::string_view b);

// Up to `limit` candidates nearest to `word`, nearest first, ties by name;
// only those close enough to be a plausible typo or near miss.
std::vector<std::string> closest(std::string_view word, const std::vector<std::string>& candidates,
                                 size_t limit = 3);

// 1536 -> "1.5 KiB"; 12 -> "12 B"
std::string format_bytes(int64_t bytes);
// 1234567 -> "1.23M"; 999 -> "999"
std::string format_count(int64_t n);

}  // namespace fsdp_plan
