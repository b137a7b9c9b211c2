#include "report/json_sink.h"

#include <array>
#include <charconv>
#include <cmath>
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

JsonTextSink::JsonTextSink(std::function<void(std::string_view)> out) : out_(std::move(out)) {
  buffer_.reserve(kSpill + 4096);
}

void JsonTextSink::flush() {
  if (!buffer_.empty()) out_(buffer_);
  buffer_.clear();
}

// serializer::dump writes "[\n" or "{\n" before the first member, ",\n"
// between members, each at the container's indent plus one; "\n", the
// container's indent and the closing bracket after the last; "[]" or "{}"
// when there is none. Here the newline waits for a first member.
void JsonTextSink::next_line() {
  Open& o = open_.back();
  buffer_.append(o.members++ ? ",\n" : "\n");
  buffer_.append(open_.size(), ' ');
}

void JsonTextSink::before_value() {
  if (!open_.empty() && !open_.back().object) next_line();  // in an object, key() did it
}

void JsonTextSink::begin_object() {
  before_value();
  buffer_.push_back('{');
  open_.push_back({true, 0});
}

void JsonTextSink::begin_array() {
  before_value();
  buffer_.push_back('[');
  open_.push_back({false, 0});
}

void JsonTextSink::end() {
  const Open o = open_.back();
  open_.pop_back();
  if (o.members) {
    buffer_.push_back('\n');
    buffer_.append(open_.size(), ' ');
  }
  buffer_.push_back(o.object ? '}' : ']');
  spill();
}

void JsonTextSink::key(std::string_view k) {
  next_line();
  quoted(k);
  buffer_.append(": ");
}

void JsonTextSink::null() {
  before_value();
  buffer_.append("null");
}

void JsonTextSink::boolean(bool b) {
  before_value();
  buffer_.append(b ? "true" : "false");
}

// serializer::dump_integer: the decimal digits, '-' before a negative one.
void JsonTextSink::integer(int64_t i) {
  before_value();
  std::array<char, 24> digits;
  const auto r = std::to_chars(digits.data(), digits.data() + digits.size(), i);
  buffer_.append(digits.data(), r.ptr);
}

void JsonTextSink::unsigned_integer(uint64_t u) {
  before_value();
  std::array<char, 24> digits;
  const auto r = std::to_chars(digits.data(), digits.data() + digits.size(), u);
  buffer_.append(digits.data(), r.ptr);
}

// serializer::dump_float: NaN and infinities as null; otherwise nlohmann's
// own shortest round-trip form (detail/conversions/to_chars.hpp: Grisu2,
// "1.0" for a whole number, "1e+20" past 15 digits, "-0.0"), the very
// function dump calls.
void JsonTextSink::number(double d) {
  before_value();
  if (!std::isfinite(d)) {
    buffer_.append("null");
    return;
  }
  std::array<char, 64> digits;  // serializer::number_buffer's size
  char* last = nlohmann::detail::to_chars(digits.data(), digits.data() + digits.size(), d);
  buffer_.append(digits.data(), last);
}

void JsonTextSink::string(std::string_view s) {
  before_value();
  quoted(s);
  spill();
}

// serializer::dump_escaped(s, ensure_ascii = false): \b \t \n \f \r \" \\,
// other bytes below 0x20 as \u00XX (lowercase hex), everything else as it is.
// A string with a byte of 0x80 or more goes to nlohmann itself: it checks the
// UTF-8 and throws type_error 316 on a bad byte, as dump() does.
void JsonTextSink::quoted(std::string_view s) {
  bool plain = true;
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (b >= 0x80) {
      buffer_.append(ojson(std::string(s)).dump());
      return;
    }
    if (b < 0x20 || b == '"' || b == '\\') plain = false;
  }
  buffer_.push_back('"');
  if (plain) {
    buffer_.append(s);
  } else {
    static const char hex[] = "0123456789abcdef";
    for (const char c : s) {
      switch (c) {
        case '\b': buffer_.append("\\b"); break;
        case '\t': buffer_.append("\\t"); break;
        case '\n': buffer_.append("\\n"); break;
        case '\f': buffer_.append("\\f"); break;
        case '\r': buffer_.append("\\r"); break;
        case '"': buffer_.append("\\\""); break;
        case '\\': buffer_.append("\\\\"); break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            const auto b = static_cast<unsigned char>(c);
            buffer_.append("\\u00");
            buffer_.push_back(hex[b >> 4]);
            buffer_.push_back(hex[b & 0xF]);
          } else {
            buffer_.push_back(c);
          }
      }
    }
  }
  buffer_.push_back('"');
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
