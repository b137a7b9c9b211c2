#include "report/json_sink.h"

#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace fsdp_plan {
namespace {
using ojson = nlohmann::ordered_json;
}  // namespace

// ---- JsonValueSink ----

ojson* JsonValueSink::insert(ojson v) {
  if (open_.empty()) {
    root_ = std::move(v);
    return &root_;
  }
  ojson& top = *open_.back();
  if (top.is_array()) {
    top.push_back(std::move(v));
    return &top.back();
  }
  ojson& slot = top[key_];
  slot = std::move(v);
  return &slot;
}

void JsonValueSink::begin_object() { open_.push_back(insert(ojson::object())); }
void JsonValueSink::begin_array() { open_.push_back(insert(ojson::array())); }
void JsonValueSink::end() { open_.pop_back(); }
void JsonValueSink::key(std::string_view k) { key_.assign(k); }
void JsonValueSink::null() { insert(nullptr); }
void JsonValueSink::boolean(bool b) { insert(b); }
void JsonValueSink::integer(int64_t i) { insert(i); }
void JsonValueSink::unsigned_integer(uint64_t u) { insert(u); }
void JsonValueSink::number(double d) { insert(d); }
void JsonValueSink::string(std::string_view s) { insert(std::string(s)); }
void JsonValueSink::json(const ojson& v) { insert(v); }

// ---- JsonTextSink: serializer::dump(val, pretty_print = true, ensure_ascii = false, indent_step = 1) ----

namespace {

constexpr size_t kNumberCache = 256;  // entries; a power of 2

// Whether a byte is one dump_escaped would change or check: below 0x20,
// '"', '\\', 0x80 and up.
bool special(char c) {
  const auto b = static_cast<unsigned char>(c);
  return b < 0x20 || b == '"' || b == '\\' || b >= 0x80;
}

// The same for 4 or 8 bytes at once: nonzero if any is (the "has a zero
// byte" and "has a byte less than" tests of Bit Twiddling Hacks, exact as
// yes-or-no; a word with a byte of 0x80 or more is special whatever they say).
template <class Word>
Word special_word(Word w) {
  constexpr Word ones = static_cast<Word>(0x0101010101010101u), highs = static_cast<Word>(0x8080808080808080u);
  const Word q = w ^ (ones * '"'), b = w ^ (ones * '\\');
  return (((w - ones * 0x20) & ~w) | ((q - ones) & ~q) | ((b - ones) & ~b) | w) & highs;
}

// Copies the `Word`s at src + at and src + n - sizeof(Word) (n >= sizeof(Word)),
// and says whether either has a special byte.
template <class Word>
Word copy_word(char* dst, const char* src, size_t at) {
  Word w;
  std::memcpy(&w, src + at, sizeof w);
  std::memcpy(dst + at, &w, sizeof w);
  return special_word(w);
}

// Copies n bytes to `dst` (room for them there), and says whether none is
// special: then they are their own JSON string's content. Keys and strings
// are short: words of 8 (or 4), the last one overlapping, no call to memcpy.
#if defined(__GNUC__) || defined(__clang__)
__attribute__((always_inline))  // in key() and string(): a call was a third of its cost
#endif
inline bool copy_plain(char* dst, const char* src, size_t n) {
  if (n >= 8) {
    uint64_t any = 0;
    for (size_t i = 0; i + 8 < n; i += 8) any |= copy_word<uint64_t>(dst, src, i);
    return (any | copy_word<uint64_t>(dst, src, n - 8)) == 0;
  }
  if (n >= 4) return (copy_word<uint32_t>(dst, src, 0) | copy_word<uint32_t>(dst, src, n - 4)) == 0;
  bool any = false;
  for (size_t i = 0; i < n; ++i) {
    dst[i] = src[i];
    any = any || special(src[i]);
  }
  return !any;
}

}  // namespace

JsonTextSink::JsonTextSink(std::function<void(std::string_view)> out)
    : out_(std::move(out)),
      buffer_(new char[kCapacity]),
      capacity_(kCapacity),
      numbers_(new CachedNumber[kNumberCache]) {}

JsonTextSink::~JsonTextSink() = default;

void JsonTextSink::flush() {
  if (used_ == 0) return;
  const size_t n = used_;
  used_ = 0;
  out_(std::string_view(buffer_.get(), n));
}

char* JsonTextSink::make_room(size_t n) {
  flush();
  if (capacity_ < n) {  // one string longer than the buffer
    buffer_.reset(new char[n]);
    capacity_ = n;
  }
  return buffer_.get();
}

void JsonTextSink::put(const char* s, size_t n) {
  std::memcpy(room(n), s, n);
  used_ += n;
}

// serializer::dump writes "[\n" or "{\n" before the first member, ",\n"
// between members, each at the container's indent plus one; "\n", the
// container's indent and the closing bracket after the last; "[]" or "{}"
// when there is none. Here the newline waits for a first member
// (next_line, in the header).

void JsonTextSink::begin_object() {
  char* p = value_room(1);
  *p++ = '{';
  used_ = static_cast<size_t>(p - buffer_.get());
  open_.push_back({true, 0});
}

void JsonTextSink::begin_array() {
  char* p = value_room(1);
  *p++ = '[';
  used_ = static_cast<size_t>(p - buffer_.get());
  open_.push_back({false, 0});
}

void JsonTextSink::end() {
  const Open o = open_.back();
  open_.pop_back();
  char* p = room(open_.size() + json_sink_detail::kLine);
  if (o.members) {
    *p++ = '\n';
    p = json_sink_detail::indent(p, open_.size());
  }
  *p++ = o.object ? '}' : ']';
  used_ = static_cast<size_t>(p - buffer_.get());
}

void JsonTextSink::key(std::string_view k) {
  char* p = next_line(room(open_.size() + json_sink_detail::kLine + k.size() + 4));
  *p = '"';
  if (!copy_plain(p + 1, k.data(), k.size())) {
    used_ = static_cast<size_t>(p - buffer_.get());
    quoted(k);
    put(": ", 2);
    return;
  }
  p += 1 + k.size();
  std::memcpy(p, "\": ", 3);
  used_ = static_cast<size_t>(p + 3 - buffer_.get());
}

void JsonTextSink::null() {
  char* p = value_room(4);
  std::memcpy(p, "null", 4);
  used_ = static_cast<size_t>(p + 4 - buffer_.get());
}

void JsonTextSink::boolean(bool b) {
  char* p = value_room(5);
  std::memcpy(p, b ? "true" : "false", b ? 4 : 5);
  used_ = static_cast<size_t>(p + (b ? 4 : 5) - buffer_.get());
}

// serializer::dump_integer: the decimal digits, '-' before a negative one.
void JsonTextSink::integer(int64_t i) {
  char* p = value_room(24);
  used_ = static_cast<size_t>(std::to_chars(p, p + 24, i).ptr - buffer_.get());
}

void JsonTextSink::unsigned_integer(uint64_t u) {
  char* p = value_room(24);
  used_ = static_cast<size_t>(std::to_chars(p, p + 24, u).ptr - buffer_.get());
}

// serializer::dump_float: NaN and infinities as null; otherwise nlohmann's
// own shortest round-trip form (detail/conversions/to_chars.hpp: Grisu2,
// "1.0" for a whole number, "1e+20" past 15 digits, "-0.0"), the very
// function dump calls, once per distinct value in the cache's reach.
void JsonTextSink::number(double d) {
  char* p = value_room(sizeof(CachedNumber::text));
  if (!std::isfinite(d)) {
    std::memcpy(p, "null", 4);
    used_ = static_cast<size_t>(p + 4 - buffer_.get());
    return;
  }
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof bits);
  CachedNumber& c = numbers_[(bits * 0x9E3779B97F4A7C15u) >> 56];  // Fibonacci hashing to 256 slots
  static_assert(kNumberCache == 256, "the hash's shift");
  if (c.size == 0 || c.bits != bits) {
    // At most 24 characters ("-1.7976931348623157e+308"); the text has room for 31.
    char* last = nlohmann::detail::to_chars(c.text, c.text + sizeof c.text, d);
    c.bits = bits;
    c.size = static_cast<uint8_t>(last - c.text);
  }
  std::memcpy(p, c.text, sizeof c.text);
  used_ = static_cast<size_t>(p + c.size - buffer_.get());
}

void JsonTextSink::string(std::string_view s) {
  char* p = value_room(s.size() + 2);
  *p = '"';
  if (!copy_plain(p + 1, s.data(), s.size())) {
    used_ = static_cast<size_t>(p - buffer_.get());
    quoted(s);
    return;
  }
  p += 1 + s.size();
  *p++ = '"';
  used_ = static_cast<size_t>(p - buffer_.get());
}

// serializer::dump_escaped(s, ensure_ascii = false): \b \t \n \f \r \" \\,
// other bytes below 0x20 as \u00XX (lowercase hex), everything else as it is.
// A string with a byte of 0x80 or more goes to nlohmann itself: it checks the
// UTF-8 and throws type_error 316 on a bad byte, as dump() does.
void JsonTextSink::quoted(std::string_view s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      const std::string text = ojson(std::string(s)).dump();
      put(text.data(), text.size());
      return;
    }
  }
  // Each byte 6 at most ("\u001f"), and the quotes.
  char* p = room(6 * s.size() + 2);
  static const char hex[] = "0123456789abcdef";
  *p++ = '"';
  for (const char c : s) {
    const char* esc = nullptr;
    switch (c) {
      case '\b': esc = "\\b"; break;
      case '\t': esc = "\\t"; break;
      case '\n': esc = "\\n"; break;
      case '\f': esc = "\\f"; break;
      case '\r': esc = "\\r"; break;
      case '"': esc = "\\\""; break;
      case '\\': esc = "\\\\"; break;
      default: break;
    }
    const auto b = static_cast<unsigned char>(c);
    if (esc) {
      *p++ = esc[0];
      *p++ = esc[1];
    } else if (b < 0x20) {
      std::memcpy(p, "\\u00", 4);
      p[4] = hex[b >> 4];
      p[5] = hex[b & 0xF];
      p += 6;
    } else {
      *p++ = c;
    }
  }
  *p++ = '"';
  used_ = static_cast<size_t>(p - buffer_.get());
}

// A value made elsewhere, walked member by member so that it takes this
// writer's indent (serializer::dump's switch on m_type).
void JsonTextSink::json(const ojson& v) {
  switch (v.type()) {
    case ojson::value_t::object:
      begin_object();
      for (auto it = v.begin(); it != v.end(); ++it) {
        key(it.key());
        json(it.value());
      }
      end();
      return;
    case ojson::value_t::array:
      begin_array();
      for (const ojson& e : v) json(e);
      end();
      return;
    case ojson::value_t::string: return string(v.get_ref<const std::string&>());
    case ojson::value_t::boolean: return boolean(v.get<bool>());
    case ojson::value_t::number_integer: return integer(v.get<int64_t>());
    case ojson::value_t::number_unsigned: return unsigned_integer(v.get<uint64_t>());
    case ojson::value_t::number_float: return number(v.get<double>());
    case ojson::value_t::null: return null();
    case ojson::value_t::binary:
    case ojson::value_t::discarded: break;
  }
  // A plan holds neither (binary comes only from CBOR/MessagePack input).
  throw std::logic_error("JsonTextSink: a binary or discarded JSON value");
}

}  // namespace fsdp_plan
