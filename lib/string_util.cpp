#include "string_util.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

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

std::string format_bytes(int64_t bytes) {
  return scaled(bytes, 1024.0, {" B", " KiB", " MiB", " GiB", " TiB", " PiB"}, 1);
}

std::string format_count(int64_t n) { return scaled(n, 1000.0, {"", "K", "M", "B", "T"}, 2); }

}  // namespace fsdp_plan
