// FLOPs from a graph (lib/time/flops.h) on tiny hand-built graphs: the
// formulas of torch/utils/flop_counter.py, gradients only where autograd
// computes them, and activation checkpointing's recompute with early stop.
#include <doctest/doctest.h>

#include <map>

#include "time/flops.h"
#include "time/hardware.h"
#include "time/step_time.h"
#include "tree_builder.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {

const DtypeInfo* f32() { return dtype_from_stem("Float"); }
const DtypeInfo* i64() { return dtype_from_stem("Long"); }

struct Graph_ {
  WalkGraph g;
  std::map<std::string, int32_t> ids;

  int32_t tensor(const std::string& name, std::vector<int64_t> sizes, const DtypeInfo* dtype = f32(),
                 bool rg = false) {
    WalkTensor t;
    t.sizes = std::move(sizes);
    t.strides.assign(t.sizes.size(), 1);
    t.dtype = dtype;
    t.requires_grad = rg;
    g.tensors.push_back(t);
    return ids[name] = static_cast<int32_t>(g.tensors.size()) - 1;
  }
  void param(const std::string& name, std::vector<int64_t> sizes, TensorId tree_tensor, bool rg = true) {
    WalkPlaceholder p;
    p.tensor = tensor(name, std::move(sizes), f32(), rg);
    p.kind = WalkInput::Parameter;
    p.param = tree_tensor;
    g.placeholders.push_back(p);
  }
  void input(const std::string& name, std::vector<int64_t> sizes, const DtypeInfo* dtype = f32()) {
    WalkPlaceholder p;
    p.tensor = tensor(name, std::move(sizes), dtype);
    g.placeholders.push_back(p);
  }
  WalkNode& node(const std::string& op, ModuleId module, std::vector<std::pair<std::string, std::string>> args,
                 const std::string& out, std::vector<int64_t> out_sizes, const DtypeInfo* dtype = f32()) {
    WalkNode n;
    n.op = op;
    n.module = module;
    for (auto& [name, t] : args) {
      WalkArg a;
      a.name = name;
      a.value.kind = ArgValue::Kind::Tensor;
      a.tensors = {ids.at(t)};
      n.args.push_back(std::move(a));
    }
    n.outputs = {tensor(out, std::move(out_sizes), dtype)};
    g.nodes.push_back(std::move(n));
    return g.nodes.back();
  }
};

// layers.0 and layers.1 (fc1 Linear(4, 8), relu, fc2 Linear(8, 4), optionally a tanh after fc2),
// head Linear(4, 10), the loss in the root; 6 tokens. By hand: fc1 and fc2 2*6*4*8 = 384 FLOPs
// each, the head 2*6*4*10 = 480.
struct Net {
  TreeBuilder b{"__torch__.Net"};
  Graph_ gb;
  explicit Net(bool tanh = false) {
    b.add("layers", "ModuleList");
    for (int l = 0; l < 2; ++l) {
      const std::string p = "layers." + std::to_string(l);
      b.add(p, "Block");
      b.linear(p + ".fc1", 4, 8);
      b.linear(p + ".fc2", 8, 4);
    }
    b.linear("head", 4, 10);
    gb.input("x", {6, 4});
    gb.input("y", {6}, i64());
    TensorId t = 0;
    for (int l = 0; l < 2; ++l)
      for (const char* fc : {"fc1", "fc2"}) {
        const std::string n = "l" + std::to_string(l) + fc;
        gb.param(n + "w", fc == std::string("fc1") ? std::vector<int64_t>{8, 4} : std::vector<int64_t>{4, 8}, t++);
        gb.param(n + "b", {fc == std::string("fc1") ? 8 : 4}, t++);
      }
    gb.param("hw", {10, 4}, t++);
    gb.param("hb", {10}, t++);
    std::string h = "x";
    for (int l = 0; l < 2; ++l) {
      const std::string p = "layers." + std::to_string(l), n = "l" + std::to_string(l);
      gb.node("aten.linear.default", b.id(p + ".fc1"), {{"input", h}, {"weight", n + "fc1w"}, {"bias", n + "fc1b"}},
              n + "a", {6, 8});
      gb.node("aten.relu.default", b.id(p), {{"self", n + "a"}}, n + "r", {6, 8});
      gb.node("aten.linear.default", b.id(p + ".fc2"), {{"input", n + "r"}, {"weight", n + "fc2w"}, {"bias", n + "fc2b"}},
              n + "o", {6, 4});
      h = n + "o";
      if (tanh) {
        gb.node("aten.tanh.default", b.id(p), {{"self", h}}, n + "t", {6, 4});
        h = n + "t";
      }
    }
    gb.node("aten.linear.default", b.id("head"), {{"input", h}, {"weight", "hw"}, {"bias", "hb"}}, "logits", {6, 10});
    gb.node("aten.cross_entropy_loss.default", 0, {{"self", "logits"}, {"target", "y"}}, "loss", {});
    gb.g.outputs = {gb.ids.at("loss")};
  }
  FlopProfile count(GraphFlopOptions opt = {}) const { return count_graph_flops(gb.g, b.tree, opt); }
  const ModuleFlops& own(const FlopProfile& p, const std::string& path) const {
    return p.own.at(static_cast<size_t>(b.id(path)));
  }
};

}  // namespace

TEST_CASE("graph FLOPs: linear forward, and backward only for operands that need a gradient") {
  Net net;
  FlopProfile p = net.count();
  CHECK(net.own(p, "layers.0.fc1").forward == 384);
  CHECK(net.own(p, "layers.0.fc1").backward == 384);  // weight only: x is the user's input
  CHECK(net.own(p, "layers.0.fc2").backward == 768);  // input and weight
  CHECK(net.own(p, "layers.1.fc1").backward == 768);
  CHECK(net.own(p, "head").forward == 480);
  CHECK(net.own(p, "head").backward == 960);
  CHECK(net.own(p, "").forward == 0);  // relu and the loss count 0, as in FlopCounterMode
  CHECK(net.own(p, "layers.0").forward == 0);
  // The forward's order: one entry per run of a module's FLOP ops.
  REQUIRE(p.forward_order.size() == 5);
  CHECK(p.forward_order[0] == std::make_pair(net.b.id("layers.0.fc1"), int64_t{384}));
  CHECK(p.forward_order[4] == std::make_pair(net.b.id("head"), int64_t{480}));
  CHECK(p.notes.empty());
}

TEST_CASE("graph FLOPs: frozen parameters (the plan's trainable set) drop their gradients' products") {
  Net net;
  GraphFlopOptions opt;
  opt.trainable_params.assign(net.b.tree.num_tensors(), true);
  // layers.0 frozen (tensors 0-3) and the head's weight (8): LoRA-like.
  for (TensorId t : {0, 1, 2, 3, 8}) opt.trainable_params[static_cast<size_t>(t)] = false;
  FlopProfile p = net.count(opt);
  CHECK(net.own(p, "layers.0.fc1").backward == 0);  // nothing before it or in it needs a gradient
  CHECK(net.own(p, "layers.0.fc2").backward == 0);
  CHECK(net.own(p, "layers.1.fc1").backward == 384);  // its input no longer needs one
  CHECK(net.own(p, "layers.1.fc2").backward == 768);
  CHECK(net.own(p, "head").backward == 480);  // a frozen weight: the input's gradient only
  CHECK(net.own(p, "head").forward == 480);
}

TEST_CASE("graph FLOPs: activation checkpointing recomputes up to the last saving op") {
  SUBCASE("the last op saves its input: fc2 is not recomputed") {
    Net net;
    GraphFlopOptions opt;
    opt.checkpointed = {net.b.id("layers.0"), net.b.id("layers.1")};
    FlopProfile p = net.count(opt);
    CHECK(net.own(p, "layers.0.fc1").recompute == 384);
    CHECK(net.own(p, "layers.0.fc2").recompute == 0);
    CHECK(net.own(p, "layers.1.fc1").recompute == 384);
    CHECK(net.own(p, "layers.1.fc2").recompute == 0);
    CHECK(net.own(p, "head").recompute == 0);
  }
  SUBCASE("selective: the whole call again (early_stop=False) but the nodes the policy saved") {
    Net net;
    GraphFlopOptions opt;
    opt.checkpointed = {net.b.id("layers.0"), net.b.id("layers.1")};
    opt.selective = true;
    opt.sac_saved_nodes = {0};  // layers.0.fc1's output came from the cache
    FlopProfile p = net.count(opt);
    CHECK(net.own(p, "layers.0.fc1").recompute == 0);
    CHECK(net.own(p, "layers.0.fc2").recompute == 384);
    CHECK(net.own(p, "layers.1.fc1").recompute == 384);
    CHECK(net.own(p, "layers.1.fc2").recompute == 384);
    CHECK(net.own(p, "head").recompute == 0);
  }
  SUBCASE("a trailing op that saves its output (tanh): the whole block again") {
    Net net(true);
    GraphFlopOptions opt;
    opt.checkpointed = {net.b.id("layers.1")};
    FlopProfile p = net.count(opt);
    CHECK(net.own(p, "layers.0.fc1").recompute == 0);
    CHECK(net.own(p, "layers.1.fc1").recompute == 384);
    CHECK(net.own(p, "layers.1.fc2").recompute == 384);
  }
}

TEST_CASE("graph FLOPs: matmul broadcasting, addmm, SDPA and convolution formulas") {
  TreeBuilder b;
  b.add("m", "M");
  Graph_ gb;
  gb.param("w", {5, 6}, 0);
  gb.input("a", {2, 3, 4, 5});
  gb.input("v1", {5});
  gb.input("q", {2, 4, 16, 8});
  gb.input("x", {2, 3, 8, 8});
  gb.param("cw", {4, 3, 3, 3}, 1);
  gb.input("bias", {6});
  gb.input("m1", {7, 5});
  gb.param("ew", {3, 5, 6}, 2);  // 3 experts' [5, 6] weights, fused
  gb.input("g3", {3, 7, 5});
  const ModuleId m = b.id("m");
  gb.node("aten.matmul.default", m, {{"self", "a"}, {"other", "w"}}, "o1", {2, 3, 4, 6});
  gb.node("aten.matmul.default", m, {{"self", "v1"}, {"other", "w"}}, "o2", {6});
  gb.node("aten.addmm.default", m, {{"self", "bias"}, {"mat1", "m1"}, {"mat2", "w"}}, "o3", {7, 6});
  gb.node("aten.scaled_dot_product_attention.default", m, {{"query", "q"}, {"key", "q"}, {"value", "q"}}, "o4",
          {2, 4, 16, 8});
  gb.node("aten.convolution.default", m, {{"input", "x"}, {"weight", "cw"}}, "o5", {2, 4, 6, 6});
  gb.node("aten._grouped_mm.default", m, {{"self", "m1"}, {"mat2", "w"}}, "o6", {7, 6});
  gb.node("transformers.grouped_mm_fallback.default", m, {{"input", "m1"}, {"weight", "ew"}}, "o7", {7, 6});
  gb.node("aten._grouped_mm.default", m, {{"self", "g3"}, {"mat2", "ew"}}, "o8", {3, 7, 6});
  gb.node("aten.my_matmul.default", m, {{"self", "m1"}, {"other", "w"}}, "o9", {7, 6});
  std::vector<bool> grad(gb.g.tensors.size(), false);
  grad[static_cast<size_t>(gb.ids.at("w"))] = true;
  grad[static_cast<size_t>(gb.ids.at("cw"))] = true;
  auto at = [&](size_t i) { return node_flops(gb.g, gb.g.nodes[i], grad); };
  CHECK(at(0).forward == 2 * 3 * (2 * 4 * 5 * 6));  // batch 6 of [4, 5] @ [5, 6]
  CHECK(at(0).backward == at(0).forward);           // the weight's gradient only
  CHECK(at(1).forward == 2 * 5 * 6);                // a 1-D operand: M = 1
  CHECK(at(2).forward == 2 * 7 * 5 * 6);            // addmm: the product, the bias free
  // sdpa_flop_count: 2 * b*h * sq * sk * (dq + dv); no gradient into q, k, v: no backward.
  CHECK(at(3).forward == 2 * 8 * 16 * 16 * (8 + 8));
  CHECK(at(3).backward == 0);
  // conv_flop_count: batch * numel(w) * prod(output spatial) * 2; backward: the weight's gradient.
  CHECK(at(4).forward == 2 * 108 * 36 * 2);
  CHECK(at(4).backward == at(4).forward);
  // Grouped matmuls (not in FlopCounterMode's registry, which counts them 0): the matmuls they run.
  CHECK(at(5).forward == 2 * 7 * 5 * 6);  // [7, 5] against [5, 6] split at offs: the weights' gradient form
  CHECK(at(5).backward == at(5).forward);
  CHECK(at(5).beyond_counter);
  CHECK(at(6).forward == 2 * 7 * 5 * 6);      // each expert's rows times its weight: 7 rows in all
  CHECK(at(6).backward == 0);                 // the experts' weight needs no gradient here
  CHECK(at(7).forward == 3 * 2 * 7 * 5 * 6);  // [3, 7, 5] against [3, 5, 6]: a batched matmul
  CHECK_FALSE(at(8).counted);                 // no formula: 0, and noted
  grad.assign(grad.size(), true);
  CHECK(at(3).backward == 2 * 8 * 16 * 16 * (3 * 8 + 2 * 8));  // sdpa_backward_flop_count: five bmm
  CHECK(at(6).backward == 2 * at(6).forward);                  // the input's and the weights' gradients
  FlopProfile p = count_graph_flops(gb.g, b.tree, {});
  REQUIRE(p.notes.size() == 3);
  CHECK(p.notes[0].find("aten.my_matmul.default (1 node) counted as 0 FLOPs") != std::string::npos);
  CHECK(p.notes[1].find("aten._grouped_mm.default (2 nodes) counted as the matmuls it runs") != std::string::npos);
  CHECK(p.notes[2].find("transformers.grouped_mm_fallback.default (1 node)") != std::string::npos);
}

TEST_CASE("step time: each module's FLOPs at the peak of its own dtype (issue 41, item 3)") {
  // peft's LoRA: a frozen bf16 base Linear beside small fp32 adapters, no mixed precision.
  TreeBuilder b;
  b.add("base", "Linear");
  TensorInfo base{{1024, 1024}, "bfloat16", 2};
  base.requires_grad = false;
  b.tree.add_param(b.id("base"), "weight", b.tree.add_tensor(base));
  b.add("lora_A", "Linear");
  b.param("lora_A", "weight", {8, 1024});  // float32
  Plan plan = plan_of(b, "{}");
  FlopProfile f;
  f.source = "flops.json";
  f.own.resize(b.tree.num_modules());
  const int64_t big = 1000000000000, small = 10000000000;
  f.own[static_cast<size_t>(b.id("base"))] = {big, 2 * big, 0};
  f.own[static_cast<size_t>(b.id("lora_A"))] = {small, 2 * small, 0};
  f.forward_order = {{b.id("base"), big}, {b.id("lora_A"), small}};
  const HardwareFigures hw = resolve_hardware(plan.policy.hardware);
  const StepTime t = estimate_step_time(plan, hw, &f);
  const double want = 3 * (big / (hw.bf16_flops * hw.compute_efficiency) + small / (hw.tf32_flops * hw.compute_efficiency));
  CHECK(t.compute_s == doctest::Approx(want).epsilon(1e-9));
  CHECK(t.compute_dtype == "bf16");  // most FLOPs
  bool said = false;
  for (const auto& a : t.assumptions)
    said = said || (a.find("bf16 peak") != std::string::npos && a.find("TF32 peak") != std::string::npos &&
                    a.find("lora_A") != std::string::npos);
  CHECK(said);
}

TEST_CASE("step time under CPU offload: the optimizer step is not modelled, and says so (issue 41, item 7)") {
  TreeBuilder b;
  b.linear("l", 1024, 1024);
  for (bool offload : {false, true}) {
    CAPTURE(offload);
    Plan plan = plan_of(b, std::string(R"({"fsdp": {"version": 2, "world_size": 8, "cpu_offload": )") +
                               (offload ? "true" : "false") + "}}");
    FlopProfile f;
    f.source = "flops.json";
    f.own.resize(b.tree.num_modules());
    f.own[static_cast<size_t>(b.id("l"))] = {1000000000, 2000000000, 0};
    f.forward_order = {{b.id("l"), 1000000000}};
    const StepTime t = estimate_step_time(plan, resolve_hardware(plan.policy.hardware), &f);
    CHECK(t.optimizer_modelled == !offload);
    CHECK((t.optimizer_s > 0) == !offload);
    bool said = false;
    for (const auto& a : t.assumptions) said = said || a.find("not modelled; the step time leaves it out") != std::string::npos;
    CHECK(said == offload);
  }
}
