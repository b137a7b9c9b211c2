// Tensor parallelism (tp/placements.h, policy/tensor_parallel.h): the policy
// section, parallelize_module's key matching and styles, FSDP2's shard of the
// TP-local tensor. tests/tensor_parallel/ checks the same against torch itself.
#include <doctest/doctest.h>

#include <stdexcept>

#include "plan/plan.h"
#include "planner/planner.h"
#include "policy/policy.h"
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

TEST_CASE("styles place parameters as torch's ParallelStyles do, and FSDP2 shards the local tensor") {
  TreeBuilder b = tiny_lm();
  const Policy policy = tp_policy(R"J({"emb": "rowwise", "layers.*.attn.q": "colwise",
      "layers.*.attn.o": {"style": "rowwise", "output_layouts": "shard(1)"}, "layers.*.norm": "sequence_parallel",
      "head": {"style": "colwise", "output_layouts": "replicate"}})J");
  const Plan plan = make_plan(b.tree, policy, "m.pt");
  REQUIRE(plan.tensor_parallel);
  CHECK_FALSE(plan.has_errors());
  const TensorParallelPlan& tp = *plan.tensor_parallel;
  CHECK(tp.mesh.dp_shard == 4);
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
  CHECK(tp_mesh_sizes(*p.tensor_parallel, 8).dp_shard == 2);
  p.fsdp.world_size = 6;
  CHECK(p.combination_error().find("has 4 ranks, the world size is 6") != std::string::npos);
  p.fsdp.world_size = 2;
  p.tensor_parallel->dp_replicate = 0;
  CHECK(p.combination_error().find("takes every rank") != std::string::npos);
  p.fsdp.version = FsdpVersion::V1;
  CHECK(p.combination_error().find("composes with FSDP2") != std::string::npos);
  // policy_file_json reads back as the same section.
  const Policy q = tp_policy(R"J({"a.*": {"style": "rowwise", "output_layouts": "shard(1)"}, "n": "sequence_parallel"})J");
  const Policy back = parse_policy(policy_file_json(q).dump(), "back.json");
  REQUIRE(back.tensor_parallel);
  CHECK(back.tensor_parallel->plan == q.tensor_parallel->plan);
  CHECK(tp_style_python(q.tensor_parallel->plan[0].second) == "RowwiseParallel(output_layouts=Shard(1))");
}
