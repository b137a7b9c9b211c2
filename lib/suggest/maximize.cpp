#include "suggest/maximize.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "model/class_names.h"
#include "model/graph.h"
#include "planner/planner.h"
#include "util/errors.h"

namespace fsdp_plan {
namespace {

// The dimension at `value`, the other --dim values kept.
Policy at_value(Policy p, const std::vector<std::pair<std::string, int64_t>>& others, const std::string& dim,
                int64_t value) {
  p.activations.dims = others;
  p.activations.dims.emplace_back(dim, value);
  return p;
}

}  // namespace

Maximized maximize_dim(const ModuleTree& tree, const Policy& base, const SuggestOptions& opt,
                       const std::string& dim, const std::string& model_path) {
  const Graph* g = tree.graph().get();
  if (!g) {
    throw InputError(model_path, "--maximize " + dim + ": the model file records no shapes (a TorchScript file); "
                                 "export a .pt2 with dynamic dimensions (fsdp-plan-export --dynamic batch,seq)");
  }
  const std::optional<SymbolId> sym = g->find_symbol(dim);
  if (!sym) {
    try {
      (void)DimValues::bind(*g, {{dim, 0}});  // throws, naming the dimensions there are
    } catch (const InputError& e) {
      const std::string what = e.what();
      throw InputError(e.file(), what.rfind("--dim ", 0) == 0 ? "--maximize " + what.substr(6) : what);
    }
  }
  const GraphSymbol& s = g->symbol(*sym);

  Maximized out;
  out.dim = s.dim;
  out.ceiling = s.max ? *s.max : kMaximizeCeiling;
  const int64_t lo = std::max<int64_t>(s.min, 1);
  std::vector<std::pair<std::string, int64_t>> others;  // the other --dim values stay
  int64_t start = s.hint != kNoHint ? s.hint : lo;
  for (const auto& [name, v] : base.activations.dims) {
    if (g->find_symbol(name) == sym) {
      start = v;
    } else {
      others.emplace_back(name, v);
    }
  }
  start = std::clamp(start, lo, out.ceiling);

  // A whole suggestion; the probes skip its advice (what would make a miss fit).
  SuggestOptions quiet = opt;
  quiet.advice = false;
  auto suggest_at = [&](int64_t v, const SuggestOptions& o) {
    ++out.probes;
    return suggest(tree, at_value(base, others, s.dim, v), o);
  };
  auto fits = [](const Suggestion& x) { return !x.ranked.empty() && x.ranked.front().fits; };
  auto nearest = [](const Suggestion& x) { return x.ranked.empty() ? int64_t{0} : x.ranked.front().needed_bytes; };

  // Below a value that fits, the search needs whole suggestions; above it, only
  // the candidates that fit there: a candidate's peak grows with the dimension,
  // so one that misses at v misses above v too. The candidates themselves (the
  // classes, sizes, groups, their checkpointed and fixed variants) do not
  // depend on the dimension.
  const ClassMatcher matcher(tree);
  std::vector<Policy> fitting;  // the policies that fit at `good`
  auto keep_fitting = [&](const Suggestion& x) {
    fitting.clear();
    for (const Candidate& c : x.ranked)
      if (c.fits) fitting.push_back(c.policy);
  };
  // Which of `fitting` fit at v (each planned at v); the nearest need when none does.
  auto fitting_at = [&](int64_t v, int64_t& need) {
    ++out.probes;
    std::vector<Policy> still;
    need = 0;
    for (const Policy& p : fitting) {
      Policy q = at_value(p, others, s.dim, v);
      const int64_t n =
          make_plan(tree, q, "", matcher, PlanPurpose::Ranking, opt.flops).memory.per_rank.peak_bytes +
          opt.activation_bytes;
      if (n <= opt.budget_bytes) {
        still.push_back(std::move(p));
      } else if (need == 0 || n < need) {
        need = n;
      }
    }
    return still;
  };

  int64_t good = 0, bad = out.ceiling + 1;  // good fits; bad does not (ceiling + 1: none failed)
  int64_t bad_need = 0;
  Suggestion first = suggest_at(start, quiet);
  if (fits(first)) {
    good = start;
    keep_fitting(first);
  } else {
    bad = start;
    bad_need = nearest(first);
    int64_t below = start;
    // Down to the smallest value with whole suggestions, halving the gap.
    Suggestion at_lo = start == lo ? std::move(first) : suggest_at(lo, quiet);
    if (!fits(at_lo)) {
      out.value = lo;
      out.suggestion = suggest_at(lo, opt);  // with the advice, for the report
      return out;
    }
    good = lo;
    keep_fitting(at_lo);
    while (below - good > 1) {
      const int64_t mid = good + (below - good) / 2;
      Suggestion x = suggest_at(mid, quiet);
      if (fits(x)) {
        good = mid;
        keep_fitting(x);
      } else {
        below = bad = mid;
        bad_need = nearest(x);
      }
    }
  }
  // Up from `good`: doublings, then halving the gap, planning only what fits at `good`.
  auto try_value = [&](int64_t v) {
    int64_t need = 0;
    std::vector<Policy> still = fitting_at(v, need);
    if (still.empty()) {
      bad = v;
      bad_need = need;
      return false;
    }
    good = v;
    fitting = std::move(still);
    return true;
  };
  if (bad > out.ceiling) {
    for (int64_t v = std::min(good * 2, out.ceiling); v > good; v = std::min(v * 2, out.ceiling)) {
      if (!try_value(v) || v == out.ceiling) break;
    }
  }
  while (bad <= out.ceiling && bad - good > 1) try_value(good + (bad - good) / 2);

  out.found = true;
  out.value = good;
  out.at_ceiling = bad > out.ceiling;
  if (!out.at_ceiling) out.next_needed_bytes = bad_need;
  out.suggestion = suggest_at(good, opt);  // the report's ranking, at the answer
  return out;
}

}  // namespace fsdp_plan
