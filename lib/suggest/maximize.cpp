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

  // good fits and bad does not (ceiling + 1: none failed); bad_need is the
  // nearest candidate's need at bad when a whole suggestion planned it. Above a value known to fit, only the
  // candidates that fit there are planned again: a candidate's peak grows with
  // the dimension, so one that misses at v misses above v too, and the
  // candidates themselves (the classes, sizes, groups, their checkpointed and
  // fixed variants) do not depend on it. Elsewhere a whole suggestion.
  int64_t good = 0, bad = out.ceiling + 1, bad_need = 0;
  bool bad_need_whole = false;  // bad was probed by a whole suggestion
  std::vector<Policy> fitting;  // the policies that fit at `good`
  const ClassMatcher matcher(tree);
  auto probe_at = [&](int64_t v, bool pruned, std::vector<Policy>& still, int64_t& need) {
    if (pruned) {
      ++out.probes;
      for (const Policy& p : fitting) {  // copied: a probe that throws leaves `fitting` whole
        const int64_t n = make_plan(tree, at_value(p, others, s.dim, v), "", matcher, PlanPurpose::Ranking, opt.flops)
                              .memory.per_rank.peak_bytes +
                          opt.activation_bytes;
        if (n <= opt.budget_bytes) still.push_back(p);
      }
    } else {
      const Suggestion x = suggest_at(v, quiet);
      for (const Candidate& c : x.ranked)
        if (c.fits) still.push_back(c.policy);
      if (still.empty() && !x.ranked.empty()) need = x.ranked.front().needed_bytes;
    }
  };
  auto probe = [&](int64_t v) {
    std::vector<Policy> still;
    int64_t need = 0;  // the nearest miss, from a whole suggestion
    const bool pruned = good > 0 && v > good;
    try {
      probe_at(v, pruned, still, need);
    } catch (const TooLargeError&) {  // a tensor past docs/limits.md's bound at v: v does not fit
      still.clear();
      need = 0;
    }
    if (still.empty()) {
      bad = v;
      bad_need = need;
      bad_need_whole = !pruned;
      return false;
    }
    good = v;
    fitting = std::move(still);
    return true;
  };

  if (!probe(start) && (start == lo || !probe(lo))) {
    out.value = lo;
    out.suggestion = suggest_at(lo, opt);  // with the advice, for the report
    return out;
  }
  if (bad > out.ceiling) {  // up from what fits: doublings until one fails or the ceiling
    for (int64_t v = std::min(good * 2, out.ceiling); v > good; v = std::min(v * 2, out.ceiling)) {
      if (!probe(v) || v == out.ceiling) break;
    }
  }
  while (bad <= out.ceiling && bad - good > 1) probe(good + (bad - good) / 2);  // then halving the gap

  out.found = true;
  out.value = good;
  out.at_ceiling = bad > out.ceiling;
  if (!out.at_ceiling) {
    // A pruned probe planned only the candidates that fit one below; one that
    // missed there may be the nearest at `bad`: the need is asked of them all.
    if (!bad_need_whole) {
      try {
        const Suggestion x = suggest_at(bad, quiet);
        bad_need = x.ranked.empty() ? 0 : x.ranked.front().needed_bytes;
      } catch (const TooLargeError&) {
        bad_need = 0;  // too large to plan at all there
      }
    }
    out.next_needed_bytes = bad_need;
  }
  out.suggestion = suggest_at(good, opt);  // the report's ranking, at the answer
  return out;
}

}  // namespace fsdp_plan
