// The size expressions of a torch.export graph (model/sym_expr.h): every form
// tests/activations/GRAPH.md met in the corpus exports, the functions of
// torch/utils/_sympy/functions.py that serialize.py can write, and hostile
// text (deep nesting, huge numbers, division by zero).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "model/sym_expr.h"

using namespace fsdp_plan;

namespace {

// One pool, symbols s0, s1, ... interned by name.
struct Pool {
  SymExprPool pool;
  std::vector<std::string> names;

  ExprId parse(const std::string& text) {
    return pool.parse(text, [this](std::string_view n) {
      for (size_t i = 0; i < names.size(); ++i)
        if (names[i] == n) return static_cast<SymbolId>(i);
      names.emplace_back(n);
      return static_cast<SymbolId>(names.size() - 1);
    });
  }
  // `text` at the given values, in first-use order of the symbols.
  int64_t eval(const std::string& text, std::vector<std::optional<int64_t>> values = {}) {
    const ExprId e = parse(text);
    values.resize(names.size());
    return pool.evaluate(e, values);
  }
  std::string show(const std::string& text) {
    return pool.to_string(parse(text), [this](SymbolId s) { return names[static_cast<size_t>(s)]; });
  }
};

const std::string s38 = "Symbol('s38', positive=True, integer=True)";
const std::string s72 = "Symbol('s72', positive=True, integer=True)";

std::string error_of(const std::string& text, std::vector<std::optional<int64_t>> values = {}) {
  Pool p;
  try {
    p.eval(text, std::move(values));
  } catch (const ExprError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("the forms the corpus exports write (srepr)") {
  Pool p;
  CHECK(p.eval("Integer(32)") == 32);
  CHECK(p.eval("Integer(-3)") == -3);
  CHECK(p.eval(s38, {7}) == 7);
  CHECK(p.eval("Mul(Integer(32), " + s38 + ")", {7}) == 224);
  CHECK(p.eval("Add(" + s38 + ", Integer(1))", {7}) == 8);
  CHECK(p.eval("Add(" + s38 + ", Integer(-1))", {7}) == 6);
  CHECK(p.eval("Mul(" + s72 + ", " + s38 + ")", {7, 3}) == 21);
  CHECK(p.eval("Mul(Integer(64), " + s72 + ", " + s38 + ")", {7, 3}) == 64 * 21);
  CHECK(p.eval("Min(Integer(256), Mul(Integer(256), " + s38 + "))", {7}) == 256);
  CHECK(p.eval("Max(Integer(1), " + s38 + ")", {7}) == 7);
  CHECK(p.eval("Pow(" + s38 + ", Integer(2))", {7}) == 49);
  // Symbols are interned: s38 is symbol 0 throughout this pool.
  CHECK(p.names.size() == 2);
  // The same text is one expression.
  CHECK(p.parse("Mul(Integer(32), " + s38 + ")") == p.parse("Mul(Integer(32), " + s38 + ")"));
}

TEST_CASE("torch's integer functions, exactly as Python computes them") {
  Pool p;
  CHECK(p.eval("FloorDiv(Integer(7), Integer(2))") == 3);
  CHECK(p.eval("FloorDiv(Integer(-7), Integer(2))") == -4);  // Python's //
  CHECK(p.eval("CleanDiv(Integer(8), Integer(2))") == 4);
  CHECK(p.eval("CeilDiv(Integer(7), Integer(2))") == 4);
  CHECK(p.eval("CeilDiv(Integer(-7), Integer(2))") == -3);
  CHECK(p.eval("Mod(Integer(-7), Integer(3))") == 2);  // Python's %, sign of the divisor
  CHECK(p.eval("PythonMod(Integer(7), Integer(-3))") == -2);
  CHECK(p.eval("ModularIndexing(Integer(23), Integer(4), Integer(3))") == 2);  // (23 // 4) % 3
  CHECK(p.eval("IntTrueDiv(Integer(8), Integer(4))") == 2);
  CHECK(p.eval("FloorToInt(Rational(7, 2))") == 3);
  CHECK(p.eval("CeilToInt(Rational(7, 2))") == 4);
  CHECK(p.eval("TruncToInt(Rational(-7, 2))") == -3);
  CHECK(p.eval("RoundToInt(Rational(5, 2))") == 2);  // halves to even, as round()
  CHECK(p.eval("RoundToInt(Rational(7, 2))") == 4);
  CHECK(p.eval("RoundToInt(Rational(-5, 2))") == -2);
  CHECK(p.eval("Abs(Integer(-5))") == 5);
  CHECK(p.eval("Identity(Integer(5))") == 5);
  CHECK(p.eval("LShift(Integer(3), Integer(4))") == 48);
  CHECK(p.eval("RShift(Integer(49), Integer(4))") == 3);
  CHECK(p.eval("PowByNatural(Integer(2), Integer(62))") == (int64_t{1} << 62));
  // Sums of fractions that come out whole are whole.
  CHECK(p.eval("Add(Rational(1, 2), Rational(1, 2))") == 1);
  CHECK(p.eval("Mul(Rational(1, 3), Mul(Integer(3), " + s38 + "))", {5}) == 5);
}

TEST_CASE("results that are not whole numbers, or not numbers at all, are errors") {
  CHECK(error_of("Rational(1, 2)") == "a fraction, not a whole number");
  CHECK(error_of("Pow(Integer(2), Integer(-1))") == "a fraction, not a whole number");
  CHECK(error_of("IntTrueDiv(Integer(7), Integer(2))") == "a fraction, not a whole number");
  CHECK(error_of("LShift(Integer(1), Integer(-1))") == "a negative shift");
  CHECK(error_of("Pow(Integer(2), Rational(1, 2))") == "a power of a fraction");
  CHECK(error_of("Piecewise(Integer(1))").find("the function Piecewise") == 0);
  CHECK(error_of("oo").find("the function oo") == 0);
  CHECK(error_of(s38) == "a dimension without a value");
}

TEST_CASE("division by zero and overflow are errors, never a crash or a wrapped value") {
  CHECK(error_of("FloorDiv(Integer(1), Integer(0))") == "a division by zero");
  CHECK(error_of("CeilDiv(Integer(1), " + s38 + ")", {0}) == "a division by zero");
  CHECK(error_of("Mod(Integer(1), Integer(0))") == "a division by zero");
  CHECK(error_of("ModularIndexing(Integer(1), Integer(1), Integer(0))") == "a division by zero");
  CHECK(error_of("Pow(Integer(0), Integer(-1))") == "a division by zero");
  CHECK(error_of("Mul(Integer(9223372036854775807), Integer(2))") == "a value beyond 64-bit integers");
  CHECK(error_of("Add(Integer(9223372036854775807), Integer(1))") == "a value beyond 64-bit integers");
  CHECK(error_of("Pow(Integer(2), Integer(63))") == "a value beyond 64-bit integers");
  CHECK(error_of("Pow(Integer(3), Integer(9223372036854775807))") == "a value beyond 64-bit integers");
  CHECK(error_of("Mul(" + s38 + ", " + s38 + ")", {int64_t{1} << 32}) == "a value beyond 64-bit integers");
  CHECK(error_of("Abs(Integer(-9223372036854775808))") == "a value beyond 64-bit integers");
  // Powers of 1, 0 and -1 are exact at any exponent.
  Pool p;
  CHECK(p.eval("Pow(Integer(-1), Integer(9223372036854775807))") == -1);
  CHECK(p.eval("Pow(Integer(1), Integer(-9223372036854775808))") == 1);
  CHECK(p.eval("Integer(-9223372036854775808)") == INT64_MIN);
}

TEST_CASE("malformed text is refused with where") {
  auto parse_error = [](const std::string& text) {
    Pool p;
    try {
      p.parse(text);
    } catch (const ExprError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(parse_error("Integer(99999999999999999999)") ==
        "malformed size expression (a number beyond 64-bit integers at character 9)");
  CHECK(parse_error("Integer(9223372036854775808)").find("beyond 64-bit") != std::string::npos);
  CHECK(parse_error("Mul(Integer(2)") == "malformed size expression (expected ')' or ',' at character 15)");
  CHECK(parse_error("Integer(2) x").find("unexpected text after the expression") != std::string::npos);
  CHECK(parse_error("").find("unexpected end") != std::string::npos);
  CHECK(parse_error("Symbol('a b')").find("odd characters") != std::string::npos);
  CHECK(parse_error("Symbol('s1)").find("an unclosed quote") != std::string::npos);
  CHECK(parse_error("Symbol('')").find("empty or too long") != std::string::npos);
  CHECK(parse_error("Symbol(Integer(1))").find("Symbol with 0 arguments") != std::string::npos);
  CHECK(parse_error("Rational(1, 0)").find("zero denominator") != std::string::npos);
  CHECK(parse_error("Rational(" + s38 + ", 2)").find("something other than a number") != std::string::npos);
  CHECK(parse_error("FloorDiv(Integer(1))").find("FloorDiv with 1 arguments") != std::string::npos);
  CHECK(parse_error("Mod(Integer(1), 'x')").find("quoted argument") != std::string::npos);
  CHECK(parse_error("Symbol('s\\1')").find("an escape") != std::string::npos);
  CHECK(parse_error("12abc(").find("unexpected text") != std::string::npos);
  // Deep nesting: refused at the limit, not by the stack.
  std::string deep;
  for (int i = 0; i < 100000; ++i) deep += "Abs(";
  deep += "Integer(1)";
  for (int i = 0; i < 100000; ++i) deep += ")";
  CHECK(parse_error(deep).find("a size expression longer than 65536 characters") != std::string::npos);
  std::string nested;
  for (int i = 0; i <= kMaxExprDepth; ++i) nested += "Abs(";
  nested += "Integer(1)";
  for (int i = 0; i <= kMaxExprDepth; ++i) nested += ")";
  CHECK(parse_error(nested).find("nested deeper than 64") != std::string::npos);
  std::string ok;
  for (int i = 0; i < kMaxExprDepth - 1; ++i) ok += "Abs(";
  ok += "Integer(-1)";
  for (int i = 0; i < kMaxExprDepth - 1; ++i) ok += ")";
  Pool p;
  CHECK(p.eval(ok) == 1);
  // A failed parse leaves the pool as it was.
  Pool q;
  const ExprId a = q.parse("Integer(1)");
  CHECK_THROWS_AS(q.parse("Add(Integer(1), "), ExprError);
  CHECK(q.parse("Integer(2)") == a + 1);
  CHECK(q.pool.size() == 2);
}

TEST_CASE("text for people, the symbols each uses, and a bare symbol") {
  Pool p;
  CHECK(p.show("Mul(Integer(32), " + s38 + ")") == "32*s38");
  CHECK(p.show("Add(" + s38 + ", Integer(-1))") == "s38 - 1");
  CHECK(p.show("Mul(Integer(2), Add(" + s38 + ", Integer(1)))") == "2*(s38 + 1)");
  CHECK(p.show("Min(Integer(256), Mul(Integer(256), " + s38 + "))") == "Min(256, 256*s38)");
  CHECK(p.show("FloorDiv(" + s72 + ", Integer(2))") == "s72//2");
  const ExprId e = p.parse("Mul(" + s72 + ", " + s38 + ", " + s72 + ")");
  CHECK(p.pool.symbols(e) == std::vector<SymbolId>{1, 0});
  CHECK(p.pool.as_symbol(p.parse(s38)) == SymbolId{0});
  CHECK(!p.pool.as_symbol(e));
}
