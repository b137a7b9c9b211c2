// Activations (issue 30): the op table's evaluator, the walk's rules on tiny
// hand-built graphs, and the memory models' timeline with activations.
#include <doctest/doctest.h>

#include <algorithm>
#include <map>
#include <random>

#include "activations/activations.h"
#include "activations/saved_ops.h"
#include "activations/schedule.h"
#include "activations/walk.h"
#include "activations/walk_rules.h"
#include "fsdp1/memory.h"
#include "fsdp2/memory.h"
#include "tree_builder.h"
#include "util/errors.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

namespace {

const DtypeInfo* f32() { return dtype_from_stem("Float"); }
const DtypeInfo* bf16() { return dtype_from_stem("BFloat16"); }
const DtypeInfo* i64() { return dtype_from_stem("Long"); }

std::vector<int64_t> contiguous(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> st(sizes.size(), 1);
  for (size_t k = sizes.size(); k-- > 1;) st[k - 1] = st[k] * sizes[k];
  return st;
}

OpTensor meta(std::vector<int64_t> sizes, const DtypeInfo* dtype, bool rg, int32_t storage) {
  OpTensor m;
  m.strides = contiguous(sizes);
  m.sizes = std::move(sizes);
  m.dtype = dtype;
  m.requires_grad = rg;
  m.storage = storage;
  m.storage_bytes = m.numel() * dtype->itemsize;
  return m;
}

SaveEnv env(ComputeDevice d, SdpaKernel k = SdpaKernel::Default) {
  SaveEnv e;
  e.device = d;
  e.sdpa = k;
  return e;
}

int64_t saved_bytes(const std::vector<SavedTensor>& saves) {
  int64_t n = 0;
  for (const auto& s : saves) n += s.bytes;
  return n;
}

}  // namespace

TEST_CASE("op table: rows by name, every row has a case") {
  CHECK(find_op_row("aten.linear.default") != nullptr);
  CHECK(find_op_row("aten.scaled_dot_product_attention.default") != nullptr);
  CHECK(find_op_row("transformers.grouped_mm_fallback.default") != nullptr);
  CHECK(find_op_row("aten.no_such_op.default") == nullptr);
  const auto names = op_table_names();
  CHECK(names.size() >= 112);
  CHECK(std::is_sorted(names.begin(), names.end()));
}

TEST_CASE("op table: generated rows (gen_op_rows.py) for the operators issue 40 found unknown") {
  for (const char* op : {"aten.type_as.default", "aten.split_with_sizes.default", "aten.numpy_T.default",
                         "aten.broadcast_to.default", "aten.max.dim", "aten.view_as_complex.default",
                         "aten.view_as_real.default", "aten.polar.default", "aten.softplus.default", "aten.triu.default",
                         "aten.tril.default", "aten.eye.default", "aten.new_empty.default", "aten.scatter_.src",
                         "aten.bitwise_not.default"}) {
    CAPTURE(op);
    CHECK(find_op_row(op) != nullptr);
  }
  CHECK(op_table_names().size() >= 1400);
  // Views from the schema's alias annotations; factories record nothing.
  REQUIRE(find_op_row("aten.numpy_T.default"));
  CHECK(std::string(op_row_alias(*find_op_row("aten.numpy_T.default"))) == "self");
  CHECK(op_differentiable(*find_op_row("aten.eye.default")).empty());
  // type_as: its input itself when the dtypes agree, else a copy (_to_copy saves nothing).
  const OpRow* row = find_op_row("aten.type_as.default");
  REQUIRE(row);
  OpTensor x = meta({4, 8}, f32(), true, 1), same = meta({2}, f32(), false, 2), other = meta({2}, bf16(), false, 3);
  const SaveEnv e = env(ComputeDevice::Cpu);
  for (const OpTensor* o : {&same, &other}) {
    CallArgs args;
    args.items.emplace_back("self", ArgValue::of_tensor(&x));
    args.items.emplace_back("other", ArgValue::of_tensor(o));
    CHECK(op_output_alias(*row, 0, args, {}, e).has_value() == (o == &same));
    CHECK(op_saves(*row, select_op_case(*row, args, {}, e), args, {}, e).empty());
  }
  // max.dim saves its indices (result1), not the input.
  const OpRow* mx = find_op_row("aten.max.dim");
  REQUIRE(mx);
  OpTensor values = meta({4}, f32(), true, 4), indices = meta({4}, i64(), false, 5);
  CallArgs margs;
  margs.items.emplace_back("self", ArgValue::of_tensor(&x));
  margs.items.emplace_back("dim", ArgValue::of_int(1));
  const std::vector<const OpTensor*> outs{&values, &indices};
  const auto saves = op_saves(*mx, select_op_case(*mx, margs, outs, e), margs, outs, e);
  REQUIRE(saves.size() == 1);
  CHECK(saves[0].storage == 5);
}

TEST_CASE("op table: linear saves its input only for the weight's gradient") {
  const OpRow* row = find_op_row("aten.linear.default");
  REQUIRE(row);
  OpTensor x = meta({2, 3, 4}, f32(), false, 1), w = meta({5, 4}, f32(), true, 2);
  CallArgs args;
  args.items.emplace_back("input", ArgValue::of_tensor(&x));
  args.items.emplace_back("weight", ArgValue::of_tensor(&w));
  add_op_defaults(*row, args);
  REQUIRE(op_records(*row, args));
  const SaveEnv e = env(ComputeDevice::Cuda);
  const OpCase& c = select_op_case(*row, args, {}, e);
  auto saves = op_saves(*row, c, args, {}, e);
  REQUIRE(saves.size() == 1);
  CHECK(saves[0].storage == 1);  // the input, for the weight's gradient; not the weight (the input needs none)
  // A frozen weight and an input that needs a gradient: the weight is saved, not the input.
  x.requires_grad = true;
  w.requires_grad = false;
  saves = op_saves(*row, select_op_case(*row, args, {}, e), args, {}, e);
  REQUIRE(saves.size() == 1);
  CHECK(saves[0].storage == 2);
  // Nothing requires grad: autograd records nothing.
  x.requires_grad = false;
  CHECK_FALSE(op_records(*row, args));
}

TEST_CASE("op table: a Python number is never saved") {
  const OpRow* row = find_op_row("aten.mul.Tensor");
  REQUIRE(row);
  OpTensor x = meta({8}, f32(), true, 1);
  CallArgs args;
  args.items.emplace_back("self", ArgValue::of_tensor(&x));
  args.items.emplace_back("other", ArgValue::of_float(0.5));
  const SaveEnv e = env(ComputeDevice::Cpu);
  CHECK(op_saves(*row, select_op_case(*row, args, {}, e), args, {}, e).empty());
}

TEST_CASE("op table: SDPA by device and kernel") {
  const OpRow* row = find_op_row("aten.scaled_dot_product_attention.default");
  REQUIRE(row);
  // [B, H, L, D] = [1, 4, 16, 8]
  OpTensor q = meta({1, 4, 16, 8}, f32(), true, 1), k = meta({1, 4, 16, 8}, f32(), true, 2),
             v = meta({1, 4, 16, 8}, f32(), true, 3), out = meta({1, 4, 16, 8}, f32(), true, 4);
  CallArgs args;
  args.items.emplace_back("query", ArgValue::of_tensor(&q));
  args.items.emplace_back("key", ArgValue::of_tensor(&k));
  args.items.emplace_back("value", ArgValue::of_tensor(&v));
  args.items.emplace_back("is_causal", ArgValue::of_bool(true));
  add_op_defaults(*row, args);
  const std::vector<const OpTensor*> outs = {&out};
  {  // the CPU flash kernel: q, k, v, the output and a [B, H, L] log-sum-exp
    const SaveEnv e = env(ComputeDevice::Cpu);
    const OpCase& c = select_op_case(*row, args, outs, e);
    CHECK(std::string(op_case_name(c)).find("CPU flash") != std::string::npos);
    CHECK(op_case_verified(c));
    auto saves = op_saves(*row, c, args, outs, e);
    CHECK(saves.size() == 5);
    CHECK(saved_bytes(saves) == 4 * 2048 + 1 * 4 * 16 * 4);
    auto st = op_output_strides(c, args, outs, e);
    REQUIRE(st);
    CHECK(*st == std::vector<int64_t>{512, 128, 8, 1});
  }
  {  // math keeps the [B, H, L, S] probabilities
    const SaveEnv e = env(ComputeDevice::Cpu, SdpaKernel::Math);
    const OpCase& c = select_op_case(*row, args, outs, e);
    auto saves = op_saves(*row, c, args, outs, e);
    int64_t probs = 0;
    for (const auto& s : saves)
      if (s.what == "attn") probs = s.bytes;
    CHECK(probs == 1 * 4 * 16 * 16 * 4);
  }
  {  // CUDA, fp32: no flash (fp16/bf16 only); memory-efficient, not measured here
    const SaveEnv e = env(ComputeDevice::Cuda);
    const OpCase& c = select_op_case(*row, args, outs, e);
    CHECK(std::string(op_case_name(c)).find("memory-efficient") != std::string::npos);
    CHECK_FALSE(op_case_verified(c));
  }
  {  // CUDA, bf16: flash, a float32 log-sum-exp
    OpTensor qb = meta({1, 4, 16, 8}, bf16(), true, 1), kb = meta({1, 4, 16, 8}, bf16(), true, 2),
               vb = meta({1, 4, 16, 8}, bf16(), true, 3);
    CallArgs b;
    b.items.emplace_back("query", ArgValue::of_tensor(&qb));
    b.items.emplace_back("key", ArgValue::of_tensor(&kb));
    b.items.emplace_back("value", ArgValue::of_tensor(&vb));
    add_op_defaults(*row, b);
    const SaveEnv e = env(ComputeDevice::Cuda);
    const OpCase& c = select_op_case(*row, b, outs, e);
    CHECK(std::string(op_case_name(c)).find("CUDA flash") != std::string::npos);
    auto saves = op_saves(*row, c, b, outs, e);
    bool lse = false;
    for (const auto& s : saves)
      if (s.what == "logsumexp") lse = s.bytes == 1 * 4 * 16 * 4 && std::string(s.dtype->name) == "float32";
    CHECK(lse);
  }
}

TEST_CASE("op table: dropout keeps a bool mask on CUDA, a noise tensor on the CPU") {
  const OpRow* row = find_op_row("aten.dropout.default");
  REQUIRE(row);
  OpTensor x = meta({4, 8}, f32(), true, 1);
  CallArgs args;
  args.items.emplace_back("input", ArgValue::of_tensor(&x));
  args.items.emplace_back("p", ArgValue::of_float(0.1));
  args.items.emplace_back("train", ArgValue::of_bool(true));
  auto bytes_on = [&](ComputeDevice d) {
    const SaveEnv e = env(d);
    return saved_bytes(op_saves(*row, select_op_case(*row, args, {}, e), args, {}, e));
  };
  CHECK(bytes_on(ComputeDevice::Cuda) == 32);
  CHECK(bytes_on(ComputeDevice::Cpu) == 128);
  // Not training: the input itself, nothing saved, and the output is the input.
  args.items[2].second = ArgValue::of_bool(false);
  CHECK(bytes_on(ComputeDevice::Cuda) == 0);
  CHECK(op_output_alias(*row, 0, args, {}, env(ComputeDevice::Cuda)) == std::optional<std::string>("input"));
}

TEST_CASE("op table: cross entropy keeps its log-probabilities, not its input") {
  const OpRow* row = find_op_row("aten.cross_entropy_loss.default");
  REQUIRE(row);
  OpTensor logits = meta({6, 10}, f32(), true, 1), target = meta({6}, i64(), false, 2);
  CallArgs args;
  args.items.emplace_back("self", ArgValue::of_tensor(&logits));
  args.items.emplace_back("target", ArgValue::of_tensor(&target));
  add_op_defaults(*row, args);
  const SaveEnv e = env(ComputeDevice::Cuda);
  auto saves = op_saves(*row, select_op_case(*row, args, {}, e), args, {}, e);
  int64_t new_bytes = 0;
  bool target_saved = false;
  for (const auto& s : saves) {
    if (s.storage < 0) new_bytes += s.bytes;
    if (s.storage == 2) target_saved = true;
  }
  CHECK(new_bytes == 240 + 4);  // log_softmax [6, 10] fp32 and the 0-dim total weight
  CHECK(target_saved);
}

TEST_CASE("backward temporaries: pow's two self-sized tensors, none for exponent 0") {
  // pow_backward: grad * (exponent * self.pow(exponent - 1)); torch.square is pow(self, 2).
  OpTensor x;
  x.sizes = {2, 128, 128};
  x.dtype = f32();
  CallArgs args;
  args.items.push_back({"self", ArgValue::of_tensor(&x)});
  args.items.push_back({"exponent", ArgValue::of_int(2)});
  CHECK(node_extra("aten.pow.Tensor_Scalar", nullptr, args, RingAttention{}).backward == 2 * 2 * 128 * 128 * 4);
  CallArgs square;
  square.items.push_back({"self", ArgValue::of_tensor(&x)});
  CHECK(node_extra("aten.square.default", nullptr, square, RingAttention{}).backward == 2 * 2 * 128 * 128 * 4);
  args.items[1].second = ArgValue::of_float(0.0);
  CHECK(node_extra("aten.pow.Tensor_Scalar", nullptr, args, RingAttention{}).backward == 0);
  CHECK(node_extra("aten.relu.default", nullptr, square, RingAttention{}).backward == 0);
}

TEST_CASE("op table: views by torch's computeStride") {
  CHECK(compute_view_strides({2, 3, 4}, {12, 4, 1}, {6, 4}) == std::vector<int64_t>{4, 1});
  CHECK(compute_view_strides({2, 3, 4}, {12, 4, 1}, {-1}) == std::vector<int64_t>{1});
  // A transpose cannot be flattened without a copy.
  CHECK_FALSE(compute_view_strides({4, 3}, {1, 4}, {12}).has_value());
  CHECK(dense_like_strides({1, 16, 4, 8}, {512, 8, 128, 1}) == std::vector<int64_t>{512, 8, 128, 1});
  CHECK(span_bytes({2, 3}, {3, 1}, 4) == 24);
  CHECK(span_bytes({2, 3}, {1, 2}, 4) == 24);
}

namespace {

// A tiny graph builder: tensors by name, nodes by op and named arguments.
struct GraphBuilder {
  WalkGraph g;
  std::map<std::string, int32_t> ids;

  int32_t tensor(const std::string& name, std::vector<int64_t> sizes, const DtypeInfo* dtype = f32(),
                 bool rg = false) {
    WalkTensor t;
    t.strides = contiguous(sizes);
    t.sizes = std::move(sizes);
    t.dtype = dtype;
    t.requires_grad = rg;
    g.tensors.push_back(t);
    ids[name] = static_cast<int32_t>(g.tensors.size()) - 1;
    return ids[name];
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
    p.kind = WalkInput::UserInput;
    g.placeholders.push_back(p);
  }
  // args: {name, tensor name} or plain values; out: name and sizes.
  void node(const std::string& op, ModuleId module, std::vector<std::pair<std::string, std::string>> tensor_args,
            const std::string& out, std::vector<int64_t> out_sizes, const DtypeInfo* dtype = f32()) {
    WalkNode n;
    n.op = op;
    n.module = module;
    for (auto& [arg, t] : tensor_args) {
      WalkArg a;
      a.name = arg;
      a.value.kind = ArgValue::Kind::Tensor;
      a.tensors = {ids.at(t)};
      n.args.push_back(std::move(a));
    }
    n.outputs = {tensor(out, std::move(out_sizes), dtype)};
    g.nodes.push_back(std::move(n));
  }
};

// Net: layers.0 and layers.1 (Block: fc1 Linear(4, 8), fc2 Linear(8, 4)) and head Linear(4, 10); the
// loss in the root. Tokens: 6. What autograd saves, by hand (fp32): per block the relu output
// [6, 8] (192 B, saved by relu and by fc2) and the block's input [6, 4] (96 B, saved by fc1 if it
// needs a gradient: not for layers.0, whose input is the user's); the head saves its input
// (layers.1's output, 96 B); the loss its log-probabilities [6, 10] (240 B) and a 0-dim total weight.
struct TinyNet {
  TreeBuilder b{"__torch__.Net"};
  GraphBuilder gb;
  TinyNet() {
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
    }
    gb.node("aten.linear.default", b.id("head"), {{"input", h}, {"weight", "hw"}, {"bias", "hb"}}, "logits", {6, 10});
    gb.node("aten.cross_entropy_loss.default", 0, {{"self", "logits"}, {"target", "y"}}, "loss", {});
    gb.g.outputs = {gb.ids.at("loss"), gb.ids.at("logits")};
  }
};

ActivationPlan walk_tiny(TinyNet& net, const Plan& plan, std::vector<ModuleId> checkpointed = {},
                         bool param_grads = false) {
  WalkOptions opt;
  opt.env = env(ComputeDevice::Cuda);
  opt.checkpointed = std::move(checkpointed);
  if (param_grads) {  // as activations.cpp fills it: each parameter's owning unit
    opt.unit_of_param.assign(net.b.tree.num_tensors(), -1);
    for (size_t u = 0; u < plan.units.size(); ++u)
      for (const Owned& o : plan.units[u].params) opt.unit_of_param[static_cast<size_t>(o.tensor)] = static_cast<int>(u);
  }
  opt.unit_of_module.assign(net.b.tree.num_modules(), 0);
  for (ModuleId m : net.b.tree.preorder()) {
    const ModuleId parent = net.b.tree.module(m).parent;
    if (parent >= 0) opt.unit_of_module[static_cast<size_t>(m)] = opt.unit_of_module[static_cast<size_t>(parent)];
    for (size_t u = 0; u < plan.units.size(); ++u)
      if (plan.units[u].module == m) opt.unit_of_module[static_cast<size_t>(m)] = static_cast<int>(u);
  }
  ActivationPlan acts;
  acts.source = ActivationSource::Graph;
  std::vector<Warning> warnings;
  walk_graph(net.gb.g, net.b.tree, plan.units.size(), opt, acts, &warnings);
  CHECK(warnings.empty());
  return acts;
}

// The fp32 export walked as bf16 mixed precision on CUDA, every module in unit 0,
// with the root's cast of the floating inputs (FSDP's cast_forward_inputs).
ActivationPlan walk_bf16_cast(TinyNet& net, const Plan& plan) {
  WalkOptions opt;
  opt.env = env(ComputeDevice::Cuda);
  opt.unit_of_module.assign(net.b.tree.num_modules(), 0);
  opt.compute_dtype = bf16();
  opt.export_dtype = f32();
  opt.input_cast = bf16();
  ActivationPlan mp;
  mp.source = ActivationSource::Graph;
  walk_graph(net.gb.g, net.b.tree, plan.units.size(), opt, mp, nullptr);
  return mp;
}

}  // namespace

TEST_CASE("walk: saved bytes per module and unit, parameters and inputs apart") {
  TinyNet net;
  Plan plan = plan_of(net.b, R"({"module_classes": ["Block"]})");
  REQUIRE(plan.units.size() == 3);
  ActivationPlan a = walk_tiny(net, plan);
  // layers.0: relu 192 (its input is the user's x, saved as an input); layers.1: its input 96 + relu 192;
  // head: layers.1's output 96; loss: 240 + 4.
  CHECK(a.saved_bytes == 192 + 96 + 192 + 96 + 244);
  CHECK(a.input_saved_bytes == 96 + 48);  // x (by layers.0.fc1) and the int64 target
  CHECK(a.param_saved_bytes > 0);         // fc2's and the head's weights
  CHECK(a.loss == "aten.cross_entropy_loss.default");
  CHECK(a.unit_bytes == std::vector<int64_t>{96 + 244, 192, 96 + 192});
  // Runs: layers.0, layers.1, the root (head and loss).
  REQUIRE(a.runs.size() == 3);
  CHECK(a.runs[0].unit == 1);
  CHECK(a.runs[2].unit == 0);
  // Forward: the last run ends with everything saved and the loss held.
  CHECK(a.runs[2].forward_end == a.saved_bytes + 4);
  // The loss's backward: the logits' gradient and nll's [6, 10] gradient beside the saves.
  CHECK(a.runs[2].backward_peak == a.saved_bytes + 4 + 4 + 240 + 240);
  // Backward frees everything but the 0-dim loss.
  CHECK(a.runs[0].backward_end == 4);
}

TEST_CASE("walk: activation checkpointing keeps the blocks' inputs, recomputes in backward") {
  TinyNet net;
  Plan plan = plan_of(net.b, R"({"module_classes": ["Block"]})");
  ActivationPlan a = walk_tiny(net, plan, {net.b.id("layers.0"), net.b.id("layers.1")});
  CHECK(a.saved_bytes == 192 + 96 + 192 + 96 + 244);
  // Held: layers.1's input (layers.0's output, 96), the head's input (96, saved outside), the loss's 244.
  CHECK(a.held_bytes == 96 + 96 + 244);
  REQUIRE(a.checkpointed.size() == 2);
  CHECK(a.checkpointed[0].kept_bytes == 0);  // layers.0's input is the user's
  CHECK(a.checkpointed[1].kept_bytes == 96);
  CHECK(a.checkpointed[0].recompute_bytes == 192);
  CHECK(a.checkpointed[1].recompute_bytes == 192);
  // layers.1's backward starts by recomputing its relu output next to what is held.
  CHECK(a.runs[1].backward_peak >= a.runs[1].backward_start + 192);
}

TEST_CASE("walk: bf16 mixed precision on an fp32 export takes the forward in bf16, upcasts in fp32") {
  // The head's logits cast to float32 before the loss, as HF's loss does (`logits.float()`):
  // in the fp32 export an alias; under param_dtype bf16 a real fp32 copy of bf16 logits.
  TinyNet net;
  WalkNode& loss = net.gb.g.nodes.back();
  WalkNode cast;
  cast.op = "aten.to.dtype";
  cast.module = 0;
  WalkArg self;
  self.name = "self";
  self.value.kind = ArgValue::Kind::Tensor;
  self.tensors = {net.gb.ids.at("logits")};
  WalkArg dtype;
  dtype.name = "dtype";
  dtype.value = ArgValue::of_str("float32");
  cast.args = {self, dtype};
  cast.outputs = {net.gb.tensor("logits_f32", {6, 10}, f32())};
  loss.args[0].tensors = {cast.outputs[0]};
  net.gb.g.nodes.insert(net.gb.g.nodes.end() - 1, cast);
  Plan plan = plan_of(net.b, R"({"module_classes": ["Block"]})");
  const ActivationPlan fp32 = walk_tiny(net, plan);
  CHECK(fp32.saved_bytes == 192 + 96 + 192 + 96 + 244);  // the cast is an alias: nothing changes
  const ActivationPlan mp = walk_bf16_cast(net, plan);
  // Half of every layer's save (x is cast to bf16 by the root: a copy in the forward, saved by
  // layers.0.fc1: an activation now); the loss still saves fp32 log-probabilities of the fp32 copy.
  CHECK(mp.saved_bytes == 48 + 96 + 48 + 96 + 48 + 244);
  CHECK(mp.input_saved_bytes == 48);  // the int64 target only
}

TEST_CASE("walk: under bf16 mixed precision a cast to fp32 feeding a matmul beside a bf16 weight is a no-op") {
  // The head's input cast to float32, as transformers' MoE does before each grouped matmul
  // (`input.to(weight.dtype)`): in the fp32 export an alias, and in the bf16 run too, since the
  // matmul needs both operands in one dtype. The head saves its bf16 input, not an fp32 copy.
  TinyNet net;
  WalkNode& head = net.gb.g.nodes[net.gb.g.nodes.size() - 2];
  WalkNode cast;
  cast.op = "aten.to.dtype";
  cast.module = net.b.id("head");
  WalkArg self;
  self.name = "self";
  self.value.kind = ArgValue::Kind::Tensor;
  self.tensors = head.args[0].tensors;
  WalkArg dtype;
  dtype.name = "dtype";
  dtype.value = ArgValue::of_str("float32");
  cast.args = {self, dtype};
  cast.outputs = {net.gb.tensor("h_f32", {6, 4}, f32())};
  head.args[0].tensors = {cast.outputs[0]};
  net.gb.g.nodes.insert(net.gb.g.nodes.end() - 2, cast);
  Plan plan = plan_of(net.b, R"({"module_classes": ["Block"]})");
  CHECK(walk_tiny(net, plan).saved_bytes == 192 + 96 + 192 + 96 + 244);
  const ActivationPlan mp = walk_bf16_cast(net, plan);
  // As without the cast: 48 B for the head's bf16 input, not 96 B for a copy; the loss saves
  // bf16 log-probabilities [6, 10] and a 0-dim total weight (122 B).
  CHECK(mp.saved_bytes == 48 + 96 + 48 + 96 + 48 + 122);
}

namespace {
int64_t max_activation(const MemoryPlan& m) {
  int64_t best = 0;
  for (const auto& s : m.timeline) best = std::max(best, s.activation_bytes);
  return best;
}
}  // namespace

TEST_CASE("memory: both FSDP versions hold the runs' activations at their points") {
  for (const char* policy : {R"({"module_classes": ["Block"]})",
                             R"({"module_classes": ["Block"], "fsdp": {"version": 2}})"}) {
    CAPTURE(policy);
    TinyNet net;
    Plan plan = plan_of(net.b, policy);
    plan.activations = walk_tiny(net, plan);
    FsdpSettings s = plan.policy.fsdp;
    s.world_size = 2;
    const MemoryPlan m = plan.v2() ? estimate_memory_fsdp2(plan, s) : estimate_memory(plan, s);
    // The loss's backward is the activations' high point, and the plan's timeline reaches it;
    // the batch (x and y) is held beside them.
    const int64_t batch = 96 + 48;
    CHECK(plan.activations.input_bytes == batch);
    CHECK(max_activation(m) == plan.activations.runs[2].backward_peak + batch);
    // Forward grows to the held level; the optimizer step holds only the batch.
    CHECK(m.timeline.back().phase == "optimizer step");
    CHECK(m.timeline.back().activation_bytes == batch);
    int64_t last_forward = -1;
    for (const auto& st : m.timeline)
      if (st.phase == "forward") {
        CHECK(st.activation_bytes >= 0);
        last_forward = st.activation_bytes;
      }
    CHECK(last_forward >= plan.activations.runs[1].forward_end);
    // The peak counts what is live then.
    CHECK(m.per_rank.peak_bytes >= m.per_rank.steady_bytes + m.per_rank.activation_bytes - m.per_rank.grads_bytes);
    bool found = false;
    for (const auto& st : m.timeline) found = found || st.total_bytes() == m.per_rank.peak_bytes;
    CHECK(found);
  }
}

TEST_CASE("memory: a unit's forward after its wrapped child ended is a point of its own, in both versions") {
  // blocks.0's fc runs after its wrapped attention, before blocks.1 starts: FSDP1's walk used to resume
  // only the next unit's ancestors there, and so missed blocks.0's MLP in forward.
  TreeBuilder b("__torch__.Net");
  b.add("blocks", "ModuleList");
  for (const char* blk : {"blocks.0", "blocks.1"}) {
    b.add(blk, "Block");
    b.add(std::string(blk) + ".attn", "Attn");
    b.linear(std::string(blk) + ".attn.q", 4, 4);
    b.linear(std::string(blk) + ".fc", 4, 4);
  }
  for (const char* policy : {R"({"module_classes": ["Block", "Attn"]})",
                             R"({"module_classes": ["Block", "Attn"], "fsdp": {"version": 2}})"}) {
    CAPTURE(policy);
    Plan plan = plan_of(b, policy);
    REQUIRE(unit_paths(plan) == Names{"", "blocks.0", "blocks.0.attn", "blocks.1", "blocks.1.attn"});
    ActivationPlan& acts = plan.activations;
    acts.source = ActivationSource::Graph;
    // Graph order: the root, each block, its attention, its MLP (a peak of 5,000), then the root's head.
    int64_t level = 0;
    auto run = [&](int unit, int64_t peak) {
      ActivationRun r;
      r.unit = unit;
      r.forward_start = level;
      r.forward_peak = peak;
      r.forward_end = level += 10;
      acts.runs.push_back(r);
    };
    run(0, 10);
    run(1, 20);
    run(2, 30);
    run(1, 5000);
    run(3, 50);
    run(4, 60);
    run(3, 70);
    run(0, 80);
    for (size_t k = acts.runs.size(); k-- > 0;) {  // backward: the same levels back down
      acts.runs[k].backward_start = acts.runs[k].forward_end;
      acts.runs[k].backward_peak = acts.runs[k].forward_end;
      acts.runs[k].backward_end = acts.runs[k].forward_start;
    }
    FsdpSettings s = plan.policy.fsdp;
    s.world_size = 2;
    const MemoryPlan m = plan.v2() ? estimate_memory_fsdp2(plan, s) : estimate_memory(plan, s);
    bool mlp = false;
    for (const auto& st : m.timeline) mlp = mlp || (st.phase == "forward" && st.unit == 1 && st.activation_bytes == 5000);
    CHECK(mlp);
    CHECK(max_activation(m) == 5000);
  }
}

TEST_CASE("memory: an allowance is held through forward and backward") {
  auto b = two_blocks_and_a_head();
  Plan without = plan_of(b, R"({"module_classes": ["Block"]})");
  Policy p = policy(R"({"module_classes": ["Block"]})");
  p.activations.allowance_bytes = 1000;
  Plan with = make_plan(b.tree, p, "m.pt");
  CHECK(with.activations.source == ActivationSource::Allowance);
  REQUIRE(with.memory.timeline.size() == without.memory.timeline.size());
  for (size_t k = 0; k < with.memory.timeline.size(); ++k) {
    const auto& st = with.memory.timeline[k];
    CHECK(st.activation_bytes == (st.phase == "optimizer step" ? 0 : 1000));
    CHECK(st.total_bytes() == without.memory.timeline[k].total_bytes() + st.activation_bytes);
  }
  // The peak is the largest step (without the allowance it may be the optimizer step).
  int64_t largest = 0;
  for (const auto& st : with.memory.timeline) largest = std::max(largest, st.total_bytes());
  CHECK(with.memory.per_rank.peak_bytes == largest);
  CHECK(with.memory.per_rank.peak_bytes > without.memory.per_rank.peak_bytes);
  CHECK(with.memory.per_rank.activation_bytes == 1000);
}

TEST_CASE("plan: activations are not known without a graph, and say how to get them") {
  auto b = two_blocks_and_a_head();
  Plan plan = plan_of(b, R"({"module_classes": ["Block"]})");
  CHECK(plan.activations.source == ActivationSource::Unknown);
  CHECK(plan.activations.unknown_reason.find(".pt2") != std::string::npos);
  CHECK(plan.memory.per_rank.activation_bytes == 0);
  bool noted = false;
  for (const auto& n : plan.memory.notes) noted = noted || n.find("activations not included") != std::string::npos;
  CHECK(noted);
}

TEST_CASE("policy: activation_checkpointing by class and by path, outermost only") {
  auto b = two_blocks_and_a_head();
  Policy p = policy(R"({"module_classes": ["Block"], "activation_checkpointing": {"module_classes": ["Block", "Linear"]}})");
  ClassMatcher matcher;
  std::vector<Warning> warnings;
  auto mods = checkpointed_modules(b.tree, p, matcher, &warnings);
  // The blocks and the head; the blocks' own Linears are inside a checkpointed block.
  CHECK(mods == std::vector<ModuleId>{b.id("blocks.0"), b.id("blocks.1"), b.id("head")});
  CHECK(warnings.empty());
  p = policy(R"({"activation_checkpointing": {"modules": ["blocks.1", "blocks.9"]}})");
  mods = checkpointed_modules(b.tree, p, matcher, &warnings);
  CHECK(mods == std::vector<ModuleId>{b.id("blocks.1")});
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].kind == "unmatched_checkpoint");
  // A class that names no module is the analysis's unmatched_class.
  Plan plan = plan_of(b, R"({"activation_checkpointing": {"module_classes": ["Blok"]}})");
  const Warning* w = find_warning(plan, "unmatched_class");
  REQUIRE(w);
  CHECK(w->message.find("activation_checkpointing.module_classes") != std::string::npos);
}

TEST_CASE("policy: activation_checkpointing is read, written back and refused when empty") {
  Policy p = policy(R"({"activation_checkpointing": {"module_classes": ["Block"], "modules": [""]}})");
  REQUIRE(p.activation_checkpointing);
  CHECK(p.activation_checkpointing->module_classes == Names{"Block"});
  CHECK(p.activation_checkpointing->modules == Names{""});
  Policy back = policy(policy_file_json(p).dump());
  REQUIRE(back.activation_checkpointing);
  CHECK(back.activation_checkpointing->modules == Names{""});
  CHECK(policy_to_json(p)["activation_checkpointing"]["module_classes"] == nlohmann::ordered_json(Names{"Block"}));
  CHECK_FALSE(policy("{}").activation_checkpointing);
  CHECK_THROWS_WITH_AS(policy(R"({"activation_checkpointing": {}})"), doctest::Contains("names no module"), InputError);
  CHECK_THROWS_WITH_AS(policy(R"({"activation_checkpointing": {"module_class": ["A"]}})"),
                       doctest::Contains("did you mean \"module_classes\""), InputError);
  CHECK_THROWS_WITH_AS(policy(R"({"activation_checkpointing": ["Block"]})"), doctest::Contains("must be an object"),
                       InputError);
}

TEST_CASE("late gradients: equal to summing each enclosing unit's parameters used later, on random trees") {
  // The definition, walked unit by unit up the enclosing chain; LateGradients
  // answers from one tree in O(log modules).
  std::mt19937 rng(7);
  for (int trial = 0; trial < 40; ++trial) {
    ModuleTree tree;
    const int modules = 2 + static_cast<int>(rng() % 60);
    for (int m = 1; m < modules; ++m)
      tree.add_module(static_cast<ModuleId>(rng() % static_cast<unsigned>(m)), "m" + std::to_string(m), "M");
    // Tensors, some shared by two modules (tied): their last use is the later one.
    std::vector<TensorId> tensors;
    for (int m = 0; m < modules; ++m)
      for (unsigned k = rng() % 3; k-- > 0;) {
        const TensorId t = tree.add_tensor({{4}, "float32", 4});
        tree.add_param(static_cast<ModuleId>(m), "p" + std::to_string(k), t);
        tensors.push_back(t);
        if (rng() % 5 == 0) tree.add_param(static_cast<ModuleId>(rng() % static_cast<unsigned>(modules)), "tied" + std::to_string(t), t);
      }
    // Units: the root and a random subset, in pre-order, each parent the nearest enclosing unit.
    const std::vector<ModuleId> order = tree.preorder(0);
    std::vector<ModuleId> unit_module;
    std::vector<int> parents, unit_of(static_cast<size_t>(modules), -1);
    for (ModuleId m : order) {
      if (m != 0 && rng() % 3 != 0) continue;
      int p = -1;  // the root is a unit: the walk up ends there at the latest
      if (m != 0) {
        ModuleId a = tree.module(m).parent;
        while (unit_of[static_cast<size_t>(a)] < 0) a = tree.module(a).parent;
        p = unit_of[static_cast<size_t>(a)];
      }
      unit_of[static_cast<size_t>(m)] = static_cast<int>(unit_module.size());
      unit_module.push_back(m);
      parents.push_back(p);
    }
    std::vector<std::vector<std::pair<TensorId, int64_t>>> params(unit_module.size());
    for (TensorId t : tensors)
      params[rng() % params.size()].emplace_back(t, 1 + static_cast<int64_t>(rng() % 1000));
    // Positions by the definition.
    std::vector<int64_t> pos(static_cast<size_t>(modules)), end(static_cast<size_t>(modules));
    for (size_t i = 0; i < order.size(); ++i) pos[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
    for (ModuleId m : order) {
      int64_t last = pos[static_cast<size_t>(m)];
      for (ModuleId d : tree.preorder(m)) last = std::max(last, pos[static_cast<size_t>(d)]);
      end[static_cast<size_t>(m)] = last;
    }
    std::vector<int64_t> last_use(tree.num_tensors(), -1);
    for (int m = 0; m < modules; ++m)
      for (const auto& slot : tree.module(static_cast<ModuleId>(m)).params)
        last_use[static_cast<size_t>(slot.tensor)] = std::max(last_use[static_cast<size_t>(slot.tensor)], pos[static_cast<size_t>(m)]);

    const LateGradients late(tree, parents, unit_module, params);
    for (size_t u = 0; u < unit_module.size(); ++u)
      for (size_t j = 0; j < unit_module.size(); ++j) {
        const int64_t e = end[static_cast<size_t>(unit_module[j])];
        int64_t expected = 0;
        for (int a = static_cast<int>(u); a >= 0; a = parents[static_cast<size_t>(a)])
          for (const auto& [t, bytes] : params[static_cast<size_t>(a)])
            if (last_use[static_cast<size_t>(t)] > e) expected += bytes;
        CHECK(late.after(static_cast<int>(u), static_cast<int>(j)) == expected);
      }
  }
}

TEST_CASE("walk: a unit's parameter gradients made so far sit beside its activations in its backward") {
  // Autograd makes each parameter's gradient at the backward of its last use and FSDP frees it
  // only at the unit's post-backward (FSDP2: FSDPParamGroup.post_backward; FSDP1: the views'
  // gradients until SplitWithSizesBackward). layers.1's backward, by hand: fc2's backward makes
  // fc2's weight and bias gradients (128 + 16 B) beside relu's input gradient (192 B); relu's
  // backward then makes another 192 B while fc2's gradients still exist: the run's peak is 144 B
  // above what the activations alone reach. The whole run makes 128 + 16 + 128 + 32 = 304 B.
  TinyNet net;
  Plan plan = plan_of(net.b, R"({"module_classes": ["Block"], "fsdp": {"version": 2}})");
  const ActivationPlan without = walk_tiny(net, plan);
  const ActivationPlan with = walk_tiny(net, plan, {}, true);
  REQUIRE(with.runs.size() == 3);
  CHECK(with.runs[1].backward_grads == 304);
  CHECK(with.runs[0].backward_grads == 304);  // layers.0: x needs no gradient, its parameters do
  CHECK(with.runs[2].backward_grads == 160 + 40);  // the head
  CHECK(without.runs[1].backward_grads == 0);
  CHECK(with.runs[1].backward_peak == without.runs[1].backward_peak + 144);
  // The run's start and end are the activations' (the memory models count the unit's gradients after it).
  for (size_t k = 0; k < 3; ++k) {
    CHECK(with.runs[k].backward_start == without.runs[k].backward_start);
    CHECK(with.runs[k].backward_end == without.runs[k].backward_end);
  }
  // A frozen unit makes none: layers.1 frozen (its four tensors are 4..7).
  TinyNet frozen;
  for (WalkPlaceholder& p : frozen.gb.g.placeholders)
    if (p.kind == WalkInput::Parameter && p.param >= 4 && p.param < 8)
      frozen.gb.g.tensors[static_cast<size_t>(p.tensor)].requires_grad = false;
  const ActivationPlan f = walk_tiny(frozen, plan, {}, true);
  CHECK(f.runs[1].backward_grads == 0);
}

TEST_CASE("memory: the root's head gradients are counted once in its backward run, FSDP1") {
  // FSDP1 resumes the root for its head and loss before the last layer's backward, counting the
  // head's gradients as made (LateGradients); the run's own peak now counts them as they are
  // made, so there they are not counted again.
  TinyNet net;
  Plan plan = plan_of(net.b, R"({"module_classes": ["Block"]})");
  plan.activations = walk_tiny(net, plan, {}, true);
  FsdpSettings s = plan.policy.fsdp;
  s.world_size = 2;
  const MemoryPlan m = estimate_memory(plan, s);
  const MemoryStep* head = nullptr;
  for (const auto& st : m.timeline)
    if (st.phase == "backward") {
      head = &st;
      break;
    }
  REQUIRE(head != nullptr);
  CHECK(head->unit == 0);
  CHECK(head->activation_bytes == plan.activations.runs[2].backward_peak + plan.activations.input_bytes);
  CHECK(head->unsharded_grads_bytes == 0);
  // The root's pre-backward hook has already prefetched layers.1, whose backward follows
  // (BACKWARD_PRE: _runtime_utils.py _pre_backward_hook -> _prefetch_handle).
  CHECK(head->gathered_bytes == m.units[0].unsharded_bytes + m.units[2].unsharded_bytes);
}

TEST_CASE("memory: FSDP1 NO_SHARD frees a unit's low-precision copy at its post-backward") {
  // Mixed precision under NO_SHARD (world size 1): the bf16 copy is the unit's only gathered
  // memory, and _post_backward_reshard frees it (_flat_param.py: FlatParamHandle.post_reshard
  // frees _mp_shard) before the gradient's fp32 copy is made. By hand, layers.1 (76 parameters):
  // gathered = the root's copy 100 + its own 152 + layers.0's prefetched 152; the head's bf16
  // gradient 100 made before it. Its end: + the views' 152 and the flat gradient 152 = 808. The
  // post-backward: its copy gone (-152), the flat gradient 152 and its fp32 copy 304 = 808, not 960.
  TinyNet net;
  Plan plan = plan_of(net.b, R"({"module_classes": ["Block"],
                                 "mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}})");
  FsdpSettings s = plan.policy.fsdp;
  s.world_size = 1;
  const MemoryPlan m = estimate_memory(plan, s);
  const MemoryStep* last = nullptr;
  for (const auto& st : m.timeline)
    if (st.phase == "backward" && st.unit == 2) {
      last = &st;
      break;
    }
  REQUIRE(last != nullptr);
  CHECK(last->gathered_bytes + last->unsharded_grads_bytes + last->grads_bytes == 808);
}

TEST_CASE("memory: FSDP2's forward keeps the previous all-gather output through the copy-out") {
  // wait_for_unshard drops comm_ctx.all_gather_state before its copy-out, but its local
  // prev_all_gather_state holds the previous group's all-gather output until it returns
  // (_fsdp_param_group.py: FSDPParamGroup.wait_for_unshard): the first layer's unsharded
  // parameters sit beside both all-gather outputs.
  TinyNet net;
  Plan plan = plan_of(net.b, R"({"module_classes": ["Block"], "fsdp": {"version": 2}})");
  FsdpSettings s = plan.policy.fsdp;
  s.world_size = 2;
  const MemoryPlan m = estimate_memory_fsdp2(plan, s, true);
  REQUIRE(m.units.size() == 3);
  const int64_t root = m.units[0].unsharded_bytes, layer = m.units[1].unsharded_bytes;
  CHECK(root == 200);
  CHECK(layer == 304);
  bool found = false;
  for (const auto& st : m.timeline) {
    if (st.phase != "forward" || st.unit != 1) continue;
    std::map<std::string, int64_t> c(st.categories.begin(), st.categories.end());
    CHECK(c["all_gather"] == root + layer);
    CHECK(c["unsharded_params"] == root + layer);
    found = true;
  }
  CHECK(found);
}

TEST_CASE("memory: the batch is held through the step, the optimizer step included, in both versions") {
  for (const char* policy : {R"({"module_classes": ["Block"]})",
                             R"({"module_classes": ["Block"], "fsdp": {"version": 2}})"}) {
    CAPTURE(policy);
    TinyNet net;
    Plan plan = plan_of(net.b, policy);
    plan.activations = walk_tiny(net, plan);
    const int64_t batch = plan.activations.input_bytes;
    CHECK(batch == 96 + 48);
    FsdpSettings s = plan.policy.fsdp;
    s.world_size = 1;
    const MemoryPlan with = plan.v2() ? estimate_memory_fsdp2(plan, s) : estimate_memory(plan, s);
    plan.activations.input_bytes = 0;
    const MemoryPlan without = plan.v2() ? estimate_memory_fsdp2(plan, s) : estimate_memory(plan, s);
    REQUIRE(with.timeline.size() == without.timeline.size());
    for (size_t k = 0; k < with.timeline.size(); ++k)
      CHECK(with.timeline[k].activation_bytes == without.timeline[k].activation_bytes + batch);
    CHECK(with.per_rank.peak_bytes == without.per_rank.peak_bytes + batch);
  }
  // Under mixed precision the batch is what the caller holds (fp32 x), the bf16 copy an activation.
  TinyNet net;
  Plan plan = plan_of(net.b, R"({"module_classes": ["Block"]})");
  const ActivationPlan mp = walk_bf16_cast(net, plan);
  CHECK(mp.input_bytes == 96 + 48);
}

// ------------------------------------------------------------------ selective checkpointing (issue 42)
namespace {

// A block of four bias-free Linears (fc1 4->8, fc2 8->8, fc3 8->8, fc4 8->4) with a relu after each
// of the first three, then a head (Linear(4, 10) with bias) and the loss in the root. Tokens: 6, fp32.
// A bias-free linear on a 2-D input is one mm (aten/src/ATen/native/Linear.cpp), so the block runs
// four mms: a1 [6, 8], a2, a3 [6, 8] and a4 [6, 4]. autograd saves each relu's output (192 B), which
// the next linear saves too, and the head saves a4 (96 B, outside the block).
struct SacNet {
  TreeBuilder b{"__torch__.Net"};
  GraphBuilder gb;
  SacNet() {
    b.add("layers", "ModuleList");
    b.add("layers.0", "Block");
    b.linear("layers.0.fc1", 4, 8);
    b.linear("layers.0.fc2", 8, 8);
    b.linear("layers.0.fc3", 8, 8);
    b.linear("layers.0.fc4", 8, 4);
    b.linear("head", 4, 10);
    gb.input("x", {6, 4});
    gb.input("y", {6}, i64());
    const std::vector<std::pair<int64_t, int64_t>> shapes = {{8, 4}, {8, 8}, {8, 8}, {4, 8}};
    TensorId t = 0;
    for (size_t k = 0; k < 4; ++k) {
      gb.param("w" + std::to_string(k + 1), {shapes[k].first, shapes[k].second}, t);
      t += 2;  // the tree's bias, unused by the graph
    }
    gb.param("hw", {10, 4}, t++);
    gb.param("hb", {10}, t++);
    std::string h = "x";
    for (int k = 1; k <= 4; ++k) {
      const std::string fc = "layers.0.fc" + std::to_string(k), a = "a" + std::to_string(k);
      gb.node("aten.linear.default", b.id(fc), {{"input", h}, {"weight", "w" + std::to_string(k)}}, a,
              {6, k == 4 ? 4 : 8});
      h = a;
      if (k < 4) {
        gb.node("aten.relu.default", b.id("layers.0"), {{"self", a}}, "r" + std::to_string(k), {6, 8});
        h = "r" + std::to_string(k);
      }
    }
    gb.node("aten.linear.default", b.id("head"), {{"input", h}, {"weight", "hw"}, {"bias", "hb"}}, "logits", {6, 10});
    gb.node("aten.cross_entropy_loss.default", 0, {{"self", "logits"}, {"target", "y"}}, "loss", {});
    gb.g.outputs = {gb.ids.at("loss"), gb.ids.at("logits")};
  }
};

ActivationPlan walk_sac(SacNet& net, const SacPolicy* sac) {
  WalkOptions opt;
  opt.env = env(ComputeDevice::Cuda);
  opt.checkpointed = {net.b.id("layers.0")};
  opt.unit_of_module.assign(net.b.tree.num_modules(), 0);
  opt.sac = sac;
  ActivationPlan acts;
  acts.source = ActivationSource::Graph;
  std::vector<Warning> warnings;
  walk_graph(net.gb.g, net.b.tree, 1, opt, acts, &warnings);
  CHECK(warnings.empty());
  return acts;
}

}  // namespace

TEST_CASE("selective: torchtitan's policy saves the odd mms of a call, recomputes the even ones") {
  // torchtitan 0.3.0 SelectiveAC: the count goes up before the check, so the 1st and 3rd mm are
  // saved (count 1, 3: odd), the 2nd and 4th recomputed.
  SacPolicy tt;
  SacCallPolicy call(tt);
  CHECK(call.saves("aten.mm.default", std::nullopt));
  CHECK_FALSE(call.saves("aten.mm.default", std::nullopt));
  CHECK(call.saves("aten.addmm.default", std::nullopt));  // always saved, not counted
  CHECK(call.saves("aten.mm.default", std::nullopt));
  CHECK_FALSE(call.saves("aten.relu.default", std::nullopt));
  CHECK(call.saves("aten.topk.default", std::nullopt));
  CHECK_FALSE(call.saves("aten._scaled_dot_product_flash_attention_for_cpu.default", std::nullopt));
  CHECK(call.saves("aten._scaled_dot_product_efficient_attention.default", std::nullopt));
  CHECK(call.mm_count() == 3);
  // A forced shape is recomputed and not counted.
  tt.recompute_mm_shapes = {{16, 4}};
  SacCallPolicy forced(tt);
  CHECK_FALSE(forced.saves("aten.mm.default", std::make_pair(int64_t{16}, int64_t{4})));
  CHECK(forced.saves("aten.mm.default", std::make_pair(int64_t{4}, int64_t{16})));
  CHECK(forced.mm_count() == 1);
  // What the dispatch mode sees of composite ops, by the op table's case.
  CHECK(sac_dispatch("aten.linear.default", "mm(input, weight.t()) (+ add_(bias))")[0].op == "aten.mm.default");
  CHECK(sac_dispatch("aten.linear.default", "addmm(bias, input, weight.t())")[0].op == "aten.addmm.default");
  CHECK(sac_dispatch("aten.matmul.default", "batched (expand + reshape to 3-D, bmm); equal batch dims assumed")[0].op ==
        "aten.bmm.default");
  CHECK(sac_dispatch("aten.scaled_dot_product_attention.default", "math (_scaled_dot_product_attention_math)").size() ==
        2);
}

TEST_CASE("selective: the saved mms' outputs are held to the block's recompute, the rest recomputed") {
  SacNet net;
  const ActivationPlan full = walk_sac(net, nullptr);
  SacPolicy tt;
  const ActivationPlan sac = walk_sac(net, &tt);
  REQUIRE(sac.checkpointed.size() == 1);
  const CheckpointedModule& c = sac.checkpointed[0];
  CHECK(c.selective);
  CHECK_FALSE(full.checkpointed[0].selective);
  // a1 and a3 (the 1st and 3rd mm, 192 B each) are cached; a2 and a4 are not.
  CHECK(c.cached_bytes == 192 + 192);
  CHECK(sac.held_bytes == full.held_bytes + 384);
  // The nodes: a1 is node 0, r1 1, a2 2, r2 3, a3 4.
  CHECK(sac.sac_saved_nodes == std::vector<int32_t>{0, 4});
  // The recompute saves the three relu outputs again (not cached).
  CHECK(c.recompute_bytes == 3 * 192);
  CHECK(full.checkpointed[0].recompute_bytes == 3 * 192);
  // Its working set: r1, r2, r3 saved as they come, a2 until r2 is made, and a4 (made again, held
  // outside, dropped at the end): 3 * 192 + 96.
  CHECK(c.recompute_peak_bytes == 3 * 192 + 96);
  // Forward: the cached outputs stay to the end of the forward.
  REQUIRE(sac.runs.size() == 1);
  CHECK(sac.runs[0].forward_end == full.runs[0].forward_end + 384);
  // Backward: the recompute's working set on top of what is live at its start (the cached 384 among it).
  CHECK(sac.runs[0].backward_peak >= 384 + 3 * 192 + 96);
  CHECK(sac.runs[0].backward_end == full.runs[0].backward_end);
}

TEST_CASE("selective: recompute_mm_fqns forces every mm of that weight shape, a list policy saves what it names") {
  SacNet net;
  // fc3's weight is (8, 8): fc2's mm has the same shape and is forced too; fc1 (count 1) is saved,
  // fc4 (count 2) recomputed.
  SacPolicy forced;
  forced.recompute_mm_shapes = {{8, 8}};
  CHECK(walk_sac(net, &forced).checkpointed[0].cached_bytes == 192);
  SacPolicy list;
  list.torchtitan = false;
  list.save_ops = {"aten.mm.default"};
  CHECK(walk_sac(net, &list).checkpointed[0].cached_bytes == 3 * 192 + 96);
  list.save_ops = {"aten.relu.default"};
  // relu's outputs: cached, and saved by autograd in the recompute (already live: not made again).
  const ActivationPlan relu = walk_sac(net, &list);
  CHECK(relu.checkpointed[0].cached_bytes == 3 * 192);
  CHECK(relu.checkpointed[0].recompute_bytes == 0);
}

TEST_CASE("policy: activation_checkpointing mode selective is read, written back and checked") {
  Policy p = policy(R"({"activation_checkpointing": {"module_classes": ["Block"], "mode": "selective",
                        "recompute_mm_fqns": ["router.gate"]}})");
  REQUIRE(p.activation_checkpointing);
  CHECK(p.activation_checkpointing->selective());
  CHECK(p.activation_checkpointing->torchtitan_policy);
  CHECK(p.activation_checkpointing->recompute_mm_fqns == Names{"router.gate"});
  Policy back = policy(policy_file_json(p).dump());
  REQUIRE(back.activation_checkpointing);
  CHECK(back.activation_checkpointing->selective());
  CHECK(back.activation_checkpointing->recompute_mm_fqns == Names{"router.gate"});
  CHECK(policy_to_json(p)["activation_checkpointing"]["save_ops"] == "torchtitan");
  Policy list = policy(R"({"activation_checkpointing": {"modules": [""], "mode": "selective",
                           "save_ops": ["aten.mm.default"]}})");
  CHECK_FALSE(list.activation_checkpointing->torchtitan_policy);
  CHECK(policy(policy_file_json(list).dump()).activation_checkpointing->save_ops == Names{"aten.mm.default"});
  // Full AC (the default) writes nothing new.
  Policy full = policy(R"({"activation_checkpointing": {"module_classes": ["Block"], "mode": "full"}})");
  CHECK_FALSE(full.activation_checkpointing->selective());
  CHECK_FALSE(policy_file_json(full)["activation_checkpointing"].contains("mode"));
  CHECK_THROWS_WITH_AS(policy(R"({"activation_checkpointing": {"module_classes": ["B"], "mode": "op"}})"),
                       doctest::Contains("\"full\" or \"selective\""), InputError);
  CHECK_THROWS_WITH_AS(policy(R"({"activation_checkpointing": {"module_classes": ["B"], "save_ops": "torchtitan"}})"),
                       doctest::Contains("needs \"mode\": \"selective\""), InputError);
  CHECK_THROWS_WITH_AS(policy(R"({"activation_checkpointing": {"module_classes": ["B"], "mode": "selective",
                                  "save_ops": ["mm"]}})"),
                       doctest::Contains("e.g. \"aten.mm.default\""), InputError);
  CHECK_THROWS_WITH_AS(policy(R"({"activation_checkpointing": {"module_classes": ["B"], "mode": "selective",
                                  "save_ops": ["aten.mm.default"], "recompute_mm_fqns": ["g"]}})"),
                       doctest::Contains("torchtitan's policy"), InputError);
}
