#include "accelerate/config.h"

#include <re2/re2.h>
#include <yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "model/class_names.h"
#include "model/loaders/printable.h"
#include "util/errors.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

// A YAML value as PyYAML's safe_load gives it to Accelerate (YAML 1.1: plain
// yes/no/on/off are booleans, "1e8" without a dot is a string).
struct PyValue {
  enum Kind { None, Bool, Int, Float, Str, List, Dict } kind = None;
  bool b = false;
  std::string text;  // scalars: the scalar as written
  std::vector<PyValue> items;
  std::vector<std::pair<std::string, PyValue>> entries;
  size_t line = 0, column = 0;  // where the node starts in the file (0-based, as libyaml counts)
};

bool is_one_of(const std::string& s, std::initializer_list<const char*> words) {
  for (const char* w : words)
    if (s == w) return true;
  return false;
}

bool digit(char c) { return c >= '0' && c <= '9'; }

// PyYAML's implicit resolvers (yaml/resolver.py, 6.0.4), in its order: the
// int and float patterns below, exactly (a dot alone, "-.5" and "._" are
// strings; "017" is octal, "1:30" sexagesimal: 90).
bool all_of_set(const std::string& s, size_t from, const char* set) {
  return from < s.size() && s.find_first_not_of(set, from) == std::string::npos;
}

// [-+]?0b[0-1_]+ | [-+]?0[0-7_]+ | [-+]?(?:0|[1-9][0-9_]*) | [-+]?0x[0-9a-fA-F_]+
// | [-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+
bool yaml_int(const std::string& s) {
  const size_t i = !s.empty() && (s[0] == '-' || s[0] == '+');
  if (i >= s.size()) return false;
  if (s.compare(i, 2, "0b") == 0) return all_of_set(s, i + 2, "01_");
  if (s.compare(i, 2, "0x") == 0) return all_of_set(s, i + 2, "0123456789abcdefABCDEF_");
  if (s[i] == '0') return i + 1 == s.size() || all_of_set(s, i + 1, "01234567_");
  if (!digit(s[i])) return false;
  size_t j = i;
  while (j < s.size() && (digit(s[j]) || s[j] == '_')) ++j;
  if (j == s.size()) return true;
  // Sexagesimal: each further part one or two digits, the first of them 0-5.
  while (j < s.size()) {
    if (s[j] != ':' || ++j >= s.size() || !digit(s[j])) return false;
    if (j + 1 < s.size() && digit(s[j + 1])) {
      if (s[j] > '5') return false;
      ++j;
    }
    ++j;
  }
  return true;
}

// [-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)? | \.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
// | [-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]* | [-+]?\.(?:inf|Inf|INF) | \.(?:nan|NaN|NAN)
bool yaml_float(const std::string& s) {
  if (is_one_of(s, {".nan", ".NaN", ".NAN"})) return true;
  size_t i = !s.empty() && (s[0] == '-' || s[0] == '+');
  if (is_one_of(s.substr(i), {".inf", ".Inf", ".INF"})) return true;
  bool sexagesimal = false;
  if (i < s.size() && digit(s[i])) {
    while (i < s.size() && (digit(s[i]) || s[i] == '_')) ++i;
    while (i < s.size() && s[i] == ':') {
      sexagesimal = true;
      if (++i >= s.size() || !digit(s[i])) return false;
      if (i + 1 < s.size() && digit(s[i + 1])) {
        if (s[i] > '5') return false;
        ++i;
      }
      ++i;
    }
  } else if (i != 0 || s.size() < 2 || s[0] != '.' || !digit(s[1])) {
    return false;  // no digit before the dot: no sign, and a digit right after it
  }
  if (i >= s.size() || s[i] != '.') return false;
  ++i;
  while (i < s.size() && (digit(s[i]) || s[i] == '_')) ++i;
  if (i == s.size()) return true;
  if (sexagesimal || (s[i] != 'e' && s[i] != 'E')) return false;
  if (++i >= s.size() || (s[i] != '-' && s[i] != '+')) return false;
  if (++i >= s.size()) return false;
  return std::all_of(s.begin() + static_cast<std::ptrdiff_t>(i), s.end(), digit);
}

// PyYAML's construct_yaml_int on what yaml_int() matched, as decimal text.
// Decimals stay as written (Python's ints have no bound); the other bases and
// sexagesimal are converted and must fit 63 bits (no Accelerate setting comes
// near). Returns false with *error set where PyYAML raises ValueError ("0b_")
// or the value is past that bound.
bool yaml_int_text(std::string s, std::string& out, std::string& error) {
  s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
  bool negative = false;
  if (s[0] == '-' || s[0] == '+') negative = s[0] == '-', s.erase(0, 1);
  int base = 10;
  std::string digits = s;
  if (s.compare(0, 2, "0b") == 0) base = 2, digits = s.substr(2);
  else if (s.compare(0, 2, "0x") == 0) base = 16, digits = s.substr(2);
  else if (s.size() > 1 && s[0] == '0') base = 8, digits = s.substr(1);
  if (base == 10 && s.find(':') == std::string::npos) {
    out = (negative && s != "0" ? "-" : "") + s;
    return true;
  }
  if (digits.empty()) {
    error = "ValueError: invalid literal for int() with base " + std::to_string(base) + ": ''";
    return false;
  }
  constexpr unsigned long long kMax = (1ULL << 63) - 1;
  unsigned long long value = 0;
  if (base == 10) {  // sexagesimal: parts of base 60, the first part most significant
    size_t at = 0;
    while (at <= digits.size()) {
      const size_t colon = std::min(digits.find(':', at), digits.size());
      unsigned long long part = 0;
      for (size_t k = at; k < colon; ++k) {
        if (part > (kMax - 9) / 10) part = kMax;
        else part = part * 10 + static_cast<unsigned>(digits[k] - '0');
      }
      if (value > (kMax - part) / 60) {
        error = "an integer past 2^63";
        return false;
      }
      value = value * 60 + part;
      at = colon + 1;
    }
  } else {
    for (const char c : digits) {
      const unsigned d = digit(c) ? static_cast<unsigned>(c - '0') : static_cast<unsigned>((c | 0x20) - 'a' + 10);
      if (value > (kMax - d) / static_cast<unsigned>(base)) {
        error = "an integer past 2^63";
        return false;
      }
      value = value * static_cast<unsigned>(base) + d;
    }
  }
  out = (negative && value ? "-" : "") + std::to_string(value);
  return true;
}

// What Python's int() takes after strip(): [-+]?[0-9](_?[0-9])*.
bool python_int(const std::string& t) {
  size_t i = !t.empty() && (t[0] == '-' || t[0] == '+');
  if (i >= t.size() || !digit(t[i])) return false;
  for (++i; i < t.size(); ++i) {
    if (t[i] == '_') ++i;
    if (i >= t.size() || !digit(t[i])) return false;
  }
  return true;
}

// A plain scalar resolved as PyYAML's resolver does; quoted and block scalars are strings.
// *error is set where PyYAML's constructor would raise (see yaml_int_text).
PyValue scalar_value(std::string text, bool plain, std::string& error) {
  PyValue v;
  v.text = std::move(text);
  v.kind = PyValue::Str;
  if (!plain) return v;
  const std::string& s = v.text;
  if (is_one_of(s, {"~", "null", "Null", "NULL", ""})) {
    v.kind = PyValue::None;
  } else if (is_one_of(s, {"yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"})) {
    v.kind = PyValue::Bool;
    v.b = true;
  } else if (is_one_of(s, {"no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"})) {
    v.kind = PyValue::Bool;
  } else if (yaml_int(s)) {
    v.kind = PyValue::Int;
    std::string decimal;
    if (!yaml_int_text(s, decimal, error)) return v;
    v.text = std::move(decimal);
  } else if (yaml_float(s)) {
    v.kind = PyValue::Float;
  }
  return v;
}

// --- YAML as Accelerate reads it: open(file, encoding="utf-8") and yaml.safe_load ---
//
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
          PyValue v = scalar_value(std::move(value), resolve, bad);
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

// --- fsdp_ignored_modules: a Python re pattern, run by RE2 ---
//
// Accelerate compiles it with Python's re and keeps the modules whose path
// re.fullmatch()es it (utils/fsdp_utils.py: get_parameters_from_modules, and
// the FSDP1 plugin alike). RE2 matches in linear time with bounded memory,
// whatever the pattern; a backtracking engine (std::regex, Python's own)
// recurses per nesting level and can take exponential time. The two syntaxes
// agree on what module paths need (literals, ., [...], \d \w \s on ASCII,
// (?:...), (?P<name>...), | * + ? {m,n} ^ $ \A); the rest is translated
// (\Z, \uXXXX, {,n}, (?#...), the a and u flags) or refused by name.

// Python's re.compile itself stops with RecursionError near 495 nested groups.
constexpr int kMaxRegexNesting = 100;

bool hex_digits(const std::string& s, size_t at, size_t n) {
  if (at + n > s.size()) return false;
  for (size_t i = at; i < at + n; ++i)
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

// The RE2 pattern for a Python one; `why` says what RE2 cannot run (and the
// result is empty) where Python's re has a construct RE2 lacks.
std::string python_regex_to_re2(const std::string& p, std::string& why) {
  std::string out;
  int depth = 0;
  bool in_class = false;
  auto refuse_construct = [&](const std::string& what) {
    why = "uses " + what + ", which Python's re accepts but fsdp-plan's matcher (RE2: linear time, bounded "
          "memory) cannot run";
    return std::string();
  };
  // After a quantifier: a '+' makes it possessive (Python 3.11), which RE2 lacks.
  auto possessive_after = [&](size_t i) { return i < p.size() && p[i] == '+'; };
  for (size_t i = 0; i < p.size();) {
    const char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) {
        why = "ends with a lone backslash (Python: bad escape (end of pattern))";
        return "";
      }
      const char d = p[i + 1];
      if (d >= '1' && d <= '9' && !in_class) return refuse_construct(std::string("a backreference (\\") + d + ")");
      if (d == 'Z') {
        out += "\\z";  // Python's \Z is the end of the string, RE2's \z
      } else if ((d == 'u' && hex_digits(p, i + 2, 4)) || (d == 'U' && hex_digits(p, i + 2, 8))) {
        const size_t n = d == 'u' ? 4 : 8;
        out += "\\x{" + p.substr(i + 2, n) + "}";
        i += 2 + n;
        continue;
      } else if (d == 'N') {
        return refuse_construct("a named character (\\N{...})");
      } else {
        out += p.substr(i, 2);
      }
      i += 2;
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      out += c;
      ++i;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      ++i;
      if (i < p.size() && p[i] == '^') out += p[i++];
      if (i < p.size() && p[i] == ']') out += p[i++];  // a leading ] is a literal
      continue;
    }
    if (c == '(') {
      if (++depth > kMaxRegexNesting) {
        why = "nests groups more than " + std::to_string(kMaxRegexNesting) +
              " deep (Python's re.compile stops with RecursionError near 495)";
        return "";
      }
      if (p.compare(i, 2, "(?") == 0) {
        const std::string rest = p.substr(i + 2, 2);
        if (rest.rfind("=", 0) == 0 || rest.rfind("!", 0) == 0) return refuse_construct("a lookahead (" + p.substr(i, 3) + "...)");
        if (rest == "<=" || rest == "<!") return refuse_construct("a lookbehind (" + p.substr(i, 4) + "...)");
        if (rest == "P=") return refuse_construct("a backreference by name ((?P=...))");
        if (rest.rfind(">", 0) == 0) return refuse_construct("an atomic group ((?>...))");
        if (rest.rfind("(", 0) == 0) return refuse_construct("a conditional group ((?(...)...))");
        if (rest.rfind("#", 0) == 0) {  // a comment: Python skips it up to the first )
          const size_t close = p.find(')', i);
          if (close == std::string::npos) {
            why = "has a comment (?#... that is never closed";
            return "";
          }
          --depth;
          i = close + 1;
          continue;
        }
        // Inline flags, alone ((?i)) or scoped ((?i:...)); RE2 has i, m, s.
        size_t j = i + 2;
        std::string flags;
        while (j < p.size() && std::strchr("aiLmsux-", p[j]) && p[j] != '\0') flags += p[j++];
        if (!flags.empty() && j < p.size() && (p[j] == ')' || p[j] == ':')) {
          if (flags.find('x') != std::string::npos) return refuse_construct("verbose mode ((?x))");
          if (flags.find('L') != std::string::npos) return refuse_construct("locale matching ((?L))");
          std::string kept;  // a, u: ASCII or Unicode classes, the same on ASCII module paths
          for (char f : flags)
            if (f != 'a' && f != 'u') kept += f;
          if (p[j] == ')') {
            --depth;
            if (!kept.empty() && kept != "-") out += "(?" + kept + ")";
          } else {
            out += kept.empty() || kept == "-" ? "(?:" : "(?" + kept + ":";
          }
          i = j + 1;
          continue;
        }
      }
      out += c;
      ++i;
      continue;
    }
    if (c == ')') {
      --depth;
      out += c;
      ++i;
      continue;
    }
    if (c == '*' || c == '+' || c == '?') {
      out += c;
      ++i;
      if (i < p.size() && p[i] == '?') out += p[i++];  // lazy
      else if (possessive_after(i)) return refuse_construct(std::string("a possessive quantifier (") + c + "+)");
      continue;
    }
    if (c == '{') {
      // {m}, {m,}, {,n}, {m,n} is a quantifier; anything else a literal brace.
      size_t j = i + 1;
      std::string lo, hi;
      while (j < p.size() && digit(p[j])) lo += p[j++];
      bool comma = j < p.size() && p[j] == ',';
      if (comma) {
        ++j;
        while (j < p.size() && digit(p[j])) hi += p[j++];
      }
      if (j < p.size() && p[j] == '}' && (!lo.empty() || (comma && !hi.empty()))) {
        for (const std::string& n : {lo, hi})
          if (!n.empty() && (n.size() > 4 || std::stoi(n) > 1000))
            return refuse_construct("a repetition count above 1000 (" + p.substr(i, j + 1 - i) + ")");
        out += "{" + (lo.empty() ? "0" : lo) + (comma ? "," + hi : "") + "}";
        i = j + 1;
        if (i < p.size() && p[i] == '?') out += p[i++];
        else if (possessive_after(i)) return refuse_construct("a possessive quantifier ({...}+)");
        continue;
      }
      out += "\\{";
      ++i;
      continue;
    }
    out += c;
    ++i;
  }
  return out;
}

std::unique_ptr<RE2> compile_python_regex(const std::string& pattern, std::string& why) {
  std::string translated = python_regex_to_re2(pattern, why);
  if (!why.empty()) return nullptr;
  RE2::Options options;
  options.set_log_errors(false);
  auto re = std::make_unique<RE2>(translated, options);
  if (!re->ok()) {
    why = "is not a regular expression Python's re and RE2 both read: " + re->error();
    return nullptr;
  }
  return re;
}

// PyYAML's construct_yaml_float: '_' dropped, .inf and .nan in any case, else
// float() (std::stod threw on ".INF", which the fuzzer found: exit 3).
double yaml_float_value(const std::string& text) {
  std::string t;
  for (const char c : text)
    if (c != '_') t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool sign = !t.empty() && (t[0] == '-' || t[0] == '+');
  const std::string body = t.substr(sign ? 1 : 0);
  if (body == ".inf") return t[0] == '-' ? -HUGE_VAL : HUGE_VAL;
  if (body == ".nan") return std::nan("");
  if (body.find(':') != std::string::npos) {  // sexagesimal: "1:30.5" is 90.5
    double value = 0;
    size_t at = 0;
    while (at <= body.size()) {
      const size_t colon = std::min(body.find(':', at), body.size());
      value = value * 60 + std::strtod(body.substr(at, colon - at).c_str(), nullptr);
      at = colon + 1;
    }
    return t[0] == '-' ? -value : value;
  }
  return std::strtod(t.c_str(), nullptr);  // past a double: +-HUGE_VAL, inf as Python's float() gives
}

// str(value) in Python, which is what the launcher puts in the environment.
std::string py_str(const PyValue& v, bool repr = false) {
  switch (v.kind) {
    case PyValue::None: return "None";
    case PyValue::Bool: return v.b ? "True" : "False";
    case PyValue::Int: return v.text;
    case PyValue::Float: {
      const double d = yaml_float_value(v.text);
      if (std::isnan(d)) return "nan";
      if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
      std::string s = std::to_string(d);  // close to Python's repr for the values people write
      while (s.size() > 1 && s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
      return s;
    }
    case PyValue::Str: return repr ? "'" + v.text + "'" : v.text;
    case PyValue::List: {
      std::string out = "[";
      for (size_t i = 0; i < v.items.size(); ++i) out += (i ? ", " : "") + py_str(v.items[i], true);
      return out + "]";
    }
    case PyValue::Dict: {
      std::string out = "{";
      for (size_t i = 0; i < v.entries.size(); ++i)
        out += (i ? ", " : "") + std::string("'") + v.entries[i].first + "': " + py_str(v.entries[i].second, true);
      return out + "}";
    }
  }
  return "";
}

bool py_truthy(const PyValue& v) {
  switch (v.kind) {
    case PyValue::None: return false;
    case PyValue::Bool: return v.b;
    case PyValue::Int: return v.text != "0" && v.text != "-0";
    case PyValue::Float: return yaml_float_value(v.text) != 0.0;  // nan is true, as in Python
    case PyValue::Str: return !v.text.empty();
    case PyValue::List: return !v.items.empty();
    case PyValue::Dict: return !v.entries.empty();
  }
  return false;
}

// A value as Python's json.load gives it (ClusterConfig.from_json_file):
// strings stay strings, numbers keep their JSON spelling (1e8 is a float).
PyValue from_json(const nlohmann::json& j) {
  PyValue v;
  switch (j.type()) {
    case nlohmann::json::value_t::boolean: v.kind = PyValue::Bool, v.b = j.get<bool>(); break;
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: v.kind = PyValue::Int, v.text = j.dump(); break;
    case nlohmann::json::value_t::number_float: v.kind = PyValue::Float, v.text = j.dump(); break;
    case nlohmann::json::value_t::string: v.kind = PyValue::Str, v.text = j.get<std::string>(); break;
    case nlohmann::json::value_t::array:
      v.kind = PyValue::List;
      for (const auto& item : j) v.items.push_back(from_json(item));
      break;
    case nlohmann::json::value_t::object:
      v.kind = PyValue::Dict;
      for (auto it = j.begin(); it != j.end(); ++it) v.entries.emplace_back(it.key(), from_json(it.value()));
      break;
    default: break;  // null
  }
  return v;
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// ClusterConfig's dataclass fields (plus fp16 and dynamo_backend, which
// process_config converts): any other top-level key is an error.
const std::vector<std::string> kTopKeys = {
    "compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug", "num_processes",
    "machine_rank", "num_machines", "gpu_ids", "main_process_ip", "main_process_port", "rdzv_backend",
    "same_network", "main_training_function", "enable_cpu_affinity", "fp8_config", "deepspeed_config",
    "fsdp_config", "parallelism_config", "megatron_lm_config", "mpirun_config", "downcast_bf16", "tpu_name",
    "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands", "tpu_vm", "tpu_env",
    "dynamo_config", "fp16", "dynamo_backend"};

// The launcher's FSDP arguments and their argparse defaults (None: not set).
struct LauncherKey {
  const char* key;
  const char* fallback;  // nullptr: None
};
const std::vector<LauncherKey> kFsdpKeys = {
    {"fsdp_version", "1"},
    {"fsdp_offload_params", "false"},
    {"fsdp_min_num_params", "100000000"},
    {"fsdp_sharding_strategy", "FULL_SHARD"},
    {"fsdp_reshard_after_forward", "true"},
    {"fsdp_auto_wrap_policy", nullptr},
    {"fsdp_transformer_layer_cls_to_wrap", nullptr},
    {"fsdp_backward_prefetch", nullptr},
    {"fsdp_state_dict_type", nullptr},
    {"fsdp_forward_prefetch", "false"},
    {"fsdp_use_orig_params", "true"},
    {"fsdp_cpu_ram_efficient_loading", "true"},
    {"fsdp_sync_module_states", "true"},
    {"fsdp_activation_checkpointing", "false"},
    {"fsdp_activation_checkpointing_offload", "false"},
    {"fsdp_ignored_modules", nullptr},  // no CLI flag; read from the file only
};

// Keys from older Accelerate releases and what became of them.
const std::map<std::string, std::string> kStaleKeys = {
    {"fsdp_backward_prefetch_policy",
     "renamed fsdp_backward_prefetch in Accelerate 0.26 (PR #2288) and dropped in 1.0; Accelerate copies it onto "
     "the launch arguments and never reads it, so backward prefetch stays as fsdp_backward_prefetch says"},
    {"fsdp_limit_all_gathers",
     "not a launcher setting: only FullyShardedDataParallelPlugin(limit_all_gathers=...) in Python sets it; "
     "Accelerate copies the key onto the launch arguments and never reads it"},
    {"fsdp_cpu_offload", "not an Accelerate key (Transformers' Trainer spells it that way); the launcher's key is "
                         "fsdp_offload_params, so parameters are not offloaded by this key"},
};

const std::vector<std::string> kStrategies = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                              "HYBRID_SHARD_ZERO2"};
const std::vector<std::string> kWrapPolicies = {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"};
const std::vector<std::string> kPrefetch = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"};
const std::vector<std::string> kStateDicts = {"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"};

std::string py_list(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", '" : "'") + v[i] + "'";
  return out + "]";
}

class Reader {
 public:
  Reader(std::string file, AccelerateOverrides overrides) : file_(std::move(file)), overrides_(std::move(overrides)) {}

  [[noreturn]] void fail(const std::string& what) const { throw InputError(file_, what); }
  // Where accelerate launch (or the plugin it feeds) raises.
  [[noreturn]] void refuse(const std::string& what) const {
    throw InputError(file_, "accelerate launch would stop: " + what);
  }

  AccelerateConfig read(const std::string& text) {
    PyValue top = YamlReader(file_).read(text);
    if (top.kind != PyValue::Dict) fail(not_a_mapping(top, text));
    return read_top(top);
  }

  // ClusterConfig.from_json_file: json.load's values, no YAML resolving.
  AccelerateConfig read_json(const nlohmann::json& doc) { return read_top(from_json(doc)); }

 private:
  // What the file is instead of the mapping Accelerate's from_yaml_file needs.
  static std::string not_a_mapping(const PyValue& top, const std::string& text) {
    const std::string want = ", not a mapping: an Accelerate config is one (distributed_type: FSDP, fsdp_config: ...)";
    if (top.kind == PyValue::List) return "is a YAML list" + want;
    if (top.kind != PyValue::None) {
      // A file that is not JSON at all (binary, a truncated policy) lands here: show the start, printable.
      std::string shown = py_str(top, true);
      if (shown.size() > 40) shown = shown.substr(0, 36) + "...'";
      for (char& c : shown)
        if (c < 0x20 || c > 0x7e) c = '?';
      return "is a YAML scalar (" + shown + ")" + want + "; a JSON policy starts with {";
    }
    for (size_t at = 0; at < text.size();) {
      size_t end = std::min(text.find('\n', at), text.size());
      size_t first = text.find_first_not_of(" \t\r", at);
      if (first < end && text[first] != '#') return "is a YAML null" + want;
      at = end + 1;
    }
    return "holds no YAML document, only comments or blank lines: an Accelerate config is a mapping "
           "(distributed_type: FSDP, fsdp_config: ...)";
  }

  AccelerateConfig read_top(const PyValue& top) {
    // Keys of neither ClusterConfig nor anything else Accelerate reads: not meant for it.
    if (std::none_of(top.entries.begin(), top.entries.end(), [](const auto& kv) {
          return std::find(kTopKeys.begin(), kTopKeys.end(), kv.first) != kTopKeys.end();
        }))
      fail("a YAML mapping without any of Accelerate's keys (distributed_type, fsdp_config, ...), so not an Accelerate "
           "config; a policy is JSON (policies/policy.schema.json)");
    for (auto& [k, v] : top.entries) top_[k] = v;

    if (top_.count("compute_environment") && py_str(top_["compute_environment"]) == "AMAZON_SAGEMAKER")
      fail("compute_environment AMAZON_SAGEMAKER: fsdp-plan reads LOCAL_MACHINE configs only");
    if (top_.count("compute_environment") && py_str(top_["compute_environment"]) != "LOCAL_MACHINE")
      refuse("ValueError: '" + py_str(top_["compute_environment"]) + "' is not a valid ComputeEnvironment");
    if (!top_.count("distributed_type")) refuse("ValueError: A `distributed_type` must be specified in the config file.");
    std::vector<std::string> extra;
    for (const auto& [k, v] : top_)
      if (std::find(kTopKeys.begin(), kTopKeys.end(), k) == kTopKeys.end()) extra.push_back(k);
    if (!extra.empty())
      refuse("ValueError: The config file at " + file_ + " had unknown keys (" + py_list(extra) +
             "), please try upgrading your `accelerate` version or fix (and potentially remove) these keys from "
             "your config file." +
             [&] {
               auto near = closest(extra[0], kTopKeys, 1);
               return near.empty() ? std::string() : " Did you mean \"" + near[0] + "\"?";
             }());
    const std::string dtype = py_str(top_["distributed_type"]);
    if (dtype != "FSDP")
      fail("distributed_type is " + dtype + ", not FSDP: accelerate launch would not use FSDP here");

    read_world();
    read_fsdp_config();
    read_mixed_precision();
    read_parallelism();
    out_.warnings.insert(out_.warnings.begin(),
                         make_warning("accelerate_config", "Accelerate " + std::string(kAccelerateVersion) +
                                                               " (accelerate launch) effective values: " +
                                                               join(out_.effective, "; ")));
    return std::move(out_);
  }

  void note(const std::string& key, const std::string& value, bool given) {
    out_.effective.push_back(key + "=" + value + (given ? "" : " (launcher default)"));
  }

  void key_warning(const std::string& key, const std::string& message, std::vector<std::string> suggestions = {}) {
    Warning w = make_warning("accelerate_config_key", key + ": " + message);
    w.suggestions = std::move(suggestions);
    out_.warnings.push_back(std::move(w));
  }

  int64_t parse_int(const PyValue& v, const std::string& key) const {
    // The launcher passes str(value); the plugin calls int() on it.
    std::string s = py_str(v);
    std::string t = s;
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t") + 1);
    if (!python_int(t)) refuse(key + ": ValueError: invalid literal for int() with base 10: '" + s + "'");
    t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
    try {
      return std::stoll(t);
    } catch (const std::exception&) {
      fail(key + " is too large: " + s);
    }
  }

  void read_world() {
    int64_t n = -1;
    if (top_.count("num_processes") && top_["num_processes"].kind != PyValue::None)
      n = parse_int(top_["num_processes"], "num_processes");
    if (top_.count("num_machines") && top_["num_machines"].kind != PyValue::None)
      out_.num_machines = parse_int(top_["num_machines"], "num_machines");
    if (out_.num_machines < 1) fail("num_machines must be at least 1, not " + std::to_string(out_.num_machines));
    if (n == -1) {
      key_warning("num_processes",
                  "not set: accelerate launch stops with \"You need to manually pass in `--num_processes` using "
                  "this config yaml.\" unless --num_processes is given; the world size is --world-size (or 1)");
      return;
    }
    if (n < 1 || n > kMaxWorldSize) fail("num_processes must be from 1 to " + std::to_string(kMaxWorldSize));
    // num_processes is the total over all machines (nproc_per_node = num_processes // num_machines).
    out_.policy.fsdp.world_size = n;
    out_.policy.fsdp.world_size_given = true;
    note("num_processes", std::to_string(n), true);
    if (out_.num_machines > 1) {
      // prepare_multi_gpu_env: nproc_per_node = num_processes // num_machines, so torchrun
      // starts fewer ranks than num_processes says, and HYBRID_SHARD's groups (one per
      // machine) follow nproc_per_node: no plan at num_processes would be the run's.
      const int64_t m = out_.num_machines;
      if (n % m != 0)
        fail("num_processes " + std::to_string(n) + " is not a multiple of num_machines " + std::to_string(m) +
             ": accelerate launch would start " + std::to_string(n / m) + " processes on each of the " +
             std::to_string(m) + " machines, " + std::to_string(n / m * m) + " in all, not " + std::to_string(n) +
             "; set num_processes to a multiple of num_machines");
      note("num_machines", std::to_string(m), true);
      out_.policy.hardware.gpus_per_node = n / m;  // nproc_per_node: a node of the time model
    }
  }

  // The value the launcher exports for `key` ("" and false when it exports nothing).
  struct Env {
    bool set = false;
    bool given = false;  // in the file, not the launcher default
    std::string value;
    PyValue raw;  // the launcher's argument before str()
  };

  Env env(const std::string& key) const {
    Env e;
    auto it = fsdp_.find(key);
    if (it != fsdp_.end()) {
      e.given = true;
      e.raw = it->second;
      if (it->second.kind == PyValue::None) return e;  // None: nothing exported (for the keys that check)
      e.set = true;
      e.value = py_str(it->second);
      return e;
    }
    for (const auto& k : kFsdpKeys)
      if (key == k.key && k.fallback) {
        e.set = true;
        e.value = k.fallback;
        e.raw.kind = PyValue::Str;
        e.raw.text = k.fallback;
      }
    return e;
  }

  // The launcher always exports these, None included (as "None").
  Env always(const std::string& key) const {
    Env e = env(key);
    if (!e.set) {
      e.set = true;
      e.value = "None";
    }
    return e;
  }

  bool to_bool(const Env& e, const std::string& key) const {
    std::string v = lower(e.value);
    if (is_one_of(v, {"y", "yes", "t", "true", "on", "1"})) return true;
    if (is_one_of(v, {"n", "no", "f", "false", "off", "0"})) return false;
    refuse(key + ": ValueError: invalid truth value " + v);
  }

  // A name Accelerate maps through its own list (index + 1) or a torch enum.
  int enum_index(const Env& e, const std::string& key, const std::vector<std::string>& names,
                 const std::vector<std::string>& torch_names) const {
    std::string u = upper(e.value);
    auto it = std::find(names.begin(), names.end(), u);
    if (it != names.end()) return static_cast<int>(it - names.begin());
    if (all_digits(e.value)) {
      int i = std::stoi(e.value.substr(0, 6));
      if (i >= 1 && i <= static_cast<int>(torch_names.size())) return i - 1;
      refuse(key + ": ValueError: " + e.value + " is not a valid value");
    }
    auto t = std::find(torch_names.begin(), torch_names.end(), u);
    if (t != torch_names.end()) return static_cast<int>(t - torch_names.begin());
    auto near = closest(u, names, 1);
    refuse(key + ": KeyError: '" + u + "'" + (near.empty() ? " (one of " + join(names) + ")" : "; did you mean " + near[0] + "?"));
  }

  void read_fsdp_config() {
    if (top_.count("fsdp_config") && top_["fsdp_config"].kind != PyValue::None) {
      const PyValue& fc = top_["fsdp_config"];
      if (fc.kind != PyValue::Dict) fail("fsdp_config must be a mapping, not " + py_str(fc));
      for (const auto& [k, v] : fc.entries) {
        // _validate_launch_command: defaults.fsdp_config.x -> args.fsdp_x
        std::string key = k.rfind("fsdp", 0) == 0 ? k : "fsdp_" + k;
        fsdp_[key] = v;
        order_.push_back(key);
      }
    }
    // The version decides what every other key means.
    Env version = always("fsdp_version");
    if (version.value != "1" && version.value != "2")
      refuse("fsdp_version: FSDP_VERSION=" + version.value + " (1 or 2)");
    out_.policy.fsdp.version = version.value == "2" ? FsdpVersion::V2 : FsdpVersion::V1;
    note("fsdp_version", version.value, version.given);
    const bool v2 = out_.policy.fsdp.v2();
    unknown_and_stale_keys(v2);

    // The launcher's own check, on the raw values (Python truthiness).
    Env ram = env("fsdp_cpu_ram_efficient_loading"), sync = env("fsdp_sync_module_states");
    if (py_truthy(ram.raw) && !py_truthy(sync.raw))
      refuse("ValueError: When using `--fsdp_cpu_ram_efficient_loading` set `--fsdp_sync_module_states` to `True`");

    FsdpSettings& fsdp = out_.policy.fsdp;
    if (!v2) {
      Env strategy = always("fsdp_sharding_strategy");
      int i = enum_index(strategy, "fsdp_sharding_strategy", kStrategies,
                         {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"});
      const ShardingStrategy ours[] = {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                                       ShardingStrategy::NoShard, ShardingStrategy::HybridShard,
                                       ShardingStrategy::HybridShard};
      fsdp.strategy = ours[i];
      note("sharding_strategy", kStrategies[static_cast<size_t>(i)], strategy.given);
      if (i == 4)
        key_warning("fsdp_sharding_strategy",
                    "HYBRID_SHARD_ZERO2 keeps parameters gathered between forward and backward within a node; "
                    "fsdp-plan models its memory as HYBRID_SHARD");
      if (i >= 3) fsdp.shard_group_size = fsdp.world_size / out_.num_machines;
      if (fsdp_.count("fsdp_reshard_after_forward")) {
        Env raf = env("fsdp_reshard_after_forward");
        if (upper(raf.value) != kStrategies[static_cast<size_t>(i)])
          key_warning("fsdp_reshard_after_forward",
                      "\"" + raf.value + "\" does nothing under FSDP1 with accelerate launch: the launcher always "
                      "exports FSDP_SHARDING_STRATEGY (fsdp_sharding_strategy, default FULL_SHARD) and the plugin "
                      "takes that; the effective strategy is " + kStrategies[static_cast<size_t>(i)] +
                      ". Write the strategy under fsdp_sharding_strategy",
                      {"fsdp_sharding_strategy"});
      }
      Env orig = env("fsdp_use_orig_params");
      fsdp.use_orig_params = to_bool(orig, "fsdp_use_orig_params");
      note("use_orig_params", fsdp.use_orig_params ? "true" : "false", orig.given);
      to_bool(env("fsdp_forward_prefetch"), "fsdp_forward_prefetch");
      to_bool(env("fsdp_sync_module_states"), "fsdp_sync_module_states");
      Env prefetch = env("fsdp_backward_prefetch");
      if (prefetch.set && upper(prefetch.value) != "NO_PREFETCH")
        enum_index(prefetch, "fsdp_backward_prefetch", kPrefetch, {"BACKWARD_PRE", "BACKWARD_POST"});
    } else {
      Env raf = always("fsdp_reshard_after_forward");
      std::string v = lower(raf.value);
      if (!is_one_of(v, {"y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0"}))
        refuse("fsdp_reshard_after_forward: ValueError: invalid truth value " + v +
               " (FSDP2 takes true or false; to-fsdp2 maps FULL_SHARD/HYBRID_SHARD to true, the others to false)");
      out_.reshard_after_forward = to_bool(raf, "fsdp_reshard_after_forward");
      out_.policy.fsdp.reshard_after_forward.kind =
          out_.reshard_after_forward ? ReshardAfterForward::Kind::True : ReshardAfterForward::Kind::False;
      note("reshard_after_forward", out_.reshard_after_forward ? "true" : "false", raf.given);
    }
    Env offload = env("fsdp_offload_params");
    if (to_bool(offload, "fsdp_offload_params")) {
      note("offload_params", "true", offload.given);
      if (v2) out_.policy.fsdp.cpu_offload = true;
    }
    Env sd = env("fsdp_state_dict_type");
    if (sd.set) {
      int i = enum_index(sd, "fsdp_state_dict_type", kStateDicts, kStateDicts);
      if (v2 && i == 1)
        refuse("ValueError: FSDP2 does not support LOCAL_STATE_DICT. Please set `fsdp_state_dict_type` to "
               "`SHARDED_STATE_DICT` or `FULL_STATE_DICT`.");
    }
    to_bool(env("fsdp_cpu_ram_efficient_loading"), "fsdp_cpu_ram_efficient_loading");
    bool ac = to_bool(env("fsdp_activation_checkpointing"), "fsdp_activation_checkpointing");
    bool ac_offload = to_bool(env("fsdp_activation_checkpointing_offload"), "fsdp_activation_checkpointing_offload");
    if (ac_offload && !ac)
      refuse("ValueError: `activation_checkpointing_offload=True` requires `activation_checkpointing=True`.");
    if (ac_offload && !v2) refuse("ValueError: `activation_checkpointing_offload=True` requires `fsdp_version=2`.");
    out_.activation_checkpointing = ac;
    out_.activation_checkpointing_offload = ac_offload;
    if (ac) note("activation_checkpointing", "true", true);
    if (ac_offload) note("activation_checkpointing_offload", "true", true);

    read_wrap_policy();
    Env ignored = env("fsdp_ignored_modules");
    if (ignored.set) {
      out_.ignored_modules_regex = ignored.value;
      std::string why;
      if (!compile_python_regex(ignored.value, why))
        fail("fsdp_ignored_modules \"" + quoted_input(ignored.value) + "\" " + why);
      note("ignored_modules", "\"" + quoted_input(ignored.value) + "\"", true);
    }
  }

  void read_wrap_policy() {
    Env pol = env("fsdp_auto_wrap_policy");
    std::string name = pol.set ? upper(pol.value) : "NO_WRAP";
    if (std::find(kWrapPolicies.begin(), kWrapPolicies.end(), name) == kWrapPolicies.end()) {
      auto near = closest(name, kWrapPolicies, 1);
      refuse("ValueError: Invalid auto wrap policy: " + pol.value + ". Must be one of " + py_list(kWrapPolicies) +
             (near.empty() ? "" : "; did you mean " + near[0] + "?"));
    }
    out_.auto_wrap_policy = name;
    note("auto_wrap_policy", name, pol.set);
    const bool by_class = name == "TRANSFORMER_BASED_WRAP", by_size = name == "SIZE_BASED_WRAP";
    Env cls = env("fsdp_transformer_layer_cls_to_wrap");
    if (const auto& given = overrides_.transformer_layer_cls_to_wrap) {
      // `accelerate launch --fsdp_transformer_layer_cls_to_wrap A,B` wins over the file, but only
      // TRANSFORMER_BASED_WRAP reads it: rather than plan classes that would do nothing, refuse.
      if (!by_class)
        fail("--module-classes names the classes TRANSFORMER_BASED_WRAP wraps, but this config's "
             "fsdp_auto_wrap_policy is " + name + (pol.set ? "" : " (not set)") +
             ", which wraps no class: set fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP in it");
      out_.class_names = *given;
      out_.policy.module_classes = *given;
      out_.effective.push_back("transformer_layer_cls_to_wrap=\"" + join(*given, ",") + "\" (--module-classes)");
    } else if (by_class) {
      if (cls.set) {
        // str(value).split(","): a YAML list becomes "['A', 'B']", names are not stripped.
        std::vector<std::string> names;
        size_t pos = 0;
        while (true) {
          size_t comma = cls.value.find(',', pos);
          names.push_back(cls.value.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
          if (comma == std::string::npos) break;
          pos = comma + 1;
        }
        out_.class_names = names;
        if (cls.raw.kind == PyValue::List)
          key_warning("fsdp_transformer_layer_cls_to_wrap",
                      "is a YAML list; Accelerate takes str() of it (\"" + cls.value +
                          "\") and splits that at commas; write one comma-separated string instead");
        note("transformer_layer_cls_to_wrap", "\"" + cls.value + "\"", true);
        out_.policy.module_classes = out_.class_names;
      } else {
        // model._no_split_modules: resolve_accelerate_config looks for it in the file.
        out_.policy.module_classes = std::vector<std::string>{};
      }
    } else if (cls.set) {
      key_warning("fsdp_transformer_layer_cls_to_wrap", "does nothing with auto_wrap_policy " + name +
                                                            " (only TRANSFORMER_BASED_WRAP reads it)");
    }
    Env min = env("fsdp_min_num_params");
    if (by_size) {
      int64_t n = parse_int(min.raw.kind == PyValue::None ? PyValue{PyValue::Str, false, "None", {}, {}, 0, 0} : min.raw,
                            "fsdp_min_num_params");
      note("min_num_params", std::to_string(n), min.given);
      if (!out_.policy.fsdp.v2()) {
        if (n > 0) {
          out_.policy.min_num_params = n;
        } else {
          key_warning("fsdp_min_num_params",
                      std::to_string(n) + ": Accelerate (\"If zero, we silently ignore it.\") sets no auto-wrap "
                      "policy at all, so the root is the only unit");
        }
      } else {
        out_.policy.min_num_params = n;  // FSDP2: Accelerate's own rule, numel > n
      }
    } else if (fsdp_.count("fsdp_min_num_params")) {
      key_warning("fsdp_min_num_params", "does nothing with auto_wrap_policy " + name +
                                             " (only SIZE_BASED_WRAP reads it)");
    }
  }

  void unknown_and_stale_keys(bool v2) {
    std::vector<std::string> known;
    for (const auto& k : kFsdpKeys) known.push_back(k.key);
    for (const auto& key : order_) {
      if (auto s = kStaleKeys.find(key); s != kStaleKeys.end()) {
        key_warning(key, s->second);
        continue;
      }
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        auto near = closest(key, known, 1);
        key_warning(key,
                    "not an Accelerate key: accelerate launch copies it onto its arguments and nothing reads it" +
                        (near.empty() ? std::string() : "; did you mean " + near[0] + "?"),
                    near);
        continue;
      }
      if (!v2) continue;
      if (key == "fsdp_sharding_strategy") {
        key_warning(key, "does nothing under fsdp_version 2 (the plugin reads it for FSDP1 only); FSDP2 takes "
                         "fsdp_reshard_after_forward: true (was FULL_SHARD/HYBRID_SHARD) or false",
                    {"fsdp_reshard_after_forward"});
      } else if (key == "fsdp_backward_prefetch") {
        key_warning(key, "does nothing under fsdp_version 2: Accelerate warns \"backward_prefetch is not supported "
                         "in FSDP2. Setting backward prefetch to None.\"");
      } else if (key == "fsdp_forward_prefetch") {
        key_warning(key, "does nothing under fsdp_version 2: the plugin does not read it (and refuses "
                         "forward_prefetch=True given in Python: not yet implemented in FSDP2)");
      } else if (key == "fsdp_use_orig_params") {
        key_warning(key, "does nothing under fsdp_version 2: \"use_orig_params is obsolete in FSDP2, as FSDP2 "
                         "always uses the original parameters.\"");
      } else if (key == "fsdp_sync_module_states") {
        key_warning(key, "does nothing under fsdp_version 2 (\"sync_module_states is obsolete in FSDP2\"); "
                         "the launcher still requires it true when fsdp_cpu_ram_efficient_loading is true");
      }
    }
  }

  void read_mixed_precision() {
    std::string mp = "no";
    bool given = false;
    if (top_.count("mixed_precision") && top_["mixed_precision"].kind != PyValue::None) {
      const PyValue& v = top_["mixed_precision"];
      given = true;
      // YAML 1.1 reads an unquoted no as false; prepare_multi_gpu_env then calls .lower() on a bool.
      if (v.kind == PyValue::Bool)
        refuse("mixed_precision: AttributeError: 'bool' object has no attribute 'lower' (YAML reads an unquoted " +
               v.text + " as a boolean; write 'no' in quotes)");
      mp = lower(py_str(v));
    }
    if (!is_one_of(mp, {"no", "fp8", "fp16", "bf16"}))
      refuse("ValueError: Unknown mixed_precision mode: " + mp + ". Choose between ['no', 'fp8', 'fp16', 'bf16'].");
    note("mixed_precision", mp, given);
    out_.mixed_precision = mp;
    out_.policy.mixed_precision = accelerate_dtypes(mp, out_.policy.fsdp.version);
    // Accelerate then keeps fp32 master weights (plan/master_weights.h).
    out_.policy.fsdp.fp32_master_weights = mp != "no";
  }

  // The launcher exports every size, one the file leaves out as its default 1, dp_shard_size included
  // (commands/launch.py; utils/launch.py: prepare_extend_env_parallelism_config).
  void read_parallelism() {
    if (!top_.count("parallelism_config") || top_["parallelism_config"].kind == PyValue::None) return;
    const PyValue& pc = top_["parallelism_config"];
    if (pc.kind != PyValue::Dict) fail("parallelism_config must be a mapping");
    if (pc.entries.empty()) return;  // _validate_launch_command: parallelism_config != {}
    int64_t replicate = 1, shard = 1, tp = 1;
    bool shard_given = false;
    for (const auto& [k, v] : pc.entries) {
      if (k == "parallelism_config_dp_replicate_size") replicate = parse_int(v, k);
      else if (k == "parallelism_config_dp_shard_size") {
        shard = parse_int(v, k);
        shard_given = true;
      }
      else if (k == "parallelism_config_tp_size") tp = parse_int(v, k);
      else if ((k == "parallelism_config_cp_size" || k == "parallelism_config_sp_size") && parse_int(v, k) != 1)
        fail(k + " is " + py_str(v) + ": fsdp-plan plans data and tensor parallelism only (context and "
                                      "sequence parallel sizes must be 1)");
    }
    check_parallelism(replicate, shard, tp, shard_given);
    if (tp != 1) return read_tensor_parallel(replicate, shard, tp);
    FsdpSettings& fsdp = out_.policy.fsdp;
    if (!fsdp.v2()) {  // every size 1, else check_parallelism refused
      key_warning("parallelism_config", "does nothing: every size is 1, so Accelerate builds no mesh; a size above 1 "
                                        "is its error under fsdp_version 1 (FSDP1's hybrid sharding is "
                                        "fsdp_sharding_strategy: HYBRID_SHARD)");
      return;
    }
    if (replicate > 1) {
      fsdp.strategy = ShardingStrategy::HybridShard;
      fsdp.shard_group_size = shard;
      note("parallelism_config", "dp_replicate " + std::to_string(replicate) + " x dp_shard " + std::to_string(shard),
           true);
    }
  }

  // What Accelerator.__init__ raises for these sizes, in its order: ParallelismConfig() (__post_init__),
  // get_device_mesh (torch's init_device_mesh), _validate_accelerator (accelerate/parallelism_config.py).
  void check_parallelism(int64_t replicate, int64_t shard, int64_t tp, bool shard_given) {
    for (const auto& [name, size] : {std::pair<const char*, int64_t>{"dp_replicate_size", replicate},
                                     {"dp_shard_size", shard}, {"tp_size", tp}})
      if (size < 1)
        refuse("ValueError: " + std::string(name) + " must be at least 1, but got " + std::to_string(size));
    if (tp > 1 && replicate > 1 && shard == 1)
      refuse("ValueError: Tensor/Context parallelism (tp/cp_size > 1) cannot be used with pure data parallelism "
             "(dp_replicate_size > 1 and dp_shard_size == 1). Please set dp_shard_size > 1 and dp_replicate_size "
             "== 1 to compose FSDP + TP/CP for 2D parallel, or set dp_replicate_size == 1 and dp_shard_size > 1 to "
             "compose HSDP + TP/CP for 3D parallel.");
    const FsdpSettings& fsdp = out_.policy.fsdp;
    const int64_t total = replicate * shard * tp, world = fsdp.world_size;
    if (total == 1) return;  // no mesh; _validate_accelerator returns at once (not multi_device under FSDP)
    // The fixes, after Accelerate's words.
    std::vector<std::string> fix;
    if (!shard_given) {
      const int64_t fits = world % (replicate * tp) == 0 ? world / (replicate * tp) : 0;
      fix.push_back("parallelism_config_dp_shard_size is 1, the launcher's default, when the file leaves it out" +
                    (fits > 1 ? ": set it to " + std::to_string(fits) : std::string()));
    }
    if (!fsdp.v2())
      fix.push_back("parallelism_config is for fsdp_version 2: set fsdp_version: 2, or remove parallelism_config "
                    "and take fsdp_sharding_strategy: HYBRID_SHARD for FSDP1's hybrid sharding");
    const std::string why = fix.empty() ? "" : " (" + join(fix, "; ") + ")";
    if (total > world) {  // Accelerator builds the mesh before it checks the sizes
      fix.insert(fix.begin(), "torch's init_device_mesh, for the parallelism_config sizes, whose product " +
                                  std::to_string(total) + " must be num_processes");
      refuse("RuntimeError: Mesh should not be bigger than default world size " + std::to_string(world) +
             ", but found " + std::to_string(total) + " ranks! (" + join(fix, "; ") + ")");
    }
    if (total != world)
      refuse("ValueError: ParallelismConfig total_size (" + std::to_string(total) + ") does not match num_processes (" +
             std::to_string(world) + "). Please adjust dp_replicate_size/ dp_shard_size/tp_size/cp_size/"
             "sp_size." + why);
    if (fsdp.v2() && shard == 1)
      refuse("ValueError: FSDP is enabled but the parallelism config has no dimension for FSDP to shard across (both "
             "`dp_shard_size` and `cp_size` are 1). This usually means a model that is already parallelized another "
             "way -- e.g. loaded with `DistributedConfig(tp_size=N)` or `enable_expert_parallel=True`, which makes the "
             "whole world size tensor/expert parallel -- was launched under an FSDP config. Either launch it without "
             "the FSDP config, or leave ranks for FSDP to use by lowering `tp_size`." + why);
    if (!fsdp.v2())
      refuse("ValueError: ParallelismConfig is only compatible DistributedType.FSDP (version 2) or "
             "DistributedType.Multi{Device} or DistributedType.DEEPSPEED, but got DistributedType.FSDP." + why);
  }

  // parallelism_config_tp_size other than 1, sizes that check_parallelism
  // let through. What Accelerate then shards is a model transformers
  // already split with its own plan
  // (from_pretrained(..., tp_plan="auto"); Accelerator.prepare_model checks
  // the model's tp size, _prepare_tp applies no plan): "plan": "model" on the
  // (dp_replicate, dp_shard, tp) mesh, the dims of size 1 left out as
  // Accelerate's _get_mesh leaves them out.
  void read_tensor_parallel(int64_t replicate, int64_t shard, int64_t tp) {
    TensorParallel section;
    section.degree = tp;
    section.from_model = true;
    section.dp_replicate = replicate;
    section.dp_shard = shard;
    out_.policy.tensor_parallel = section;
    note("parallelism_config", "dp_replicate " + std::to_string(replicate) + " x dp_shard " + std::to_string(shard) +
                                   " x tp " + std::to_string(tp) + " (the model's own tp plan)", true);
    // accelerator.py: Accelerator._prepare_tp, under FSDP2, on a model with DTensor parameters.
    out_.warnings.push_back(make_warning(
        "accelerate_tp_refused",
        "Accelerate would stop: ImportError: cannot import name 'ReplicateParallel' from "
        "'transformers.integrations.tensor_parallel' (Accelerator.prepare with FSDP2 and tp_size " +
            std::to_string(tp) + " imports it in _prepare_tp; transformers 5.24 no longer has it). Planned as the "
            "config sets it up: the model split by its own tp plan (from_pretrained(..., tp_plan=\"auto\")), then "
            "Accelerate's fully_shard calls on the data-parallel mesh dimensions"));
  }

  std::string file_;
  AccelerateOverrides overrides_;
  std::map<std::string, PyValue> top_;
  std::map<std::string, PyValue> fsdp_;
  std::vector<std::string> order_;  // fsdp_config keys in file order, prefixed
  AccelerateConfig out_;
};

}  // namespace

bool is_accelerate_config_json(const nlohmann::json& doc) {
  return doc.is_object() && (doc.contains("distributed_type") || doc.contains("fsdp_config") ||
                             doc.contains("compute_environment"));
}

std::optional<MixedPrecision> accelerate_dtypes(const std::string& mode, FsdpVersion version) {
  if (mode == "no") return std::nullopt;
  MixedPrecision p;
  const std::string d = mode == "fp16" ? "float16" : "bfloat16";
  p.param_dtype = p.reduce_dtype = p.buffer_dtype = d;
  if (version == FsdpVersion::V2) p.output_dtype = d;  // MixedPrecisionPolicy(..., output_dtype=d)
  return p;
}

AccelerateConfig parse_accelerate_config(const std::string& text, const std::string& file,
                                         const AccelerateOverrides& overrides) {
  return Reader(file, overrides).read(text);
}

AccelerateConfig parse_accelerate_config_json(const nlohmann::json& doc, const std::string& file,
                                              const AccelerateOverrides& overrides) {
  return Reader(file, overrides).read_json(doc);
}

void resolve_accelerate_config(AccelerateConfig& config, const ModuleTree& tree) {
  const std::vector<ModuleId> order = tree.preorder();
  if (config.auto_wrap_policy == "TRANSFORMER_BASED_WRAP" && !config.class_names) {
    // FullyShardedDataParallelPlugin.set_auto_wrap_policy (FSDP2: fsdp_utils.py:
    // fsdp2_prepare_auto_wrap_policy): list(model._no_split_modules), or [] for None, then the
    // same lookup as a class list in the config.
    const ModelRecord* record = tree.record();
    if (record && record->no_split_modules) {
      config.class_names = *record->no_split_modules;
      Warning w = make_warning("accelerate_config",
                               "fsdp_transformer_layer_cls_to_wrap not set: Accelerate wraps the classes in "
                               "model._no_split_modules, which " + record->source + " records: " +
                                   (config.class_names->empty() ? std::string("[] (none)") : join(*config.class_names)));
      w.classes = *config.class_names;
      config.warnings.push_back(std::move(w));
    } else {
      config.class_names = std::vector<std::string>{};
      config.warnings.push_back(make_warning(
          "accelerate_config_key",
          record ? "fsdp_transformer_layer_cls_to_wrap: not set: Accelerate wraps the classes in "
                   "model._no_split_modules, and " + record->source + " records that the model has none (None); "
                   "planned with no class, as Accelerate does (only the root unit). Name the classes in "
                   "fsdp_transformer_layer_cls_to_wrap or with --module-classes"
                 : "fsdp_transformer_layer_cls_to_wrap: not set: Accelerate wraps the classes in "
                   "model._no_split_modules, which this file does not record (fsdp-plan-export writes it into a "
                   ".pt2); planned with no class, as Accelerate does for a model without _no_split_modules (only "
                   "the root unit). Name the classes in fsdp_transformer_layer_cls_to_wrap or with "
                   "--module-classes"));
    }
    config.policy.module_classes = config.class_names;
  }
  if (config.class_names) {
    // get_module_class_from_name: the first module in pre-order whose bare
    // class name equals the name; then isinstance() against that class.
    std::vector<std::string> resolved;
    std::set<std::string> model_classes;
    std::map<std::string, std::set<std::string>> by_short;  // bare name -> qualified classes
    for (ModuleId m : order) {
      std::string q = demangle(tree.module(m).type_name);
      model_classes.insert(std::string(short_name(q)));
      by_short[std::string(short_name(q))].insert(q);
    }
    for (const auto& name : *config.class_names) {
      std::string found;
      for (ModuleId m : order) {
        std::string q = demangle(tree.module(m).type_name);
        if (short_name(q) == name) {
          found = q;
          break;
        }
      }
      if (found.empty()) {
        std::vector<std::string> candidates(model_classes.begin(), model_classes.end());
        auto near = closest(name, candidates);
        Warning w = make_warning("accelerate_class_missing",
                                 "Accelerate would stop: ValueError: Could not find the transformer layer class " +
                                     name + " in the model." +
                                     (near.empty() ? "" : " Closest class names in the model: " + join(near) + "."));
        w.classes = {name};
        w.suggestions = std::move(near);
        config.warnings.push_back(std::move(w));
        continue;
      }
      // The bare name is exact unless another class in the model shares it.
      resolved.push_back(by_short[name].size() > 1 ? found : name);
    }
    config.policy.module_classes = resolved;
  }
  if (config.ignored_modules_regex) {
    // Accelerate: [m for name, m in named_modules() if re.fullmatch(regex, name)].
    std::string why;
    const std::unique_ptr<RE2> re = compile_python_regex(*config.ignored_modules_regex, why);
    if (!re) throw InputError("fsdp_ignored_modules", why);  // parse_accelerate_config checked it
    std::vector<std::string> paths;
    for (ModuleId m : order) {
      std::string path = tree.path(m);
      if (RE2::FullMatch(path, *re)) paths.push_back(path);
    }
    if (paths.empty()) {
      config.warnings.push_back(make_warning("accelerate_config_key",
                                             "fsdp_ignored_modules: \"" + quoted_input(*config.ignored_modules_regex) +
                                                 "\" fully matches no module path, so Accelerate ignores no module"));
    }
    config.policy.ignored_modules = paths;
  }
}

std::optional<ActivationCheckpointing> accelerate_activation_checkpointing(const AccelerateConfig& config,
                                                                          const ModuleTree& tree,
                                                                          FsdpVersion version,
                                                                          std::vector<Warning>& warnings) {
  if (!config.activation_checkpointing) return std::nullopt;
  if (config.activation_checkpointing_offload)
    warnings.push_back(make_warning(
        "accelerate_config_key",
        "fsdp_activation_checkpointing_offload: offload_wrapper moves each checkpointed layer's saved input to "
        "pinned host memory; the plan counts it on the device (an upper bound by those inputs)"));
  const bool v2 = version == FsdpVersion::V2;
  ActivationCheckpointing ac;
  if (config.auto_wrap_policy == "TRANSFORMER_BASED_WRAP") {
    // The classes resolve_accelerate_config found (the policy's module_classes).
    if (config.policy.module_classes) ac.module_classes = *config.policy.module_classes;
    if (ac.module_classes.empty()) {
      warnings.push_back(make_warning("accelerate_config_key",
                                      "fsdp_activation_checkpointing: no transformer layer class to checkpoint, so "
                                      "Accelerate checkpoints no module"));
      return std::nullopt;
    }
    return ac;
  }
  const int64_t min_params = config.policy.min_num_params.value_or(0);
  const bool sized = config.auto_wrap_policy == "SIZE_BASED_WRAP" && min_params > 0;
  if (v2) {
    if (!sized) {
      warnings.push_back(make_warning(
          "accelerate_ac_refused",
          "Accelerate would stop: TypeError: 'NoneType' object is not callable (fsdp2_apply_ac calls the FSDP2 "
          "auto-wrap policy, which " +
              std::string(config.auto_wrap_policy == "NO_WRAP" ? "fsdp_auto_wrap_policy NO_WRAP"
                                                               : "fsdp_min_num_params 0") +
              " leaves None); set fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP with the layer class, or turn "
              "fsdp_activation_checkpointing off. Planned without activation checkpointing"));
      return std::nullopt;
    }
    // fsdp2_prepare_auto_wrap_policy, size: sum(p.numel() for p in module.parameters()) > min_num_params,
    // on every module but the root; an inner one adds nothing to its checkpointed parent.
    const std::vector<int64_t> numel = subtree_numel(tree, std::vector<bool>(tree.num_tensors(), false));
    std::vector<bool> inside(tree.num_modules(), false);
    for (ModuleId m : tree.preorder()) {
      if (m == 0) continue;
      const ModuleId parent = tree.module(m).parent;
      if (parent >= 0 && inside[static_cast<size_t>(parent)]) {
        inside[static_cast<size_t>(m)] = true;
        continue;
      }
      if (numel[static_cast<size_t>(m)] > min_params) {
        ac.modules.push_back(tree.path(m));
        inside[static_cast<size_t>(m)] = true;
      }
    }
    if (ac.modules.empty()) return std::nullopt;
    return ac;
  }
  if (!sized) {
    // apply_activation_checkpointing(model, auto_wrap_policy=None): check_fn's default wraps
    // every child, first the FullyShardedDataParallel root's own child: the whole model.
    warnings.push_back(make_warning(
        "accelerate_config_key",
        "fsdp_activation_checkpointing with " +
            std::string(config.auto_wrap_policy == "NO_WRAP" ? "fsdp_auto_wrap_policy NO_WRAP"
                                                             : "fsdp_min_num_params 0") +
            ": apply_activation_checkpointing gets no policy and checkpoints the whole model (the FSDP root's "
            "child), which saves nothing: its recompute in backward holds what a plain forward does"));
    ac.modules.push_back("");
    return ac;
  }
  warnings.push_back(make_warning(
      "accelerate_config_key",
      "fsdp_activation_checkpointing with SIZE_BASED_WRAP: Accelerate checkpoints by size on the already sharded "
      "model (size_based_auto_wrap_policy over the flat parameters' local shards); the plan checkpoints the FSDP "
      "units' modules instead (an estimate)"));
  // The recursive size rule FSDP1 wrapped the unsharded model by (wrap.py: _recursive_wrap with
  // size_based_auto_wrap_policy): children first; a module is wrapped when what its wrapped
  // descendants leave is at least min_num_params; ModuleList and ModuleDict never are.
  const std::vector<int64_t> numel = subtree_numel(tree, std::vector<bool>(tree.num_tensors(), false));
  std::vector<int64_t> wrapped_below(tree.num_modules(), 0);
  std::vector<bool> wrapped(tree.num_modules(), false);
  for (ModuleId m : tree.postorder()) {
    const Module& mod = tree.module(m);
    for (ModuleId c : mod.children)
      wrapped_below[static_cast<size_t>(m)] +=
          wrapped[static_cast<size_t>(c)] ? numel[static_cast<size_t>(c)] : wrapped_below[static_cast<size_t>(c)];
    const std::string cls(short_name(demangle(mod.type_name)));
    if (m != 0 && numel[static_cast<size_t>(m)] - wrapped_below[static_cast<size_t>(m)] >= min_params &&
        cls != "ModuleList" && cls != "ModuleDict")
      wrapped[static_cast<size_t>(m)] = true;
  }
  std::vector<bool> inside(tree.num_modules(), false);
  for (ModuleId m : tree.preorder()) {
    const ModuleId parent = tree.module(m).parent;
    if (parent >= 0 && (inside[static_cast<size_t>(parent)] || wrapped[static_cast<size_t>(parent)]))
      inside[static_cast<size_t>(m)] = true;
    if (wrapped[static_cast<size_t>(m)] && !inside[static_cast<size_t>(m)]) ac.modules.push_back(tree.path(m));
  }
  if (ac.modules.empty()) return std::nullopt;
  return ac;
}

}  // namespace fsdp_plan
