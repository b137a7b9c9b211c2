#include "model/sym_expr.h"

#include <cctype>

namespace fsdp_plan {
namespace {

using int128 = __int128;

constexpr int64_t kI64Max = INT64_MAX;
constexpr int64_t kI64Min = INT64_MIN;

struct FunctionInfo {
  const char* name;
  ExprOp op;
  int min_args, max_args;  // -1: any number
};

// torch/_export/serde/serialize.py: GraphModuleDeserializer.sympy_functions,
// plus sympy's own Integer, Rational, Symbol, Add, Mul, Pow, Min, Max, Mod, Abs.
constexpr FunctionInfo kFunctions[] = {
    {"Integer", ExprOp::Integer, 1, 1},
    {"Rational", ExprOp::Rational, 2, 2},
    {"Symbol", ExprOp::Symbol, 1, 1},
    {"Add", ExprOp::Add, 1, -1},
    {"Mul", ExprOp::Mul, 1, -1},
    {"Pow", ExprOp::Pow, 2, 2},
    {"PowByNatural", ExprOp::Pow, 2, 2},
    {"Min", ExprOp::Min, 1, -1},
    {"Max", ExprOp::Max, 1, -1},
    {"FloorDiv", ExprOp::FloorDiv, 2, 2},
    {"CleanDiv", ExprOp::FloorDiv, 2, 2},
    {"CeilDiv", ExprOp::CeilDiv, 2, 2},
    {"Mod", ExprOp::Mod, 2, 2},
    {"PythonMod", ExprOp::Mod, 2, 2},
    {"ModularIndexing", ExprOp::ModularIndexing, 3, 3},
    {"IntTrueDiv", ExprOp::TrueDiv, 2, 2},
    {"FloatTrueDiv", ExprOp::TrueDiv, 2, 2},
    {"CeilToInt", ExprOp::CeilToInt, 1, 1},
    {"FloorToInt", ExprOp::FloorToInt, 1, 1},
    {"TruncToInt", ExprOp::TruncToInt, 1, 1},
    {"TruncToFloat", ExprOp::TruncToInt, 1, 1},
    {"RoundToInt", ExprOp::RoundToInt, 1, 1},
    {"Abs", ExprOp::Abs, 1, 1},
    {"Identity", ExprOp::Identity, 1, 1},
    {"ToFloat", ExprOp::Identity, 1, 1},
    {"LShift", ExprOp::LShift, 2, 2},
    {"RShift", ExprOp::RShift, 2, 2},
};

const FunctionInfo* find_function(std::string_view name) {
  for (const auto& f : kFunctions)
    if (name == f.name) return &f;
  return nullptr;
}

int128 gcd128(int128 a, int128 b) {
  if (a < 0) a = -a;
  if (b < 0) b = -b;
  while (b != 0) {
    int128 t = a % b;
    a = b;
    b = t;
  }
  return a;
}

[[noreturn]] void overflow() { throw ExprError("a value beyond 64-bit integers"); }
[[noreturn]] void div_zero() { throw ExprError("a division by zero"); }

// floor(n / d) for d > 0.
int128 floor_div(int128 n, int128 d) {
  int128 q = n / d;
  if ((n % d != 0) && (n < 0)) --q;
  return q;
}

}  // namespace

// ---------------------------------------------------------------------------- parsing

class SymExprPool::Parser {
 public:
  Parser(SymExprPool& pool, std::string_view text, const std::function<SymbolId(std::string_view)>& symbol)
      : pool_(pool), text_(text), symbol_(symbol) {}

  int32_t parse() {
    const int32_t root = expr(0);
    skip_space();
    if (pos_ != text_.size()) fail("unexpected text after the expression");
    return root;
  }

 private:
  // What one argument of a call is before its function sees it.
  struct Item {
    enum Kind { Expr, String, Keyword } kind = Expr;
    int32_t node = -1;
    std::string_view text;
  };

  [[noreturn]] void fail(const std::string& what) const {
    throw ExprError("malformed size expression (" + what + " at character " + std::to_string(pos_ + 1) + ")");
  }

  void skip_space() {
    while (pos_ < text_.size() && text_[pos_] == ' ') ++pos_;
  }

  bool eat(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  std::string_view identifier() {
    skip_space();
    const size_t start = pos_;
    while (pos_ < text_.size() && (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
    if (start == pos_ || std::isdigit(static_cast<unsigned char>(text_[start]))) {
      pos_ = start;
      fail("expected a name");
    }
    return text_.substr(start, pos_ - start);
  }

  int32_t add_node(ExprOp op, int64_t a = 0, int64_t b = 1) {
    if (pool_.nodes_.size() >= (size_t{1} << 24)) fail("too many expression nodes");
    pool_.nodes_.push_back(Node{op, 0, 0, a, b, {}});
    return static_cast<int32_t>(pool_.nodes_.size() - 1);
  }

  int32_t integer() {
    skip_space();
    const size_t start = pos_;
    bool neg = false;
    if (pos_ < text_.size() && (text_[pos_] == '-' || text_[pos_] == '+')) neg = text_[pos_++] == '-';
    if (pos_ >= text_.size() || !std::isdigit(static_cast<unsigned char>(text_[pos_]))) fail("expected a number");
    int128 v = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      v = v * 10 + (text_[pos_++] - '0');
      if (v > int128(kI64Max) + 1) {
        pos_ = start;
        fail("a number beyond 64-bit integers");
      }
    }
    if (neg) v = -v;
    if (v > kI64Max) {
      pos_ = start;
      fail("a number beyond 64-bit integers");
    }
    return add_node(ExprOp::Integer, static_cast<int64_t>(v));
  }

  std::string_view quoted() {
    const char q = text_[pos_++];
    const size_t start = pos_;
    while (pos_ < text_.size() && text_[pos_] != q) {
      if (text_[pos_] == '\\') fail("an escape in a quoted name");
      ++pos_;
    }
    if (pos_ >= text_.size()) fail("an unclosed quote");
    return text_.substr(start, pos_++ - start);
  }

  Item item(int depth) {
    skip_space();
    if (pos_ < text_.size() && (text_[pos_] == '\'' || text_[pos_] == '"')) return {Item::String, -1, quoted()};
    // keyword=value (Symbol's positive=True, integer=True)
    const size_t save = pos_;
    if (pos_ < text_.size() && (std::isalpha(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) {
      std::string_view name = identifier();
      if (eat('=')) {
        skip_space();
        if (pos_ < text_.size() && (text_[pos_] == '\'' || text_[pos_] == '"')) {
          quoted();
        } else {
          expr(depth + 1);
        }
        return {Item::Keyword, -1, name};
      }
      pos_ = save;
    }
    return {Item::Expr, expr(depth + 1), {}};
  }

  int32_t expr(int depth) {
    if (depth > kMaxExprDepth) fail("nested deeper than " + std::to_string(kMaxExprDepth));
    skip_space();
    if (pos_ >= text_.size()) fail("unexpected end");
    const char c = text_[pos_];
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '-' || c == '+') return integer();
    const size_t name_at = pos_;
    const std::string_view name = identifier();
    if (!eat('(')) {
      // A bare name: sympy's true, false, oo, zoo, nan; nothing torch writes for a size.
      const int32_t n = add_node(ExprOp::Unsupported);
      pool_.nodes_[static_cast<size_t>(n)].name = std::string(name);
      return n;
    }
    std::vector<Item> items;
    if (!eat(')')) {
      do {
        items.push_back(item(depth));
      } while (eat(','));
      if (!eat(')')) fail("expected ')' or ','");
    }
    std::vector<int32_t> args;
    std::string_view string_arg;
    int strings = 0;
    for (const Item& it : items) {
      if (it.kind == Item::Expr) args.push_back(it.node);
      if (it.kind == Item::String) {
        string_arg = it.text;
        ++strings;
      }
    }
    const FunctionInfo* f = find_function(name);
    if (!f) {
      const int32_t n = add_node(ExprOp::Unsupported);
      pool_.nodes_[static_cast<size_t>(n)].name = std::string(name);
      return n;
    }
    // Plain copies: a lambda of this (externally linked) class may not
    // capture the anonymous namespace's FunctionInfo (-Wsubobject-linkage).
    const std::string fname = f->name;
    const int min_args = f->min_args, max_args = f->max_args;
    const ExprOp fop = f->op;
    auto arity = [&](size_t n) {
      if (static_cast<int>(n) < min_args || (max_args >= 0 && static_cast<int>(n) > max_args)) {
        pos_ = name_at;
        fail(fname + " with " + std::to_string(n) + " arguments");
      }
    };
    if (fop == ExprOp::Symbol) {
      arity(static_cast<size_t>(strings));
      if (!args.empty()) fail("Symbol with an expression argument");
      if (string_arg.empty() || string_arg.size() > 256) fail("a symbol name that is empty or too long");
      for (char ch : string_arg)
        if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') fail("a symbol name with odd characters");
      return add_node(ExprOp::Symbol, symbol_(string_arg));
    }
    if (strings) fail(fname + " with a quoted argument");
    arity(args.size());
    auto literal = [&](int32_t n) {
      const Node& nd = pool_.nodes_[static_cast<size_t>(n)];
      if (nd.op != ExprOp::Integer) fail(fname + " of something other than a number");
      return nd.a;
    };
    if (fop == ExprOp::Integer) {
      literal(args[0]);
      return args[0];
    }
    if (fop == ExprOp::Rational) {
      const int64_t p = literal(args[0]), q = literal(args[1]);
      if (q == 0) fail("Rational with a zero denominator");
      return add_node(ExprOp::Rational, p, q);
    }
    const int32_t n = add_node(fop);
    Node& nd = pool_.nodes_[static_cast<size_t>(n)];
    nd.first = static_cast<int32_t>(pool_.args_.size());
    nd.count = static_cast<int32_t>(args.size());
    pool_.args_.insert(pool_.args_.end(), args.begin(), args.end());
    return n;
  }

  SymExprPool& pool_;
  std::string_view text_;
  const std::function<SymbolId(std::string_view)>& symbol_;
  size_t pos_ = 0;
};

ExprId SymExprPool::parse(std::string_view text, const std::function<SymbolId(std::string_view)>& symbol) {
  if (text.size() > kMaxExprText) throw ExprError("a size expression longer than " + std::to_string(kMaxExprText) + " characters");
  std::string key(text);
  auto it = by_text_.find(key);
  if (it != by_text_.end()) return it->second;
  const size_t nodes = nodes_.size(), args = args_.size();
  int32_t root;
  try {
    root = Parser(*this, text, symbol).parse();
  } catch (...) {
    nodes_.resize(nodes);
    args_.resize(args);
    throw;
  }
  const auto id = static_cast<ExprId>(roots_.size());
  roots_.push_back(root);
  sources_.push_back(key);
  by_text_.emplace(std::move(key), id);
  return id;
}

std::optional<SymbolId> SymExprPool::as_symbol(ExprId e) const {
  const Node& n = nodes_[static_cast<size_t>(roots_[static_cast<size_t>(e)])];
  if (n.op == ExprOp::Symbol) return static_cast<SymbolId>(n.a);
  return std::nullopt;
}

std::vector<SymbolId> SymExprPool::symbols(ExprId e) const {
  std::vector<SymbolId> out;
  std::vector<int32_t> stack{roots_[static_cast<size_t>(e)]};
  while (!stack.empty()) {
    const Node& n = nodes_[static_cast<size_t>(stack.back())];
    stack.pop_back();
    if (n.op == ExprOp::Symbol) {
      bool seen = false;
      for (SymbolId s : out) seen |= s == n.a;
      if (!seen) out.push_back(static_cast<SymbolId>(n.a));
    }
    for (int32_t i = n.count - 1; i >= 0; --i) stack.push_back(args_[static_cast<size_t>(n.first + i)]);
  }
  return out;
}

// ---------------------------------------------------------------------------- evaluation

namespace {

struct R {
  int128 num, den;  // den > 0, in lowest terms, both within int64
};

R make(int128 num, int128 den) {
  if (den == 0) div_zero();
  if (den < 0) {
    num = -num;
    den = -den;
  }
  const int128 g = gcd128(num, den);
  if (g > 1) {
    num /= g;
    den /= g;
  }
  if (num > kI64Max || num < kI64Min || den > kI64Max) overflow();
  return {num, den};
}

R add(R a, R b) { return make(a.num * b.den + b.num * a.den, a.den * b.den); }
R mul(R a, R b) { return make(a.num * b.num, a.den * b.den); }
R divide(R a, R b) {
  if (b.num == 0) div_zero();
  return make(a.num * b.den, a.den * b.num);
}
int128 floor_of(R a) { return floor_div(a.num, a.den); }
bool less(R a, R b) { return a.num * b.den < b.num * a.den; }
R whole(int128 v) { return make(v, 1); }

int64_t integer_of(R a, const char* what) {
  if (a.den != 1) throw ExprError(std::string(what) + " of a fraction");
  return static_cast<int64_t>(a.num);
}

R power(R base, R exp) {
  const int64_t e = integer_of(exp, "a power");
  R result{1, 1};
  if (e == 0) return result;
  const bool invert = e < 0;
  // |e| up to 63 steps suffice: any base other than 0, 1, -1 overflows past that.
  uint64_t k = invert ? static_cast<uint64_t>(-(e + 1)) + 1 : static_cast<uint64_t>(e);
  const bool unit = (base.num == 1 || base.num == -1 || base.num == 0) && base.den == 1;
  if (!unit && k > 126) overflow();
  if (unit) {
    if (base.num == 0) {
      if (invert) div_zero();
      return whole(0);
    }
    return whole(base.num == -1 && (k & 1) ? -1 : 1);
  }
  R b = base;
  while (k) {
    if (k & 1) result = mul(result, b);
    k >>= 1;
    if (k) b = mul(b, b);
  }
  return invert ? divide(R{1, 1}, result) : result;
}

}  // namespace

SymExprPool::Rat SymExprPool::eval(int32_t node, const std::vector<std::optional<int64_t>>& values,
                                   SymbolId* missing) const {
  const Node& n = nodes_[static_cast<size_t>(node)];
  auto arg = [&](int i) {
    Rat r = eval(args_[static_cast<size_t>(n.first + i)], values, missing);
    return R{r.num, r.den};
  };
  auto out = [](R r) { return Rat{static_cast<int64_t>(r.num), static_cast<int64_t>(r.den)}; };
  switch (n.op) {
    case ExprOp::Integer:
      return {n.a, 1};
    case ExprOp::Rational:
      return out(make(n.a, n.b));
    case ExprOp::Symbol: {
      const auto s = static_cast<size_t>(n.a);
      if (s >= values.size() || !values[s]) {
        if (missing) *missing = static_cast<SymbolId>(n.a);
        throw ExprError("a dimension without a value");
      }
      return {*values[s], 1};
    }
    case ExprOp::Add:
    case ExprOp::Mul: {
      R acc = arg(0);
      for (int i = 1; i < n.count; ++i) acc = n.op == ExprOp::Add ? add(acc, arg(i)) : mul(acc, arg(i));
      return out(acc);
    }
    case ExprOp::Min:
    case ExprOp::Max: {
      R best = arg(0);
      for (int i = 1; i < n.count; ++i) {
        R v = arg(i);
        if (n.op == ExprOp::Min ? less(v, best) : less(best, v)) best = v;
      }
      return out(best);
    }
    case ExprOp::Pow:
      return out(power(arg(0), arg(1)));
    case ExprOp::FloorDiv:
      return out(whole(floor_of(divide(arg(0), arg(1)))));
    case ExprOp::CeilDiv:
      return out(whole(-floor_of(divide(mul(arg(0), R{-1, 1}), arg(1)))));
    case ExprOp::Mod: {
      R a = arg(0), b = arg(1);
      return out(add(a, mul(b, whole(-floor_of(divide(a, b))))));
    }
    case ExprOp::ModularIndexing: {
      R q = whole(floor_of(divide(arg(0), arg(1))));
      R c = arg(2);
      return out(add(q, mul(c, whole(-floor_of(divide(q, c))))));
    }
    case ExprOp::TrueDiv:
      return out(divide(arg(0), arg(1)));
    case ExprOp::FloorToInt:
      return out(whole(floor_of(arg(0))));
    case ExprOp::CeilToInt: {
      R a = arg(0);
      return out(whole(-floor_div(-a.num, a.den)));
    }
    case ExprOp::TruncToInt: {
      R a = arg(0);
      return out(whole(a.num / a.den));
    }
    case ExprOp::RoundToInt: {
      // Python's round(): halves to the even neighbour.
      R a = arg(0);
      const int128 f = floor_of(a);
      const int128 twice_rem = 2 * (a.num - f * a.den);  // 2 * frac * den
      int128 r = f;
      if (twice_rem > a.den || (twice_rem == a.den && (f % 2 != 0))) r = f + 1;
      return out(whole(r));
    }
    case ExprOp::Abs: {
      R a = arg(0);
      return out(make(a.num < 0 ? -a.num : a.num, a.den));
    }
    case ExprOp::Identity:
      return out(arg(0));
    case ExprOp::LShift:
    case ExprOp::RShift: {
      R a = arg(0);
      const int64_t k = integer_of(arg(1), "a shift");
      if (k < 0) throw ExprError("a negative shift");
      R scale = power(R{2, 1}, R{k, 1});
      return out(n.op == ExprOp::LShift ? mul(a, scale) : whole(floor_of(divide(a, scale))));
    }
    case ExprOp::Unsupported:
      throw ExprError("the function " + n.name + ", which fsdp-plan does not evaluate");
  }
  throw ExprError("an unknown expression");
}

int64_t SymExprPool::evaluate(ExprId e, const std::vector<std::optional<int64_t>>& values, SymbolId* missing) const {
  const Rat r = eval(roots_[static_cast<size_t>(e)], values, missing);
  if (r.den != 1) throw ExprError("a fraction, not a whole number");
  return r.num;
}

// ---------------------------------------------------------------------------- printing

void SymExprPool::print(int32_t node, const std::function<std::string(SymbolId)>& symbol_name, std::string& out,
                        int parent_prec) const {
  const Node& n = nodes_[static_cast<size_t>(node)];
  auto child = [&](int i, int prec) { print(args_[static_cast<size_t>(n.first + i)], symbol_name, out, prec); };
  auto call = [&](const char* name) {
    out += name;
    out += '(';
    for (int i = 0; i < n.count; ++i) {
      if (i) out += ", ";
      child(i, 0);
    }
    out += ')';
  };
  switch (n.op) {
    case ExprOp::Integer:
      if (n.a < 0 && parent_prec > 0) {
        out += "(" + std::to_string(n.a) + ")";
      } else {
        out += std::to_string(n.a);
      }
      return;
    case ExprOp::Rational:
      out += "(" + std::to_string(n.a) + "/" + std::to_string(n.b) + ")";
      return;
    case ExprOp::Symbol:
      out += symbol_name(static_cast<SymbolId>(n.a));
      return;
    case ExprOp::Add:
    case ExprOp::Mul: {
      const int prec = n.op == ExprOp::Add ? 1 : 2;
      if (prec < parent_prec) out += '(';
      for (int i = 0; i < n.count; ++i) {
        const Node& c = nodes_[static_cast<size_t>(args_[static_cast<size_t>(n.first + i)])];
        if (i && n.op == ExprOp::Add && c.op == ExprOp::Integer && c.a < 0 && c.a != INT64_MIN) {
          out += " - " + std::to_string(-c.a);
          continue;
        }
        if (i) out += n.op == ExprOp::Add ? " + " : "*";
        child(i, prec);
      }
      if (prec < parent_prec) out += ')';
      return;
    }
    case ExprOp::Pow:
      if (3 < parent_prec) out += '(';
      child(0, 4);
      out += "**";
      child(1, 4);
      if (3 < parent_prec) out += ')';
      return;
    case ExprOp::FloorDiv:
      if (2 < parent_prec) out += '(';
      child(0, 3);
      out += "//";
      child(1, 3);
      if (2 < parent_prec) out += ')';
      return;
    case ExprOp::Mod:
      if (2 < parent_prec) out += '(';
      child(0, 3);
      out += " % ";
      child(1, 3);
      if (2 < parent_prec) out += ')';
      return;
    case ExprOp::Min: return call("Min");
    case ExprOp::Max: return call("Max");
    case ExprOp::CeilDiv: return call("CeilDiv");
    case ExprOp::ModularIndexing: return call("ModularIndexing");
    case ExprOp::TrueDiv: return call("TrueDiv");
    case ExprOp::CeilToInt: return call("CeilToInt");
    case ExprOp::FloorToInt: return call("FloorToInt");
    case ExprOp::TruncToInt: return call("TruncToInt");
    case ExprOp::RoundToInt: return call("RoundToInt");
    case ExprOp::Abs: return call("Abs");
    case ExprOp::Identity: return call("Identity");
    case ExprOp::LShift: return call("LShift");
    case ExprOp::RShift: return call("RShift");
    case ExprOp::Unsupported:
      out += n.name + "(...)";
      return;
  }
}

std::string SymExprPool::to_string(ExprId e, const std::function<std::string(SymbolId)>& symbol_name) const {
  std::string out;
  print(roots_[static_cast<size_t>(e)], symbol_name, out, 0);
  return out;
}

}  // namespace fsdp_plan
