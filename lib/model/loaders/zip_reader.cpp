#include "model/loaders/zip_reader.h"

#include "model/loaders/crc32.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zip.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>

namespace fsdp_plan::zip {

// libzip reads through this callback source, so that one code path serves
// files and memory and we can count what is read.
struct Reader::Source {
  // The file is mapped, not read: libzip reads a big central directory entry
  // by entry, and 300,000 small reads cost more than the rest of a plan.
  // Only the pages libzip copies from are ever touched.
  void* mapping = nullptr;
  const unsigned char* data = nullptr;
  uint64_t size = 0;
  uint64_t pos = 0;
  uint64_t bytes_read = 0;
  uint64_t last_read = 0;  // where the last read began
  zip_error_t error;

  Source() { zip_error_init(&error); }
  ~Source() {
    if (mapping) ::munmap(mapping, size);
    zip_error_fini(&error);
  }

  int64_t read_at(uint64_t at, void* buf, uint64_t n) {
    if (at >= size) return 0;
    n = std::min(n, size - at);
    std::memcpy(buf, data + at, n);
    bytes_read += n;
    return static_cast<int64_t>(n);
  }

  static zip_int64_t callback(void* self, void* data, zip_uint64_t len, zip_source_cmd_t cmd) {
    auto& s = *static_cast<Source*>(self);
    switch (cmd) {
      case ZIP_SOURCE_OPEN: s.pos = 0; return 0;
      case ZIP_SOURCE_READ: {
        s.last_read = s.pos;
        const int64_t got = s.read_at(s.pos, data, len);
        if (got > 0) s.pos += static_cast<uint64_t>(got);
        return got;
      }
      case ZIP_SOURCE_CLOSE: return 0;
      case ZIP_SOURCE_STAT: {
        auto* st = static_cast<zip_stat_t*>(data);
        zip_stat_init(st);
        st->size = s.size;
        st->valid |= ZIP_STAT_SIZE;
        return sizeof(*st);
      }
      case ZIP_SOURCE_ERROR: return zip_error_to_data(&s.error, data, len);
      case ZIP_SOURCE_FREE: return 0;  // the Reader owns us
      case ZIP_SOURCE_SEEK: {
        const zip_int64_t to = zip_source_seek_compute_offset(s.pos, s.size, data, len, &s.error);
        if (to < 0) return -1;
        s.pos = static_cast<uint64_t>(to);
        return 0;
      }
      case ZIP_SOURCE_TELL: return static_cast<zip_int64_t>(s.pos);
      case ZIP_SOURCE_SUPPORTS: return ZIP_SOURCE_SUPPORTS_SEEKABLE;
      default: zip_error_set(&s.error, ZIP_ER_OPNOTSUPP, 0); return -1;
    }
  }
};

// zlib's inflate state and 32 KiB window, allocated once and reset per record.
struct Reader::Inflater {
  z_stream z{};
  bool ready = false;
  ~Inflater() {
    if (ready) inflateEnd(&z);
  }

  // Raw deflate into exactly `out`; false if the stream is damaged or gives
  // more or fewer bytes.
  bool inflate_exact(const std::string& in, std::string& out) {
    if (!ready) {
      if (inflateInit2(&z, -MAX_WBITS) != Z_OK) return false;
      ready = true;
    } else if (inflateReset(&z) != Z_OK) {
      return false;
    }
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    size_t in_left = in.size(), out_left = out.size();
    int rc = Z_OK;
    while (rc == Z_OK) {
      // uInt is 32 bits: feed big buffers in pieces.
      const uInt in_chunk = static_cast<uInt>(std::min<size_t>(in_left, 1u << 30));
      const uInt out_chunk = static_cast<uInt>(std::min<size_t>(out_left, 1u << 30));
      z.avail_in = in_chunk;
      z.avail_out = out_chunk;
      rc = inflate(&z, Z_NO_FLUSH);
      in_left -= in_chunk - z.avail_in;
      out_left -= out_chunk - z.avail_out;
      if (rc == Z_OK && in_chunk == z.avail_in && out_chunk == z.avail_out) rc = Z_BUF_ERROR;  // stuck
    }
    return rc == Z_STREAM_END && out_left == 0;
  }
};

Reader::Reader(std::unique_ptr<Source> source) : source_(std::move(source)), inflater_(std::make_unique<Inflater>()) {
  // libzip turns each entry's DOS time into a time_t with mktime(), and with
  // TZ unset glibc stats /etc/localtime on every call: 150,000 stats for
  // 150,000 entries. TZ=:/etc/localtime names the zone glibc already uses.
  ::setenv("TZ", ":/etc/localtime", 0);
  zip_error_t error;
  zip_error_init(&error);
  zip_source_t* src = zip_source_function_create(&Source::callback, source_.get(), &error);
  if (!src) {
    zip_error_fini(&error);
    throw Error(Error::kDamaged, "cannot read the zip");
  }
  archive_ = zip_open_from_source(src, ZIP_RDONLY, &error);
  if (!archive_) {
    const int code = zip_error_code_zip(&error);
    const std::string what = zip_error_strerror(&error);
    zip_source_free(src);
    zip_error_fini(&error);
    // No end record found, or one that points outside the file: a cut-off file.
    if (code == ZIP_ER_NOZIP || code == ZIP_ER_INCONS) throw Error(Error::kNoEnd, what);
    throw Error(Error::kDamaged, what);
  }
  zip_error_fini(&error);
  // A throw below skips the destructor: the archive must be discarded here.
  try {
    read_entries();
  } catch (...) {
    zip_discard(archive_);
    archive_ = nullptr;
    throw;
  }
}

void Reader::read_entries() {
  const zip_int64_t n = zip_get_num_entries(archive_, 0);
  entries_.reserve(static_cast<size_t>(std::max<zip_int64_t>(n, 0)));
  for (zip_int64_t i = 0; i < n; ++i) {
    zip_stat_t st;
    if (zip_stat_index(archive_, static_cast<zip_uint64_t>(i), ZIP_FL_ENC_RAW, &st) != 0) {
      throw Error(Error::kDamaged, zip_strerror(archive_));
    }
    Entry e;
    e.name = st.name ? std::string_view(st.name) : std::string_view();
    e.method = static_cast<uint16_t>(st.comp_method);
    e.crc = st.crc;
    e.comp_size = st.comp_size;
    e.uncomp_size = st.size;
    e.index = static_cast<uint64_t>(i);
    if ((st.valid & ZIP_STAT_ENCRYPTION_METHOD) && st.encryption_method != ZIP_EM_NONE) {
      throw Error(Error::kDamaged, "record " + std::string(e.name) + " is encrypted");
    }
    entries_.push_back(e);
  }
  if (entries_.size() >= 0x7fffffffu) throw Error(Error::kDamaged, "too many records");
  size_t cap = 16;
  while (cap < 2 * entries_.size()) cap *= 2;
  slots_.assign(cap, 0);
  for (size_t i = 0; i < entries_.size(); ++i) {
    for (size_t at = std::hash<std::string_view>()(entries_[i].name) & (cap - 1);; at = (at + 1) & (cap - 1)) {
      if (slots_[at] == 0) {
        slots_[at] = static_cast<uint32_t>(i + 1);
        break;
      }
      if (entries_[slots_[at] - 1].name == entries_[i].name) break;  // first wins
    }
  }
}

Reader::~Reader() {
  if (archive_) zip_discard(archive_);
}

std::unique_ptr<Reader> Reader::open_file(const std::string& path) {
  auto s = std::make_unique<Source>();
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Error(Error::kDamaged, std::string("cannot open: ") + std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(Error::kDamaged, std::string("cannot stat: ") + std::strerror(err));
  }
  s->size = static_cast<uint64_t>(st.st_size);
  if (s->size > 0) {
    s->mapping = ::mmap(nullptr, s->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (s->mapping == MAP_FAILED) {
      s->mapping = nullptr;
      const int err = errno;
      ::close(fd);
      throw Error(Error::kDamaged, std::string("cannot map: ") + std::strerror(err));
    }
    s->data = static_cast<const unsigned char*>(s->mapping);
  }
  ::close(fd);
  return std::unique_ptr<Reader>(new Reader(std::move(s)));
}

std::unique_ptr<Reader> Reader::open_memory(const void* data, size_t size) {
  auto s = std::make_unique<Source>();
  s->data = static_cast<const unsigned char*>(data);
  s->size = size;
  return std::unique_ptr<Reader>(new Reader(std::move(s)));
}

const Entry* Reader::find(std::string_view name) const {
  if (slots_.empty()) return nullptr;
  const size_t mask = slots_.size() - 1;
  for (size_t at = std::hash<std::string_view>()(name) & mask; slots_[at] != 0; at = (at + 1) & mask) {
    const Entry& e = entries_[slots_[at] - 1];
    if (e.name == name) return &e;
  }
  return nullptr;
}

uint64_t Reader::file_size() const { return source_->size; }
uint64_t Reader::bytes_read() const { return source_->bytes_read; }

uint64_t Reader::max_honest_size(const Entry& e) const {
  constexpr uint64_t kMaxDeflateRatio = 1032;
  return e.method == 0 ? file_size() : e.comp_size * kMaxDeflateRatio + 64;
}

std::optional<std::string_view> Reader::view(const Entry& e, bool verify_crc, size_t padding) {
  const uint64_t size = source_->size;
  if (e.method != 0 || e.comp_size != e.uncomp_size || e.comp_size == 0 || e.comp_size > size) return std::nullopt;
  zip_file_t* f = zip_fopen_index(archive_, e.index, ZIP_FL_COMPRESSED);
  if (!f) return std::nullopt;
  // libzip has read and checked the local header: the first data byte it
  // reads says where the record begins.
  unsigned char first = 0;
  source_->last_read = size;
  const zip_int64_t n = zip_fread(f, &first, 1);
  zip_fclose(f);
  const uint64_t at = source_->last_read;
  if (n != 1 || at >= size || size - at < e.comp_size || size - at - e.comp_size < padding ||
      source_->data[at] != first) {
    return std::nullopt;
  }
  source_->bytes_read += e.comp_size - 1;  // as read() would have copied them
  const std::string_view out(reinterpret_cast<const char*>(source_->data + at), static_cast<size_t>(e.comp_size));
  if (verify_crc && zip::crc32(0, out.data(), out.size()) != e.crc) throw Error(Error::kDamaged, "CRC mismatch");
  return out;
}

std::string Reader::read(const Entry& e, bool verify_crc) {
  if (e.method != 0 && e.method != 8) {
    throw Error(Error::kDamaged, "zip compression method " + std::to_string(e.method) +
                                     ", which PyTorch never writes");
  }
  if (e.method == 0 && e.comp_size != e.uncomp_size) throw Error(Error::kDamaged, "sizes disagree");
  if (e.comp_size > source_->size) throw Error(Error::kDamaged, "data runs past the end of the file");
  zip_file_t* f = zip_fopen_index(archive_, e.index, ZIP_FL_COMPRESSED);
  if (!f) throw Error(Error::kDamaged, zip_strerror(archive_));
  std::string raw(static_cast<size_t>(e.comp_size), '\0');
  uint64_t got = 0;
  while (got < raw.size()) {
    const zip_int64_t n = zip_fread(f, raw.data() + got, raw.size() - got);
    if (n <= 0) break;
    got += static_cast<uint64_t>(n);
  }
  zip_fclose(f);
  if (got != raw.size()) throw Error(Error::kDamaged, "cannot read it");
  std::string out;
  if (e.method == 0) {
    out = std::move(raw);
  } else {
    out.assign(static_cast<size_t>(e.uncomp_size), '\0');
    if (!inflater_->inflate_exact(raw, out)) throw Error(Error::kDamaged, "cannot decompress it");
  }
  if (verify_crc) {
    if (zip::crc32(0, out.data(), out.size()) != e.crc) throw Error(Error::kDamaged, "CRC mismatch");
  }
  return out;
}

}  // namespace fsdp_plan::zip
