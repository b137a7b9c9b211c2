// The zip CRC-32 (polynomial 0xEDB88320, as zlib's crc32()), with carry-less
// multiplication where the CPU has it: zlib 1.2.13's table code costs 7.7
// instructions a byte, a third of the loader's work on a 9.4 MB
// models/model.json; folding 64 bytes at a time costs about 0.3.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fsdp_plan::zip {

// zlib's crc32(crc, data, size): start from 0, chain by passing the last result.
uint32_t crc32(uint32_t crc, const void* data, size_t size);

// zlib's table code alone (the reference the folding is tested against).
uint32_t crc32_zlib(uint32_t crc, const void* data, size_t size);

}  // namespace fsdp_plan::zip
