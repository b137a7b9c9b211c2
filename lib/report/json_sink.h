// One way to write a JSON value, two places it goes: JsonValueSink builds an
// nlohmann::ordered_json (the plan the HTML report, the gate and the tests
// read), JsonTextSink writes the bytes that value's dump(1) would give,
// without building it. The plan's writer says each element once, to a
// JsonSink, so the two cannot drift. A plan of 100,000 units is 265 MB of
// JSON; one ordered_json per element, dumped and re-indented, was over half
// of `-f json`'s run time (malloc/free, basic_json's constructor and destroy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdp_plan {

namespace json_sink_detail {
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};
template <class T>
struct is_vector : std::false_type {};
template <class T, class A>
struct is_vector<std::vector<T, A>> : std::true_type {};
template <class>
inline constexpr bool always_false = false;

// JsonTextSink's room asked for beyond a line's indent: ",\n", and spaces
// written in words of 8 (up to 7 bytes past the indent, overwritten by what
// follows).
inline constexpr size_t kLine = 2 + 8;
inline char* indent(char* p, size_t depth) {
  for (size_t i = 0; i < depth; i += 8) std::memcpy(p + i, "        ", 8);
  return p + depth;
}
}  // namespace json_sink_detail

class JsonSink {
 public:
  virtual ~JsonSink() = default;

  // A container opens, takes keys (objects) or values, and closes with end().
  virtual void begin_object() = 0;
  virtual void begin_array() = 0;
  virtual void end() = 0;
  // The next value's key, inside an object.
  virtual void key(std::string_view k) = 0;

  virtual void null() = 0;
  virtual void boolean(bool b) = 0;
  virtual void integer(int64_t i) = 0;            // nlohmann's number_integer
  virtual void unsigned_integer(uint64_t u) = 0;  // nlohmann's number_unsigned
  virtual void number(double d) = 0;              // nlohmann's number_float
  virtual void string(std::string_view s) = 0;
  virtual void json(const nlohmann::ordered_json& v) = 0;  // a value made elsewhere (the policy)

  // x as nlohmann's constructor would store it: signed integers as
  // number_integer, unsigned as number_unsigned, floating point as double, an
  // empty optional as null, a vector as an array.
  template <class T>
  void value(const T& x) {
    using namespace json_sink_detail;
    if constexpr (std::is_same_v<T, bool>)
      boolean(x);
    else if constexpr (std::is_same_v<T, std::nullptr_t>)
      null();
    else if constexpr (std::is_integral_v<T> && std::is_signed_v<T>)
      integer(static_cast<int64_t>(x));
    else if constexpr (std::is_integral_v<T>)
      unsigned_integer(static_cast<uint64_t>(x));
    else if constexpr (std::is_floating_point_v<T>)
      number(static_cast<double>(x));
    else if constexpr (std::is_same_v<T, nlohmann::ordered_json>)
      json(x);
    else if constexpr (std::is_convertible_v<const T&, std::string_view>)
      string(x);
    else if constexpr (is_optional<T>::value) {
      if (x)
        value(*x);
      else
        null();
    } else if constexpr (is_vector<T>::value) {
      begin_array();
      for (const auto& e : x) value(e);
      end();
    } else {
      static_assert(always_false<T>, "no JSON form for this type");
    }
  }

  template <class T>
  void field(std::string_view k, const T& x) {
    key(k);
    value(x);
  }
  // An object (or array) whose members `body` writes.
  template <class F>
  void object(F&& body) {
    begin_object();
    body();
    end();
  }
  template <class F>
  void array(F&& body) {
    begin_array();
    body();
    end();
  }
  template <class F>
  void object_field(std::string_view k, F&& body) {
    key(k);
    object(std::forward<F>(body));
  }
  template <class F>
  void array_field(std::string_view k, F&& body) {
    key(k);
    array(std::forward<F>(body));
  }
};

// Builds the value: take() it after the last end().
class JsonValueSink final : public JsonSink {
 public:
  void begin_object() override;
  void begin_array() override;
  void end() override;
  void key(std::string_view k) override;
  void null() override;
  void boolean(bool b) override;
  void integer(int64_t i) override;
  void unsigned_integer(uint64_t u) override;
  void number(double d) override;
  void string(std::string_view s) override;
  void json(const nlohmann::ordered_json& v) override;

  nlohmann::ordered_json take() { return std::move(root_); }

 private:
  nlohmann::ordered_json* insert(nlohmann::ordered_json v);

  nlohmann::ordered_json root_;
  // The open containers, outermost first. Only the innermost grows, so
  // pointers into its ancestors stay valid.
  std::vector<nlohmann::ordered_json*> open_;
  std::string key_;
};

// Writes, in pieces of at most 64 KB to `out`, exactly what the value's
// dump(1) gives (nlohmann/detail/output/serializer.hpp: serializer::dump with
// indent_step 1, ensure_ascii false, error_handler_t::strict). flush() after
// the last end().
// Its own buffer, written through a pointer: a plan's comm and time sections
// are a million small keys and numbers, and std::string's out-of-line append
// for each was most of what they cost (bench/time_overhead.py).
class JsonTextSink final : public JsonSink {
 public:
  explicit JsonTextSink(std::function<void(std::string_view)> out);
  ~JsonTextSink() override;
  JsonTextSink(const JsonTextSink&) = delete;
  JsonTextSink& operator=(const JsonTextSink&) = delete;
  void begin_object() override;
  void begin_array() override;
  void end() override;
  void key(std::string_view k) override;
  void null() override;
  void boolean(bool b) override;
  void integer(int64_t i) override;
  void unsigned_integer(uint64_t u) override;
  void number(double d) override;
  void string(std::string_view s) override;
  void json(const nlohmann::ordered_json& v) override;
  void flush();

 private:
  struct Open {
    bool object;
    size_t members;
  };
  // One double's text, remembered: a plan repeats its figures (every layer's
  // collectives the same size), and the shortest form costs far more to find
  // than to copy.
  struct CachedNumber {
    uint64_t bits = 0;
    uint8_t size = 0;  // 0: empty
    char text[31] = {};
  };
  // At least n bytes free at the end of the buffer, flushing or growing for them.
  char* room(size_t n) { return capacity_ - used_ >= n ? buffer_.get() + used_ : make_room(n); }
  char* make_room(size_t n);
  void put(const char* s, size_t n);
  // A container's first member or the ",\n" before the next, indented; p: room for it.
  char* next_line(char* p) {
    Open& o = open_.back();
    if (o.members++) *p++ = ',';
    *p++ = '\n';
    return json_sink_detail::indent(p, open_.size());
  }
  // Room for a value of up to n bytes, after the line it starts in an array
  // (in an object, key() wrote it).
  char* value_room(size_t n) {
    char* p = room(open_.size() + json_sink_detail::kLine + n);
    if (!open_.empty() && !open_.back().object) p = next_line(p);
    return p;
  }
  void quoted(std::string_view s);

  static constexpr size_t kCapacity = size_t{1} << 16;
  std::function<void(std::string_view)> out_;
  std::unique_ptr<char[]> buffer_;
  size_t capacity_ = 0;
  size_t used_ = 0;
  std::vector<Open> open_;
  std::unique_ptr<CachedNumber[]> numbers_;
};

}  // namespace fsdp_plan
