#include "model/loaders/crc32.h"

#include <algorithm>

#include <zlib.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FSDP_PLAN_CLMUL_CRC 1
#include <immintrin.h>
#endif

namespace fsdp_plan::zip {

uint32_t crc32_zlib(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  // zlib's length is a uInt: a record over 4 GiB goes in pieces.
  while (size > 0) {
    const auto n = static_cast<uInt>(std::min<size_t>(size, size_t{1} << 30));
    c = ::crc32(c, p, n);
    p += n;
    size -= n;
  }
  return static_cast<uint32_t>(c);
}

#ifdef FSDP_PLAN_CLMUL_CRC
namespace {

// Folding by carry-less multiplication, in the bit-reflected domain of the
// zip polynomial: Gopal et al., "Fast CRC Computation for Generic Polynomials
// Using PCLMULQDQ Instruction" (Intel, 2009), whose constants these are
// (x^(n) mod P for the fold distances, then P and its Barrett quotient); the
// same steps as zlib-ng's arch/x86/crc32_pclmulqdq.c and Chromium's zlib
// crc32_simd.c. Only this file's functions use the instructions, and only
// after the CPU says it has them.
#define FSDP_PLAN_CLMUL __attribute__((target("pclmul,sse4.1")))

// x's two 64-bit halves multiplied by k's, added to the next 16 bytes.
FSDP_PLAN_CLMUL inline __m128i fold(__m128i x, __m128i k, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11)), next);
}

FSDP_PLAN_CLMUL inline __m128i load(const unsigned char* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// The CRC register (zlib's value, inverted) after n bytes; n >= 64, n a multiple of 16.
FSDP_PLAN_CLMUL uint32_t fold_bytes(uint32_t reg, const unsigned char* p, size_t n) {
  const __m128i by4 = _mm_set_epi64x(0x1c6e41596, 0x154442bd4);  // 512 bits on: k2, k1
  const __m128i by1 = _mm_set_epi64x(0x0ccaa009e, 0x1751997d0);  // 128 bits on: k4, k3
  const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124);
  const __m128i barrett = _mm_set_epi64x(0x1f7011641, 0x1db710641);  // mu, P
  const __m128i low32 = _mm_setr_epi32(-1, 0, -1, 0);

  __m128i a = _mm_xor_si128(load(p), _mm_cvtsi32_si128(static_cast<int>(reg)));
  __m128i b = load(p + 16), c = load(p + 32), d = load(p + 48);
  p += 64;
  n -= 64;
  for (; n >= 64; p += 64, n -= 64) {
    a = fold(a, by4, load(p));
    b = fold(b, by4, load(p + 16));
    c = fold(c, by4, load(p + 32));
    d = fold(d, by4, load(p + 48));
  }
  __m128i x = fold(fold(fold(a, by1, b), by1, c), by1, d);
  for (; n >= 16; p += 16, n -= 16) x = fold(x, by1, load(p));

  // 128 bits to 64, 64 to 32, then Barrett's reduction to the remainder.
  x = _mm_xor_si128(_mm_srli_si128(x, 8), _mm_clmulepi64_si128(x, by1, 0x10));
  x = _mm_xor_si128(_mm_srli_si128(x, 4), _mm_clmulepi64_si128(_mm_and_si128(x, low32), k5, 0x00));
  __m128i t = _mm_clmulepi64_si128(_mm_and_si128(x, low32), barrett, 0x10);
  t = _mm_clmulepi64_si128(_mm_and_si128(t, low32), barrett, 0x00);
  return static_cast<uint32_t>(_mm_extract_epi32(_mm_xor_si128(x, t), 1));
}

bool cpu_has_clmul() {
  static const bool has = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return has;
}

}  // namespace
#endif

uint32_t crc32(uint32_t crc, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
#ifdef FSDP_PLAN_CLMUL_CRC
  if (size >= 64 && cpu_has_clmul()) {
    const size_t n = size & ~size_t{15};
    crc = ~fold_bytes(~crc, p, n);
    p += n;
    size -= n;
  }
#endif
  return crc32_zlib(crc, p, size);
}

}  // namespace fsdp_plan::zip
