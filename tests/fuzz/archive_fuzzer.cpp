// libFuzzer target: any bytes as a model file, read by the structure-only
// archive loader from memory. It must return a tree or throw InputError;
// anything else (a crash, another exception, a sanitizer report, a hang or an
// allocation past libFuzzer's limits) is a bug. CRC checks are off so that
// mutations inside records reach the pickle and class parsers.
//
// Half the mutations land inside one code/ record: torch.jit.save stores its
// records, so their bytes lie in the file as they are, and an edit there
// reaches the class-declaration parser and its cross-check with data.pkl
// instead of breaking the zip (issue 29: damaged code/ records planned a
// different tree with exit 0).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "model/loaders/archive_loader.h"
#include "util/errors.h"

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

namespace {

uint32_t le(const uint8_t* p, size_t n) {
  uint32_t v = 0;
  for (size_t i = 0; i < n; ++i) v |= uint32_t{p[i]} << (8 * i);
  return v;
}

// The stored code/ records of a zip, as (offset, length) of their bytes, from the local headers.
std::vector<std::pair<size_t, size_t>> code_records(const uint8_t* data, size_t size) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t at = 0; at + 30 <= size; ++at) {
    if (std::memcmp(data + at, "PK\x03\x04", 4) != 0) continue;
    const uint32_t method = le(data + at + 8, 2), comp = le(data + at + 18, 4);
    const size_t name_len = le(data + at + 26, 2), extra_len = le(data + at + 28, 2);
    const size_t start = at + 30 + name_len + extra_len;
    if (start > size || comp > size - start) continue;
    const std::string name(reinterpret_cast<const char*>(data + at + 30), name_len);
    if (method == 0 && comp > 0 && name.find("/code/") != std::string::npos) out.emplace_back(start, comp);
    at = start + comp - 1;
  }
  return out;
}

}  // namespace

extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  std::minstd_rand rng(seed);
  if (rng() % 2 == 0) {
    const auto records = code_records(data, size);
    if (!records.empty()) {
      const auto [start, len] = records[rng() % records.size()];
      std::vector<uint8_t> record(data + start, data + start + len);
      const size_t n = LLVMFuzzerMutate(record.data(), len, len);
      std::memset(record.data() + n, ' ', len - n);  // the record keeps its length, so the zip stays whole
      std::memcpy(data + start, record.data(), len);
      return size;
    }
  }
  return LLVMFuzzerMutate(data, size, max_size);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fsdp_plan::ArchiveOptions options;
  options.verify_crc = false;
  try {
    (void)fsdp_plan::load_archive_bytes("fuzz.pt", data, size, nullptr, options);
  } catch (const fsdp_plan::InputError&) {
  }
  return 0;
}
