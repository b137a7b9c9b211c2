#include "accelerate/pyyaml_resolver.h"

#include <algorithm>
#include <cstddef>
#include <string>

namespace fsdp_plan {
namespace {

// PyYAML's implicit resolvers (yaml/resolver.py, 6.0.4), in its order: the
// int and float patterns below, exactly (a dot alone, "-.5" and "._" are
// strings; "017" is octal, "1:30" sexagesimal: 90).
bool all_of_set(const std::string& s, size_t from, const char* set) {
  return from < s.size() && s.find_first_not_of(set, from) == std::string::npos;
}

// [-+]?0b[0-1_]+ | [-+]?0[0-7_]+ | [-+]?(?:0|[1-9][0-9_]*) | [-+]?0x[0-9a-fA-F_]+
// | [-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+
bool yaml_int(const std::string& s) {
  const size_t i = !s.empty() && (s[0] == '-' || s[0] == '+');
  if (i >= s.size()) return false;
  if (s.compare(i, 2, "0b") == 0) return all_of_set(s, i + 2, "01_");
  if (s.compare(i, 2, "0x") == 0) return all_of_set(s, i + 2, "0123456789abcdefABCDEF_");
  if (s[i] == '0') return i + 1 == s.size() || all_of_set(s, i + 1, "01234567_");
  if (!ascii_digit(s[i])) return false;
  size_t j = i;
  while (j < s.size() && (ascii_digit(s[j]) || s[j] == '_')) ++j;
  if (j == s.size()) return true;
  // Sexagesimal: each further part one or two digits, the first of them 0-5.
  while (j < s.size()) {
    if (s[j] != ':' || ++j >= s.size() || !ascii_digit(s[j])) return false;
    if (j + 1 < s.size() && ascii_digit(s[j + 1])) {
      if (s[j] > '5') return false;
      ++j;
    }
    ++j;
  }
  return true;
}

// [-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)? | \.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
// | [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]* | [-+]?\.(?:inf|Inf|INF) | \.(?:nan|NaN|NAN)
bool yaml_float(const std::string& s) {
  if (is_one_of(s, {".nan", ".NaN", ".NAN"})) return true;
  size_t i = !s.empty() && (s[0] == '-' || s[0] == '+');
  if (is_one_of(s.substr(i), {".inf", ".Inf", ".INF"})) return true;
  bool sexagesimal = false;
  if (i < s.size() && ascii_digit(s[i])) {
    while (i < s.size() && (ascii_digit(s[i]) || s[i] == '_')) ++i;
    while (i < s.size() && s[i] == ':') {
      sexagesimal = true;
      if (++i >= s.size() || !ascii_digit(s[i])) return false;
      if (i + 1 < s.size() && ascii_digit(s[i + 1])) {
        if (s[i] > '5') return false;
        ++i;
      }
      ++i;
    }
  } else if (i != 0 || s.size() < 2 || s[0] != '.' || !ascii_digit(s[1])) {
    return false;  // no digit before the dot: no sign, and a digit right after it
  }
  if (i >= s.size() || s[i] != '.') return false;
  ++i;
  while (i < s.size() && (ascii_digit(s[i]) || s[i] == '_')) ++i;
  if (i == s.size()) return true;
  if (sexagesimal || (s[i] != 'e' && s[i] != 'E')) return false;
  if (++i >= s.size() || (s[i] != '-' && s[i] != '+')) return false;
  if (++i >= s.size()) return false;
  return std::all_of(s.begin() + static_cast<std::ptrdiff_t>(i), s.end(), ascii_digit);
}

// PyYAML's construct_yaml_int on what yaml_int() matched, as decimal text.
// Decimals stay as written (Python's ints have no bound); the other bases and
// sexagesimal are converted and must fit 63 bits (no Accelerate setting comes
// near). Returns false with *error set where PyYAML raises ValueError ("0b_")
// or the value is past that bound.
bool yaml_int_text(std::string s, std::string& out, std::string& error) {
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  bool negative = false;
  if (s[0] == '-' || s[0] == '+') negative = s[0] == '-', s.erase(0, 1);
  int base = 10;
  std::string digits = s;
  if (s.compare(0, 2, "0b") == 0) base = 2, digits = s.substr(2);
  else if (s.compare(0, 2, "0x") == 0) base = 16, digits = s.substr(2);
  else if (s.size() > 1 && s[0] == '0') base = 8, digits = s.substr(1);
  if (base == 10 && s.find(':') == std::string::npos) {
    out = (negative && s != "0" ? "-" : "") + s;
    return true;
  }
  if (digits.empty()) {
    error = "ValueError: invalid literal for int() with base " + std::to_string(base) + ": ''";
    return false;
  }
  constexpr unsigned long long kMax = (1ULL << 63) - 1;
  unsigned long long value = 0;
  if (base == 10) {  // sexagesimal: parts of base 60, the first part most significant
    size_t at = 0;
    while (at <= digits.size()) {
      const size_t colon = std::min(digits.find(':', at), digits.size());
      unsigned long long part = 0;
      for (size_t k = at; k < colon; ++k) {
        if (part > (kMax - 9) / 10) part = kMax;
        else part = part * 10 + static_cast<unsigned>(digits[k] - '0');
      }
      if (value > (kMax - part) / 60) {
        error = "an integer past 2^63";
        return false;
      }
      value = value * 60 + part;
      at = colon + 1;
    }
  } else {
    for (const char c : digits) {
      const unsigned d = ascii_digit(c) ? static_cast<unsigned>(c - '0') : static_cast<unsigned>((c | 0x20) - 'a' + 10);
      if (value > (kMax - d) / static_cast<unsigned>(base)) {
        error = "an integer past 2^63";
        return false;
      }
      value = value * static_cast<unsigned>(base) + d;
    }
  }
  out = (negative && value ? "-" : "") + std::to_string(value);
  return true;
}

}  // namespace

PyValue resolve_yaml_scalar(std::string text, bool plain, std::string& error) {
  PyValue v;
  v.text = std::move(text);
  v.kind = PyValue::Str;
  if (!plain) return v;
  const std::string& s = v.text;
  if (is_one_of(s, {"~", "null", "Null", "NULL", ""})) {
    v.kind = PyValue::None;
  } else if (is_one_of(s, {"yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"})) {
    v.kind = PyValue::Bool;
    v.b = true;
  } else if (is_one_of(s, {"no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"})) {
    v.kind = PyValue::Bool;
  } else if (yaml_int(s)) {
    v.kind = PyValue::Int;
    std::string decimal;
    if (!yaml_int_text(s, decimal, error)) return v;
    v.text = std::move(decimal);
  } else if (yaml_float(s)) {
    v.kind = PyValue::Float;
  }
  return v;
}

}  // namespace fsdp_plan
