#include "util/json_input.h"

#include <iterator>
#include <vector>

#include "util/errors.h"

namespace fsdp_plan {
namespace {

using json = nlohmann::json;

// A char iterator that tells how far the parser has read, so that a key's
// line can be named: nlohmann's SAX events carry no position.
struct CountingIterator {
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;
  const char* p = nullptr;
  const char** read_to = nullptr;  // shared by every copy the parser makes
  const char& operator*() const { return *p; }
  CountingIterator& operator++() {
    *read_to = ++p;
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const CountingIterator& o) const { return p == o.p; }
  bool operator!=(const CountingIterator& o) const { return p != o.p; }
};

// nlohmann's DOM builder again, with the checks it lacks: a key given twice
// in one object (nlohmann keeps the last silently, Python's json too, other
// readers the first), nesting depth, and the number of values (a value costs
// 16 bytes and more: 2 MB of "[]," would be 700,000 allocations).
class CheckedBuilder : public nlohmann::json_sax<json> {
 public:
  CheckedBuilder(const std::string& text, const std::string& file, const char** read_to)
      : text_(text), file_(file), read_to_(read_to) {}

  json result;

  bool null() override { return put(nullptr); }
  bool boolean(bool v) override { return put(v); }
  bool number_integer(number_integer_t v) override { return put(v); }
  bool number_unsigned(number_unsigned_t v) override { return put(v); }
  bool number_float(number_float_t v, const string_t&) override { return put(v); }
  bool string(string_t& v) override { return put(std::move(v)); }
  bool binary(binary_t& v) override { return put(json::binary(std::move(v))); }
  bool start_object(std::size_t) override { return open(json::object()); }
  bool start_array(std::size_t) override { return open(json::array()); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    json& obj = *stack_.back();
    if (obj.contains(k)) {
      size_t line = 1;
      for (const char* c = text_.data(); c < *read_to_; ++c) line += *c == '\n';
      throw InputError(file_, "invalid JSON: key \"" + k + "\" given twice in one object (line " +
                                  std::to_string(line) + "); JSON readers disagree on which one counts");
    }
    key_ = &obj[k];
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    // "[json.exception.parse_error.101] parse error at line 3, column 5: ...",
    // "[json.exception.out_of_range.406] number overflow parsing '1e400'": keep what follows the tag.
    std::string msg = e.what();
    auto tag_end = msg.find("] ");
    throw InputError(file_, "invalid JSON: " + (tag_end == std::string::npos ? msg : msg.substr(tag_end + 2)));
  }

 private:
  void count() {
    if (++values_ > kMaxJsonValues)
      throw InputError(file_, "invalid JSON: more than " + std::to_string(kMaxJsonValues) +
                                  " values, more than fsdp-plan reads in one file");
  }
  json* place(json&& v) {
    count();
    if (stack_.empty()) {
      result = std::move(v);
      return &result;
    }
    json& top = *stack_.back();
    if (top.is_array()) {
      top.push_back(std::move(v));
      return &top.back();
    }
    *key_ = std::move(v);
    return key_;
  }
  bool put(json&& v) {
    place(std::move(v));
    return true;
  }
  bool open(json&& v) {
    if (stack_.size() >= kMaxJsonDepth)
      throw InputError(file_, "invalid JSON: nested more than " + std::to_string(kMaxJsonDepth) +
                                  " deep, deeper than any file fsdp-plan reads");
    stack_.push_back(place(std::move(v)));
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  const std::string& text_;
  const std::string& file_;
  const char** read_to_;
  std::vector<json*> stack_;  // arrays and objects being filled; pointers stay valid (a child is
                              // complete before its parent grows again)
  json* key_ = nullptr;
  size_t values_ = 0;
};

}  // namespace

nlohmann::json parse_json(const std::string& text, const std::string& file) {
  const char* read_to = text.data();
  CheckedBuilder builder(text, file, &read_to);
  CountingIterator first{text.data(), &read_to}, last{text.data() + text.size(), &read_to};
  json::sax_parse(first, last, &builder);
  return std::move(builder.result);
}

std::string json_type_name(const nlohmann::json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number_float()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_null()) return "null";
  if (v.is_array()) return "a list";
  return "an object";
}

}  // namespace fsdp_plan
