// The zip central directory of a TorchScript archive, read by us rather than
// by LibTorch's miniz so that record sizes and CRC-32s can be checked before
// anything is allocated or trusted: miniz allocates whatever size the
// directory declares and PyTorch builds it without CRC checks. Header-only and
// torch-free so tests can use it directly.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

namespace fsdp_plan::zip {

struct Entry {
  std::string name;
  uint16_t method = 0;  // 0 stored, 8 deflated
  uint32_t crc = 0;
  uint64_t comp_size = 0;
  uint64_t uncomp_size = 0;
  uint64_t local_offset = 0;  // of the local file header
};

// Why a directory could not be read: no end record at all (a cut-off file,
// typically) or one that points at nonsense.
class Error : public std::runtime_error {
 public:
  enum Kind { kNoEnd, kDamaged };
  Error(Kind kind, const std::string& what) : std::runtime_error(what), kind(kind) {}
  Kind kind;
};

// Reads n bytes at pos; returns how many it got.
using ReadAt = std::function<size_t(uint64_t pos, void* buf, size_t n)>;

namespace detail {
inline uint64_t le(const unsigned char* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
inline std::vector<unsigned char> read_exact(const ReadAt& read, uint64_t pos, uint64_t n,
                                             const char* what) {
  std::vector<unsigned char> buf(static_cast<size_t>(n));
  if (n > 0 && read(pos, buf.data(), buf.size()) != buf.size()) {
    throw Error(Error::kDamaged, std::string("cannot read the zip's ") + what);
  }
  return buf;
}
}  // namespace detail

class Directory {
 public:
  // Parses the end of central directory record (ZIP64 too) and every entry.
  // Everything it returns lies inside the file.
  Directory(uint64_t file_size, const ReadAt& read) : file_size_(file_size) {
    using detail::le;
    const uint64_t kEnd = 22;
    if (file_size < kEnd) throw Error(Error::kNoEnd, "too short for a zip end record");
    // Without a zip comment (torch writes none) the end record is the last
    // 22 bytes; otherwise search the longest comment's worth.
    uint64_t tail_len = kEnd, tail_pos = 0;
    std::vector<unsigned char> tail;
    int64_t at = -1;
    for (int attempt = 0; attempt < 2 && at < 0; ++attempt) {
      if (attempt == 1) tail_len = std::min<uint64_t>(file_size, kEnd + 0xffff);
      tail_pos = file_size - tail_len;
      tail = detail::read_exact(read, tail_pos, tail_len, "end record");
      for (int64_t i = static_cast<int64_t>(tail_len - kEnd); i >= 0; --i) {
        if (le(&tail[static_cast<size_t>(i)], 4) == 0x06054b50) {
          at = i;
          break;
        }
      }
    }
    if (at < 0) throw Error(Error::kNoEnd, "no zip end record");
    const unsigned char* e = &tail[static_cast<size_t>(at)];
    const uint64_t end_pos = tail_pos + static_cast<uint64_t>(at);
    uint64_t count = le(e + 10, 2), cd_size = le(e + 12, 4), cd_offset = le(e + 16, 4);
    // ZIP64: a locator right before the end record points at the real one.
    if (end_pos >= 20) {
      auto loc = detail::read_exact(read, end_pos - 20, 20, "ZIP64 locator");
      if (le(loc.data(), 4) == 0x07064b50) {
        const uint64_t z_pos = le(loc.data() + 8, 8);
        if (z_pos > end_pos - 20 || end_pos - 20 - z_pos < 56) {
          throw Error(Error::kDamaged, "ZIP64 end record out of place");
        }
        auto z = detail::read_exact(read, z_pos, 56, "ZIP64 end record");
        if (le(z.data(), 4) != 0x06064b50) throw Error(Error::kDamaged, "bad ZIP64 end record");
        count = le(z.data() + 32, 8);
        cd_size = le(z.data() + 40, 8);
        cd_offset = le(z.data() + 48, 8);
        end_pos_ = z_pos;
      } else {
        end_pos_ = end_pos;
      }
    } else {
      end_pos_ = end_pos;
    }
    if (cd_offset > end_pos_ || cd_size > end_pos_ - cd_offset) {
      throw Error(Error::kNoEnd, "central directory outside the file");
    }
    if (count > cd_size / 46) throw Error(Error::kDamaged, "central directory too small for its entries");
    cd_offset_ = cd_offset;
    auto cd = detail::read_exact(read, cd_offset, cd_size, "central directory");
    entries_.reserve(static_cast<size_t>(count));
    size_t p = 0;
    for (uint64_t i = 0; i < count; ++i) {
      if (cd.size() - p < 46 || le(&cd[p], 4) != 0x02014b50) {
        throw Error(Error::kDamaged, "bad central directory entry");
      }
      const unsigned char* h = &cd[p];
      Entry en;
      en.method = static_cast<uint16_t>(le(h + 10, 2));
      en.crc = static_cast<uint32_t>(le(h + 16, 4));
      en.comp_size = le(h + 20, 4);
      en.uncomp_size = le(h + 24, 4);
      const size_t name_len = le(h + 28, 2), extra_len = le(h + 30, 2), comment_len = le(h + 32, 2);
      en.local_offset = le(h + 42, 4);
      if (cd.size() - p - 46 < name_len + extra_len + comment_len) {
        throw Error(Error::kDamaged, "central directory entry runs past its end");
      }
      en.name.assign(reinterpret_cast<const char*>(h + 46), name_len);
      // ZIP64 extra field: 64-bit values for the fields that read 0xFFFFFFFF, in order.
      const unsigned char* x = h + 46 + name_len;
      for (size_t q = 0; q + 4 <= extra_len;) {
        const uint64_t id = le(x + q, 2), len = le(x + q + 2, 2);
        if (q + 4 + len > extra_len) break;
        if (id == 0x0001) {
          size_t f = q + 4;
          auto take = [&](uint64_t& v) {
            if (v != 0xffffffffu) return;
            if (f + 8 > q + 4 + len) throw Error(Error::kDamaged, "short ZIP64 extra field");
            v = le(x + f, 8);
            f += 8;
          };
          take(en.uncomp_size);
          take(en.comp_size);
          take(en.local_offset);
        }
        q += 4 + static_cast<size_t>(len);
      }
      p += 46 + name_len + extra_len + comment_len;
      index_.emplace(en.name, entries_.size());  // first wins, as in a linear scan
      entries_.push_back(std::move(en));
    }
  }

  const std::vector<Entry>& entries() const { return entries_; }
  const Entry* find(const std::string& name) const {
    auto it = index_.find(name);
    return it == index_.end() ? nullptr : &entries_[it->second];
  }
  // Record data lies before the central directory.
  uint64_t data_limit() const { return cd_offset_; }
  uint64_t file_size() const { return file_size_; }

  // Where e's data starts, from its local header; throws if the header is not
  // there or the data would run past the central directory.
  uint64_t data_offset(const Entry& e, const ReadAt& read) const {
    using detail::le;
    if (e.local_offset > cd_offset_ || cd_offset_ - e.local_offset < 30) {
      throw Error(Error::kDamaged, "local header outside the file");
    }
    auto h = detail::read_exact(read, e.local_offset, 30, "local header");
    if (le(h.data(), 4) != 0x04034b50) throw Error(Error::kDamaged, "bad local header");
    const uint64_t start = e.local_offset + 30 + le(h.data() + 26, 2) + le(h.data() + 28, 2);
    if (start > cd_offset_ || e.comp_size > cd_offset_ - start) {
      throw Error(Error::kDamaged, "data runs past the end of the file");
    }
    return start;
  }

 private:
  uint64_t file_size_ = 0;
  uint64_t end_pos_ = 0;
  uint64_t cd_offset_ = 0;
  std::vector<Entry> entries_;
  std::unordered_map<std::string, size_t> index_;
};

}  // namespace fsdp_plan::zip
