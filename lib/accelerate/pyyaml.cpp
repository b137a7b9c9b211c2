#include "accelerate/pyyaml.h"

#include <yaml.h>

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "accelerate/pyyaml_resolver.h"
#include "model/loaders/printable.h"
#include "util/errors.h"

namespace fsdp_plan {
namespace {

// libyaml's event parser (the C library PyYAML's pure-Python scanner and
// parser are a port of, and its CSafeLoader uses): no recursion, and its
// errors name PyYAML's lines and columns. On top of it, what PyYAML's
// Reader, Composer and SafeConstructor check (yaml/reader.py, composer.py,
// constructor.py), and our own bounds (docs/limits.md).

// Nesting: an Accelerate config is 3 deep; PyYAML itself stops near 450
// (RecursionError in compose_node).
constexpr size_t kMaxYamlDepth = 64;
// Values once aliases are expanded (we copy an aliased node, PyYAML shares
// it): an Accelerate config holds about 40. Six levels of nested anchors in
// 473 bytes are 1.5 million.
constexpr size_t kMaxYamlValues = 100000;
// Scalar bytes once aliases are expanded, and one scalar: no Accelerate value
// comes near (a list of classes is well under 1 KiB).
constexpr size_t kMaxYamlText = size_t{16} << 20;
constexpr size_t kMaxYamlScalar = size_t{64} << 10;

std::string mark_text(const yaml_mark_t& m) {
  return "line " + std::to_string(m.line + 1) + ", column " + std::to_string(m.column + 1);
}

class YamlReader {
 public:
  explicit YamlReader(const std::string& file) : file_(file) {}

  PyValue read(const std::string& text) {
    check_text(text);
    check_tabs(text);
    parse(text);
    return std::move(root_);
  }

 private:
  // PyYAML's exception, as the traceback of `accelerate launch` ends.
  [[noreturn]] void error(const char* python_class, const std::string& what) const {
    throw InputError(file_, std::string("not valid YAML, so accelerate launch would stop: ") + python_class + ": " +
                                what);
  }
  [[noreturn]] void limit(const std::string& what) const {
    throw InputError(file_, "not an Accelerate config: " + what);
  }

  // Python decodes the file as UTF-8, then PyYAML's Reader refuses control
  // characters: its NON_PRINTABLE class, position in characters.
  void check_text(const std::string& text) const {
    size_t chars = 0;
    for (size_t i = 0; i < text.size(); ++chars) {
      const auto c = static_cast<unsigned char>(text[i]);
      uint32_t cp = c;
      size_t len = 1;
      unsigned char lo = 0x80, hi = 0xBF;  // the first continuation byte's range
      if (c >= 0x80) {
        if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1Fu;
        else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0Fu, lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
        else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07u, lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
        else decode_error(c, i, "invalid start byte");
        for (size_t k = 1; k < len; ++k) {
          if (i + k >= text.size()) decode_error(c, i, "unexpected end of data");
          const auto b = static_cast<unsigned char>(text[i + k]);
          if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) decode_error(c, i, "invalid continuation byte");
          cp = cp << 6 | (b & 0x3Fu);
        }
      }
      const bool printable = cp == 0x09 || cp == 0x0A || cp == 0x0D || (cp >= 0x20 && cp <= 0x7E) || cp == 0x85 ||
                             (cp >= 0xA0 && cp <= 0xD7FF) || (cp >= 0xE000 && cp <= 0xFFFD) || cp >= 0x10000;
      if (!printable) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "unacceptable character #x%04x: special characters are not allowed (position %zu)",
                      cp, chars);
        error("yaml.reader.ReaderError", buf);
      }
      i += len;
    }
  }

  [[noreturn]] void decode_error(unsigned char c, size_t at, const char* why) const {
    char buf[128];
    std::snprintf(buf, sizeof buf, "'utf-8' codec can't decode byte 0x%02x in position %zu: %s", c, at, why);
    throw InputError(file_, std::string("not UTF-8 text, so accelerate launch would stop: UnicodeDecodeError: ") + buf);
  }

  // PyYAML never skips a tab between tokens (Scanner.scan_to_next_token eats
  // spaces only) and ends a plain scalar at one, where libyaml takes tabs as
  // separators: a tab outside a quoted or block scalar or a comment is
  // "found character '\t' that cannot start any token".
  void check_tabs(const std::string& text) const {
    if (text.find('\t') == std::string::npos) return;
    struct Span {
      yaml_mark_t start, end;
      bool tabs_ok;
    };
    std::vector<Span> spans;
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_string(&p, reinterpret_cast<const unsigned char*>(text.data()), text.size());
    yaml_mark_t stop{};
    bool failed = false;
    while (true) {
      yaml_token_t t;
      if (!yaml_parser_scan(&p, &t)) {
        failed = true;
        stop = p.problem_mark;
        break;
      }
      const bool end = t.type == YAML_STREAM_END_TOKEN;
      if (!end && (t.start_mark.line != t.end_mark.line || t.start_mark.column != t.end_mark.column))
        spans.push_back({t.start_mark, t.end_mark,
                         t.type == YAML_SCALAR_TOKEN && t.data.scalar.style != YAML_PLAIN_SCALAR_STYLE});
      yaml_token_delete(&t);
      if (end) break;
    }
    yaml_parser_delete(&p);
    auto before = [](size_t l1, size_t c1, const yaml_mark_t& m) { return l1 < m.line || (l1 == m.line && c1 < m.column); };
    size_t line = 0, col = 0, s = 0;
    bool comment = false;
    // A byte order mark at the start is not a column to libyaml (nor to PyYAML).
    size_t first = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
    for (size_t i = first; i < text.size();) {
      if (failed && !before(line, col, stop)) return;  // the scanner's own error comes first
      while (s < spans.size() && !before(line, col, spans[s].end)) ++s;
      const bool inside = s < spans.size() && !before(line, col, spans[s].start);
      const char c = text[i];
      if (c == '\t' && !comment && !(inside && spans[s].tabs_ok)) {
        yaml_mark_t m{};
        m.line = line;
        m.column = col;
        error("yaml.scanner.ScannerError", "while scanning for the next token: found character '\\t' that cannot "
                                           "start any token (" + mark_text(m) + ")");
      }
      if (c == '#' && !inside) comment = true;
      // Line breaks as YAML 1.1 counts them (libyaml and PyYAML alike): \n, \r\n, \r, NEL, LS, PS.
      size_t other_break = 0;
      if (text.compare(i, 2, "\xC2\x85") == 0)
        other_break = 2;
      else if (text.compare(i, 3, "\xE2\x80\xA8") == 0 || text.compare(i, 3, "\xE2\x80\xA9") == 0)
        other_break = 3;
      if (c == '\n' || c == '\r' || other_break) {
        i += other_break ? other_break : c == '\r' && i + 1 < text.size() && text[i + 1] == '\n' ? 2 : 1;
        ++line;
        col = 0;
        comment = false;
        continue;
      }
      i += 1;
      while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) ++i;  // one column per character
      ++col;
    }
  }

  // A node being filled: a sequence or a mapping.
  struct Frame {
    PyValue value;
    std::string anchor;
    yaml_mark_t start{};
    size_t values = 1, bytes = 0;  // what an alias to it copies
    bool has_key = false;          // mappings: a key waits for its value
    std::string key;
    bool merge_key = false;
    yaml_mark_t key_mark{};
    std::vector<std::pair<PyValue, yaml_mark_t>> merges;  // values of << keys
  };

  struct Anchored {
    PyValue value;
    size_t values = 0, bytes = 0;
    yaml_mark_t mark{};
  };

  // ConstructorError: PyYAML composes the whole document first, so these
  // come after every parse and composition error; the first one is kept.
  void construct_error(const std::string& what) {
    if (deferred_.empty()) deferred_ = what;
  }

  void count(size_t values, size_t bytes, const yaml_mark_t& m) {
    values_ += values;
    bytes_ += bytes;
    if (values_ > kMaxYamlValues)
      limit("more than " + std::to_string(kMaxYamlValues) + " values once its aliases are expanded (" + mark_text(m) +
            "); an Accelerate config holds about 40");
    if (bytes_ > kMaxYamlText)
      limit("more than " + std::to_string(kMaxYamlText >> 20) + " MiB of text once its aliases are expanded (" +
            mark_text(m) + ")");
  }

  void define_anchor(const unsigned char* anchor, const yaml_mark_t& m) {
    if (!anchor) return;
    const std::string name(reinterpret_cast<const char*>(anchor));
    if (auto it = anchors_.find(name); it != anchors_.end())
      error("yaml.composer.ComposerError", "found duplicate anchor '" + name + "'; first occurrence (" +
                                               mark_text(it->second.mark) + "), second occurrence (" + mark_text(m) + ")");
    for (const Frame& f : stack_)
      if (f.anchor == name)
        error("yaml.composer.ComposerError", "found duplicate anchor '" + name + "'; first occurrence (" +
                                                 mark_text(f.start) + "), second occurrence (" + mark_text(m) + ")");
  }

  bool known_tag(const unsigned char* tag, bool collection) const {
    if (!tag) return true;
    const std::string t(reinterpret_cast<const char*>(tag));
    const std::string std_prefix = "tag:yaml.org,2002:";
    if (t == "!") return true;
    if (t.rfind(std_prefix, 0) != 0) return false;
    const std::string name = t.substr(std_prefix.size());
    // SafeConstructor's constructors (and merge, which flatten_mapping takes).
    if (collection) return is_one_of(name, {"seq", "map", "omap", "pairs", "set"});
    return is_one_of(name, {"null", "bool", "int", "float", "binary", "timestamp", "str", "merge", "value"});
  }

  void check_tag(const unsigned char* tag, bool collection, const yaml_mark_t& m) {
    if (!known_tag(tag, collection))
      construct_error("could not determine a constructor for the tag '" + std::string(reinterpret_cast<const char*>(tag)) +
                      "' (" + mark_text(m) + ")");
  }

  // A complete value (scalar, alias copy or finished collection) goes to its parent.
  void attach(PyValue v, const yaml_mark_t& start, bool merge_key = false) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return;
    }
    Frame& f = stack_.back();
    if (f.value.kind == PyValue::List) {
      f.value.items.push_back(std::move(v));
      return;
    }
    if (!f.has_key) {
      if (v.kind == PyValue::List || v.kind == PyValue::Dict)
        construct_error("while constructing a mapping (" + mark_text(f.start) + "): found unhashable key (" +
                        mark_text(start) + ")");
      f.has_key = true;
      f.key = v.text;
      f.merge_key = merge_key;
      f.key_mark = start;
      return;
    }
    f.has_key = false;
    if (f.merge_key) {
      f.merges.emplace_back(std::move(v), start);
      return;
    }
    put(f.value, std::move(f.key), std::move(v));
  }

  // d[key] = value: a key seen before keeps its place and takes the new value.
  static void put(PyValue& d, std::string key, PyValue v) {
    for (auto& [k, old] : d.entries)
      if (k == key) {
        old = std::move(v);
        return;
      }
    d.entries.emplace_back(std::move(key), std::move(v));
  }

  // SafeConstructor.flatten_mapping of PyYAML 6.0.4: the merged mappings'
  // keys first, in order (in a list of mappings the later one wins, unlike
  // the YAML 1.1 merge spec and older PyYAML), then the node's own keys.
  void merge(Frame& f) {
    if (f.merges.empty()) return;
    PyValue out;
    out.kind = PyValue::Dict;
    for (auto& [m, mark] : f.merges) {
      if (m.kind == PyValue::Dict) {
        for (auto& [k, v] : m.entries) put(out, k, v);
      } else if (m.kind == PyValue::List) {
        for (auto it = m.items.begin(); it != m.items.end(); ++it) {
          if (it->kind != PyValue::Dict) {
            yaml_mark_t at{};
            at.line = it->line;
            at.column = it->column;
            construct_error("while constructing a mapping (" + mark_text(f.start) +
                            "): expected a mapping for merging, but found " +
                            (it->kind == PyValue::List ? "sequence" : "scalar") + " (" + mark_text(at) + ")");
            continue;
          }
          for (auto& [k, v] : it->entries) put(out, k, v);
        }
      } else {
        construct_error("while constructing a mapping (" + mark_text(f.start) +
                        "): expected a mapping or list of mappings for merging, but found scalar (" + mark_text(mark) + ")");
      }
    }
    for (auto& [k, v] : f.value.entries) put(out, std::move(k), std::move(v));
    f.value.entries = std::move(out.entries);
  }

  [[noreturn]] void parse_error(const yaml_parser_t& p) const {
    const char* cls = p.error == YAML_SCANNER_ERROR ? "yaml.scanner.ScannerError"
                      : p.error == YAML_PARSER_ERROR ? "yaml.parser.ParserError"
                      : p.error == YAML_READER_ERROR ? "yaml.reader.ReaderError"
                                                     : "yaml.YAMLError";
    std::string what;
    if (p.context) what = std::string(p.context) + " (" + mark_text(p.context_mark) + "): ";
    what += std::string(p.problem ? p.problem : "unknown error");
    yaml_mark_t at = p.problem_mark;
    // PyYAML marks the character after the backslash, and names it.
    if (p.problem && std::string(p.problem) == "found unknown escape character" && at.index + 1 < text_->size()) {
      ++at.column;
      what += " '" + quoted_input(text_->substr(at.index + 1, 1)) + "'";
    }
    if (p.error == YAML_READER_ERROR)
      what += " (position " + std::to_string(p.problem_offset) + ")";
    else
      what += " (" + mark_text(at) + ")";
    error(cls, what);
  }

  void parse(const std::string& text) {
    text_ = &text;
    yaml_parser_t p;
    yaml_parser_initialize(&p);
    yaml_parser_set_input_string(&p, reinterpret_cast<const unsigned char*>(text.data()), text.size());
    struct Closer {
      yaml_parser_t* p;
      ~Closer() { yaml_parser_delete(p); }
    } closer{&p};
    int documents = 0;
    yaml_mark_t first_root{};
    bool seen_root = false;
    while (true) {
      yaml_event_t e;
      if (!yaml_parser_parse(&p, &e)) parse_error(p);
      struct EventCloser {
        yaml_event_t* e;
        ~EventCloser() { yaml_event_delete(e); }
      } event_closer{&e};
      const yaml_mark_t& m = e.start_mark;
      switch (e.type) {
        case YAML_STREAM_END_EVENT:
          if (!deferred_.empty()) error("yaml.constructor.ConstructorError", deferred_);
          return;
        case YAML_DOCUMENT_START_EVENT:
          // Composer.get_single_node.
          if (++documents > 1)
            error("yaml.composer.ComposerError", "expected a single document in the stream (" +
                                                     mark_text(first_root) + "), but found another document (" +
                                                     mark_text(m) + ")");
          break;
        case YAML_ALIAS_EVENT: {
          const std::string name(reinterpret_cast<const char*>(e.data.alias.anchor));
          for (const Frame& f : stack_)
            if (f.anchor == name)
              limit("alias *" + name + " (" + mark_text(m) + ") stands for the node it is inside of (&" + name +
                    ", " + mark_text(f.start) + "): a recursive structure, which no Accelerate setting can be "
                    "(PyYAML builds it; fsdp-plan refuses it)");
          auto it = anchors_.find(name);
          if (it == anchors_.end())
            error("yaml.composer.ComposerError", "found undefined alias '" + name + "' (" + mark_text(m) + ")");
          count(it->second.values, it->second.bytes, m);
          note_size(it->second.values, it->second.bytes);
          attach(it->second.value, m);
          break;
        }
        case YAML_SCALAR_EVENT: {
          if (!seen_root) first_root = m, seen_root = true;
          define_anchor(e.data.scalar.anchor, m);
          check_tag(e.data.scalar.tag, false, m);
          const size_t n = e.data.scalar.length;
          if (n > kMaxYamlScalar)
            limit("a value of " + std::to_string(n) + " bytes (" + mark_text(m) + "), longer than any Accelerate "
                  "value can be (" + std::to_string(kMaxYamlScalar >> 10) + " KiB)");
          count(1, n, m);
          note_size(1, n);
          std::string value(reinterpret_cast<const char*>(e.data.scalar.value), n);
          const std::string tag = e.data.scalar.tag ? reinterpret_cast<const char*>(e.data.scalar.tag) : "";
          const bool plain = e.data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
          const bool merge_key = (plain && tag.empty() && value == "<<") || tag == "tag:yaml.org,2002:merge";
          // !!str and "!" are strings; the other standard tags resolve as a plain scalar would.
          const bool resolve = tag.empty() ? plain : tag != "!" && tag != "tag:yaml.org,2002:str";
          std::string bad;
          PyValue v = resolve_yaml_scalar(std::move(value), resolve, bad);
          if (!bad.empty()) {
            if (bad.rfind("ValueError: ", 0) == 0) error("ValueError", bad.substr(12) + " (" + mark_text(m) + ")");
            limit(bad + " (" + mark_text(m) + "), larger than any Accelerate setting can be");
          }
          v.line = m.line;
          v.column = m.column;
          if (e.data.scalar.anchor)
            anchors_[reinterpret_cast<const char*>(e.data.scalar.anchor)] = {v, 1, n, m};
          attach(std::move(v), m, merge_key);
          break;
        }
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT: {
          if (!seen_root) first_root = m, seen_root = true;
          const bool seq = e.type == YAML_SEQUENCE_START_EVENT;
          const unsigned char* anchor = seq ? e.data.sequence_start.anchor : e.data.mapping_start.anchor;
          define_anchor(anchor, m);
          check_tag(seq ? e.data.sequence_start.tag : e.data.mapping_start.tag, true, m);
          if (stack_.size() >= kMaxYamlDepth)
            limit("nested more than " + std::to_string(kMaxYamlDepth) + " deep (" + mark_text(m) +
                  "); an Accelerate config is 3 deep");
          count(1, 0, m);
          note_size(1, 0);
          Frame f;
          f.value.kind = seq ? PyValue::List : PyValue::Dict;
          f.value.line = m.line;
          f.value.column = m.column;
          f.anchor = anchor ? reinterpret_cast<const char*>(anchor) : "";
          f.start = m;
          stack_.push_back(std::move(f));
          break;
        }
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT: {
          Frame f = std::move(stack_.back());
          stack_.pop_back();
          merge(f);
          if (!f.anchor.empty()) anchors_[f.anchor] = {f.value, f.values, f.bytes, f.start};
          note_size(f.values - 1, f.bytes);  // the parent's size grows by this node's
          attach(std::move(f.value), f.start);
          break;
        }
        default:
          break;
      }
    }
  }

  // Every open collection grows by what was just added, for its own aliases.
  void note_size(size_t values, size_t bytes) {
    if (!stack_.empty()) {
      stack_.back().values += values;
      stack_.back().bytes += bytes;
    }
  }

  const std::string& file_;
  const std::string* text_ = nullptr;
  std::vector<Frame> stack_;
  std::map<std::string, Anchored> anchors_;
  PyValue root_;
  size_t values_ = 0, bytes_ = 0;
  std::string deferred_;
};

}  // namespace

PyValue pyyaml_safe_load(const std::string& text, const std::string& file) { return YamlReader(file).read(text); }

}  // namespace fsdp_plan
