// Checked and saturating 64-bit arithmetic for sizes and byte counts read
// from input: a product or sum that would wrap is an error or a saturated
// value, never a small or negative number (issue 39: a 2^64-byte tensor
// planned at 3.4 MiB). Wrappers over GCC/Clang's __builtin_*_overflow.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>

namespace fsdp_plan {

inline constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// a * b, or nullopt when it does not fit in int64.
inline std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// a + b, or nullopt when it does not fit in int64.
inline std::optional<int64_t> checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Counts and byte sizes (never negative): a + b and a * b, held at
// kInt64Max instead of wrapping, so a total past int64 still compares as
// "more than any budget".
inline int64_t saturating_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) return b < 0 ? std::numeric_limits<int64_t>::min() : kInt64Max;
  return r;
}
inline int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return (a < 0) != (b < 0) ? std::numeric_limits<int64_t>::min() : kInt64Max;
  return r;
}

// The product of `sizes` (each >= 0) times `scale`, or nullopt past int64
// or for a negative size.
template <typename Range>
std::optional<int64_t> checked_product(const Range& sizes, int64_t scale = 1) {
  int64_t n = scale;
  for (int64_t s : sizes) {
    if (s < 0 || __builtin_mul_overflow(n, s, &n)) return std::nullopt;
  }
  return n;
}

}  // namespace fsdp_plan
