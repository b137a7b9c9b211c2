#include "accelerate/python_regex.h"

#include <re2/re2.h>

#include <cctype>
#include <cstring>
#include <string>

namespace fsdp_plan {
namespace {

// Python's re.compile itself stops with RecursionError near 495 nested groups.
constexpr int kMaxRegexNesting = 100;

bool hex_digits(const std::string& s, size_t at, size_t n) {
  if (at + n > s.size()) return false;
  for (size_t i = at; i < at + n; ++i)
    if (!std::isxdigit(static_cast<unsigned char>(s[i]))) return false;
  return true;
}

// One pass over the Python pattern: each step reads the construct at `i`,
// writes its RE2 spelling to `out` and moves past it, or sets `why` (and the
// translation stops) where RE2 cannot run it.
struct RegexTranslation {
  explicit RegexTranslation(const std::string& pattern) : p(pattern) {}

  const std::string& p;
  size_t i = 0;
  std::string out;
  int depth = 0;          // open groups
  bool in_class = false;  // inside [...]
  std::string why;

  void refuse(const std::string& what) { why = what; }
  void refuse_construct(const std::string& what) {
    why = "uses " + what + ", which Python's re accepts but fsdp-plan's matcher (RE2: linear time, bounded "
          "memory) cannot run";
  }
  // After a quantifier: a '+' makes it possessive (Python 3.11), which RE2 lacks.
  bool possessive_after(size_t at) const { return at < p.size() && p[at] == '+'; }
};

// \X: RE2 spells most escapes as Python does; \Z, \uXXXX and \UXXXXXXXX differ.
void translate_escape(RegexTranslation& t) {
  const std::string& p = t.p;
  if (t.i + 1 >= p.size()) return t.refuse("ends with a lone backslash (Python: bad escape (end of pattern))");
  const char d = p[t.i + 1];
  if (d >= '1' && d <= '9' && !t.in_class) return t.refuse_construct(std::string("a backreference (\\") + d + ")");
  if (d == 'Z') {
    t.out += "\\z";  // Python's \Z is the end of the string, RE2's \z
  } else if ((d == 'u' && hex_digits(p, t.i + 2, 4)) || (d == 'U' && hex_digits(p, t.i + 2, 8))) {
    const size_t n = d == 'u' ? 4 : 8;
    t.out += "\\x{" + p.substr(t.i + 2, n) + "}";
    t.i += 2 + n;
    return;
  } else if (d == 'N') {
    return t.refuse_construct("a named character (\\N{...})");
  } else {
    t.out += p.substr(t.i, 2);
  }
  t.i += 2;
}

// [...]: copied as it is; a leading ^ and a leading ] (a literal) with the bracket.
void open_class(RegexTranslation& t) {
  const std::string& p = t.p;
  t.in_class = true;
  t.out += p[t.i++];
  if (t.i < p.size() && p[t.i] == '^') t.out += p[t.i++];
  if (t.i < p.size() && p[t.i] == ']') t.out += p[t.i++];  // a leading ] is a literal
}

void class_char(RegexTranslation& t) {
  if (t.p[t.i] == ']') t.in_class = false;
  t.out += t.p[t.i++];
}

// Inline flags, alone ((?i)) or scoped ((?i:...)); RE2 has i, m, s. False
// where the text after "(?" is not flags (a named group, say).
bool inline_flags(RegexTranslation& t) {
  const std::string& p = t.p;
  size_t j = t.i + 2;
  std::string flags;
  while (j < p.size() && std::strchr("aiLmsux-", p[j]) && p[j] != '\0') flags += p[j++];
  if (flags.empty() || j >= p.size() || (p[j] != ')' && p[j] != ':')) return false;
  if (flags.find('x') != std::string::npos) {
    t.refuse_construct("verbose mode ((?x))");
    return true;
  }
  if (flags.find('L') != std::string::npos) {
    t.refuse_construct("locale matching ((?L))");
    return true;
  }
  std::string kept;  // a, u: ASCII or Unicode classes, the same on ASCII module paths
  for (char f : flags)
    if (f != 'a' && f != 'u') kept += f;
  if (p[j] == ')') {
    --t.depth;
    if (!kept.empty() && kept != "-") t.out += "(?" + kept + ")";
  } else {
    t.out += kept.empty() || kept == "-" ? "(?:" : "(?" + kept + ":";
  }
  t.i = j + 1;
  return true;
}

// The "(?" construct at `i` that RE2 lacks, by name; "" for the others.
std::string missing_construct(const std::string& p, size_t i) {
  const std::string rest = p.substr(i + 2, 2);
  if (rest.rfind("=", 0) == 0 || rest.rfind("!", 0) == 0) return "a lookahead (" + p.substr(i, 3) + "...)";
  if (rest == "<=" || rest == "<!") return "a lookbehind (" + p.substr(i, 4) + "...)";
  if (rest == "P=") return "a backreference by name ((?P=...))";
  if (rest.rfind(">", 0) == 0) return "an atomic group ((?>...))";
  if (rest.rfind("(", 0) == 0) return "a conditional group ((?(...)...))";
  return "";
}

// "(?" constructs: those RE2 lacks refused by name, a comment skipped, inline
// flags translated. False where the group is copied as it is ((?:, (?P<).
bool extension_group(RegexTranslation& t) {
  const std::string& p = t.p;
  if (const std::string missing = missing_construct(p, t.i); !missing.empty()) {
    t.refuse_construct(missing);
    return true;
  }
  if (p.substr(t.i + 2, 2).rfind("#", 0) == 0) {  // a comment: Python skips it up to the first )
    const size_t close = p.find(')', t.i);
    if (close == std::string::npos) {
      t.refuse("has a comment (?#... that is never closed");
      return true;
    }
    --t.depth;
    t.i = close + 1;
    return true;
  }
  return inline_flags(t);
}

void open_group(RegexTranslation& t) {
  if (++t.depth > kMaxRegexNesting)
    return t.refuse("nests groups more than " + std::to_string(kMaxRegexNesting) +
                    " deep (Python's re.compile stops with RecursionError near 495)");
  if (t.p.compare(t.i, 2, "(?") == 0 && extension_group(t)) return;
  t.out += t.p[t.i++];
}

void close_group(RegexTranslation& t) {
  --t.depth;
  t.out += t.p[t.i++];
}

// * + ?, lazy (a ? after) or possessive (a + after, refused).
void quantifier(RegexTranslation& t) {
  const std::string& p = t.p;
  const char c = p[t.i];
  t.out += c;
  ++t.i;
  if (t.i < p.size() && p[t.i] == '?') t.out += p[t.i++];  // lazy
  else if (t.possessive_after(t.i)) t.refuse_construct(std::string("a possessive quantifier (") + c + "+)");
}

// {m}, {m,}, {,n}, {m,n} is a quantifier; anything else a literal brace.
void braces(RegexTranslation& t) {
  const std::string& p = t.p;
  const size_t i = t.i;
  size_t j = i + 1;
  std::string lo, hi;
  while (j < p.size() && std::isdigit(static_cast<unsigned char>(p[j]))) lo += p[j++];
  bool comma = j < p.size() && p[j] == ',';
  if (comma) {
    ++j;
    while (j < p.size() && std::isdigit(static_cast<unsigned char>(p[j]))) hi += p[j++];
  }
  if (j < p.size() && p[j] == '}' && (!lo.empty() || (comma && !hi.empty()))) {
    for (const std::string& n : {lo, hi})
      if (!n.empty() && (n.size() > 4 || std::stoi(n) > 1000))
        return t.refuse_construct("a repetition count above 1000 (" + p.substr(i, j + 1 - i) + ")");
    t.out += "{" + (lo.empty() ? "0" : lo) + (comma ? "," + hi : "") + "}";
    t.i = j + 1;
    if (t.i < p.size() && p[t.i] == '?') t.out += p[t.i++];
    else if (t.possessive_after(t.i)) t.refuse_construct("a possessive quantifier ({...}+)");
    return;
  }
  t.out += "\\{";
  ++t.i;
}

}  // namespace

std::string python_regex_to_re2(const std::string& pattern, std::string& why) {
  RegexTranslation t(pattern);
  while (t.i < pattern.size() && t.why.empty()) {
    const char c = pattern[t.i];
    if (c == '\\') translate_escape(t);
    else if (t.in_class) class_char(t);
    else if (c == '[') open_class(t);
    else if (c == '(') open_group(t);
    else if (c == ')') close_group(t);
    else if (c == '*' || c == '+' || c == '?') quantifier(t);
    else if (c == '{') braces(t);
    else t.out += pattern[t.i++];
  }
  if (!t.why.empty()) {
    why = t.why;
    return "";
  }
  return t.out;
}

std::unique_ptr<re2::RE2> compile_python_regex(const std::string& pattern, std::string& why) {
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

}  // namespace fsdp_plan
