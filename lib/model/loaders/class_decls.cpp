#include "model/loaders/class_decls.h"

#include <algorithm>
#include <iterator>
#include <cctype>
#include <stdexcept>
#include <string_view>
#include <unordered_set>

namespace fsdp_plan {
namespace {

bool starts_with(std::string_view s, size_t pos, std::string_view prefix) {
  return pos <= s.size() && s.substr(pos, prefix.size()) == prefix;
}

bool is_ident_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

// Reads the quoted string literal starting at line[pos] (a quote), as the
// TorchScript printer writes it; advances pos past the closing quote.
std::string read_string_literal(std::string_view line, size_t& pos) {
  const char quote = line.at(pos++);
  std::string out;
  while (pos < line.size() && line[pos] != quote) {
    char c = line[pos++];
    if (c == '\\' && pos < line.size()) {
      char e = line[pos++];
      switch (e) {
        case 'n': c = '\n'; break;
        case 't': c = '\t'; break;
        case 'r': c = '\r'; break;
        case 'x':
          if (pos + 2 > line.size()) throw std::runtime_error("bad escape in string literal");
          c = static_cast<char>(std::stoi(std::string(line.substr(pos, 2)), nullptr, 16));
          pos += 2;
          break;
        default: c = e; break;  // \\ \" \'
      }
    }
    out.push_back(c);
  }
  if (pos >= line.size()) throw std::runtime_error("unterminated string literal: " + std::string(line));
  ++pos;  // closing quote
  return out;
}

// `["a", "b", ]` -> {a, b}
std::unordered_set<std::string> read_name_list(std::string_view line, size_t pos) {
  std::unordered_set<std::string> names;
  pos = line.find('[', pos);
  if (pos == std::string_view::npos) throw std::runtime_error("expected a list: " + std::string(line));
  ++pos;
  while (pos < line.size() && line[pos] != ']') {
    if (line[pos] == '"' || line[pos] == '\'') {
      names.insert(read_string_literal(line, pos));
    } else {
      ++pos;  // spaces and commas
    }
  }
  return names;
}

}  // namespace

size_t code_nesting(const std::string& source) {
  size_t depth = 0, deepest = 0;
  for (const char c : source) {
    if (c == '(' || c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > kMaxCodeNesting) break;
    } else if ((c == ')' || c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

const ClassDecl* find_class(const ClassDecls& decls, const std::string& name) {
  for (const auto& [n, d] : decls)
    if (n == name) return &d;
  return nullptr;
}

ClassDecls parse_class_decls(const std::string& source) {
  ClassDecls classes;
  ClassDecl* cur = nullptr;
  // Flags are given by name before or after the attribute lines; apply at the end.
  std::unordered_set<std::string> params, buffers;
  auto finish = [&] {
    if (cur) {
      for (auto& a : cur->attributes) {
        a.is_param = params.count(a.name) > 0;
        a.is_buffer = buffers.count(a.name) > 0;
      }
      // Each flag names an attribute the class declares.
      for (const auto* names : {&params, &buffers})
        for (const auto& n : *names)
          if (std::none_of(cur->attributes.begin(), cur->attributes.end(), [&](const AttributeDecl& a) { return a.name == n; }))
            throw std::runtime_error((names == &params ? "__parameters__" : std::string("__buffers__")) + " names " + n +
                                     ", which the class does not declare");
    }
    cur = nullptr;
    params.clear();
    buffers.clear();
  };

  // Lines are views: a mangled-class file has one class per module, and only
  // names and types are kept.
  const std::string_view text = source;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;

    if (line[0] != ' ') {  // top level: a class header ends the previous class
      finish();
      if (starts_with(line, 0, "class ")) {
        size_t p = 6;
        size_t name_end = p;
        while (name_end < line.size() && is_ident_char(line[name_end])) ++name_end;
        if (name_end == p)
          throw std::runtime_error("malformed class header \"" + std::string(line.substr(0, 80)) + "\"");
        // python_print.cpp writes `class N:`, `class N(Module):`, and
        // (Interface), (ModuleInterface), (NamedTuple), (Enum).
        const std::string_view base = line.substr(name_end);
        static const std::string_view kBases[] = {":", "(Module):", "(Interface):", "(ModuleInterface):",
                                                  "(NamedTuple):", "(Enum):"};
        if (std::find(std::begin(kBases), std::end(kBases), base) == std::end(kBases))
          throw std::runtime_error("malformed class header \"" + std::string(line.substr(0, 80)) + "\"");
        std::string name(line.substr(p, name_end - p));
        auto it = std::find_if(classes.begin(), classes.end(), [&](const auto& c) { return c.first == name; });
        if (it == classes.end()) it = classes.emplace(classes.end(), std::move(name), ClassDecl{});
        ClassDecl& decl = it->second;
        decl = ClassDecl{};  // declared again: the later body wins
        decl.is_module = base == "(Module):";
        decl.is_interface = base == "(Interface):" || base == "(ModuleInterface):";
        cur = &decl;
      } else if (!starts_with(line, 0, "def ") && !starts_with(line, 0, "@") && line[0] != '#' &&
                 !starts_with(line, 0, "import ") && !starts_with(line, 0, "from ")) {
        throw std::runtime_error("malformed line \"" + std::string(line.substr(0, 80)) + "\"");
      }
      continue;
    }
    // Class-level statements are indented by exactly two spaces; deeper lines
    // are method bodies or continuations.
    if (!cur || line.size() < 3 || line[1] != ' ' || line[2] == ' ') continue;
    const size_t p = 2;
    if (starts_with(line, p, "def ")) {
      if (starts_with(line, p, "def __setstate__(")) cur->has_setstate = true;
    } else if (starts_with(line, p, "__parameters__ ")) {
      params = read_name_list(line, p);
    } else if (starts_with(line, p, "__buffers__ ")) {
      buffers = read_name_list(line, p);
    } else if (starts_with(line, p, "__annotations__[")) {
      // __annotations__["0"] = Type: an attribute whose name is not an identifier.
      size_t q = p + 16;
      if (q >= line.size() || (line[q] != '"' && line[q] != '\'')) {
        throw std::runtime_error("malformed attribute: " + std::string(line));
      }
      std::string name = read_string_literal(line, q);
      if (!starts_with(line, q, "] = ") || q + 4 >= line.size())
        throw std::runtime_error("malformed attribute: " + std::string(line));
      cur->attributes.push_back({std::move(name), std::string(line.substr(q + 4)), false, false});
    } else if (is_ident_char(line[p]) && !std::isdigit(static_cast<unsigned char>(line[p]))) {
      // `name : Type` is an attribute; `name : Final[T] = v` a constant;
      // `__forward_hooks__ = [...]` and friends have no annotation.
      size_t name_end = p;
      while (name_end < line.size() && is_ident_char(line[name_end])) ++name_end;
      if (starts_with(line, name_end, " = ") || line.substr(p) == "pass") continue;
      if (!starts_with(line, name_end, " : ") || name_end + 3 >= line.size())
        throw std::runtime_error("malformed class attribute \"" + std::string(line.substr(0, 80)) + "\"");
      // Types never contain '=', so an '=' after the annotation means a value.
      if (line.find('=', name_end) != std::string_view::npos) continue;
      cur->attributes.push_back(
          {std::string(line.substr(p, name_end - p)), std::string(line.substr(name_end + 3)), false, false});
    } else if (line[p] != '@') {
      throw std::runtime_error("malformed class body \"" + std::string(line.substr(0, 80)) + "\"");
    }
  }
  finish();
  return classes;
}

}  // namespace fsdp_plan
