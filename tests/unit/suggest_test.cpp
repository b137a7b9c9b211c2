// fsdp-plan suggest: candidates, what is dropped, ranking and fit advice.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "model/class_names.h"
#include "model/module_tree.h"
#include "suggest/groups.h"
#include "suggest/suggest.h"
#include "tree_builder.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {

std::vector<std::string> labels(const std::vector<Candidate>& cs) {
  std::vector<std::string> out;
  for (const auto& c : cs) out.push_back(c.label);
  return out;
}

// Net's trunk: emb (Embedding 100x8), blocks (ModuleList) of four Blocks with
// fc Linear(8, 8) (72 each), norm LayerNorm(8). Returns emb's weight.
TensorId lm_trunk(TreeBuilder& b) {
  b.add("emb", "Embedding");
  TensorId w = b.param("emb", "weight", {100, 8});
  b.add("blocks", "ModuleList");
  for (int i = 0; i < 4; ++i) {
    std::string p = "blocks." + std::to_string(i);
    b.add(p, "Block");
    b.linear(p + ".fc", 8, 8);
  }
  b.add("norm", "LayerNorm");
  b.param("norm", "weight", {8});
  return w;
}

// The trunk, then head Linear(8, 100, no bias) tied with emb.
TreeBuilder tied_lm() {
  TreeBuilder b("__torch__.Net");
  TensorId w = lm_trunk(b);
  b.add("head", "Linear");
  b.tie("head", "weight", w);
  return b;
}

Policy world(int64_t w) {
  Policy p;
  p.fsdp.world_size = w;
  return p;
}

int64_t peak_of(const TreeBuilder& b, const Policy& p) { return make_plan(b.tree, p, "m.pt").memory.per_rank.peak_bytes; }

}  // namespace

TEST_CASE("candidates: the model's own block class first, then library classes, pairs, size thresholds") {
  auto b = tied_lm();
  auto cs = suggest_candidates(b.tree, world(4), SuggestOptions{});
  auto l = labels(cs);
  REQUIRE(l.size() > 2);
  CHECK(l[0] == "no auto-wrap (the root unit only)");
  CHECK(l[1] == "module_classes [Block]");
  // Every class owning parameters, alone; never the root's class or a ModuleList.
  for (const char* c : {"module_classes [Embedding]", "module_classes [Linear]", "module_classes [LayerNorm]"})
    CHECK(std::count(l.begin(), l.end(), c) == 1);
  CHECK(std::none_of(l.begin(), l.end(), [](const std::string& s) { return s.find("ModuleList") != std::string::npos; }));
  CHECK(std::none_of(l.begin(), l.end(), [](const std::string& s) { return s.find("Net") != std::string::npos; }));
  CHECK(std::count(l.begin(), l.end(), "module_classes [Block, Embedding]") == 1);
  // Distinct subtree sizes below the whole model: blocks 288, emb 800, block 72, norm 8.
  for (const char* t : {"min_num_params 800", "min_num_params 288", "min_num_params 72", "min_num_params 8"})
    CHECK(std::count(l.begin(), l.end(), t) == 1);
  // The base policy's own wrapping comes first when it has one.
  Policy base = world(4);
  base.module_classes = std::vector<std::string>{"Block"};
  CHECK(labels(suggest_candidates(b.tree, base, SuggestOptions{}))[0] == "base policy");
}

TEST_CASE("candidates keep the base policy's settings and change only the wrapping") {
  auto b = tied_lm();
  Policy base = world(8);
  base.mixed_precision = MixedPrecision{};
  base.mixed_precision->param_dtype = "bfloat16";
  base.ignored_params = {"norm.*"};
  base.min_num_params = 1;
  for (const auto& c : suggest_candidates(b.tree, base, SuggestOptions{})) {
    CHECK(c.policy.fsdp.world_size == 8);
    CHECK(c.policy.mixed_precision->param_dtype == "bfloat16");
    CHECK(c.policy.ignored_params == std::vector<std::string>{"norm.*"});
    if (c.origin != "none") CHECK(c.policy.module_classes.has_value() != c.policy.min_num_params.has_value());
  }
}

TEST_CASE("a candidate that splits a tied weight is dropped; the rest are ranked") {
  auto b = tied_lm();
  SuggestOptions opt;
  opt.budget_bytes = int64_t{1} << 40;
  Suggestion s = suggest(b.tree, world(4), opt);
  CHECK(s.tried == s.ranked.size() + s.dropped.size() + s.duplicates);
  auto d = labels(s.dropped);
  // Embedding alone: emb.weight in its unit, head (tied) in the root.
  CHECK(std::count(d.begin(), d.end(), "module_classes [Embedding]") == 1);
  for (const auto& c : s.dropped) CHECK(c.dropped == "splits a tied weight across units");
  // Everything fits a huge budget: a per-block plan wins (issue 27), never the root unit alone.
  REQUIRE(!s.ranked.empty());
  CHECK(s.ranked.front().fits);
  CHECK(s.ranked.front().per_block);
  CHECK(s.ranked.front().units > 1);
  CHECK(s.ranked.front().time_known());
  CHECK(s.advice.empty());
}

TEST_CASE("ranking: fits first, then fewer units, then lower peak, then smaller root share; the nearest miss "
          "first among those that do not fit") {
  auto b = tied_lm();
  SuggestOptions opt;
  // Between the lowest peak and the root-only plan's peak: only real wrapping fits.
  Policy root_only = world(4);
  int64_t one_unit = peak_of(b, root_only);
  Policy blocks = world(4);
  blocks.module_classes = std::vector<std::string>{"Block"};
  int64_t with_blocks = peak_of(b, blocks);
  REQUIRE(with_blocks < one_unit);
  opt.budget_bytes = with_blocks;
  Suggestion s = suggest(b.tree, world(4), opt);
  REQUIRE(!s.ranked.empty());
  const Candidate& best = s.ranked.front();
  CHECK(best.fits);
  CHECK(best.needed_bytes <= opt.budget_bytes);
  for (size_t i = 1; i < s.ranked.size(); ++i) {
    const Candidate &a = s.ranked[i - 1], &c = s.ranked[i];
    if (!a.fits && !c.fits && a.needed_bytes != c.needed_bytes) {
      CHECK(a.needed_bytes < c.needed_bytes);
      continue;
    }
    if (a.fits != c.fits) {
      CHECK(a.fits);
      continue;
    }
    // Among those that fit: finer than the root alone, the block granularity, the estimate, fewer units, peak.
    if (a.coarse != c.coarse) {
      CHECK(c.coarse);
      continue;
    }
    if (a.per_block != c.per_block) {
      CHECK(a.per_block);
      continue;
    }
    if (std::abs(a.exposed_comm_s - c.exposed_comm_s) > 1e-9) {
      CHECK(a.exposed_comm_s < c.exposed_comm_s);
      continue;
    }
    CHECK((a.units < c.units || (a.units == c.units &&
          (a.peak_bytes < c.peak_bytes || (a.peak_bytes == c.peak_bytes && a.root_share <= c.root_share)))));
  }
  // Every fitting candidate's plan really is under the budget.
  for (const auto& c : s.ranked) CHECK(c.fits == (peak_of(b, c.policy) <= opt.budget_bytes));
}

TEST_CASE("issue 27: the root unit alone never ranks ahead of a fitting per-block plan, even with nothing to "
          "communicate, nor when it exposes less") {
  auto b = tied_lm();
  SuggestOptions opt;
  opt.budget_bytes = int64_t{1} << 40;
  for (int64_t w : {1, 8}) {
    Suggestion s = suggest(b.tree, world(w), opt);
    REQUIRE(!s.ranked.empty());
    const Candidate& best = s.ranked.front();
    CHECK(best.per_block);
    CHECK(best.label != "no auto-wrap (the root unit only)");
    auto root = std::find_if(s.ranked.begin(), s.ranked.end(),
                             [](const Candidate& c) { return c.label == "no auto-wrap (the root unit only)"; });
    REQUIRE(root != s.ranked.end());
    CHECK(root->coarse);
    // At one rank nothing is communicated; at eight, the root alone exposes all it communicates.
    if (w == 1) CHECK(root->exposed_comm_s == 0);
    if (w == 8) {
      CHECK(root->exposed_comm_s == doctest::Approx(root->comm_s));
      // A model this small is latency-bound: the per-block plan exposes more (more collectives), and the
      // tier still puts it first. That is the rule, not the estimate.
      CHECK(best.exposed_comm_s > 0);
    }
  }
}

TEST_CASE("the activation allowance counts against the budget") {
  auto b = tied_lm();
  SuggestOptions opt;
  opt.budget_bytes = int64_t{1} << 40;
  opt.activation_bytes = opt.budget_bytes;  // leaves nothing for the model
  Suggestion s = suggest(b.tree, world(4), opt);
  REQUIRE(!s.ranked.empty());
  for (const auto& c : s.ranked) {
    CHECK(c.needed_bytes == c.peak_bytes + opt.activation_bytes);
    CHECK(!c.fits);
  }
}

TEST_CASE("nothing fits: the smallest world size that would, checked by planning it") {
  auto b = tied_lm();
  SuggestOptions opt;
  Policy blocks = world(16);
  blocks.module_classes = std::vector<std::string>{"Block"};
  opt.budget_bytes = peak_of(b, blocks);  // reachable with 16 ranks, not with one
  Suggestion s = suggest(b.tree, world(1), opt);
  REQUIRE(!s.ranked.empty());
  CHECK(!s.ranked.front().fits);
  auto it = std::find_if(s.advice.begin(), s.advice.end(), [](const FitAdvice& a) { return a.setting == "world_size"; });
  REQUIRE(it != s.advice.end());
  int64_t w = std::stoll(it->value);
  CHECK(w > 1);
  CHECK(w <= 16);
  CHECK(it->needed_bytes <= opt.budget_bytes);
  // Past one node (opt.gpus_per_node, 8), whole nodes.
  CHECK((w <= opt.gpus_per_node || w % opt.gpus_per_node == 0));
  // The candidate the advice names fits at w ranks and not at the count before (a node fewer past one node).
  auto named = std::find_if(s.ranked.begin(), s.ranked.end(), [&](const Candidate& c) { return c.label == it->candidate; });
  REQUIRE(named != s.ranked.end());
  Policy p = named->policy;
  p.fsdp.world_size = w;
  CHECK(peak_of(b, p) <= opt.budget_bytes);
  p.fsdp.world_size = w > opt.gpus_per_node ? w - opt.gpus_per_node : w - 1;
  CHECK(peak_of(b, p) > opt.budget_bytes);
  // One GPU per node: any count, the smallest that fits.
  opt.gpus_per_node = 1;
  s = suggest(b.tree, world(1), opt);
  it = std::find_if(s.advice.begin(), s.advice.end(), [](const FitAdvice& a) { return a.setting == "world_size"; });
  REQUIRE(it != s.advice.end());
  CHECK(std::stoll(it->value) <= w);
}

TEST_CASE("policies that give the same units are planned once, under the first label") {
  auto b = tied_lm();
  SuggestOptions opt;
  opt.budget_bytes = int64_t{1} << 40;
  Suggestion s = suggest(b.tree, world(4), opt);
  CHECK(s.duplicates > 0);
  CHECK(s.tried == s.ranked.size() + s.dropped.size() + s.duplicates);
  // A threshold above every module wraps nothing: the same plan as no auto-wrap, listed under that name.
  auto l = labels(s.ranked);
  CHECK(std::count(l.begin(), l.end(), "no auto-wrap (the root unit only)") == 1);
  CHECK(std::count(l.begin(), l.end(), "min_num_params 800") == 0);
}

TEST_CASE("policy_file_json reads back as the same policy") {
  Policy p = world(16);
  p.module_classes = std::vector<std::string>{"Block", "Embedding"};
  p.mixed_precision = MixedPrecision{};
  p.mixed_precision->param_dtype = "bfloat16";
  p.ignored_params = {"*.lora_*"};
  p.fsdp.optimizer = Optimizer::Sgd;
  Policy q = parse_policy(policy_file_json(p).dump(), "p.json");
  CHECK(policy_to_json(q) == policy_to_json(p));
}

TEST_CASE("policy_file_json keeps the mixed-precision fields the user set, FSDP1 and FSDP2") {
  Policy p = world(8);
  p.module_classes = std::vector<std::string>{"Block"};
  p.mixed_precision = MixedPrecision{};
  p.mixed_precision->param_dtype = "bfloat16";
  p.mixed_precision->keep_low_precision_grads = true;
  p.mixed_precision->cast_forward_inputs = true;
  p.mixed_precision->cast_root_forward_inputs = false;
  auto j = policy_file_json(p);
  CHECK(j["mixed_precision"]["keep_low_precision_grads"] == true);
  CHECK_FALSE(j["mixed_precision"].contains("output_dtype"));
  CHECK(policy_to_json(parse_policy(j.dump(), "p.json")) == policy_to_json(p));

  Policy q = world(8);
  q.fsdp.version = FsdpVersion::V2;
  q.mixed_precision = MixedPrecision{};
  q.mixed_precision->param_dtype = "bfloat16";
  q.mixed_precision->output_dtype = "float32";
  q.mixed_precision->cast_forward_inputs = false;
  j = policy_file_json(q);
  CHECK(j["mixed_precision"]["output_dtype"] == "float32");
  CHECK_FALSE(j["mixed_precision"].contains("keep_low_precision_grads"));  // only what was set
  CHECK(policy_to_json(parse_policy(j.dump(), "p.json")) == policy_to_json(q));
}

namespace {

Policy fsdp2(int64_t w) {
  Policy p = world(w);
  p.fsdp.version = FsdpVersion::V2;
  return p;
}

// tied_lm without the tie: head has its own weight.
TreeBuilder untied_lm() {
  TreeBuilder b("__torch__.Net");
  lm_trunk(b);
  b.add("rope", "Rotary");  // no parameters: in no group
  b.add("head", "Linear");
  b.param("head", "weight", {100, 8});
  return b;
}

const Candidate* find(const std::vector<Candidate>& cs, const std::string& label) {
  for (const auto& c : cs)
    if (c.label == label) return &c;
  return nullptr;
}

}  // namespace

TEST_CASE("edge_modules: the parameter-holding subtrees before the first block and after the last") {
  auto b = untied_lm();
  std::vector<bool> block(b.tree.num_modules(), false), skip(b.tree.num_modules(), false);
  for (int i = 0; i < 4; ++i) block[static_cast<size_t>(b.id("blocks." + std::to_string(i)))] = true;
  auto numel = subtree_numel(b.tree, std::vector<bool>(b.tree.num_tensors(), false));
  EdgeModules e = edge_modules(b.tree, block, skip, numel);
  CHECK(e.input == std::vector<std::string>{"emb"});
  CHECK(e.output == std::vector<std::string>{"norm", "head"});
  skip[static_cast<size_t>(b.id("norm"))] = true;  // ignored modules are in no group
  CHECK(edge_modules(b.tree, block, skip, numel).output == std::vector<std::string>{"head"});
  // No block: nothing around it.
  std::vector<bool> none(b.tree.num_modules(), false);
  e = edge_modules(b.tree, none, skip, numel);
  CHECK(e.input.empty());
  CHECK(e.output.empty());
}

TEST_CASE("FSDP2: the block class with groups for the embedding and the head, separately and together") {
  auto b = untied_lm();
  auto cs = suggest_candidates(b.tree, fsdp2(4), SuggestOptions{});
  const std::string blk = "module_classes [Block] + groups ";
  for (const char* g : {"[emb]", "[norm, head]", "[norm, head] kept after forward", "[emb], [norm, head]",
                        "[emb], [norm, head] kept after forward", "[emb, norm, head]",
                        "[emb, norm, head] kept after forward"}) {
    const Candidate* c = find(cs, blk + g);
    REQUIRE_MESSAGE(c != nullptr, g);
    CHECK(c->origin == "groups");
    CHECK(c->policy.fsdp.v2());
    CHECK(c->policy.module_classes == std::vector<std::string>{"Block"});
  }
  const Candidate* kept = find(cs, blk + "[emb], [norm, head] kept after forward");
  REQUIRE(kept->policy.groups.size() == 2);
  CHECK(!kept->policy.groups[0].reshard_after_forward);
  CHECK(kept->policy.groups[1].reshard_after_forward->kind == ReshardAfterForward::Kind::False);
  // FSDP1 has no groups.
  for (const auto& c : suggest_candidates(b.tree, world(4), SuggestOptions{})) CHECK(c.policy.groups.empty());
  // FSDP2's size rule is "more than min_num_params": thresholds one below the subtree sizes.
  CHECK(find(cs, "min_num_params 799") != nullptr);
  CHECK(find(cs, "min_num_params 800") == nullptr);
}

TEST_CASE("FSDP2: every candidate is planned and measured as FSDP2; groups count as one unit each") {
  auto b = untied_lm();
  SuggestOptions opt;
  opt.budget_bytes = int64_t{1} << 40;
  Suggestion s = suggest(b.tree, fsdp2(4), opt);
  REQUIRE(!s.ranked.empty());
  for (const auto& c : s.ranked) {
    Plan p = make_plan(b.tree, c.policy, "m.pt");
    CHECK(p.v2());
    CHECK(c.peak_bytes == p.memory.per_rank.peak_bytes);
    CHECK(c.units == static_cast<int64_t>(p.units.size()));
  }
  // [emb, norm, head] in one call: blocks 4 + group + root = 6 units; the root keeps nothing.
  auto it = std::find_if(s.ranked.begin(), s.ranked.end(),
                         [](const Candidate& c) { return c.label == "module_classes [Block] + groups [emb, norm, head]"; });
  REQUIRE(it != s.ranked.end());
  CHECK(it->units == 6);
  CHECK(it->root_share == 0.0);
  CHECK(it->largest_unit_path == "[emb, norm, head]");
  // Its kept-after-forward twin is a plan of its own; at an equal peak it ranks first (one all-gather fewer).
  auto kept = std::find_if(s.ranked.begin(), s.ranked.end(), [](const Candidate& c) {
    return c.label == "module_classes [Block] + groups [emb, norm, head] kept after forward";
  });
  REQUIRE(kept != s.ranked.end());
  CHECK(kept->peak_bytes <= it->peak_bytes);
  if (kept->peak_bytes == it->peak_bytes) CHECK(kept < it);
}

TEST_CASE("FSDP2: a group that splits a tied weight is refused (fsdp2_shared_param) and dropped") {
  auto b = tied_lm();
  SuggestOptions opt;
  opt.budget_bytes = int64_t{1} << 40;
  Suggestion s = suggest(b.tree, fsdp2(4), opt);
  const Candidate* split = find(s.dropped, "module_classes [Block] + groups [emb], [norm, head]");
  REQUIRE(split != nullptr);
  CHECK(split->dropped == "FSDP would refuse it: fsdp2_shared_param");
  CHECK(find(s.ranked, "module_classes [Block] + groups [emb, norm, head]") != nullptr);
}

TEST_CASE("FSDP2: the world size advice uses FSDP2's memory model") {
  auto b = untied_lm();
  Policy blocks = fsdp2(16);
  blocks.module_classes = std::vector<std::string>{"Block"};
  SuggestOptions opt;
  opt.budget_bytes = peak_of(b, blocks);
  Suggestion s = suggest(b.tree, fsdp2(1), opt);
  REQUIRE(!s.ranked.empty());
  REQUIRE(!s.ranked.front().fits);
  auto it = std::find_if(s.advice.begin(), s.advice.end(), [](const FitAdvice& a) { return a.setting == "world_size"; });
  REQUIRE(it != s.advice.end());
  int64_t w = std::stoll(it->value);
  auto named = std::find_if(s.ranked.begin(), s.ranked.end(), [&](const Candidate& c) { return c.label == it->candidate; });
  REQUIRE(named != s.ranked.end());
  Policy p = named->policy;
  p.fsdp.world_size = w;
  CHECK(peak_of(b, p) == it->needed_bytes);
  CHECK(peak_of(b, p) <= opt.budget_bytes);
  p.fsdp.world_size = w - 1;
  CHECK(peak_of(b, p) > opt.budget_bytes);
}

TEST_CASE("policy_file_json writes FSDP2's version and groups, and reads back") {
  Policy p = fsdp2(8);
  p.module_classes = std::vector<std::string>{"Block"};
  Fsdp2Group g;
  g.modules = {"emb", "head"};
  g.reshard_after_forward = ReshardAfterForward{ReshardAfterForward::Kind::False, 0};
  p.groups = {g};
  auto j = policy_file_json(p);
  CHECK(j["fsdp"]["version"] == 2);
  CHECK(j["groups"][0]["reshard_after_forward"] == false);
  Policy q = parse_policy(j.dump(), "p.json");
  CHECK(policy_to_json(q) == policy_to_json(p));
}

TEST_CASE("fix candidates: LoRA's frozen and trainable parameters in one unit, fixed as the refusal says") {
  auto b = lora_blocks();
  SuggestOptions opt;
  opt.budget_bytes = int64_t{1} << 40;
  Suggestion s = suggest(b.tree, world(4), opt);
  const Candidate* refused = find(s.dropped, "module_classes [Block, Embedding]");
  REQUIRE(refused != nullptr);
  CHECK(refused->dropped == "FSDP would refuse it: mixed_requires_grad");
  // The same policy plus the warning's own fix (the trainable LoRA Linears wrapped separately) is ranked.
  const Candidate* fixed = find(s.ranked, "module_classes [Block, Embedding] + frozen parameters in units of their own");
  REQUIRE(fixed != nullptr);
  CHECK(fixed->origin == "fix");
  Plan p = make_plan(b.tree, fixed->policy, "m.pt");
  CHECK(!p.has_errors());
  CHECK(count_warnings(p, "mixed_requires_grad") == 0);
  CHECK(fixed->peak_bytes == p.memory.per_rank.peak_bytes);
  REQUIRE(fixed->policy.module_classes);
  CHECK(fixed->policy.module_classes->size() == 3);
  CHECK(fixed->policy.module_classes->at(0) == "Block");
  // module_classes [Block]'s fix gives the units of an earlier candidate ([Block, Linear]): planned, not listed.
  CHECK(find(s.dropped, "module_classes [Block]") != nullptr);
  CHECK(find(s.ranked, "module_classes [Block] + frozen parameters in units of their own") == nullptr);
  CHECK(find(s.ranked, "module_classes [Block, torch.nn.modules.linear.Linear]") != nullptr);
  CHECK(s.tried == s.ranked.size() + s.dropped.size() + s.duplicates);
}

TEST_CASE("fix candidates: a tied weight split across units kept in one") {
  SuggestOptions opt;
  opt.budget_bytes = int64_t{1} << 40;
  // FSDP2: [emb] in a group, head (tied) in the root: fully_shard refuses; the fix groups emb with head.
  auto b = tied_lm();
  Suggestion s = suggest(b.tree, fsdp2(4), opt);
  REQUIRE(find(s.dropped, "module_classes [Block] + groups [norm, head]") != nullptr);
  const Candidate* fixed = find(s.ranked, "module_classes [Block] + groups [norm, head] + tied weights in one unit");
  REQUIRE(fixed != nullptr);
  REQUIRE(fixed->policy.groups.size() == 1);
  CHECK(fixed->policy.groups[0].modules == std::vector<std::string>{"norm", "head", "emb"});
  CHECK(!make_plan(b.tree, fixed->policy, "m.pt").has_errors());
  // [Block, Embedding]: emb in a call of its own, head in the root; the fix names both in one call.
  REQUIRE(find(s.dropped, "module_classes [Block, Embedding]") != nullptr);
  fixed = find(s.ranked, "module_classes [Block, Embedding] + tied weights in one unit");
  REQUIRE(fixed != nullptr);
  REQUIRE(fixed->policy.groups.size() == 1);
  CHECK(fixed->policy.groups[0].modules == std::vector<std::string>{"emb", "head"});
  CHECK(!make_plan(b.tree, fixed->policy, "m.pt").has_errors());
  // module_classes [Embedding]: emb wrapped, head in the root; FSDP2's fix: one call for both.
  fixed = find(s.ranked, "module_classes [Embedding] + tied weights in one unit");
  REQUIRE(fixed != nullptr);
  CHECK(fixed->policy.groups[0].modules == std::vector<std::string>{"emb", "head"});
  // FSDP1, size policy: the units below the users' common unit are excluded from wrapping.
  Suggestion s1 = suggest(b.tree, world(4), opt);
  for (const auto& c : s1.ranked) {
    if (c.origin != "fix") continue;
    Plan p = make_plan(b.tree, c.policy, "m.pt");
    CHECK(count_warnings(p, "shared_param_across_units") == 0);
    CHECK(!p.has_errors());
  }
  for (const auto& c : s1.dropped) CHECK(c.origin != "fix");  // every FSDP1 tie fix works here
}

TEST_CASE("a ranking plan has the report's units, refusals and peak, without root warnings or a timeline") {
  TreeBuilder b = tied_lm();
  for (int version : {1, 2}) {
    CAPTURE(version);
    Policy p = policy(R"({"module_classes": ["LayerNorm"]})");  // the root keeps nearly everything
    p.fsdp.world_size = 4;
    p.fsdp.version = *parse_version(version);
    const ClassMatcher matcher;
    Plan report = make_plan(b.tree, p, "m.pt", matcher);
    Plan ranking = make_plan(b.tree, p, "m.pt", matcher, PlanPurpose::Ranking);
    REQUIRE(find_warning(report, "root_too_large") != nullptr);
    CHECK(find_warning(ranking, "root_too_large") == nullptr);
    CHECK(unit_paths(ranking) == unit_paths(report));
    std::vector<std::string> kinds;
    for (const auto& w : report.warnings)
      if (w.kind != "root_too_large") kinds.push_back(w.kind);
    std::vector<std::string> ranking_kinds;
    for (const auto& w : ranking.warnings) ranking_kinds.push_back(w.kind);
    CHECK(ranking_kinds == kinds);
    CHECK(ranking.memory.per_rank.peak_bytes == report.memory.per_rank.peak_bytes);
    CHECK(ranking.memory.per_rank.peak_phase == report.memory.per_rank.peak_phase);
    CHECK_FALSE(report.memory.timeline.empty());
    CHECK(ranking.memory.timeline.empty());
  }
}

TEST_CASE("the optimizer advice names the first ranked candidate that fits with a cheaper optimizer, checked by planning each") {
  auto b = untied_lm();
  for (int version : {1, 2}) {
    Policy base = version == 2 ? fsdp2(1) : world(1);  // one rank: the optimizer state outweighs what is gathered
    SuggestOptions all;
    int64_t lowest = INT64_MAX;  // with SGD
    for (const Candidate& c : suggest(b.tree, base, all).ranked) {
      Policy p = c.policy;
      p.fsdp.optimizer = Optimizer::Sgd;
      lowest = std::min(lowest, peak_of(b, p));
    }
    // At the lowest peak with SGD, one candidate fits with SGD only (its
    // Adam state alone is over); under every candidate's parameters and
    // gradients, none can.
    for (int64_t budget : {lowest, int64_t{100}}) {
      CAPTURE(version);
      CAPTURE(budget);
      SuggestOptions opt;
      opt.budget_bytes = budget;
      Suggestion s = suggest(b.tree, base, opt);
      REQUIRE(!s.ranked.empty());
      REQUIRE(!s.ranked.front().fits);
      std::optional<FitAdvice> expected;
      for (Optimizer o : {Optimizer::SgdMomentum, Optimizer::Sgd}) {
        for (const Candidate& c : s.ranked) {
          Policy p = c.policy;
          p.fsdp.optimizer = o;
          if (const int64_t need = peak_of(b, p); need <= budget) {
            expected = FitAdvice{"optimizer", optimizer_name(o), need, "", c.label};
            break;
          }
        }
        if (expected) break;
      }
      auto it = std::find_if(s.advice.begin(), s.advice.end(), [](const FitAdvice& a) { return a.setting == "optimizer"; });
      REQUIRE((it != s.advice.end()) == expected.has_value());
      CHECK(expected.has_value() == (budget != 100));
      if (!expected) continue;
      CHECK(it->value == expected->value);
      // The advice takes candidates in the order they would rank once fitting
      // (suggest.cpp: fit_advice, better_if_fitting), which may differ from
      // s.ranked's among candidates that fit: the one it names must fit, as planned.
      auto named = std::find_if(s.ranked.begin(), s.ranked.end(),
                                [&](const Candidate& c) { return c.label == it->candidate; });
      REQUIRE(named != s.ranked.end());
      Policy p = named->policy;
      for (Optimizer o : {Optimizer::SgdMomentum, Optimizer::Sgd})
        if (it->value == optimizer_name(o)) p.fsdp.optimizer = o;
      CHECK(it->needed_bytes == peak_of(b, p));
      CHECK(it->needed_bytes <= budget);
    }
  }
}
