#include "util/strings.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cctype>
#include <cstdio>
#include <limits>

namespace fsdp_plan {

bool glob_match(std::string_view pattern, std::string_view text) {
  // Greedy match with one backtrack point: linear in practice, no recursion.
  size_t p = 0, t = 0, star = std::string_view::npos, resume = 0;
  while (t < text.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = t;
    } else if (p < pattern.size() && pattern[p] == text[t]) {
      ++p;
      ++t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      bool same = std::tolower(static_cast<unsigned char>(a[i - 1])) ==
                  std::tolower(static_cast<unsigned char>(b[j - 1]));
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (same ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::vector<std::string> closest(std::string_view word, const std::vector<std::string>& candidates,
                                 size_t limit) {
  std::vector<std::pair<size_t, std::string>> scored;
  const size_t max_distance = std::max<size_t>(2, word.size() / 2);
  for (const auto& c : candidates) {
    // The distance is at least the difference in length: a 50 MB word costs nothing here.
    if ((word.size() > c.size() ? word.size() - c.size() : c.size() - word.size()) > max_distance) continue;
    size_t d = edit_distance(word, c);
    if (d <= max_distance) scored.emplace_back(d, c);
  }
  std::sort(scored.begin(), scored.end());
  scored.erase(std::unique(scored.begin(), scored.end()), scored.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < scored.size() && out.size() < limit; ++i) out.push_back(scored[i].second);
  return out;
}

namespace {

// n in the largest unit (each `base` times the last) that keeps it >= 1:
// whole numbers below the first step, `decimals` places above it.
std::string scaled(int64_t n, double base, const std::vector<const char*>& units, int decimals) {
  double v = static_cast<double>(n);
  size_t u = 0;
  while (v >= base && u + 1 < units.size()) {
    v /= base;
    ++u;
  }
  char buf[48];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld%s", static_cast<long long>(n), units[0]);
  else
    std::snprintf(buf, sizeof buf, "%.*f%s", decimals, v, units[u]);
  return buf;
}

}  // namespace

std::string pad(const std::string& s, size_t width, bool right_align) {
  if (s.size() >= width) return s;
  std::string fill(width - s.size(), ' ');
  return right_align ? fill + s : s + fill;
}

std::string format_bytes(int64_t bytes) {
  return scaled(bytes, 1024.0, {" B", " KiB", " MiB", " GiB", " TiB", " PiB"}, 1);
}

std::string format_count(int64_t n) { return scaled(n, 1000.0, {"", "K", "M", "B", "T"}, 2); }

std::string format_factor(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", f);
  return buf;
}

}  // namespace fsdp_plan

namespace fsdp_plan {

std::string wrap_words(const std::string& text, size_t width, const std::string& indent) {
  std::string out, line;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find(' ', pos);
    if (end == std::string::npos) end = text.size();
    std::string word = text.substr(pos, end - pos);
    if (!line.empty() && line != indent && line.size() + 1 + word.size() > width) {
      out += line + "\n";
      line = indent;
    }
    if (!line.empty() && line != indent) line += ' ';
    line += word;
    pos = end + 1;
  }
  return out + line + "\n";
}

std::optional<int64_t> parse_size(std::string_view text) {
  // Exact decimal arithmetic in 128 bits: "0.3GB" must be 300000000, which
  // a double does not guarantee.
  size_t i = 0;
  __int128 mantissa = 0, scale = 1;
  size_t digits = 0;
  bool dot = false;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (c == '.' && !dot) {
      dot = true;
      continue;
    }
    if (c < '0' || c > '9') break;
    if (++digits > 20) return std::nullopt;  // keeps mantissa * 2^50 within 128 bits
    mantissa = mantissa * 10 + (c - '0');
    if (dot) scale *= 10;
  }
  if (digits == 0) return std::nullopt;
  while (i < text.size() && text[i] == ' ') ++i;
  std::string unit;
  for (; i < text.size(); ++i) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));

  static const std::pair<const char*, __int128> kUnits[] = {
      {"", 1},          {"b", 1},
      {"k", 1000},      {"kb", 1000},      {"kib", __int128{1} << 10},
      {"m", 1000000},   {"mb", 1000000},   {"mib", __int128{1} << 20},
      {"g", 1000000000}, {"gb", 1000000000}, {"gib", __int128{1} << 30},
      {"t", 1000000000000}, {"tb", 1000000000000}, {"tib", __int128{1} << 40},
      {"p", 1000000000000000}, {"pb", 1000000000000000}, {"pib", __int128{1} << 50},
  };
  for (const auto& [name, multiplier] : kUnits) {
    if (unit != name) continue;
    if (dot && multiplier == 1) return std::nullopt;  // a fraction of a byte
    __int128 bytes = (mantissa * multiplier + scale / 2) / scale;
    if (bytes > std::numeric_limits<int64_t>::max()) return std::nullopt;
    return static_cast<int64_t>(bytes);
  }
  return std::nullopt;
}

std::optional<int64_t> parse_count(std::string_view text) {
  const std::string s(text);
  if (s.empty() || s.find_first_not_of("0123456789.eE+") != std::string::npos) return std::nullopt;
  if (s.find_first_not_of("0123456789") == std::string::npos) {
    errno = 0;
    const long long v = std::strtoll(s.c_str(), nullptr, 10);
    if (errno == ERANGE) return std::nullopt;
    return v;
  }
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || !std::isfinite(d) || d < 0 || d != std::floor(d) || d >= 9.2e18)
    return std::nullopt;
  return static_cast<int64_t>(d);
}

std::string quoted_path(const std::string& path) { return path.empty() ? "(root)" : "'" + path + "'"; }
std::string path_or_root(const std::string& path) { return path.empty() ? "(root)" : path; }

std::string listing(const std::vector<std::string>& items, size_t shown) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < shown; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > shown) out += " and " + std::to_string(items.size() - shown) + " more";
  return out;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::string percent(double share) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * share);
  return buf;
}

std::string percent(int64_t part, int64_t whole) {
  if (whole <= 0) return "0%";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * static_cast<double>(part) / static_cast<double>(whole));
  return buf;
}

}  // namespace fsdp_plan
