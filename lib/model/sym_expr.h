// Symbolic sizes of a torch.export graph: the sympy expressions torch writes
// for a dynamic dimension's sizes, strides and offsets ("Mul(Integer(32),
// Symbol('s38', positive=True, integer=True))"), parsed once into a flat pool
// and evaluated exactly (rationals of int64, every step checked) at given
// symbol values. Torch-free; the graph (graph.h) owns one pool.
//
// torch/_export/serde/serialize.py: _print_sympy writes sympy.srepr(expr);
// GraphModuleDeserializer.deserialize reads it back with sympy.sympify and the
// functions of torch/utils/_sympy/functions.py (its `sympy_functions` table).
// Those are the forms read here; a well-formed call of any other function is
// kept, and only evaluating it is an error.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace fsdp_plan {

using ExprId = int32_t;    // an expression of a SymExprPool
using SymbolId = int32_t;  // a symbol (s72) of the graph

// A malformed expression, or one that cannot be evaluated at the given
// values; the graph turns it into an InputError naming the file.
struct ExprError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ExprOp : uint8_t {
  Integer,          // a
  Rational,         // a / b (sympy's Rational(1, 2))
  Symbol,           // symbol a
  Add, Mul,         // n-ary
  Pow,              // Pow, PowByNatural: base ** exponent (an integer exponent)
  Min, Max,         // n-ary
  FloorDiv,         // FloorDiv, CleanDiv: floor(a / b)
  CeilDiv,          // ceil(a / b)
  Mod,              // Mod, PythonMod: a - b * floor(a / b)
  ModularIndexing,  // (a // b) % c
  TrueDiv,          // IntTrueDiv, FloatTrueDiv: a / b, exactly
  CeilToInt, FloorToInt, TruncToInt, RoundToInt,  // RoundToInt: half to even, as Python's round
  Abs,
  Identity,         // Identity, ToFloat
  LShift, RShift,   // a * 2**b, floor(a / 2**b)
  Unsupported,      // a call of a function not evaluated here (its name in `name`)
};

// The limits of one expression: deeper or longer ones are refused (torch
// writes a few levels; these are far above anything a model needs).
inline constexpr int kMaxExprDepth = 64;
inline constexpr size_t kMaxExprText = 64 * 1024;

class SymExprPool {
 public:
  // Parses srepr text; the same text always gives the same id. `symbol`
  // interns a symbol name ("s72") into a SymbolId. Throws ExprError.
  ExprId parse(std::string_view text, const std::function<SymbolId(std::string_view)>& symbol);

  // The value at `values` (one per SymbolId; nullopt: the symbol has none).
  // Throws ExprError for division by zero, a result beyond int64, a
  // non-integer result, an unsupported function, or a symbol without a
  // value (`missing`, if given, then gets that symbol).
  int64_t evaluate(ExprId e, const std::vector<std::optional<int64_t>>& values,
                   SymbolId* missing = nullptr) const;

  // Infix text for people: "32*s38", "Min(256, 256*s38)", "s38 + 1".
  std::string to_string(ExprId e, const std::function<std::string(SymbolId)>& symbol_name) const;
  // The srepr text it was parsed from.
  const std::string& source(ExprId e) const { return sources_[static_cast<size_t>(e)]; }
  // The symbol the expression is, when it is exactly one (Symbol('s72', ...)).
  std::optional<SymbolId> as_symbol(ExprId e) const;
  // Every symbol the expression uses, in first-use order.
  std::vector<SymbolId> symbols(ExprId e) const;
  size_t size() const { return roots_.size(); }

 private:
  struct Node {
    ExprOp op;
    int32_t first = 0, count = 0;  // children in args_
    int64_t a = 0, b = 1;
    std::string name;  // Unsupported: the function's name
  };
  struct Rat {
    int64_t num, den;
  };
  class Parser;
  Rat eval(int32_t node, const std::vector<std::optional<int64_t>>& values, SymbolId* missing) const;
  void print(int32_t node, const std::function<std::string(SymbolId)>& symbol_name, std::string& out,
             int parent_prec) const;

  std::vector<Node> nodes_;
  std::vector<int32_t> args_;
  std::vector<int32_t> roots_;         // ExprId -> its top node
  std::vector<std::string> sources_;   // ExprId -> srepr text
  std::unordered_map<std::string, ExprId> by_text_;
};

}  // namespace fsdp_plan
