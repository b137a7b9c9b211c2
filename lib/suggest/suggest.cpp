#include "suggest/suggest.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "ep/experts.h"
#include "fsdp1/memory.h"
#include "fsdp2/memory.h"
#include "mesh/device_mesh.h"
#include "model/class_names.h"
#include "model/graph.h"
#include "model/module_tree.h"
#include "planner/planner.h"
#include "policy/ignored.h"
#include "policy/tensor_parallel.h"
#include "suggest/fixes.h"
#include "suggest/groups.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

constexpr double kRootDominated = 0.5;

// torch.nn and torchvision classes are library building blocks; the model's
// own classes (transformers' LlamaDecoderLayer, a user's Block) come first.
bool is_library_class(const std::string& qualified) {
  return qualified.rfind("torch.", 0) == 0 || qualified.rfind("torchvision.", 0) == 0;
}

struct ClassInfo {
  std::string qualified;
  int64_t count = 0;         // modules of exactly this class
  int64_t max_numel = 0;     // largest subtree among them
  bool own = false;
};

// The name a policy uses for a class: the short name when no other class in
// the model shares it, else the qualified name.
std::map<std::string, std::string> policy_names(const std::vector<ClassInfo>& classes) {
  std::map<std::string, int> short_count;
  for (const auto& c : classes) ++short_count[std::string(short_name(c.qualified))];
  std::map<std::string, std::string> out;
  for (const auto& c : classes) {
    std::string s(short_name(c.qualified));
    out[c.qualified] = short_count[s] == 1 ? s : c.qualified;
  }
  return out;
}

std::vector<ClassInfo> wrappable_classes(const ModuleTree& tree, const std::vector<int64_t>& numel) {
  std::map<std::string, ClassInfo> by_name;
  const std::string root_class = demangle(tree.module(0).type_name);
  for (ModuleId m = 1; m < static_cast<ModuleId>(tree.num_modules()); ++m) {
    std::string q = demangle(tree.module(m).type_name);
    if (q == root_class || is_container(q, true)) continue;
    ClassInfo& c = by_name[q];
    c.qualified = q;
    c.count += 1;
    c.max_numel = std::max(c.max_numel, numel[static_cast<size_t>(m)]);
    c.own = !is_library_class(q);
  }
  std::vector<ClassInfo> out;
  for (auto& [name, c] : by_name)
    if (c.max_numel > 0) out.push_back(c);  // wrapping only parameter-less modules makes empty units
  // The model's own repeated classes first (its blocks), then by size.
  std::stable_sort(out.begin(), out.end(), [](const ClassInfo& a, const ClassInfo& b) {
    auto key = [](const ClassInfo& c) { return std::make_tuple(!(c.own && c.count > 1), !c.own); };
    if (key(a) != key(b)) return key(a) < key(b);
    if (a.max_numel != b.max_numel) return a.max_numel > b.max_numel;
    return a.qualified < b.qualified;
  });
  return out;
}

// What is wrapped varies; FSDP2's explicit groups are part of it.
Policy with_classes(const Policy& base, std::vector<std::string> classes) {
  Policy p = base;
  p.module_classes = std::move(classes);
  p.min_num_params.reset();
  p.groups.clear();
  return p;
}

// FSDP1 wraps a subtree of at least `threshold` parameters; FSDP2's rule
// (Accelerate's fsdp2_prepare_model) one of more than its min_num_params.
Policy with_threshold(const Policy& base, int64_t threshold) {
  Policy p = base;
  p.module_classes.reset();
  p.min_num_params = base.fsdp.v2() ? threshold - 1 : threshold;
  p.groups.clear();
  return p;
}

// Instances of exactly the class `qualified`.
std::vector<bool> instances_of(const ModuleTree& tree, const std::string& qualified) {
  std::vector<bool> out(tree.num_modules(), false);
  std::unordered_map<std::string, bool> by_stored;  // demangle once per stored name
  for (size_t m = 0; m < tree.num_modules(); ++m) {
    const std::string& stored = tree.modules()[m].type_name;
    auto it = by_stored.find(stored);
    if (it == by_stored.end()) it = by_stored.emplace(stored, demangle(stored) == qualified).first;
    out[m] = it->second;
  }
  return out;
}

// Size thresholds where the size policy's choice can change: the distinct
// subtree sizes. Past `limit` of them, a geometric spread keeps the search
// bounded on models with many distinct sizes.
std::vector<int64_t> size_thresholds(const std::vector<int64_t>& numel, size_t limit) {
  std::set<int64_t> distinct;
  for (size_t m = 1; m < numel.size(); ++m)
    if (numel[m] > 0 && numel[m] < numel[0]) distinct.insert(numel[m]);
  std::vector<int64_t> all(distinct.rbegin(), distinct.rend());  // largest first
  if (all.size() <= limit) return all;
  std::vector<int64_t> out;
  for (size_t i = 0; i < limit; ++i) out.push_back(all[i * (all.size() - 1) / (limit - 1)]);
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// A base policy with a tensor_parallel section: each wrapping at each tp
// degree of 1, 2, 4, 8 that fits in a node (--gpus-per-node: torchtitan and
// Accelerate keep the tp group inside a node, where its blocking collectives
// run on NVLink) and whose mesh the world size builds (device_mesh_error:
// dp_shard = world / (dp_replicate x tp), at least 1). tp 1 is plain FSDP2
// over every rank (no section). The plan's checks drop the degrees that do
// not divide the heads, key-value heads, FFN or vocabulary (tp_uneven_split).
std::vector<Candidate> with_tp_degrees(std::vector<Candidate> wrappings, const Policy& base, const SuggestOptions& opt) {
  if (!base.tensor_parallel || base.tensor_parallel->degree < 1) return wrappings;
  std::vector<int64_t> degrees;
  for (int64_t d : {1, 2, 4, 8}) {
    if (d > std::max<int64_t>(1, opt.gpus_per_node)) continue;
    if (d == 1) {
      degrees.push_back(d);
      continue;
    }
    TensorParallel tp = *base.tensor_parallel;
    tp.degree = d;
    tp.dp_shard = 0;  // the rest of the ranks
    const ContextParallel* cp = base.context_parallel ? &*base.context_parallel : nullptr;
    if (device_mesh_error(base.fsdp, &tp, nullptr, cp).empty()) degrees.push_back(d);
  }
  std::vector<Candidate> out;
  for (const Candidate& w : wrappings)
    for (int64_t d : degrees) {
      Candidate c = w;
      c.label = "tp " + std::to_string(d) + ", " + w.label;
      c.tp = d;
      if (d == 1) {
        c.policy.tensor_parallel.reset();
      } else {
        c.policy.tensor_parallel->degree = d;
        c.policy.tensor_parallel->dp_shard = 0;
      }
      out.push_back(std::move(c));
    }
  return out;
}

// The sequence a plan splits over cp: the graph's seq at the policy's --dim
// values (0 where the export has no dynamic seq: planning it says why).
int64_t whole_sequence(const ModuleTree& tree, const Policy& base) {
  const std::shared_ptr<const Graph>& g = tree.graph();
  if (!g) return 0;
  const std::optional<SymbolId> seq = g->find_symbol("seq");
  if (!seq) return 0;
  return DimValues::hints(*g, base.activations.dims).value(*seq).value_or(0);
}

// Each candidate at the other power-of-two degrees of one mesh dimension up
// to the world size, labelled "cp 4, ..." (`name`, `degree` its field in
// Candidate); `apply` sets the degree on the copy's policy (1: no section)
// and says whether the engines would build it.
template <class Apply>
std::vector<Candidate> with_degrees(const std::vector<Candidate>& in, int64_t world, const char* name,
                                    int64_t Candidate::*degree, Apply apply) {
  std::vector<Candidate> out;
  for (const Candidate& w : in)
    for (int64_t d = 1; d <= world; d *= 2) {
      if (d == w.*degree) continue;  // the candidate itself
      Candidate c = w;
      c.*degree = d;
      c.label = std::string(name) + " " + std::to_string(d) + ", " + w.label;
      if (apply(c.policy, d)) out.push_back(std::move(c));
    }
  return out;
}

// Context parallelism's degrees, where the base policy has a context_parallel
// section: 1 (no section) and the powers of two whose mesh the world builds
// beside each candidate's tp (device_mesh_error) and that split the sequence
// into equal shards (the ring needs them: cp must divide it).
std::vector<Candidate> with_cp_degrees(std::vector<Candidate> in, const ModuleTree& tree, const Policy& base) {
  if (!base.context_parallel || base.context_parallel->degree < 1) return in;
  const int64_t seq = whole_sequence(tree, base);
  return with_degrees(in, base.fsdp.world_size, "cp", &Candidate::cp, [&](Policy& p, int64_t d) {
    if (d == 1) {
      p.context_parallel.reset();
      return true;
    }
    p.context_parallel->degree = d;
    const TensorParallel* tp = p.tensor_parallel ? &*p.tensor_parallel : nullptr;
    const ExpertParallel* ep = p.expert_parallel ? &*p.expert_parallel : nullptr;
    return seq > 0 && seq % d == 0 && device_mesh_error(p.fsdp, tp, ep, &*p.context_parallel).empty();
  });
}

// Expert parallelism's degrees, where the base policy has an expert_parallel
// section: 1 (no section) and the powers of two whose sparse mesh the world
// builds (ep divides dp_shard x cp x tp: device_mesh_error) and that divide
// every expert module's experts (torchtitan's dispatcher; plan_expert_parallel
// refuses the others), and no smaller than the policy's routing imbalance (the
// busiest rank receives at most ep x the mean). A degree leaves the samples a
// step trains as they are.
std::vector<Candidate> with_ep_degrees(std::vector<Candidate> in, const ModuleTree& tree, const Policy& base) {
  if (!base.expert_parallel || base.expert_parallel->degree < 1) return in;
  const std::vector<int64_t> experts = routed_expert_counts(tree, *base.expert_parallel, ClassMatcher(tree));
  return with_degrees(in, base.fsdp.world_size, "ep", &Candidate::ep, [&](Policy& p, int64_t d) {
    if (d == 1) {
      p.expert_parallel.reset();
      return true;
    }
    p.expert_parallel->degree = d;
    const TensorParallel* tp = p.tensor_parallel ? &*p.tensor_parallel : nullptr;
    const ContextParallel* cp = p.context_parallel ? &*p.context_parallel : nullptr;
    return !experts.empty() && imbalance_over_degree(*p.expert_parallel).empty() &&
           std::all_of(experts.begin(), experts.end(), [&](int64_t e) { return e % d == 0; }) &&
           device_mesh_error(p.fsdp, tp, &*p.expert_parallel, cp).empty();
  });
}

}  // namespace

double rank_seconds(const Candidate& c) {
  return (c.step_known ? c.step_s : c.exposed_comm_s) *
         static_cast<double>(std::max<int64_t>(1, c.tp) * std::max<int64_t>(1, c.cp));
}

std::vector<Candidate> suggest_candidates(const ModuleTree& tree, const Policy& base, const SuggestOptions& opt) {
  if (opt.pin_wrapping) {
    Candidate c;
    c.label = "the --policy as given (--pin-wrapping)";
    c.origin = "base";
    c.policy = base;
    c.tp = base.tensor_parallel ? base.tensor_parallel->degree : 1;
    c.cp = base.context_parallel ? base.context_parallel->degree : 1;
    c.ep = base.expert_parallel ? base.expert_parallel->degree : 1;
    return {std::move(c)};
  }
  Ignored ignored = resolve_ignored(tree, base);
  std::vector<int64_t> numel = subtree_numel(tree, ignored.tensor);
  std::vector<ClassInfo> classes = wrappable_classes(tree, numel);
  auto names = policy_names(classes);

  std::vector<Candidate> out;
  std::set<std::string> seen;
  auto push = [&](std::string label, std::string origin, Policy p) {
    if (!seen.insert(label).second) return;
    Candidate c;
    c.label = std::move(label);
    c.origin = std::move(origin);
    c.policy = std::move(p);
    out.push_back(std::move(c));
  };

  if (base.auto_wrap() || !base.groups.empty()) push("base policy", "base", base);
  Policy unwrapped = base;
  unwrapped.module_classes.reset();
  unwrapped.min_num_params.reset();
  unwrapped.groups.clear();
  push("no auto-wrap (the root unit only)", "none", unwrapped);
  for (const auto& c : classes) {
    const std::string& n = names[c.qualified];
    push("module_classes [" + n + "]", "class", with_classes(base, {n}));
  }
  for (size_t i = 0; i < classes.size(); ++i)
    for (size_t j = i + 1; j < classes.size(); ++j) {
      const std::string &a = names[classes[i].qualified], &b = names[classes[j].qualified];
      push("module_classes [" + a + ", " + b + "]", "class pair", with_classes(base, {a, b}));
    }
  // FSDP2: the block class with groups for the modules around the blocks.
  if (base.fsdp.v2() && !classes.empty() && classes[0].own && classes[0].count > 1) {
    const std::string& block = names[classes[0].qualified];
    EdgeModules edges = edge_modules(tree, instances_of(tree, classes[0].qualified), ignored.module, numel);
    for (auto& v : edge_group_variants(edges)) {
      Policy p = with_classes(base, {block});
      p.groups = std::move(v.groups);
      push("module_classes [" + block + "] + " + v.label, "groups", std::move(p));
    }
  }
  for (int64_t t : size_thresholds(numel, opt.max_thresholds)) {
    Policy p = with_threshold(base, t);
    push("min_num_params " + std::to_string(*p.min_num_params), "size", std::move(p));
  }
  out = with_tp_degrees(std::move(out), base, opt);
  for (Candidate& c : out) {  // the policy's own degrees; suggest varies them around the best wrappings
    c.cp = c.policy.context_parallel ? c.policy.context_parallel->degree : 1;
    c.ep = c.policy.expert_parallel ? c.policy.expert_parallel->degree : 1;
  }
  return out;
}

namespace {

// The instances of the model's block class: its own class repeated most
// (wrappable_classes' first, as suggest_candidates takes it), or none.
std::vector<bool> block_instances(const ModuleTree& tree, const Policy& base) {
  Ignored ignored = resolve_ignored(tree, base);
  std::vector<int64_t> numel = subtree_numel(tree, ignored.tensor);
  std::vector<ClassInfo> classes = wrappable_classes(tree, numel);
  if (classes.empty() || !classes[0].own || classes[0].count < 2) return {};
  return instances_of(tree, classes[0].qualified);
}

// The block class as a policy names it, or "" (block_instances' class).
std::string block_class_name(const ModuleTree& tree, const Policy& base) {
  Ignored ignored = resolve_ignored(tree, base);
  std::vector<ClassInfo> classes = wrappable_classes(tree, subtree_numel(tree, ignored.tensor));
  if (classes.empty() || !classes[0].own || classes[0].count < 2) return "";
  return policy_names(classes)[classes[0].qualified];
}

// The units of a plan, as module ids (FSDP2: each call's modules and its
// reshard_after_forward): two policies with the same units and the same
// settings make the same plan.
using UnitSet = std::vector<int64_t>;

UnitSet unit_set(const Plan& plan) {
  UnitSet out;
  for (const auto& u : plan.units) {
    out.push_back(u.module);
    if (!plan.v2()) continue;
    for (size_t i = 1; i < u.modules.size(); ++i) out.push_back(u.modules[i]);
    const ReshardAfterForward r = u.reshard_after_forward.value_or(ReshardAfterForward{});
    out.push_back(-1 - static_cast<int64_t>(r.kind) - 3 * r.ranks);  // negative: no module id
  }
  return out;
}

// FSDP2 groups all-gathered again in backward (resharded after forward).
int64_t regathered(const Plan& plan) {
  if (!plan.v2() || plan.policy.fsdp.world_size == 1) return 0;
  int64_t n = 0;
  for (const auto& u : plan.units)
    n += u.reshard_after_forward.value_or(ReshardAfterForward{}).kind != ReshardAfterForward::Kind::False;
  return n;
}

// The memory model of a plan's FSDP version, for other settings: the peak
// only (no timeline). The searches ask one plan about several settings in a
// row, so FSDP2's per-plan part is kept for the plan asked about last.
class PeakFor {
 public:
  int64_t operator()(const Plan& plan, const FsdpSettings& s) {
    if (!plan.v2()) return estimate_memory(plan, s, false).per_rank.peak_bytes;
    if (fsdp2_plan_ != &plan) {
      fsdp2_.emplace(plan);
      fsdp2_plan_ = &plan;
    }
    return fsdp2_->estimate(s, false).per_rank.peak_bytes;
  }

 private:
  const Plan* fsdp2_plan_ = nullptr;
  std::optional<Fsdp2Memory> fsdp2_;
};

// Whether every module of `block` is a unit's module and no unit's module
// lies strictly inside one (Candidate::per_block).
bool per_block(const Plan& plan, const ModuleTree& tree, const std::vector<bool>& block) {
  if (block.empty()) return false;
  std::vector<bool> is_unit(tree.num_modules(), false);
  for (const auto& u : plan.units) {
    is_unit[static_cast<size_t>(u.module)] = true;
    for (ModuleId m : u.modules) is_unit[static_cast<size_t>(m)] = true;
  }
  bool any = false;
  for (size_t m = 0; m < block.size(); ++m) {
    if (block[m]) {
      if (!is_unit[m]) return false;
      any = true;
    }
    if (!is_unit[m] || block[m]) continue;
    for (ModuleId a = tree.module(static_cast<ModuleId>(m)).parent; a >= 0; a = tree.module(a).parent)
      if (block[static_cast<size_t>(a)]) return false;
  }
  return any;
}

void evaluate(Candidate& c, const Plan& plan, const ModuleTree& tree, const SuggestOptions& opt,
              const std::vector<bool>& block) {
  for (const auto& w : plan.warnings) {
    if (w.severity == Severity::Error) {
      c.dropped = "FSDP would refuse it: " + w.kind;
      return;
    }
    if (w.kind == "shared_param_across_units") {
      c.dropped = "splits a tied weight across units";
      return;
    }
    // A call on a module torch.export never ran only warns (fsdp2_refusals.cpp):
    // it may be a real ModuleList, or never gathered; a suggestion does not count on it.
    if (w.kind == "fsdp2_container" || w.kind == "fsdp2_not_called") {
      c.dropped = "FSDP2 may refuse or fail on it: " + w.kind + " (a module torch.export never ran)";
      return;
    }
  }
  c.units = static_cast<int64_t>(plan.units.size());
  int64_t total = 0;
  for (const auto& u : plan.units) {
    total += u.param_numel;
    if (u.param_numel > c.largest_unit_numel) {
      c.largest_unit_numel = u.param_numel;
      c.largest_unit_path = unit_name(tree, u);
    }
  }
  c.root_share = total > 0 ? static_cast<double>(plan.units[0].param_numel) / static_cast<double>(total) : 0;
  c.peak_bytes = plan.memory.per_rank.peak_bytes;
  c.peak_phase = plan.memory.per_rank.peak_phase;
  c.needed_bytes = c.peak_bytes + opt.activation_bytes;
  c.fits = c.needed_bytes <= opt.budget_bytes;
  c.regathered = regathered(plan);
  const StepTime& t = plan.time;
  c.step_known = t.computed && t.flops_known;
  c.step_s = c.step_known ? t.step_s : 0;
  c.exposed_comm_s = t.computed ? t.exposed_comm_s : 0;
  c.comm_s = t.computed ? t.comm_s : 0;
  // Issue 27: never a single-unit or root-dominated plan ahead of a finer one
  // that fits. Root-dominated: the root holds more than half the parameters.
  c.per_block = per_block(plan, tree, block);
  c.coarse = !c.per_block && (c.units <= 1 || c.root_share > kRootDominated);
}


// The order among candidates that fit: finer than the root first, then the
// estimated time, then fewer units, then lower peak, ...
bool better_if_fitting(const Candidate& a, const Candidate& b) {
  if (a.coarse != b.coarse) return b.coarse;
  // The estimate has no per-unit overhead (hooks, copy-in / copy-out kernels,
  // launches): it would count every split finer than the block as free. So
  // the block granularity first; the estimate decides among those plans
  // (edge groups, reshard settings, separate embeddings) and among the rest.
  if (a.per_block != b.per_block) return a.per_block;
  // Checkpointing is for memory: the recompute costs about a forward, which
  // an estimate without FLOPs does not see. Only where it is needed to fit.
  if (a.checkpointed != b.checkpointed) return b.checkpointed;
  // Compiling changes the step's code and its estimate does not see the kernels' speed:
  // ahead of checkpointing (no recompute to speak of), behind the eager step where both fit.
  if (a.compiled != b.compiled) return b.compiled;
  if (a.selective != b.selective) return a.selective;  // less recompute, more memory: tried where it fits
  if (a.step_known == b.step_known) {
    const double ta = rank_seconds(a), tb = rank_seconds(b);
    if (std::abs(ta - tb) > 1e-9) return ta < tb;
  }
  if (a.units != b.units) return a.units < b.units;
  if (a.peak_bytes != b.peak_bytes) return a.peak_bytes < b.peak_bytes;
  if (a.regathered != b.regathered) return a.regathered < b.regathered;  // fewer all-gathers in backward
  if (a.root_share != b.root_share) return a.root_share < b.root_share;
  return a.label < b.label;
}

// Those that fit first; among those that do not, the nearest miss first: it
// is the one a change of settings brings in soonest.
bool better(const Candidate& a, const Candidate& b) {
  if (a.fits != b.fits) return a.fits;
  if (!a.fits && a.needed_bytes != b.needed_bytes) return a.needed_bytes < b.needed_bytes;
  return better_if_fitting(a, b);
}

int64_t needed(const ModuleTree& tree, const Policy& p, const SuggestOptions& opt, const ClassMatcher& matcher) {
  return make_plan(tree, p, "", matcher, PlanPurpose::Ranking, opt.flops).memory.per_rank.peak_bytes + opt.activation_bytes;
}

// World size: the smallest number of ranks at which some candidate fits,
// searched per candidate on its plan (only the memory estimate depends on the
// world size): doublings, then the smallest count between the last two. The
// peak need not fall forever (flat parameters are padded to the world size),
// so the search stops at 2^20 ranks.
std::optional<FitAdvice> world_size_advice(const std::vector<const Candidate*>& ranked, const SuggestOptions& opt,
                                           PeakFor& peak_for) {
  constexpr int64_t kMaxRanks = int64_t{1} << 20;
  int64_t pick_hi = kMaxRanks + 1;
  std::vector<std::pair<const Candidate*, int64_t>> tied;  // candidates fitting at pick_hi, with their last miss
  std::map<std::pair<const Candidate*, int64_t>, int64_t> known;  // each estimate once
  auto at = [&](const Candidate& c, int64_t w) {
    auto it = known.find({&c, w});
    if (it != known.end()) return it->second;
    FsdpSettings s = memory_settings(c.policy);
    s.world_size = w;
    // With expert parallelism a world size ep does not divide is no mesh (device_mesh_error says so).
    const ExpertParallel* ep = c.policy.expert_parallel ? &*c.policy.expert_parallel : nullptr;
    const ContextParallel* cp = c.policy.context_parallel ? &*c.policy.context_parallel : nullptr;
    const int64_t need = device_mesh_error(s, nullptr, ep, cp).empty()
                             ? peak_for(*c.plan, s) + opt.activation_bytes
                             : INT64_MAX;
    known.emplace(std::make_pair(&c, w), need);
    return need;
  };
  // Doublings first, each candidate only as far as the best so far got.
  for (const Candidate* cp : ranked) {
    const Candidate& c = *cp;
    if (c.policy.fsdp.strategy == ShardingStrategy::NoShard) continue;
    // A 2-D plan's mesh was sized at its world size (its dp_shard): another
    // world size is another mesh, which this estimate on its plan does not redo.
    if (c.tp > 1 || c.cp > 1) continue;
    int64_t lo = c.policy.fsdp.world_size, hi = lo;
    while (hi < std::min(kMaxRanks, pick_hi) && at(c, hi) > opt.budget_bytes) {
      lo = hi;
      hi = std::min(hi * 2, kMaxRanks);
    }
    if (hi <= pick_hi && at(c, hi) <= opt.budget_bytes) {
      if (hi < pick_hi) tied.clear();
      tied.push_back({&c, lo});
      pick_hi = hi;
    }
  }
  // Then the smallest count between the last two doublings, for each
  // candidate that got as far as the best.
  std::optional<FitAdvice> best;
  const Candidate* best_c = nullptr;
  for (auto [c, lo] : tied) {
    int64_t hi = pick_hi;
    while (hi - lo > 1) {  // at(lo) does not fit, at(hi) does
      int64_t mid = lo + (hi - lo) / 2;
      (at(*c, mid) <= opt.budget_bytes ? hi : lo) = mid;
    }
    if (!best || hi < std::stoll(best->value)) {
      best = FitAdvice{"world_size", std::to_string(hi), at(*c, hi), "fsdp.world_size: " + std::to_string(hi), c->label};
      best_c = c;
    }
  }
  // Ranks come in whole nodes: past one node, the advice is a multiple of the
  // GPUs per node, the first at which some candidate fits (the peak need not
  // fall at every count, so each is checked; a few nodes on at most).
  const int64_t g = std::max<int64_t>(1, opt.gpus_per_node);
  if (!best || std::stoll(best->value) <= g) return best;
  std::vector<const Candidate*> order{best_c};  // the one that fits soonest, first
  for (const Candidate* c : ranked)
    if (c != best_c && c->policy.fsdp.strategy != ShardingStrategy::NoShard && c->tp <= 1) order.push_back(c);
  const int64_t first = (std::stoll(best->value) + g - 1) / g * g;
  for (int64_t w = first; w <= kMaxRanks && w < first + 64 * g; w += g)
    for (const Candidate* c : order)
      if (at(*c, w) <= opt.budget_bytes)
        return FitAdvice{"world_size", std::to_string(w), at(*c, w), "fsdp.world_size: " + std::to_string(w), c->label};
  return std::nullopt;
}

// Nothing fits: which one setting, changed on some candidate, would bring it
// under the budget; each with the best candidate it works for.
std::vector<FitAdvice> fit_advice(const ModuleTree& tree, const std::vector<Candidate>& candidates,
                                  const SuggestOptions& opt, const ClassMatcher& matcher) {
  // In the order they would rank once they fit: the advice names the
  // candidate that would be best after the change.
  std::vector<const Candidate*> ranked;
  for (const Candidate& c : candidates) ranked.push_back(&c);
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const Candidate* a, const Candidate* b) { return better_if_fitting(*a, *b); });
  std::vector<FitAdvice> out;
  PeakFor peak_for;
  if (auto a = world_size_advice(ranked, opt, peak_for)) out.push_back(*a);
  const Policy& base = ranked.front()->policy;  // every candidate shares the base's settings
  // Mixed precision: bf16 compute halves what is gathered. Sharded parameters,
  // gradients and optimizer state keep their dtype, so a candidate whose
  // steady state alone is over the budget is not replanned.
  if (!base.mixed_precision || !base.mixed_precision->param_dtype) {
    for (const Candidate* cp : ranked) {  // rank order: the first that fits is the best
      const Candidate& c = *cp;
      if (c.plan->memory.per_rank.steady_bytes + opt.activation_bytes > opt.budget_bytes) continue;
      Policy p = c.policy;
      MixedPrecision mp = p.mixed_precision.value_or(MixedPrecision{});
      mp.param_dtype = "bfloat16";
      p.mixed_precision = mp;
      int64_t n = needed(tree, p, opt, matcher);
      if (n > opt.budget_bytes) continue;
      out.push_back({"mixed_precision", "bfloat16", n, "mixed_precision.param_dtype: \"bfloat16\"", c.label});
      break;
    }
  }
  // Optimizer: fewer states per parameter (Adam 2, SGD with momentum 1, SGD 0).
  std::vector<Optimizer> cheaper;
  if (is_adam(base.fsdp.optimizer)) cheaper = {Optimizer::SgdMomentum, Optimizer::Sgd};
  if (base.fsdp.optimizer == Optimizer::SgdMomentum) cheaper = {Optimizer::Sgd};
  for (Optimizer o : cheaper) {  // the units stay: only the memory estimate changes
    auto fits = std::find_if(ranked.begin(), ranked.end(), [&](const Candidate* cp) {
      const Candidate& c = *cp;
      // Whatever the optimizer, its step holds every sharded parameter and
      // gradient and the buffers (both models' peak is at least that, FSDP2's
      // unless CPU offload moves them): a candidate over the budget with those
      // alone is not estimated again.
      const RankMemory& r = c.plan->memory.per_rank;
      if (!c.policy.fsdp.cpu_offload &&
          r.params_bytes + r.grads_bytes + r.buffers_bytes + opt.activation_bytes > opt.budget_bytes)
        return false;
      FsdpSettings s = memory_settings(c.policy);
      s.optimizer = o;
      return peak_for(*c.plan, s) + opt.activation_bytes <= opt.budget_bytes;
    });
    if (fits != ranked.end()) {
      const Candidate& c = **fits;
      FsdpSettings s = memory_settings(c.policy);
      s.optimizer = o;
      out.push_back({"optimizer", optimizer_name(o), peak_for(*c.plan, s) + opt.activation_bytes,
                     std::string("fsdp.optimizer: \"") + optimizer_name(o) + "\"", c.label});
      break;
    }
  }
  return out;
}

// The cp degrees and the ep degrees (with_cp_degrees, with_ep_degrees: one
// dimension at a time) of the best `wrappings` ranked so far: a degree
// multiplies the plans (9 ep degrees at 256 ranks), and a wrapping ranks much
// the same at any of them, so only the leaders are tried at each.
std::vector<Candidate> mesh_degree_variants(const ModuleTree& tree, const Policy& base,
                                            const std::vector<Candidate>& ranked, size_t wrappings) {
  std::vector<Candidate> leaders;
  for (size_t i = 0; i < ranked.size() && leaders.size() < wrappings; ++i) {
    leaders.push_back(ranked[i]);
    leaders.back().plan.reset();
  }
  std::vector<Candidate> out = with_cp_degrees(leaders, tree, base);
  for (Candidate& v : with_ep_degrees(leaders, tree, base)) out.push_back(std::move(v));
  return out;
}

constexpr size_t kDegreeWrappings = 2;  // the wrappings mesh_degree_variants tries at every degree

// A candidate's policy with one more setting: its label, origin, policy and degrees.
Candidate variant_of(const Candidate& c, const std::string& suffix) {
  Candidate v;
  v.label = c.label + suffix;
  v.origin = c.origin;
  v.policy = c.policy;
  v.tp = c.tp;
  v.cp = c.cp;
  v.ep = c.ep;
  return v;
}

}  // namespace

Suggestion suggest(const ModuleTree& tree, const Policy& base, const SuggestOptions& opt) {
  Suggestion s;
  std::vector<Candidate> candidates = suggest_candidates(tree, base, opt);
  std::set<std::string> labels;
  for (const auto& c : candidates) labels.insert(c.label);
  // The units, how the blocks are checkpointed, and the tp, cp and ep degrees.
  std::set<std::tuple<UnitSet, int, int64_t, int64_t, int64_t>> seen;
  const ClassMatcher matcher(tree);  // one tree, many plans: its classes are worked out once
  const std::vector<bool> block = block_instances(tree, base);
  const std::string block_class = block_class_name(tree, base);
  bool degrees = opt.pin_wrapping || !(base.context_parallel || base.expert_parallel);  // tried (or none to try)
  for (size_t i = 0; i < candidates.size(); ++i) {
    // At the first round's last candidate, a second round: the cp and ep degrees around its leaders.
    if (i + 1 == candidates.size() && !degrees && !s.ranked.empty()) {
      degrees = true;
      std::vector<Candidate> ranked = s.ranked;
      std::stable_sort(ranked.begin(), ranked.end(), better);
      for (Candidate& v : mesh_degree_variants(tree, base, ranked, kDegreeWrappings))
        if (labels.insert(v.label).second) candidates.push_back(std::move(v));
    }
    Candidate c = std::move(candidates[i]);  // fixes below append to `candidates`
    auto plan = std::make_shared<Plan>(make_plan(tree, c.policy, "", matcher, PlanPurpose::Ranking, opt.flops));
    if (!seen.insert({unit_set(*plan), c.checkpointed + c.selective + 4 * c.compiled, c.tp, c.cp, c.ep}).second) {
      ++s.duplicates;
      continue;
    }
    evaluate(c, *plan, tree, opt, block);
    // The same plan with its blocks checkpointed, fully and selectively, where the graph
    // says what that saves (a TorchScript file or an allowance does not) and the base
    // policy sets none.
    if (!opt.pin_wrapping && c.dropped.empty() && c.per_block && !c.checkpointed && !c.compiled &&
        !block_class.empty() && !base.activation_checkpointing && plan->activations.source == ActivationSource::Graph) {
      // And with its blocks compiled (issue 42): the partitioner's saves, no extra recompute to speak of.
      if (!base.compile) {
        Candidate cc = variant_of(c, " + compiled blocks [" + block_class + "]");
        cc.policy.compile = CompileConfig{{block_class}};
        cc.compiled = true;
        if (labels.insert(cc.label).second) candidates.push_back(std::move(cc));
      }
      for (const bool selective : {false, true}) {
        Candidate ac = variant_of(c, (selective ? " + selective activation checkpointing (torchtitan's policy) ["
                                                : " + activation checkpointing [") + block_class + "]");
        ac.policy.activation_checkpointing = ActivationCheckpointing{};
        ac.policy.activation_checkpointing->module_classes = {block_class};
        if (selective) ac.policy.activation_checkpointing->mode = CheckpointMode::Selective;
        ac.checkpointed = true;
        ac.selective = selective;
        if (labels.insert(ac.label).second) candidates.push_back(std::move(ac));
      }
    }
    // A refused candidate, fixed as the refusal checks say, is a candidate too
    // (twice at most: a fix may uncover another refusal).
    if (!opt.pin_wrapping && !c.dropped.empty() && c.fixes < 2) {
      if (auto f = fix_refusals(*plan); f && labels.insert(c.label + " + " + f->what).second) {
        Candidate fixed;
        fixed.label = c.label + " + " + f->what;
        fixed.origin = "fix";
        fixed.policy = std::move(f->policy);
        fixed.fixes = c.fixes + 1;
        fixed.tp = c.tp;
        fixed.cp = c.cp;
        fixed.ep = c.ep;
        candidates.push_back(std::move(fixed));
      }
    }
    if (c.dropped.empty()) {
      c.plan = std::move(plan);
      s.ranked.push_back(std::move(c));
    } else {
      s.dropped.push_back(std::move(c));
    }
  }
  s.tried = candidates.size();
  std::stable_sort(s.ranked.begin(), s.ranked.end(), better);
  if (opt.advice && !s.ranked.empty() && !s.ranked.front().fits) s.advice = fit_advice(tree, s.ranked, opt, matcher);
  return s;
}

}  // namespace fsdp_plan
