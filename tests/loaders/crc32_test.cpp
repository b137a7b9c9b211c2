// zip::crc32 (carry-less folding where the CPU has it) against zlib's table
// code: every length around the 16- and 64-byte steps, unaligned starts,
// chained calls, and the check value of the CRC-32 catalogue.
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <vector>

#include "model/loaders/crc32.h"

using fsdp_plan::zip::crc32;
using fsdp_plan::zip::crc32_zlib;

TEST_CASE("crc32: the catalogue's check value") {
  CHECK(crc32(0, "123456789", 9) == 0xcbf43926u);
  CHECK(crc32(0, "", 0) == 0u);
  const std::string zeros(4096, '\0');
  CHECK(crc32(0, zeros.data(), zeros.size()) == crc32_zlib(0, zeros.data(), zeros.size()));
}

TEST_CASE("crc32: equal to zlib's at every length, start and seed") {
  std::mt19937_64 rng(30);
  std::vector<unsigned char> bytes(1 << 16);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  int differ = 0;
  for (size_t n = 0; n < 1100; ++n) {
    for (size_t start = 0; start < 4; ++start) {
      const auto seed = static_cast<uint32_t>(n % 5 ? rng() : 0);
      differ += crc32(seed, bytes.data() + start, n) != crc32_zlib(seed, bytes.data() + start, n);
    }
  }
  CHECK(differ == 0);
  CHECK(crc32(0, bytes.data(), bytes.size()) == crc32_zlib(0, bytes.data(), bytes.size()));
  // In pieces, as a reader that checks a record chunk by chunk would.
  const uint32_t half = crc32(0, bytes.data(), 1000);
  CHECK(crc32(half, bytes.data() + 1000, bytes.size() - 1000) == crc32_zlib(0, bytes.data(), bytes.size()));
}
