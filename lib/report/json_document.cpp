#include "report/json_document.h"

#include <algorithm>

namespace fsdp_plan {
namespace {

using ojson = nlohmann::ordered_json;
using Out = std::function<void(std::string_view)>;

bool starts_with(const std::vector<std::string>& path, const std::vector<std::string>& prefix) {
  return path.size() > prefix.size() && std::equal(prefix.begin(), prefix.end(), path.begin());
}

class Writer {
 public:
  Writer(const JsonDocument& doc, const Out& out) : doc_(doc), out_(out) {}

  void value(const ojson& v, std::vector<std::string>& at, size_t depth) {
    const bool holds_streamed = std::any_of(doc_.arrays.begin(), doc_.arrays.end(),
                                            [&](const StreamedArray& a) { return starts_with(a.path, at); });
    if (!v.is_object() || v.empty() || !holds_streamed) return dumped(v, depth);
    // nlohmann's pretty object: one "key": value per line, at depth + 1.
    out_("{\n");
    bool first = true;
    for (const auto& [key, child] : v.items()) {
      if (!first) out_(",\n");
      first = false;
      indent(depth + 1);
      out_(ojson(key).dump());
      out_(": ");
      at.push_back(key);
      const auto streamed = std::find_if(doc_.arrays.begin(), doc_.arrays.end(),
                                         [&](const StreamedArray& a) { return a.path == at; });
      if (streamed != doc_.arrays.end())
        array(*streamed, depth + 1);
      else
        value(child, at, depth + 1);
      at.pop_back();
    }
    out_("\n");
    indent(depth);
    out_("}");
  }

 private:
  void array(const StreamedArray& a, size_t depth) {
    if (a.size == 0) return out_("[]");
    out_("[\n");
    for (size_t i = 0; i < a.size; ++i) {
      if (i) out_(",\n");
      indent(depth + 1);
      dumped(a.element(i), depth + 1);
    }
    out_("\n");
    indent(depth);
    out_("]");
  }

  // v.dump(1) at `depth`: a JSON text has no raw newline inside a string, so
  // each newline starts a line that takes `depth` more spaces.
  void dumped(const ojson& v, size_t depth) {
    const std::string text = v.dump(1);
    size_t from = 0;
    for (size_t nl = text.find('\n'); nl != std::string::npos; nl = text.find('\n', from)) {
      out_(std::string_view(text).substr(from, nl + 1 - from));
      indent(depth);
      from = nl + 1;
    }
    out_(std::string_view(text).substr(from));
  }

  void indent(size_t depth) {
    static const std::string spaces(256, ' ');
    for (; depth > spaces.size(); depth -= spaces.size()) out_(spaces);
    out_(std::string_view(spaces).substr(0, depth));
  }

  const JsonDocument& doc_;
  const Out& out_;
};

}  // namespace

ojson JsonDocument::filled() const {
  ojson out = skeleton;
  for (const StreamedArray& a : arrays) {
    ojson* at = &out;
    for (const std::string& key : a.path) at = &(*at)[key];
    *at = ojson::array();
    for (size_t i = 0; i < a.size; ++i) at->push_back(a.element(i));
  }
  return out;
}

void JsonDocument::write(const Out& out) const {
  std::vector<std::string> at;
  Writer(*this, out).value(skeleton, at, 0);
}

}  // namespace fsdp_plan
