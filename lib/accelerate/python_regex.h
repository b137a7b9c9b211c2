// fsdp_ignored_modules: a Python re pattern, run by RE2.
//
// Accelerate compiles it with Python's re and keeps the modules whose path
// re.fullmatch()es it (utils/fsdp_utils.py: get_parameters_from_modules, and
// the FSDP1 plugin alike). RE2 matches in linear time with bounded memory,
// whatever the pattern; a backtracking engine (std::regex, Python's own)
// recurses per nesting level and can take exponential time. The two syntaxes
// agree on what module paths need (literals, ., [...], \d \w \s on ASCII,
// (?:...), (?P<name>...), | * + ? {m,n} ^ $ \A); the rest is translated
// (\Z, \uXXXX, {,n}, (?#...), the a and u flags) or refused by name.
#pragma once

#include <memory>
#include <string>

namespace re2 {
class RE2;
}

namespace fsdp_plan {

// The RE2 pattern for a Python one; `why` says what RE2 cannot run (and the
// result is empty) where Python's re has a construct RE2 lacks.
std::string python_regex_to_re2(const std::string& pattern, std::string& why);

// The pattern translated and compiled; nullptr with `why` set where RE2
// cannot run it or either syntax refuses it.
std::unique_ptr<re2::RE2> compile_python_regex(const std::string& pattern, std::string& why);

}  // namespace fsdp_plan
