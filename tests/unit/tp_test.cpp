// Tensor parallelism (tp/placements.h, policy/tensor_parallel.h): the policy
// section, parallelize_module's key matching and styles, FSDP2's shard of the
// TP-local tensor. tests/tensor_parallel/ checks the same against torch itself.
#include <doctest/doctest.h>

#include <stdexcept>

#include "mesh/device_mesh.h"
#include "plan/plan.h"
#include "planner/planner.h"
#include "policy/policy.h"
#include "tp/activations.h"
#include "tp/placements.h"
#include "tree_builder.h"
#include "util/errors.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {

// emb (Embedding 16x8), layers.{0,1} with attn.{q,o} (Linear 8->8, o without bias) and norm, head.
TreeBuilder tiny_lm() {
  TreeBuilder b("__torch__.LM");
  b.add("emb", "Embedding");
  b.param("emb", "weight", {16, 8});
  b.add("layers", "ModuleList");
  for (const char* i : {"0", "1"}) {
    std::string p = std::string("layers.") + i;
    b.add(p, "Block");
    b.add(p + ".attn", "Attention");
    b.linear(p + ".attn.q", 8, 8);
    b.add(p + ".attn.o", "Linear");
    b.param(p + ".attn.o", "weight", {8, 8});
    b.add(p + ".norm", "LayerNorm");
    b.param(p + ".norm", "weight", {8});
  }
  b.add("head", "Linear");
  b.param("head", "weight", {16, 8});
  return b;
}

Policy tp_policy(const std::string& plan, int64_t world = 8, const std::string& extra = "") {
  return parse_policy(R"J({"module_classes": ["Block"], "fsdp": {"version": 2, "world_size": )J" + std::to_string(world) +
                          R"J(}, "tensor_parallel": {"degree": 2, "plan": )J" + plan + extra + "}}",
                      "p.json");
}

const TpPlacement& placement_of(const Plan& plan, const TreeBuilder& b, const std::string& path, size_t slot = 0) {
  return plan.tensor_parallel->placement[static_cast<size_t>(b.tree.module(b.id(path)).params[slot].tensor)];
}

bool has_kind(const Plan& plan, const std::string& kind) {
  for (const auto& w : plan.warnings)
    if (w.kind == kind) return true;
  return false;
}

}  // namespace

TEST_CASE("fnmatch_token follows Python's fnmatch on one path token") {
  CHECK(fnmatch_token("*", "0"));
  CHECK(fnmatch_token("q_proj", "q_proj"));
  CHECK_FALSE(fnmatch_token("q_proj", "q_proj2"));
  CHECK(fnmatch_token("?_proj", "k_proj"));
  CHECK(fnmatch_token("[qk]_proj", "k_proj"));
  CHECK_FALSE(fnmatch_token("[!qk]_proj", "k_proj"));
  CHECK(fnmatch_token("[0-3]", "2"));
  CHECK(fnmatch_token("*proj", "gate_proj"));
  CHECK_FALSE(fnmatch_token("a*b", "ac"));
}

// The recursive matcher fnmatch_token replaced (issue 39), as the reference:
// right, but exponential in the stars.
static bool reference_fnmatch(const std::string& p, size_t pi, const std::string& s, size_t si) {
  while (pi < p.size()) {
    if (p[pi] == '*') {
      for (size_t k = si; k <= s.size(); ++k)
        if (reference_fnmatch(p, pi + 1, s, k)) return true;
      return false;
    }
    if (si >= s.size()) return false;
    if (p[pi] == '[') {
      size_t j = pi + 1;
      bool negate = j < p.size() && p[j] == '!';
      if (negate) ++j;
      const size_t first = j;
      bool hit = false;
      for (; j < p.size() && (p[j] != ']' || j == first); ++j) {
        if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
          hit = hit || (p[j] <= s[si] && s[si] <= p[j + 2]);
          j += 2;
        } else {
          hit = hit || p[j] == s[si];
        }
      }
      if (j < p.size()) {
        if (hit == negate) return false;
        pi = j + 1, ++si;
        continue;
      }
    }
    if (p[pi] != '?' && p[pi] != s[si]) return false;
    ++pi, ++si;
  }
  return si == s.size();
}

TEST_CASE("fnmatch_token agrees with the recursive matcher on random patterns, in linear steps") {
  const std::vector<std::string> atoms = {"a", "b", "*", "**", "?", "[ab]", "[!a]", "[a-b]", "[", "]", "[]a]"};
  uint64_t seed = 39;
  auto next = [&](size_t n) {
    seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<size_t>((seed >> 33) % n);
  };
  for (int i = 0; i < 20000; ++i) {
    std::string p, s;
    for (size_t k = next(7); k-- > 0;) p += atoms[next(atoms.size())];
    for (size_t k = next(8); k-- > 0;) s += "ab[]"[next(4)];
    INFO(p, " vs ", s);
    CHECK(fnmatch_token(p, s) == reference_fnmatch(p, 0, s, 0));
  }
  // 4,000 stars and an X: the recursion never finished; this returns at once.
  CHECK_FALSE(fnmatch_token(std::string(4000, '*') + "X", std::string(200, 'a')));
  CHECK(fnmatch_token(std::string(4000, '*') + "X", std::string(200, 'a') + "X"));
}

TEST_CASE("styles place parameters as torch's ParallelStyles do, and FSDP2 shards the local tensor") {
  TreeBuilder b = tiny_lm();
  const Policy policy = tp_policy(R"J({"emb": "rowwise", "layers.*.attn.q": "colwise",
      "layers.*.attn.o": {"style": "rowwise", "output_layouts": "shard(1)"}, "layers.*.norm": "sequence_parallel",
      "head": {"style": "colwise", "output_layouts": "replicate"}})J");
  const Plan plan = make_plan(b.tree, policy, "m.pt");
  REQUIRE(plan.tensor_parallel);
  CHECK_FALSE(plan.has_errors());
  const TensorParallelPlan& tp = *plan.tensor_parallel;
  CHECK(plan.mesh.size(MeshDim::DpShard) == 4);
  CHECK(tp.modules.size() == 8);
  CHECK(tp_placement_repr(placement_of(plan, b, "emb")) == "Shard(dim=0)");              // rowwise Embedding
  CHECK(tp_placement_repr(placement_of(plan, b, "layers.0.attn.q")) == "Shard(dim=0)");  // colwise weight
  CHECK(tp_placement_repr(placement_of(plan, b, "layers.0.attn.q", 1)) == "Shard(dim=0)");  // and bias
  CHECK(tp_placement_repr(placement_of(plan, b, "layers.1.attn.o")) == "Shard(dim=1)");  // rowwise weight
  CHECK(tp_placement_repr(placement_of(plan, b, "layers.1.norm")) == "Replicate()");
  const TensorId o = b.tree.module(b.id("layers.1.attn.o")).params[0].tensor;
  CHECK(tp.local_shape[static_cast<size_t>(o)] == std::vector<int64_t>{8, 4});
  const Fsdp2TpParam f = fsdp2_tp_param(tp, b.tree, o);
  CHECK(f.placements == std::vector<std::string>{"Shard(dim=0)", "Shard(dim=1)"});
  CHECK(f.mesh_dims == std::vector<std::string>{"dp_shard", "tp"});
  CHECK(f.local_shape == std::vector<int64_t>{2, 4});
  const TensorId q = b.tree.module(b.id("layers.0.attn.q")).params[0].tensor;
  CHECK(fsdp2_tp_param(tp, b.tree, q).placements == std::vector<std::string>{"_StridedShard(dim=0, sf=2)", "Shard(dim=0)"});
  // Sharded parameters per rank: each TP-local tensor's ceil(d0 / 4) rows.
  // emb 16x8 -> 8x8 -> 2x8; per layer q 8x8+8 -> 4x8+4 -> 1x8+1, o 8x4 -> 2x4, norm 8 -> 2; head 16x8 -> 8x8 -> 2x8.
  CHECK(plan.memory.shard_group_size == 4);
  CHECK(plan.memory.per_rank.params_bytes == 4 * (16 + 2 * (8 + 1 + 8 + 2) + 16));
}

TEST_CASE("a 2-D plan's FSDP collectives run on the strided dp group; TP's sizes need a graph") {
  TreeBuilder b = tiny_lm();
  const Plan plan = make_plan(b.tree, tp_policy(R"J({"emb": "rowwise", "layers.*.attn.q": "colwise",
      "layers.*.attn.o": "rowwise", "head": {"style": "colwise", "output_layouts": "replicate"}})J"), "m.pt");
  REQUIRE(plan.comm.computed);
  // (dp_shard 4, tp 2): rank 0's dp group is ranks 0, 2, 4, 6 (tp innermost).
  REQUIRE_FALSE(plan.comm.collectives.empty());
  for (const Collective& c : plan.comm.collectives) CHECK(c.group == RankGroup{4, 2});
  // The root's all-gather: emb 16x8 and head 16x8, each TP-local 8x8, each rank's padded
  // shard 2x8, gathered over 4 ranks: 128 float32 elements.
  const Collective& root = plan.comm.collectives.front();
  CHECK(root.unit == 0);
  CHECK(root.numel == 128);
  CHECK(root.bytes == 512);
  // A TorchScript-like tree has no activation shapes: TP's collectives are not guessed.
  const TpComm& tp = plan.comm.tp;
  CHECK(tp.planned);
  CHECK_FALSE(tp.sizes_known);
  CHECK(tp.collectives.empty());
  CHECK(tp.group == RankGroup{2, 1});
  CHECK(tp.unknown_reason.find("unknown") != std::string::npos);
  CHECK(plan.time.tp_comm_s == 0);
}

TEST_CASE("the plan refuses what parallelize_module refuses") {
  TreeBuilder b = tiny_lm();
  CHECK(has_kind(make_plan(b.tree, tp_policy(R"J({"layers.*.attn.k": "colwise"})J"), "m.pt"), "tp_unmatched_pattern"));
  CHECK(has_kind(make_plan(b.tree, tp_policy(R"J({"layers.*.norm": "colwise"})J"), "m.pt"), "tp_style_class"));
  CHECK(has_kind(make_plan(b.tree, tp_policy(R"J({"layers.*": "sequence_parallel"})J"), "m.pt"), "tp_style_class"));
  CHECK(has_kind(make_plan(b.tree, tp_policy(R"J({"layers.*.attn.q": "colwise", "layers.0.attn.q": "rowwise"})J"), "m.pt"),
                 "tp_applied_twice"));
  TreeBuilder odd("__torch__.M");
  odd.add("blocks", "ModuleList");
  odd.add("blocks.0", "Block");
  odd.linear("blocks.0.fc", 8, 6);
  const Plan p = make_plan(odd.tree, tp_policy(R"J({"blocks.0.fc": {"style": "colwise"}})J", 8, R"J(, "mesh": {"dp_shard": 2})J"),
                           "m.pt");
  CHECK_FALSE(has_kind(p, "tp_uneven_split"));  // 6 rows over tp 2
  Policy three = tp_policy(R"J({"blocks.0.fc": "colwise"})J", 6);
  three.tensor_parallel->degree = 3;
  const Plan p3 = make_plan(odd.tree, three, "m.pt");
  CHECK_FALSE(has_kind(p3, "tp_uneven_split"));  // 6 over 3 divides
  three.tensor_parallel->degree = 4;
  three.fsdp.world_size = 8;
  CHECK(has_kind(make_plan(odd.tree, three, "m.pt"), "tp_uneven_split"));  // 6 over 4
}

TEST_CASE("the tensor_parallel section: parser, mesh checks and writers") {
  CHECK_THROWS_AS(tp_policy(R"J({"x": "colwse"})J"), InputError);
  CHECK_THROWS_AS(tp_policy(R"J({"x": {"style": "colwise", "output_layouts": "Shard(1)"}})J"), InputError);
  // Layouts are "replicate" or "shard(N)", N an optional '-' and digits (checked by hand, not std::regex).
  for (const char* bad : {"shard()", "shard(-)", "shard(--1)", "shard(1-)", "shard(1))", "shard(1", "replicate "}) {
    CHECK_THROWS_AS(tp_policy(std::string(R"J({"x": {"style": "colwise", "output_layouts": ")J") + bad + "\"}}"),
                    InputError);
  }
  CHECK_NOTHROW(tp_policy(R"J({"x": {"style": "colwise", "output_layouts": "shard(-1)"}})J"));
  CHECK_THROWS_AS(tp_policy(R"J({"x": {"style": "colwise", "sequence_dim": 1}})J"), InputError);
  // "plan": "model" parses; only a file with fsdp-plan-export's record can give the plan.
  const Policy from_model = tp_policy(R"J("model")J");
  CHECK(from_model.tensor_parallel->from_model);
  CHECK(from_model.tensor_parallel->plan.empty());
  const TreeBuilder lm = tiny_lm();
  CHECK_THROWS_AS(make_plan(lm.tree, from_model, "m.pt"), InputError);
  CHECK_THROWS_AS(tp_policy("{}"), InputError);
  Policy p = tp_policy(R"J({"x": "colwise"})J", 8, R"J(, "mesh": {"dp_replicate": 2})J");
  CHECK(p.combination_error().empty());
  CHECK(device_mesh_error(p.fsdp, &*p.tensor_parallel).empty());
  CHECK(device_mesh(p.fsdp, &*p.tensor_parallel).size(MeshDim::DpShard) == 2);
  p.fsdp.world_size = 6;
  CHECK(device_mesh_error(p.fsdp, &*p.tensor_parallel).find("has 4 ranks, the world size is 6") != std::string::npos);
  p.fsdp.world_size = 2;
  p.tensor_parallel->dp_replicate = 0;
  CHECK(device_mesh_error(p.fsdp, &*p.tensor_parallel).find("takes every rank") != std::string::npos);
  p.fsdp.version = FsdpVersion::V1;
  CHECK(device_mesh_error(p.fsdp, &*p.tensor_parallel).find("composes with FSDP2") != std::string::npos);
  // policy_file_json reads back as the same section.
  const Policy q = tp_policy(R"J({"a.*": {"style": "rowwise", "output_layouts": "shard(1)"}, "n": "sequence_parallel"})J");
  const Policy back = parse_policy(policy_file_json(q).dump(), "back.json");
  REQUIRE(back.tensor_parallel);
  CHECK(back.tensor_parallel->plan == q.tensor_parallel->plan);
  CHECK(tp_style_python(q.tensor_parallel->plan[0].second) == "RowwiseParallel(output_layouts=Shard(1))");
  // prepare_module_input: a layout or a list with nulls, as long as the desired ones (torch's asserts).
  const Policy prep = tp_policy(R"J({"layers.*.attn": {"style": "prepare_module_input",
      "input_layouts": ["shard(1)", null], "desired_input_layouts": ["replicate", null]}})J");
  const TpStyleSpec& ps = prep.tensor_parallel->plan[0].second;
  CHECK(ps.prepare_layouts == TpStyleSpec::Layouts{std::string("shard(1)"), std::nullopt});
  CHECK(tp_style_python(ps) ==
        "PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None))");
  CHECK(parse_policy(policy_file_json(prep).dump(), "back.json").tensor_parallel->plan == prep.tensor_parallel->plan);
  CHECK(tp_style_python(tp_policy(R"J({"m": {"style": "prepare_module_input", "input_layouts": "shard(1)",
      "desired_input_layouts": "replicate"}})J").tensor_parallel->plan[0].second) ==
        "PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))");
  CHECK_THROWS_AS(tp_policy(R"J({"m": {"style": "prepare_module_input", "input_layouts": "shard(1)"}})J"), InputError);
  CHECK_THROWS_AS(tp_policy(R"J({"m": {"style": "prepare_module_input", "input_layouts": ["shard(1)"],
      "desired_input_layouts": ["replicate", null]}})J"), InputError);
  CHECK_THROWS_AS(tp_policy(R"J({"m": {"style": "prepare_module_input", "output_layouts": "shard(1)",
      "desired_output_layouts": "replicate"}})J"), InputError);
  CHECK_THROWS_AS(tp_policy(R"J({"m": {"style": "colwise", "desired_input_layouts": "replicate"}})J"), InputError);
  // The plan keeps the order written (parallelize_module applies a dict in order), not JSON's sorted keys.
  const Policy order = tp_policy(R"J({"z": "colwise", "a": "rowwise", "m": "sequence_parallel"})J");
  REQUIRE(order.tensor_parallel->plan.size() == 3);
  CHECK(order.tensor_parallel->plan[0].first == "z");
  CHECK(order.tensor_parallel->plan[2].first == "m");
  CHECK(parse_policy(policy_file_json(order).dump(), "back.json").tensor_parallel->plan[0].first == "z");
  // transformers' own styles belong to a model's plan, not to parallelize_module's.
  CHECK_THROWS_AS(tp_policy(R"J({"m": "moe_tp_experts"})J"), InputError);
}

namespace {

// A hand-made walk graph over tiny_lm's modules (tp/activations.h rewrites it to rank 0's shapes).
struct TpGraph {
  WalkGraph g;
  int32_t tensor(std::vector<int64_t> sizes, std::vector<int64_t> strides = {}) {
    WalkTensor t;
    if (strides.empty()) {
      strides.assign(sizes.size(), 1);
      for (size_t k = sizes.size(); k-- > 1;) strides[k - 1] = strides[k] * sizes[k];
    }
    t.sizes = std::move(sizes);
    t.strides = std::move(strides);
    g.tensors.push_back(t);
    return static_cast<int32_t>(g.tensors.size()) - 1;
  }
  int32_t param(const TreeBuilder& b, const std::string& path, std::vector<int64_t> sizes) {
    WalkPlaceholder p;
    p.tensor = tensor(std::move(sizes));
    p.kind = WalkInput::Parameter;
    p.param = b.tree.module(b.id(path)).params[0].tensor;
    g.placeholders.push_back(p);
    return p.tensor;
  }
  static WalkArg targ(const std::string& name, int32_t t) {
    WalkArg a;
    a.name = name;
    a.value.kind = ArgValue::Kind::Tensor;
    a.tensors = {t};
    return a;
  }
  static WalkArg iarg(const std::string& name, ArgValue v) {
    WalkArg a;
    a.name = name;
    a.value = std::move(v);
    return a;
  }
  int32_t node(const std::string& op, ModuleId m, std::vector<WalkArg> args, int32_t out) {
    WalkNode n;
    n.op = op;
    n.module = m;
    n.args = std::move(args);
    n.outputs = {out};
    g.nodes.push_back(std::move(n));
    return out;
  }
};

}  // namespace

TEST_CASE("activations per tp rank: local shapes through colwise, views, rowwise and a gathered head") {
  TreeBuilder b = tiny_lm();
  const Plan plan = make_plan(b.tree, tp_policy(R"J({"layers.*.attn.q": "colwise", "layers.*.attn.o": "rowwise",
      "head": {"style": "colwise", "output_layouts": "replicate"}})J"), "m.pt");
  REQUIRE(plan.tensor_parallel);
  TpGraph t;
  const int32_t qw = t.param(b, "layers.0.attn.q", {8, 8});
  const int32_t ow = t.param(b, "layers.0.attn.o", {8, 8});
  const int32_t hw = t.param(b, "head", {16, 8});
  WalkPlaceholder in;
  in.tensor = t.tensor({2, 4, 8});
  t.g.placeholders.push_back(in);
  const ModuleId q = b.id("layers.0.attn.q"), attn = b.id("layers.0.attn"), o = b.id("layers.0.attn.o");
  const int32_t y = t.node("aten.linear.default", q, {TpGraph::targ("input", in.tensor), TpGraph::targ("weight", qw)},
                           t.tensor({2, 4, 8}));
  // [B, S, H * D] -> [B, S, H, D] -> [B, H, S, D]: the heads are what tp splits.
  const int32_t v = t.node("aten.view.default", attn, {TpGraph::targ("self", y), TpGraph::iarg("size", ArgValue::of_ints({2, 4, 2, 4}))},
                           t.tensor({2, 4, 2, 4}));
  const int32_t tr = t.node("aten.transpose.int", attn,
                            {TpGraph::targ("self", v), TpGraph::iarg("dim0", ArgValue::of_int(1)), TpGraph::iarg("dim1", ArgValue::of_int(2))},
                            t.tensor({2, 2, 4, 4}, {32, 4, 8, 1}));
  const int32_t z = t.node("aten.linear.default", o, {TpGraph::targ("input", y), TpGraph::targ("weight", ow)},
                           t.tensor({2, 4, 8}));
  const int32_t logits = t.node("aten.linear.default", b.id("head"),
                                {TpGraph::targ("input", z), TpGraph::targ("weight", hw)}, t.tensor({2, 4, 16}));
  const int32_t s = t.node("aten.sum.default", 0, {TpGraph::targ("self", logits)}, t.tensor({}));
  t.g.outputs = {s};

  const WalkGraph local = tp_local_walk_graph(t.g, plan);
  auto sizes = [&](int32_t id) { return local.tensors[static_cast<size_t>(id)].sizes; };
  CHECK(sizes(qw) == std::vector<int64_t>{4, 8});   // Shard(0) weight: its local rows
  CHECK(sizes(ow) == std::vector<int64_t>{8, 4});   // rowwise: Shard(1)
  CHECK(sizes(in.tensor) == std::vector<int64_t>{2, 4, 8});
  CHECK(sizes(y) == std::vector<int64_t>{2, 4, 4});  // colwise output: Shard(-1), local
  CHECK(sizes(v) == std::vector<int64_t>{2, 4, 1, 4});
  CHECK(local.tensors[static_cast<size_t>(v)].strides == std::vector<int64_t>{16, 4, 4, 1});
  CHECK(sizes(tr) == std::vector<int64_t>{2, 1, 4, 4});  // the local heads, a view of the local q
  CHECK(local.tensors[static_cast<size_t>(tr)].strides == std::vector<int64_t>{16, 4, 4, 1});
  CHECK(sizes(z) == std::vector<int64_t>{2, 4, 8});  // rowwise output: all-reduced whole
  CHECK(sizes(logits) == std::vector<int64_t>{2, 4, 8});  // the head's local chunk ...
  // ... all-gathered whole (a copy in the head's module), which the sum then reads.
  REQUIRE(local.nodes.size() == t.g.nodes.size() + 1);
  const WalkNode& gather = local.nodes[local.nodes.size() - 2];
  CHECK(gather.op == "aten.clone.default");
  CHECK(gather.module == b.id("head"));
  REQUIRE(gather.outputs.size() == 1);
  CHECK(sizes(gather.outputs[0]) == std::vector<int64_t>{2, 4, 16});
  CHECK(local.nodes.back().args[0].tensors[0] == gather.outputs[0]);

  // Sequence parallelism: o reduce-scatters to Shard(1); what follows is 1/tp along the sequence
  // until a colwise module with input_layouts shard(1) all-gathers it.
  const Plan sp = make_plan(b.tree, tp_policy(R"J({"layers.*.attn.q": "colwise",
      "layers.*.attn.o": {"style": "rowwise", "output_layouts": "shard(1)"},
      "head": {"style": "colwise", "input_layouts": "shard(1)"}})J"), "m.pt");
  const WalkGraph seq = tp_local_walk_graph(t.g, sp);
  CHECK(seq.tensors[static_cast<size_t>(z)].sizes == std::vector<int64_t>{2, 2, 8});
  const WalkNode& head = seq.nodes[seq.nodes.size() - 2];
  REQUIRE(head.op == "aten.linear.default");
  CHECK(seq.tensors[static_cast<size_t>(head.args[0].tensors[0])].sizes == std::vector<int64_t>{2, 4, 8});
  CHECK(seq.tensors[static_cast<size_t>(logits)].sizes == std::vector<int64_t>{2, 4, 8});  // Shard(-1): V / tp
  // Without tensor parallelism there is nothing to rewrite.
  CHECK_FALSE(tp_local_graph(make_plan(b.tree, parse_policy(R"J({"fsdp": {"version": 2, "world_size": 8}})J", "p.json"), "m.pt")));
}

// Issue 41 item 5: torchtitan's sequence-parallel plan on Hugging Face's Llama
// builds, and torch's first forward fails (the rotary embeddings are computed
// once, outside the layers): an error, not a plan that exits 0.
TEST_CASE("a sequence-sharding plan on a model with its rotary embeddings outside the layers is refused") {
  TreeBuilder b = tiny_lm();
  b.add("rotary_emb", "LlamaRotaryEmbedding");
  const std::string sp = R"J({"emb": {"style": "rowwise", "input_layouts": "replicate", "output_layouts": "shard(1)"},
      "layers.*.norm": "sequence_parallel", "layers.*.attn.q": "colwise",
      "layers.*.attn.o": {"style": "rowwise", "output_layouts": "shard(1)"}})J";
  const Plan refused = make_plan(b.tree, tp_policy(sp), "m.pt");
  REQUIRE(has_kind(refused, "tp_sequence_rotary"));
  CHECK(refused.has_errors());
  // Without sequence sharding it runs; so does the plan on a model without that module.
  CHECK_FALSE(has_kind(make_plan(b.tree, tp_policy(R"J({"layers.*.attn.q": "colwise", "layers.*.attn.o": "rowwise"})J"), "m.pt"),
                       "tp_sequence_rotary"));
  const TreeBuilder plain = tiny_lm();
  CHECK_FALSE(has_kind(make_plan(plain.tree, tp_policy(sp), "m.pt"), "tp_sequence_rotary"));
  // Rotary embeddings inside each layer (computed from the layer's own input) are not this case.
  TreeBuilder inside = tiny_lm();
  inside.add("layers.0.attn.rotary_emb", "GPTNeoXRotaryEmbedding");
  CHECK_FALSE(has_kind(make_plan(inside.tree, tp_policy(sp), "m.pt"), "tp_sequence_rotary"));
}
