// A zip archive's directory and records, through libzip: names, sizes and
// CRC-32s from the central directory (ZIP64 included), and record bytes read
// only up to a size the caller accepts, inflated by zlib, checked against the
// directory. Torch-free: the TorchScript loader and the .pt2 loader use it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

struct zip;  // libzip's archive

namespace fsdp_plan::zip {

struct Entry {
  // Points into libzip's copy of the directory: valid while the Reader lives
  // (150,000 names copied and freed one by one cost more than planning).
  std::string_view name;
  uint16_t method = 0;  // 0 stored, 8 deflated
  uint32_t crc = 0;
  uint64_t comp_size = 0;
  uint64_t uncomp_size = 0;
  uint64_t index = 0;  // libzip's
};

// Why an archive or a record could not be read. kNoEnd: no end record at all
// (a cut-off file, typically); kDamaged: a directory or record that points at
// nonsense or whose bytes do not match it.
class Error : public std::runtime_error {
 public:
  enum Kind { kNoEnd, kDamaged };
  Error(Kind kind, const std::string& what) : std::runtime_error(what), kind(kind) {}
  Kind kind;
};

class Reader {
 public:
  // The file at path, or bytes in memory (kept by the caller while the
  // Reader lives). Throws Error if there is no readable central directory.
  static std::unique_ptr<Reader> open_file(const std::string& path);
  static std::unique_ptr<Reader> open_memory(const void* data, size_t size);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::vector<Entry>& entries() const { return entries_; }
  // The first entry of that name, or nullptr.
  const Entry* find(std::string_view name) const;
  uint64_t file_size() const;
  // The most bytes e can honestly hold: the file's size if stored, else what
  // deflate can expand its compressed bytes to (about 1032 times). A bigger
  // uncomp_size means a damaged or hostile archive.
  uint64_t max_honest_size(const Entry& e) const;
  // Bytes pulled from the file so far, central directory included.
  uint64_t bytes_read() const;

  // e's bytes. Throws Error(kDamaged) with a short reason ("CRC mismatch",
  // "sizes disagree", ...) unless they are exactly e.uncomp_size bytes that
  // e's compressed data gives (and match e.crc, with verify_crc). Callers
  // bound e.uncomp_size first: this allocates it.
  std::string read(const Entry& e, bool verify_crc = true);
  // e's bytes where they lie in the file or memory, valid while the Reader
  // lives, for a stored entry with at least `padding` bytes of the file after
  // it (a parser may read them); checked as read() checks them. Nothing for
  // any other entry, or one libzip cannot open: read() it (and say why).
  // A 9.4 MB models/model.json read() costs a zeroed copy and libzip's own
  // CRC pass of it, which read()'s check repeats.
  std::optional<std::string_view> view(const Entry& e, bool verify_crc, size_t padding);

  struct Source;  // where bytes come from: a file or memory

 private:
  explicit Reader(std::unique_ptr<Source> source);
  void read_entries();  // the directory, after the archive is open
  std::unique_ptr<Source> source_;
  struct Inflater;  // one zlib stream for every record: a TorchScript file can have 50,000 deflated ones
  std::unique_ptr<Inflater> inflater_;
  ::zip* archive_ = nullptr;
  std::vector<Entry> entries_;
  // Open addressing over entries_: slot = index + 1, 0 empty. No allocation
  // per entry, unlike a std::unordered_map.
  std::vector<uint32_t> slots_;
};

}  // namespace fsdp_plan::zip
