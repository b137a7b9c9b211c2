#include <doctest/doctest.h>

#include "accelerate/config.h"
#include "emit/emit.h"
#include "tree_builder.h"
#include "util/errors.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {

const std::string kHead = "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 8\n";

AccelerateConfig read(const std::string& fsdp_config, const std::string& top = "") {
  return parse_accelerate_config(kHead + top + "fsdp_config:\n" + fsdp_config, "a.yaml");
}

std::string error_of(const std::string& yaml) {
  try {
    parse_accelerate_config(yaml, "a.yaml");
  } catch (const InputError& e) {
    CHECK(e.file() == "a.yaml");
    return e.what();
  }
  return "";
}

const Warning* warning_about(const AccelerateConfig& c, const std::string& key) {
  for (const auto& w : c.warnings)
    if (w.kind == "accelerate_config_key" && w.message.rfind(key + ":", 0) == 0) return &w;
  return nullptr;
}

Names plan_units(const TreeBuilder& b, AccelerateConfig c) {
  resolve_accelerate_config(c, b.tree);
  return unit_paths(make_plan(b.tree, c.policy, "m.pt"));
}

// a (pkg_a.Block) and b (pkg_b.Block): two classes Accelerate knows by one bare name.
TreeBuilder two_packages_one_bare_name() {
  TreeBuilder b;
  b.add("a", "__torch__.pkg_a.Block");
  b.param("a", "w", {4});
  b.add("b", "__torch__.pkg_b.Block");
  b.param("b", "w", {4});
  return b;
}

}  // namespace

TEST_CASE("an Accelerate config in JSON is recognised by its keys, a JSON policy is not") {
  CHECK(is_accelerate_config_json(nlohmann::json::parse(R"({"distributed_type": "FSDP"})")));
  CHECK(is_accelerate_config_json(nlohmann::json::parse(R"({"fsdp_config": {"fsdp_version": 1}})")));
  CHECK_FALSE(is_accelerate_config_json(nlohmann::json::parse(R"({"module_classes": ["Block"]})")));
  CHECK_FALSE(is_accelerate_config_json(nlohmann::json::parse(R"(["distributed_type"])")));
}

TEST_CASE("an Accelerate config in JSON reads as its YAML does, with json.load's values") {
  AccelerateConfig y = read("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 1000\n");
  AccelerateConfig j = parse_accelerate_config_json(
      nlohmann::json::parse(R"({"compute_environment": "LOCAL_MACHINE", "distributed_type": "FSDP",
         "num_processes": 8, "fsdp_config": {"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP",
         "fsdp_min_num_params": 1000}})"),
      "a.json");
  CHECK(policy_to_json(j.policy) == policy_to_json(y.policy));
  CHECK(j.policy.min_num_params == 1000);
  // json.load gives 1e8 as a float; the plugin's int() refuses its str() as it refuses YAML's "1e8".
  CHECK_THROWS_WITH_AS(parse_accelerate_config_json(nlohmann::json::parse(
                           R"({"distributed_type": "FSDP", "num_processes": 2, "fsdp_config": {
                               "fsdp_auto_wrap_policy": "SIZE_BASED_WRAP", "fsdp_min_num_params": 1e8}})"),
                           "a.json"),
                       doctest::Contains("invalid literal for int() with base 10: '100000000.0'"), InputError);
  // A string "no" stays a string (YAML would need quotes), a JSON false a bool.
  CHECK_FALSE(parse_accelerate_config_json(nlohmann::json::parse(
                  R"({"distributed_type": "FSDP", "num_processes": 2, "mixed_precision": "no"})"), "a.json")
                  .policy.mixed_precision.has_value());
}

TEST_CASE("a YAML file that is no Accelerate mapping says what it is") {
  CHECK(error_of("# only a comment\n\n").find("no YAML document") != std::string::npos);
  CHECK(error_of("- a\n- b\n").find("is a YAML list") != std::string::npos);
  CHECK(error_of("just text\n").find("is a YAML scalar ('just text')") != std::string::npos);
  CHECK(error_of("~\n").find("is a YAML null") != std::string::npos);
  CHECK(error_of("module_classes: [Block]\n").find("without any of Accelerate's keys") != std::string::npos);
  // A YAML error names its line and column.
  CHECK(error_of("distributed_type: FSDP\nfsdp_config:\n  a: 1\n   b: 2\n").find("(line 4, column ") !=
        std::string::npos);
}

TEST_CASE("missing keys take the launcher's defaults, not the plugin's") {
  AccelerateConfig c = read("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n");
  CHECK(c.policy.fsdp.version == FsdpVersion::V1);
  CHECK(c.policy.min_num_params == 100000000);  // launcher 1e8; the plugin alone would say 0
  CHECK(c.policy.fsdp.use_orig_params);          // launcher "true"; the plugin alone False
  CHECK(c.policy.fsdp.world_size == 8);
  CHECK(c.policy.fsdp.strategy == ShardingStrategy::FullShard);
  CHECK_FALSE(c.policy.mixed_precision.has_value());
  REQUIRE(!c.warnings.empty());
  CHECK(c.warnings[0].kind == "accelerate_config");
  CHECK(c.warnings[0].message.find("min_num_params=100000000 (launcher default)") != std::string::npos);
}

TEST_CASE("no auto-wrap policy is NO_WRAP; names are case-insensitive") {
  CHECK_FALSE(read("  fsdp_offload_params: false\n").policy.auto_wrap());
  AccelerateConfig c = read("  fsdp_auto_wrap_policy: transformer_based_wrap\n  fsdp_transformer_layer_cls_to_wrap: Block\n");
  CHECK(c.auto_wrap_policy == "TRANSFORMER_BASED_WRAP");
  CHECK(c.class_names == Names{"Block"});
}

TEST_CASE("min_num_params 0 means no auto-wrap in Accelerate") {
  AccelerateConfig c = read("  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 0\n");
  CHECK_FALSE(c.policy.auto_wrap());
  const Warning* w = warning_about(c, "fsdp_min_num_params");
  REQUIRE(w);
  CHECK(w->message.find("If zero, we silently ignore it.") != std::string::npos);
}

TEST_CASE("class names split at commas as Accelerate splits them, unstripped") {
  AccelerateConfig c = read("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                            "  fsdp_transformer_layer_cls_to_wrap: Block, Head\n");
  CHECK(c.class_names == Names{"Block", " Head"});
  AccelerateConfig l = read("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                            "  fsdp_transformer_layer_cls_to_wrap: [Block, Head]\n");
  CHECK(l.class_names == Names{"['Block'", " 'Head']"});
  CHECK(warning_about(l, "fsdp_transformer_layer_cls_to_wrap"));
}

TEST_CASE("a missing class is Accelerate's error with the nearest names") {
  TreeBuilder b = two_blocks_and_a_head();
  AccelerateConfig c = read("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                            "  fsdp_transformer_layer_cls_to_wrap: Blok,Linear\n");
  resolve_accelerate_config(c, b.tree);
  const Warning* w = nullptr;
  for (const auto& x : c.warnings)
    if (x.kind == "accelerate_class_missing") w = &x;
  REQUIRE(w);
  CHECK(w->severity == Severity::Error);
  CHECK(w->message.find("Could not find the transformer layer class Blok in the model.") != std::string::npos);
  CHECK(w->suggestions == Names{"Block"});
  CHECK(c.policy.module_classes == Names{"Linear"});
}

TEST_CASE("class names are exact bare names: a base class name matches no module") {
  TreeBuilder b;
  b.add("bn", "BatchNorm2d");
  b.param("bn", "weight", {4});
  AccelerateConfig c = read("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                            "  fsdp_transformer_layer_cls_to_wrap: _BatchNorm\n");
  resolve_accelerate_config(c, b.tree);
  CHECK(c.warnings.back().kind == "accelerate_class_missing");
}

TEST_CASE("two classes with one bare name: Accelerate wraps the first it meets") {
  TreeBuilder b = two_packages_one_bare_name();
  AccelerateConfig c = read("  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
                            "  fsdp_transformer_layer_cls_to_wrap: Block\n");
  CHECK(plan_units(b, c) == Names{"", "a"});
}

TEST_CASE("unknown, stale and version-dead keys are warnings naming the key") {
  AccelerateConfig c = read("  fsdp_backward_prefetch_policy: BACKWARD_PRE\n"
                            "  fsdp_ofload_params: true\n"
                            "  min_num_params: 5\n");  // no prefix: Accelerate adds fsdp_
  CHECK(warning_about(c, "fsdp_backward_prefetch_policy"));
  const Warning* typo = warning_about(c, "fsdp_ofload_params");
  REQUIRE(typo);
  CHECK(typo->suggestions == Names{"fsdp_offload_params"});
  CHECK(warning_about(c, "fsdp_min_num_params"));  // read, but does nothing with NO_WRAP
  AccelerateConfig v1 = read("  fsdp_reshard_after_forward: SHARD_GRAD_OP\n");
  CHECK(v1.policy.fsdp.strategy == ShardingStrategy::FullShard);
  CHECK(warning_about(v1, "fsdp_reshard_after_forward"));
  AccelerateConfig v2 = read("  fsdp_version: 2\n  fsdp_sharding_strategy: FULL_SHARD\n  fsdp_use_orig_params: true\n");
  CHECK(v2.policy.fsdp.v2());
  CHECK(warning_about(v2, "fsdp_sharding_strategy"));
  CHECK(warning_about(v2, "fsdp_use_orig_params"));
}

TEST_CASE("mixed precision and HYBRID_SHARD over machines") {
  AccelerateConfig c = read("  fsdp_sharding_strategy: HYBRID_SHARD\n", "mixed_precision: bf16\nnum_machines: 2\n");
  REQUIRE(c.policy.mixed_precision);
  CHECK(c.policy.mixed_precision->param_dtype == "bfloat16");
  CHECK(c.policy.mixed_precision->reduce_dtype == "bfloat16");
  CHECK(c.policy.mixed_precision->buffer_dtype == "bfloat16");
  CHECK_FALSE(c.policy.mixed_precision->output_dtype);  // FSDP1's MixedPrecision has none
  AccelerateConfig v2 = read("  fsdp_version: 2\n", "mixed_precision: fp16\n");
  CHECK(v2.policy.mixed_precision->output_dtype == "float16");  // MixedPrecisionPolicy(output_dtype=d)
  CHECK(c.policy.fsdp.strategy == ShardingStrategy::HybridShard);
  CHECK(c.policy.fsdp.shard_group_size == 4);
  CHECK_FALSE(read("  fsdp_version: 1\n", "mixed_precision: 'no'\n").policy.mixed_precision);
  // Unquoted, YAML makes it false and accelerate launch fails on it.
  CHECK(error_of(kHead + "mixed_precision: no\n").find("'bool' object has no attribute 'lower'") != std::string::npos);
}

TEST_CASE("what accelerate launch refuses is an input error") {
  CHECK(error_of("distributed_type: FSDP\nnum_processes: 2\nfsdp_confg: {}\n").find("had unknown keys (['fsdp_confg'])") !=
        std::string::npos);
  CHECK(error_of("num_processes: 2\n").find("A `distributed_type` must be specified") != std::string::npos);
  CHECK(error_of(kHead + "fsdp_config:\n  fsdp_auto_wrap_policy: BY_SIZE\n").find("Invalid auto wrap policy: BY_SIZE") !=
        std::string::npos);
  CHECK(error_of(kHead + "fsdp_config:\n  fsdp_sharding_strategy: FULL\n").find("KeyError: 'FULL'") != std::string::npos);
  CHECK(error_of(kHead + "fsdp_config:\n  fsdp_auto_wrap_policy: SIZE_BASED_WRAP\n  fsdp_min_num_params: 1e8\n")
            .find("invalid literal for int() with base 10: '1e8'") != std::string::npos);
  CHECK(error_of(kHead + "fsdp_config:\n  fsdp_sync_module_states: false\n").find("fsdp_cpu_ram_efficient_loading") !=
        std::string::npos);
  CHECK(error_of(kHead + "mixed_precision: fp32\n").find("Unknown mixed_precision mode: fp32") != std::string::npos);
  CHECK(error_of(kHead + "fsdp_config:\n  fsdp_version: 2\n  fsdp_reshard_after_forward: FULL_SHARD\n")
            .find("invalid truth value full_shard") != std::string::npos);
  CHECK(error_of("distributed_type: MULTI_GPU\n").find("not FSDP") != std::string::npos);
  CHECK(error_of("distributed_type: FSDP\nfsdp_config: [1\n").find("not valid YAML") != std::string::npos);
}

TEST_CASE("fsdp_ignored_modules is a regex fully matched against module paths") {
  TreeBuilder b = two_blocks_and_a_head();
  AccelerateConfig c = read("  fsdp_ignored_modules: 'blocks\\.[0-9]'\n");
  resolve_accelerate_config(c, b.tree);
  CHECK(c.policy.ignored_modules == Names{"blocks.0", "blocks.1"});
}

TEST_CASE("emit accelerate: a class plan round-trips, an inexpressible one says why") {
  TreeBuilder b = two_blocks_and_a_head();
  Plan plan = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"world_size": 4}})");
  std::string yaml = plan_to_accelerate(plan);
  CHECK(yaml.find("fsdp_transformer_layer_cls_to_wrap: Block\n") != std::string::npos);
  CHECK(yaml.find("num_processes: 4\n") != std::string::npos);
  AccelerateConfig back = parse_accelerate_config(yaml, "e.yaml");
  CHECK(plan_units(b, back) == unit_paths(plan));

  Plan globbed = plan_of(b, R"({"module_classes": ["Block"], "ignored_params": ["head.*"]})");
  CHECK_THROWS_WITH_AS(plan_to_accelerate(globbed), doctest::Contains("--emit torch"), EmitError);
  Plan zero = plan_of(b, R"({"min_num_params": 0})");
  CHECK_THROWS_AS(plan_to_accelerate(zero), EmitError);
  Plan fp32_reduce = plan_of(b, R"({"module_classes": ["Block"], "mixed_precision": {"param_dtype": "bfloat16"}})");
  CHECK_THROWS_AS(plan_to_accelerate(fp32_reduce), EmitError);
}

TEST_CASE("emit accelerate: units Accelerate would choose differently are named, both lists") {
  TreeBuilder b = two_packages_one_bare_name();
  Plan plan = plan_of(b, R"({"module_classes": ["pkg_a.Block", "pkg_b.Block"]})");
  REQUIRE(unit_paths(plan) == Names{"", "a", "b"});
  CHECK_THROWS_WITH_AS(plan_to_accelerate(plan),
                       doctest::Contains("Accelerate would make the units [(root), a], the plan has [(root), a, b]"),
                       EmitError);
}

TEST_CASE("emit torch spells out the units and checks them") {
  TreeBuilder b = two_blocks_and_a_head();
  Plan plan = plan_of(b, R"({"module_classes": ["Block"]})");
  std::string py = plan_to_torch(plan);
  CHECK(py.find("UNITS = [\n    \"blocks.0\",\n    \"blocks.1\",\n]") != std::string::npos);
  CHECK(py.find("CustomPolicy") != std::string::npos);
  CHECK(py.find("raise RuntimeError") != std::string::npos);
  Plan size = plan_of(b, R"({"min_num_params": 10})");
  CHECK(plan_to_torch(size).find("size_based_auto_wrap_policy, min_num_params=10") != std::string::npos);
}

TEST_CASE("emit torch, FSDP2: fully_shard calls in call order, the root last with PyTorch's default") {
  TreeBuilder b = two_blocks_and_a_head();
  Plan plan = plan_of(b, R"({"module_classes": ["Block"], "groups": [{"modules": ["head"], "reshard_after_forward": 2}],
      "ignored_params": ["blocks.1.*"], "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"},
      "fsdp": {"version": 2, "world_size": 8, "sharding_strategy": "HYBRID_SHARD", "shard_group_size": 4,
               "reshard_after_forward": false, "cpu_offload": true}})");
  std::string py = plan_to_torch(plan);
  CHECK(py.find("CALLS = [\n    ([\"blocks.0\"], False),\n    ([\"blocks.1\"], False),\n    ([\"head\"], 2),\n"
                "    ([\"\"], None),\n]") != std::string::npos);
  CHECK(py.find("MESH_SHAPE = (2, 4)") != std::string::npos);
  CHECK(py.find("mesh_dim_names=(\"dp_replicate\", \"dp_shard\")") != std::string::npos);
  CHECK(py.find("MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)") != std::string::npos);
  CHECK(py.find("kwargs[\"offload_policy\"] = CPUOffloadPolicy()") != std::string::npos);
  CHECK(py.find("IGNORED_PARAMS = [\n") != std::string::npos);
  CHECK(py.find("\"blocks.1.") != std::string::npos);
  Plan one = plan_of(b, R"({"groups": [{"modules": ["blocks.0", "blocks.1"]}], "fsdp": {"version": 2, "world_size": 4}})");
  py = plan_to_torch(one);
  CHECK(py.find("([\"blocks.0\", \"blocks.1\"], True),") != std::string::npos);
  CHECK(py.find("MESH_SHAPE = (4,)") != std::string::npos);
  CHECK(py.find("MixedPrecisionPolicy()") != std::string::npos);
}

TEST_CASE("emit accelerate, FSDP2: the plan's calls come back through Accelerate's unit choice, or it says why") {
  TreeBuilder b = two_blocks_and_a_head();
  Plan plan = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"version": 2, "world_size": 8,
      "sharding_strategy": "HYBRID_SHARD", "shard_group_size": 4, "reshard_after_forward": false}})");
  std::string yaml = plan_to_accelerate(plan);
  CHECK(yaml.find("fsdp_version: 2\n") != std::string::npos);
  CHECK(yaml.find("fsdp_transformer_layer_cls_to_wrap: Block\n") != std::string::npos);
  CHECK(yaml.find("fsdp_reshard_after_forward: false\n") != std::string::npos);
  CHECK(yaml.find("parallelism_config_dp_replicate_size: 2\n") != std::string::npos);
  // Groups only (as read from an Accelerate config): the class list is found again.
  Plan groups = plan_of(b, R"({"groups": [{"modules": ["blocks.0"]}, {"modules": ["blocks.1"]}],
      "fsdp": {"version": 2, "world_size": 4}})");
  CHECK(plan_to_accelerate(groups).find("fsdp_transformer_layer_cls_to_wrap: Block\n") != std::string::npos);
  Plan two = plan_of(b, R"({"groups": [{"modules": ["blocks.0", "blocks.1"]}], "fsdp": {"version": 2}})");
  CHECK_THROWS_WITH_AS(plan_to_accelerate(two), doctest::Contains("several modules in one fully_shard call"),
                       EmitError);
  Plan ranks = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"version": 2, "world_size": 4,
      "reshard_after_forward": 2}})");
  CHECK_THROWS_WITH_AS(plan_to_accelerate(ranks), doctest::Contains("--emit torch"), EmitError);
  Plan globbed = plan_of(b, R"({"module_classes": ["Block"], "ignored_params": ["head.*"], "fsdp": {"version": 2}})");
  CHECK_THROWS_WITH_AS(plan_to_accelerate(globbed), doctest::Contains("ignored parameters by glob"), EmitError);
}

namespace {

// Two bf16 blocks of two weights each, and a head, all trainable.
TreeBuilder bf16_blocks(const std::string& dtype = "bfloat16", int64_t itemsize = 2) {
  TreeBuilder b;
  for (const char* blk : {"blocks.0", "blocks.1"}) {
    if (std::string(blk) == "blocks.0") b.add("blocks", "ModuleList");
    b.add(blk, "Block");
    b.param(blk, "w", {64, 64}, dtype, itemsize);
    b.param(blk, "base", {64, 64}, dtype, itemsize);
  }
  b.add("head", "Linear");
  b.param("head", "weight", {32, 64}, dtype, itemsize);
  return b;
}

Plan accelerate_plan(TreeBuilder& b, const std::string& fsdp_config, const std::string& mp) {
  AccelerateConfig c = parse_accelerate_config(
      kHead + "mixed_precision: " + mp + "\nfsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n"
              "  fsdp_transformer_layer_cls_to_wrap: Block\n" + fsdp_config,
      "a.yaml");
  resolve_accelerate_config(c, b.tree);
  if (c.policy.fsdp.v2()) apply_accelerate_fsdp2(c, b.tree);
  return make_plan(b.tree, c.policy, "m.pt");
}

bool has_kind(const Plan& p, const std::string& kind) {
  for (const auto& w : p.warnings)
    if (w.kind == kind) return true;
  return false;
}

}  // namespace

TEST_CASE("Accelerate's mixed precision: trainable bf16 parameters become fp32 master weights (FSDP2)") {
  // fsdp2_prepare_model: "Upcast to fp32 master weights" for every trainable parameter not in float32.
  TreeBuilder bf16 = bf16_blocks();
  TreeBuilder fp32 = bf16_blocks("float32", 4);
  Plan got = accelerate_plan(bf16, "  fsdp_version: 2\n", "bf16");
  Plan want = accelerate_plan(fp32, "  fsdp_version: 2\n", "bf16");
  CHECK(got.policy.fsdp.fp32_master_weights);
  CHECK(got.memory.per_rank.params_bytes == want.memory.per_rank.params_bytes);
  CHECK(got.memory.per_rank.grads_bytes == want.memory.per_rank.grads_bytes);
  CHECK(got.memory.per_rank.optimizer_bytes == want.memory.per_rank.optimizer_bytes);
  CHECK(has_kind(got, "fp32_master_weights"));
  // The all-gathers carry param_dtype, bfloat16.
  for (const auto& c : got.comm.collectives) CHECK(c.dtype == "bfloat16");
  // mixed_precision 'no': nothing is cast.
  Plan plain = accelerate_plan(bf16, "  fsdp_version: 2\n", "'no'");
  CHECK_FALSE(plain.policy.fsdp.fp32_master_weights);
  CHECK(plain.memory.per_rank.params_bytes * 2 == want.memory.per_rank.params_bytes);
  CHECK_FALSE(has_kind(plain, "fp32_master_weights"));
}

TEST_CASE("Accelerate's fp32 master weights: FSDP2 leaves frozen parameters, FSDP1 casts the whole flat parameter") {
  TreeBuilder b;
  b.add("blocks", "ModuleList");
  b.add("blocks.0", "Block");
  b.param("blocks.0", "w", {64, 64}, "bfloat16", 2);
  // blocks.0.base and head.weight frozen, as peft leaves a base model.
  auto frozen = [&b](const std::string& path, const std::string& name, std::vector<int64_t> shape) {
    TensorInfo info{std::move(shape), "bfloat16", 2};
    info.requires_grad = false;
    b.tree.add_param(b.id(path), name, b.tree.add_tensor(info));
  };
  frozen("blocks.0", "base", {64, 64});
  b.add("head", "Linear");
  frozen("head", "weight", {32, 64});
  // FSDP2: only blocks.0.w (4096 elements) goes to fp32; the frozen 4096 + 2048 stay bf16.
  Plan v2 = accelerate_plan(b, "  fsdp_version: 2\n", "bf16");
  CHECK(v2.tree->tensor(0).dtype == "float32");
  CHECK(v2.tree->tensor(1).dtype == "bfloat16");
  CHECK(v2.tree->tensor(2).dtype == "bfloat16");
  CHECK(v2.memory.per_rank.params_bytes == 4096 * 4 / 8 + (4096 + 2048) * 2 / 8);
  // FSDP1 with use_orig_params: blocks.0's flat parameter requires grad (one of its
  // parameters does) and is cast whole; the root's (head, frozen) is left in bf16.
  Plan v1 = accelerate_plan(b, "  fsdp_version: 1\n  fsdp_use_orig_params: true\n", "bf16");
  CHECK(v1.tree->tensor(0).dtype == "float32");
  CHECK(v1.tree->tensor(1).dtype == "float32");
  CHECK(v1.tree->tensor(2).dtype == "bfloat16");
  CHECK(has_kind(v1, "fp32_master_weights"));
  // The loaded tree is untouched.
  CHECK(b.tree.tensor(0).dtype == "bfloat16");
}

TEST_CASE("Accelerate's fp32 master weights: FSDP1 gathers in param_dtype, shards and steps in fp32") {
  TreeBuilder bf16 = bf16_blocks();
  TreeBuilder fp32 = bf16_blocks("float32", 4);
  Plan got = accelerate_plan(bf16, "  fsdp_version: 1\n", "bf16");
  Plan want = accelerate_plan(fp32, "  fsdp_version: 1\n", "bf16");
  CHECK(got.memory.per_rank.params_bytes == want.memory.per_rank.params_bytes);
  CHECK(got.memory.per_rank.optimizer_bytes == want.memory.per_rank.optimizer_bytes);
  CHECK(got.memory.per_rank.peak_bytes == want.memory.per_rank.peak_bytes);
  for (const auto& c : got.comm.collectives) CHECK(c.dtype == "bfloat16");
}

TEST_CASE("fsdp.fp32_master_weights is a policy key that round-trips") {
  Policy p = parse_policy(R"({"fsdp": {"fp32_master_weights": true}})", "p.json");
  CHECK(p.fsdp.fp32_master_weights);
  CHECK(policy_file_json(p)["fsdp"]["fp32_master_weights"] == true);
  CHECK(policy_to_json(p)["fsdp"]["fp32_master_weights"] == true);
  CHECK_FALSE(parse_policy("{}", "p.json").fsdp.fp32_master_weights);
  CHECK_THROWS_AS(parse_policy(R"({"fsdp": {"fp32_master_weights": 1}})", "p.json"), InputError);
}

TEST_CASE("emit accelerate keeps num_machines (issue 41, item 6)") {
  TreeBuilder b = two_blocks_and_a_head();
  for (const char* version : {"1", "2"}) {
    CAPTURE(version);
    AccelerateConfig c = parse_accelerate_config(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: 16\nnum_machines: 2\n"
        "fsdp_config:\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n  fsdp_transformer_layer_cls_to_wrap: Block\n"
        "  fsdp_version: " + std::string(version) + "\n",
        "a.yaml");
    resolve_accelerate_config(c, b.tree);
    if (c.policy.fsdp.v2()) apply_accelerate_fsdp2(c, b.tree);
    CHECK(c.policy.hardware.gpus_per_node == 8);  // nproc_per_node: the time model's node
    std::string yaml = plan_to_accelerate(make_plan(b.tree, c.policy, "m.pt"));
    CHECK(yaml.find("num_machines: 2\n") != std::string::npos);
    CHECK(yaml.find("num_processes: 16\n") != std::string::npos);
  }
  // A JSON policy's hardware.gpus_per_node says the same.
  Plan p = plan_of(b, R"({"module_classes": ["Block"], "fsdp": {"world_size": 32}, "hardware": {"gpus_per_node": 8}})");
  CHECK(plan_to_accelerate(p).find("num_machines: 4\n") != std::string::npos);
}
