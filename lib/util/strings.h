// Small string helpers shared by the policy parser, the analysis and the writers.
#pragma once

#include <cstdint>
#include <optional>
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

// A module path in a message: 'a.b', or (root) for the empty path.
std::string quoted_path(const std::string& path);
// A module path as the reports print it: "(root)" for the root's empty path.
std::string path_or_root(const std::string& path);

// A list for a message: "a, b, c and 4 more" (the first `shown` items).
std::string listing(const std::vector<std::string>& items, size_t shown = 3);
// All of them: "a, b, c".
std::string join(const std::vector<std::string>& items, std::string_view sep = ", ");

// 1536 -> "1.5 KiB"; 12 -> "12 B"
std::string format_bytes(int64_t bytes);
// 1234567 -> "1.23M"; 999 -> "999"
std::string format_count(int64_t n);
// A factor as given, printf's %g: 2.0 -> "2", 1.5 -> "1.5".
std::string format_factor(double f);
// A share as the reports print it: 0.271 -> "27.1%" (printf's %.1f, ties to even).
std::string percent(double share);
// part of whole as percent() prints it; "0%" when whole is not positive.
std::string percent(int64_t part, int64_t whole);

// `s` filled with spaces to `width` columns (one per byte), on the left when
// right-aligned; a longer `s` is left as it is.
std::string pad(const std::string& s, size_t width, bool right_align = false);

// Word-wraps `text` to `width` columns; lines after the first start with
// `indent`. Ends with a newline.
std::string wrap_words(const std::string& text, size_t width, const std::string& indent);

// A byte size as people write it: "1073741824", "80GiB", "80 GB", "1.5TiB",
// "512k". Binary units (KiB, MiB, GiB, TiB, PiB) are powers of 1024; decimal
// ones (KB/K, MB/M, GB/G, TB/T, PB/P) powers of 1000; the unit is
// case-insensitive and "B" alone means bytes. A fraction is allowed with a
// unit and rounds to the nearest byte. Returns nullopt for anything else,
// negative numbers and sizes beyond int64.
std::optional<int64_t> parse_size(std::string_view text);

// A whole number as people and JSON write it: "1000000", "1e6", "2.5e3";
// nullopt for fractions ("2.5"), negatives and anything beyond int64.
std::optional<int64_t> parse_count(std::string_view text);

}  // namespace fsdp_plan
