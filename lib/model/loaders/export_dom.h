// Reading models/model.json and the configs of a .pt2 through simdjson's DOM,
// with the rules nlohmann's reading had: a value of the wrong type is absent,
// an integer is one within int64, a known key given twice refuses the file.
// Shared by the walk over the program (export_walk.h) and the tree's reader.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <string_view>

#include <simdjson.h>

namespace fsdp_plan::pt2 {

namespace dom = simdjson::dom;

// A simdjson error, or a key given twice, thrown out of the walk: the
// message comes from nlohmann's reading of the same text where it too
// refuses it, as before simdjson read this record.
struct JsonFail {
  simdjson::error_code code;
  std::string what;
};

[[noreturn]] inline void twice(std::string_view key) {
  throw JsonFail{simdjson::SUCCESS, "key \"" + std::string(key) + "\" given twice in one object"};
}

// An integer within int64 (nlohmann's is_number_integer, unsigned above
// int64's range refused, as get_int in export_configs.cpp).
inline bool read_int(dom::element v, int64_t& out) {
  if (v.type() != dom::element_type::INT64) return false;
  return !v.get_int64().get(out);
}

// A float argument: a number, or the strings torch writes for the others
// (torch/_export/serde/serialize.py: _dataclass_to_dict, "Infinity",
// "-Infinity", "NaN": masked_fill(-inf) in attention masks).
inline bool read_double(dom::element v, double& out) {
  std::string_view s;
  if (v.is_string() && !v.get_string().get(s)) {
    if (s == "Infinity") out = std::numeric_limits<double>::infinity();
    else if (s == "-Infinity") out = -std::numeric_limits<double>::infinity();
    else if (s == "NaN") out = std::numeric_limits<double>::quiet_NaN();
    else return false;
    return true;
  }
  const auto t = v.type();
  if (t != dom::element_type::INT64 && t != dom::element_type::UINT64 && t != dom::element_type::DOUBLE) return false;
  return !v.get_double().get(out);
}

inline bool read_bool(dom::element v, bool& out) { return v.is_bool() && !v.get_bool().get(out); }

inline bool read_string(dom::element v, std::string_view& out) { return v.is_string() && !v.get_string().get(out); }

// Calls f(key, value) for each field of an object; a key of `known` given
// twice refuses the file (nlohmann kept the last silently, other readers the first).
template <typename F>
void for_fields(dom::element v, std::initializer_list<std::string_view> known, F&& f) {
  dom::object obj;
  if (v.get_object().get(obj)) return;
  uint64_t seen = 0;
  for (dom::key_value_pair field : obj) {
    int i = 0;
    for (std::string_view k : known) {
      if (k == field.key) {
        if (seen & (uint64_t{1} << i)) twice(field.key);
        seen |= uint64_t{1} << i;
        break;
      }
      ++i;
    }
    f(field.key, field.value);
  }
}

template <typename F>
void for_elements(dom::element v, F&& f) {
  dom::array arr;
  if (v.get_array().get(arr)) return;
  for (dom::element e : arr) f(e);
}

// Where a value sits, for a damage message: its text is made only when damage
// is recorded. Built eagerly ("node 1234: an argument", "tensor x's size")
// it cost a heap string or two per argument, output and dimension read (an
// estimate: some 100,000 for a 70B graph), for messages a sound file never gives.
class What {
 public:
  What(const char* text) : head_(text) {}  // a fixed text
  What(const char* head, size_t number, const char* tail) : head_(head), tail_(tail), number_(number), numbered_(true) {}
  What(const char* head, std::string_view name) : head_(head), name_(name) {}
  // This one with more words after it ("'s size").
  What with(const char* more) const {
    What w = *this;
    w.more_ = more;
    return w;
  }
  std::string str() const {
    std::string out = head_;
    if (numbered_) out += std::to_string(number_);
    out.append(name_.data(), name_.size());
    return out + tail_ + more_;
  }
  friend std::string operator+(const What& w, const char* s) { return w.str() + s; }

 private:
  const char* head_;
  const char* tail_ = "";
  const char* more_ = "";
  std::string_view name_;
  size_t number_ = 0;
  bool numbered_ = false;
};

}  // namespace fsdp_plan::pt2
