// The memory model against figures worked out by hand (docs/memory-model.md).
#include <doctest/doctest.h>

#include <algorithm>

#include "mesh/device_mesh.h"
#include "fsdp1/memory.h"
#include "plan/optimizer_step.h"
#include "policy/policy.h"
#include "tree_builder.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {
// root owns p [10]; blocks a [30], b [21] (and c [40] when asked): fp32.
TreeBuilder blocks(bool with_c = false) {
  TreeBuilder b;
  b.param("", "p", {10});
  b.add("a", "Block");
  b.param("a", "w", {30});
  b.add("b", "Block");
  b.param("b", "w", {21});
  if (with_c) {
    b.add("c", "Block");
    b.param("c", "w", {40});
  }
  return b;
}

MemoryPlan memory_of(const TreeBuilder& b, const std::string& json, FsdpSettings s) {
  Plan plan = plan_of(b, json);
  return estimate_memory(plan, s);
}

FsdpSettings ranks(int64_t world, ShardingStrategy st = ShardingStrategy::FullShard) {
  FsdpSettings s;
  s.world_size = world;
  s.strategy = st;
  return s;
}
}  // namespace

TEST_CASE("FULL_SHARD: shards padded to the world size, peak in backward") {
  auto b = blocks();
  auto m = memory_of(b, R"({"module_classes": ["Block"]})", ranks(4));
  REQUIRE(m.units.size() == 3);
  // ceil(10/4)=3, ceil(30/4)=8, ceil(21/4)=6 elements per rank.
  CHECK(m.units[0].sharded_numel == 3);
  CHECK(m.units[1].sharded_numel == 8);
  CHECK(m.units[2].sharded_numel == 6);
  CHECK(m.units[1].sharded_bytes == 32);
  CHECK(m.units[1].unsharded_bytes == 8 * 4 * 4);  // padded to 32 elements, fp32
  const RankMemory& r = m.per_rank;
  CHECK(r.params_bytes == 68);
  CHECK(r.grads_bytes == 68);
  CHECK(r.optimizer_bytes == 136 + 12);  // adam: two states, and a 4-byte step per flat parameter
  CHECK(r.steady_bytes == 284);
  // Backward at b, its end: root (48) + b (96) + prefetched a (128) gathered; b's
  // parameters' own gradients (21 x 4) and the flat gradient autograd concatenates
  // from them (84), over params + optimizer (216). The root's gradient comes later
  // (p is used before the blocks).
  CHECK(r.peak_bytes == 216 + 48 + 96 + 128 + 84 + 84);
  CHECK(r.peak_phase == "backward");
  CHECK(r.peak_unit == 2);
  CHECK(r.peak_gathered == std::vector<int>{0, 1, 2});
}

TEST_CASE("SHARD_GRAD_OP keeps units gathered after forward") {
  auto b = blocks(true);
  auto full = memory_of(b, R"({"module_classes": ["Block"]})", ranks(4));
  auto grad_op = memory_of(b, R"({"module_classes": ["Block"]})", ranks(4, ShardingStrategy::ShardGradOp));
  // c: ceil(40/4)=10 per rank, 160 B gathered. base = params 108 + adam 216 + 4 steps 16 = 340.
  // FULL_SHARD, backward at c: root 48 + c 160 + prefetched b 96; c's parameters' own
  // gradients 160 and its flat gradient 160.
  CHECK(full.per_rank.peak_bytes == 340 + 48 + 160 + 96 + 160 + 160);
  // SHARD_GRAD_OP, backward at c: root, a, b, c all still gathered (48+128+96+160).
  CHECK(grad_op.per_rank.peak_bytes == 340 + 432 + 160 + 160);
  CHECK(grad_op.per_rank.steady_bytes == full.per_rank.steady_bytes);
}

TEST_CASE("mixed precision gathers in the low precision dtype, shards stay full precision") {
  auto b = blocks();
  auto m = memory_of(b, R"({"module_classes": ["Block"], "mixed_precision": {"param_dtype": "bfloat16"}})", ranks(4));
  CHECK(m.units[1].sharded_bytes == 32);
  CHECK(m.units[1].unsharded_bytes == 8 * 4 * 2);
  CHECK(m.per_rank.steady_bytes == 284);
  // Backward at a, its end: root 24 + a 64 gathered in bf16; a's parameters' own
  // gradients 30 x 2 and its flat one 60; b's sharded fp32 grad 24 already left.
  CHECK(m.per_rank.peak_bytes == 216 + (24 + 64) + (60 + 60) + 24);
  CHECK(m.per_rank.peak_unit == 1);
}

TEST_CASE("units of ignored classes keep full precision") {
  TreeBuilder b;
  b.add("bn", "BatchNorm2d");
  b.param("bn", "weight", {16});
  b.add("fc", "Linear");
  b.param("fc", "weight", {16});
  auto m = memory_of(b, R"({"module_classes": ["Linear"], "mixed_precision": {"param_dtype": "float16"}})", ranks(2));
  REQUIRE(m.units.size() == 3);
  CHECK(m.units[1].unsharded_bytes == 16 * 4);  // bn: fp32
  CHECK(m.units[2].unsharded_bytes == 16 * 2);  // fc: fp16
}

TEST_CASE("use_orig_params aligns each parameter to 16 bytes and pads to the world size") {
  TreeBuilder b;
  b.param("", "x", {3});
  b.param("", "y", {5});
  FsdpSettings s = ranks(4);
  CHECK(memory_of(b, "{}", s).units[0].flat_numel == 8);
  CHECK(memory_of(b, "{}", s).units[0].sharded_numel == 2);
  s.use_orig_params = true;
  // x at 0..3, one element of padding, y at 4..9, padded to 12.
  CHECK(memory_of(b, "{}", s).units[0].flat_numel == 12);
  CHECK(memory_of(b, "{}", s).units[0].sharded_numel == 3);
}

TEST_CASE("world size 1 is NO_SHARD, as FSDP switches it") {
  auto b = blocks();
  auto m = memory_of(b, R"({"module_classes": ["Block"]})", ranks(1));
  CHECK(m.effective_strategy == ShardingStrategy::NoShard);
  CHECK(m.units[1].sharded_numel == 30);
  CHECK(m.per_rank.params_bytes == 244);
  // The peak is AdamW's step: steady 988, and while a's denom (120) is referenced b's
  // two temporaries (2 x 84) are made (optim/adam.py: _single_tensor_adam).
  CHECK(m.per_rank.peak_bytes == 988 + 120 + 2 * 84);
  CHECK(m.per_rank.peak_phase == "optimizer step");
  CHECK(m.per_rank.peak_unit == -1);
  auto backward_of = [](const MemoryPlan& mem, int unit) {
    for (const auto& st : mem.timeline)
      if (st.phase == "backward" && st.unit == unit) return st.total_bytes();
    return int64_t{-1};
  };
  // Nothing to gather without mixed precision, but at the end of a's backward its flat
  // gradient (120, which it keeps) and its parameters' own (120) exist together, b's (84)
  // already made; params + Adam 744.
  CHECK(backward_of(m, 1) == 744 + 120 + 120 + 84);
  auto mp = memory_of(b, R"({"module_classes": ["Block"], "mixed_precision": {"param_dtype": "bfloat16"}})", ranks(1));
  // With mixed precision NO_SHARD makes a low-precision copy to compute in (a: 30 x 2 B).
  CHECK(mp.units[1].unsharded_bytes == 60);
  // Backward at a: base 744 + root and a copies (20 + 60) + a's parameters' own bf16
  // grads 60 and its flat bf16 gradient 60 + b's fp32 grad 84.
  CHECK(backward_of(mp, 1) == 744 + (20 + 60) + (60 + 60) + 84);
}

TEST_CASE("HYBRID_SHARD shards within groups and replicates across them") {
  auto b = blocks();
  FsdpSettings s = ranks(16, ShardingStrategy::HybridShard);
  s.shard_group_size = 4;
  auto hybrid = memory_of(b, R"({"module_classes": ["Block"]})", s);
  auto full4 = memory_of(b, R"({"module_classes": ["Block"]})", ranks(4));
  CHECK(hybrid.shard_group_size == 4);
  CHECK(hybrid.per_rank.peak_bytes == full4.per_rank.peak_bytes);
  s.shard_group_size = 5;
  CHECK_THROWS_AS(memory_of(b, R"({"module_classes": ["Block"]})", s), std::invalid_argument);
}

TEST_CASE("HYBRID_SHARD's default group is the largest divisor of the world size up to 8") {
  FsdpSettings s = ranks(12, ShardingStrategy::HybridShard);
  CHECK(hybrid_group_size(s) == 6);
  CHECK(device_mesh_error(s).empty());
  s.world_size = 64;
  CHECK(hybrid_group_size(s) == 8);
  s.world_size = 4;
  CHECK(hybrid_group_size(s) == 4);
  s.world_size = 13;
  CHECK(hybrid_group_size(s) == 1);
  s.world_size = 12;
  s.shard_group_size = 8;  // as set: refused, with what would do
  CHECK(device_mesh_error(s).find("one of 1, 2, 3, 4, 6, 12") != std::string::npos);
  auto b = blocks();
  s.shard_group_size = 0;
  auto mem = memory_of(b, R"({"module_classes": ["Block"]})", s);
  CHECK(mem.shard_group_size == 6);
  CHECK(mem.notes.front().find("assumed 6 GPUs per node") != std::string::npos);
}

TEST_CASE("optimizers hold different state; ignored parameters stay whole on every rank") {
  auto b = blocks();
  FsdpSettings s = ranks(4);
  s.optimizer = Optimizer::SgdMomentum;
  CHECK(memory_of(b, R"({"module_classes": ["Block"]})", s).per_rank.optimizer_bytes == 68);
  s.optimizer = Optimizer::None;
  CHECK(memory_of(b, R"({"module_classes": ["Block"]})", s).per_rank.optimizer_bytes == 0);
  s.optimizer = Optimizer::Adam;
  auto ignored = memory_of(b, R"({"module_classes": ["Block"], "ignored_modules": ["a"]})", s);
  // a's 30 params (120 B) are not sharded: params 12 + 24 + 120.
  CHECK(ignored.per_rank.params_bytes == 156);
  CHECK(ignored.per_rank.optimizer_bytes == 2 * 156 + 4 * 2);  // Adam's steps: root and b
}

TEST_CASE("buffers are replicated, cast to buffer_dtype under mixed precision") {
  TreeBuilder b;
  b.buffer("", "stat", {100});
  auto plain = memory_of(b, "{}", ranks(8));
  CHECK(plain.per_rank.buffers_bytes == 400);
  auto mp = memory_of(b, R"({"mixed_precision": {"buffer_dtype": "bfloat16"}})", ranks(8));
  CHECK(mp.per_rank.buffers_bytes == 200);
}

TEST_CASE("the timeline walks forward, backward in reverse, then the optimizer step; its largest total is the peak") {
  auto b = blocks();
  auto m = memory_of(b, R"({"module_classes": ["Block"]})", ranks(4));
  const auto& t = m.timeline;
  REQUIRE(t.size() == 2 * 3 + 1);
  const std::vector<std::string> phases = {"forward", "forward", "forward", "backward",
                                           "backward", "backward", "optimizer step"};
  const std::vector<int> units = {0, 1, 2, 2, 1, 0, -1};
  for (size_t i = 0; i < t.size(); ++i) {
    CHECK(t[i].phase == phases[i]);
    CHECK(t[i].unit == units[i]);
    CHECK(t[i].params_bytes == 68);
    // The optimizer step adds AdamW's temporaries: a's denom (32) while b's two (2 x 24) are made.
    CHECK(t[i].optimizer_bytes == 148 + (i == 6 ? 32 + 48 : 0));
  }
  // Forward at root: root (48) and the prefetched a (128) gathered, no gradient yet.
  CHECK(t[0].gathered_bytes == 48 + 128);
  CHECK(t[0].grads_bytes + t[0].unsharded_grads_bytes == 0);
  // Backward at b (the peak, its end): root + b + prefetched a; b's parameters' own
  // gradients and its flat one.
  CHECK(t[3].gathered_bytes == 48 + 96 + 128);
  CHECK(t[3].unsharded_grads_bytes == 84 + 84);
  CHECK(t[3].total_bytes() == m.per_rank.peak_bytes);
  // Backward at root: b (24) and a (32) have left their sharded gradients.
  CHECK(t[5].grads_bytes == 24 + 32);
  CHECK(t[6].total_bytes() == m.per_rank.steady_bytes + 32 + 48);
  CHECK(t[6].gathered_bytes == 0);
  int64_t largest = 0;
  for (const auto& s : t) largest = std::max(largest, s.total_bytes());
  CHECK(largest == m.per_rank.peak_bytes);
}

TEST_CASE("the timeline's optimizer step is the peak when nothing else exceeds it") {
  // Frozen and unsharded: nothing is gathered and no gradient is made.
  TreeBuilder b;
  frozen(b, "", "p", {10});
  b.add("a", "Block");
  frozen(b, "a", "w", {30});
  auto m = memory_of(b, R"({"module_classes": ["Block"]})", ranks(1));
  REQUIRE(m.per_rank.peak_phase == "optimizer step");
  CHECK(m.timeline.back().phase == "optimizer step");
  CHECK(m.timeline.back().total_bytes() == m.per_rank.peak_bytes);
  for (const auto& s : m.timeline) CHECK(s.total_bytes() <= m.per_rank.peak_bytes);
}

TEST_CASE("only floating-point buffers are cast to buffer_dtype") {
  // The root: an int64 buffer [100] (swin's relative_position_index, say) and a float32 buffer [100].
  TreeBuilder b;
  b.add("a", "Block");
  b.param("a", "w", {1000});
  b.tree.add_buffer(0, "steps", b.tree.add_tensor({{100}, "int64", 8}));
  b.buffer("", "scale", {100});
  auto mem = memory_of(b, R"({"module_classes": ["Block"], "mixed_precision": {"param_dtype": "bfloat16",
                              "buffer_dtype": "bfloat16"}})", ranks(2));
  CHECK(mem.per_rank.buffers_bytes == 100 * 8 + 100 * 2);  // the int64 one stays int64
}

TEST_CASE("keep_low_precision_grads: sharded gradients are param_dtype for the optimizer, fp32 through backward") {
  auto b = blocks();
  const std::string mp = R"({"module_classes": ["Block"], "mixed_precision": {"param_dtype": "bfloat16")";
  auto full = memory_of(b, mp + "}}", ranks(4));
  auto low = memory_of(b, mp + R"(, "keep_low_precision_grads": true}})", ranks(4));
  // 3 + 8 + 6 sharded elements: fp32 (68 B) by default, bf16 (34 B) kept low.
  CHECK(full.per_rank.grads_bytes == 68);
  CHECK(low.per_rank.grads_bytes == 34);
  CHECK(low.per_rank.steady_bytes == full.per_rank.steady_bytes - 34);
  // _accumulate_sharded_grad casts to fp32 after reduce-scatter either way: backward is unchanged.
  CHECK(low.per_rank.peak_bytes == full.per_rank.peak_bytes);
  REQUIRE(low.timeline.size() == full.timeline.size());
  for (size_t i = 0; i + 1 < low.timeline.size(); ++i) CHECK(low.timeline[i].total_bytes() == full.timeline[i].total_bytes());
  CHECK(low.timeline.back().grads_bytes == 34);
  // Without mixed precision the flag changes nothing (the gradient is already param dtype).
  auto plain = memory_of(b, R"({"module_classes": ["Block"], "mixed_precision": {"keep_low_precision_grads": true}})",
                         ranks(4));
  CHECK(plain.per_rank.grads_bytes == 68);
  CHECK(std::none_of(plain.notes.begin(), plain.notes.end(),
                     [](const std::string& n) { return n.find("keep_low_precision_grads") != std::string::npos; }));
  // Adam's state stays fp32 (torch's Adam raises on bf16 gradients: a note says so);
  // SGD's momentum buffer clones the first gradient, so it is bf16 too.
  CHECK(low.per_rank.optimizer_bytes == full.per_rank.optimizer_bytes);
  CHECK(std::any_of(low.notes.begin(), low.notes.end(),
                    [](const std::string& n) { return n.find("torch.optim.Adam and AdamW raise") != std::string::npos; }));
  FsdpSettings momentum = ranks(4);
  momentum.optimizer = Optimizer::SgdMomentum;
  CHECK(memory_of(b, mp + R"(, "keep_low_precision_grads": true}})", momentum).per_rank.optimizer_bytes == 34);
  CHECK(memory_of(b, mp + "}}", momentum).per_rank.optimizer_bytes == 68);
}

TEST_CASE("keep_low_precision_grads under NO_SHARD keeps the gradient in the reduce dtype") {
  auto b = blocks();
  const std::string mp = R"({"module_classes": ["Block"], "mixed_precision": {"param_dtype": "bfloat16", )"
                         R"("keep_low_precision_grads": true)";
  // 61 elements unsharded. reduce_dtype unset reduces in param_dtype: bf16 kept, from backward on.
  auto low = memory_of(b, mp + "}}", ranks(2, ShardingStrategy::NoShard));
  CHECK(low.per_rank.grads_bytes == 122);
  const MemoryStep& after_b = low.timeline[4];  // backward of a, b's gradient done
  CHECK(after_b.phase == "backward");
  CHECK(after_b.unit == 1);
  CHECK(after_b.grads_bytes == 42);
  // reduce_dtype float32: the all-reduced gradient stays fp32.
  auto fp32 = memory_of(b, mp + R"(, "reduce_dtype": "float32"}})", ranks(2, ShardingStrategy::NoShard));
  CHECK(fp32.per_rank.grads_bytes == 244);
}

TEST_CASE("optimizer step: Adam's temporaries by how torch.optim runs it") {
  const std::vector<int64_t> state = {10, 120, 70};  // each parameter's exp_avg_sq on this rank
  // for-loop: the previous denom beside the next one's two temporaries (the largest moment is
  // 120 + 2 * 70 = 260, not 10 + 2 * 120 = 250); foreach: one sqrt per parameter, all at once; fused: none.
  CHECK(adam_step_temp_bytes(state, OptimizerImpl::ForLoop) == 120 + 2 * 70);
  CHECK(adam_step_temp_bytes(state, OptimizerImpl::Foreach) == 10 + 120 + 70);
  CHECK(adam_step_temp_bytes(state, OptimizerImpl::Fused) == 0);
  CHECK(adam_step_temp_bytes({}, OptimizerImpl::ForLoop) == 0);
}

TEST_CASE("optimizer step: PyTorch's default implementation by device, FSDP version and offload") {
  FsdpSettings s;  // FSDP1: FlatParameter is not in torch.optim's _foreach_supported_types
  CHECK(default_optimizer_impl(s, ComputeDevice::Cuda) == OptimizerImpl::ForLoop);
  s.use_orig_params = true;  // the original Parameters
  CHECK(default_optimizer_impl(s, ComputeDevice::Cuda) == OptimizerImpl::Foreach);
  CHECK(default_optimizer_impl(s, ComputeDevice::Cpu) == OptimizerImpl::ForLoop);
  FsdpSettings v2;
  v2.version = FsdpVersion::V2;  // DTensor is registered as foreach-supported
  CHECK(default_optimizer_impl(v2, ComputeDevice::Cuda) == OptimizerImpl::Foreach);
  v2.cpu_offload = true;  // the step runs on the host's sharded parameters
  CHECK(default_optimizer_impl(v2, ComputeDevice::Cuda) == OptimizerImpl::ForLoop);
  // The policy's own choice wins; memory_settings fills in the default for --device.
  Policy p = parse_policy(R"({"fsdp": {"version": 2, "optimizer_impl": "fused"}})", "p.json");
  CHECK(memory_settings(p).optimizer_impl == OptimizerImpl::Fused);
  p.fsdp.optimizer_impl.reset();
  CHECK(memory_settings(p).optimizer_impl == OptimizerImpl::Foreach);
  p.activations.device = ComputeDevice::Cpu;
  CHECK(memory_settings(p).optimizer_impl == OptimizerImpl::ForLoop);
  CHECK_THROWS_WITH_AS(parse_policy(R"({"fsdp": {"optimizer_impl": "fast"}})", "p.json"),
                       doctest::Contains("fsdp.optimizer_impl"), std::exception);
}
