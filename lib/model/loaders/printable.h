// Messages can quote names and values from a hostile file: keep them one line
// of ASCII, and short. The one escaping rule for every message fsdp-plan
// prints (command.cpp applies it to each error line; readers to what they
// quote). Header-only, so that the planner's readers use it without linking
// the loaders.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace fsdp_plan {

// The most of one quoted value a message shows, and of a whole message.
constexpr size_t kMaxQuoted = 200;
constexpr size_t kMaxMessage = 4096;

// s with every byte outside printable ASCII written as \xNN (control
// characters, escape sequences, NUL, and any byte of UTF-8 alike); past
// `max` bytes of output, cut, with how much was left out.
inline std::string printable(std::string_view s, size_t max = std::string::npos) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  size_t i = 0;
  for (; i < s.size() && out.size() < max; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  if (i < s.size()) out += "... (" + std::to_string(s.size() - i) + " more bytes)";
  return out;
}

// A value from the input as a message quotes it: printable, at most kMaxQuoted.
inline std::string quoted_input(std::string_view s) { return printable(s, kMaxQuoted); }

}  // namespace fsdp_plan
