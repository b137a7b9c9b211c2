#include "activations/retype.h"

#include <algorithm>
#include <iterator>

#include "activations/walk_rules.h"

namespace fsdp_plan {
namespace {

// A matmul needs its operands in one dtype (aten/src/ATen/native/LinearAlgebra.cpp:
// "expected m1 and m2 to have the same dtype"; _grouped_mm and transformers'
// grouped_mm_fallback alike), and so does attention (native/transformers/attention.cpp:
// validate_sdpa_input, "Expected query, key, and value to have the same dtype").
// So a cast to the export's dtype feeding one beside a param_dtype operand was
// `.to(weight.dtype)` or `.to(result_dtype)`, a no-op in the run
// (transformers/integrations/moe.py: _grouped_mm's `input.to(weight.dtype)`;
// peft/tuners/lora/layer.py: Linear.forward's `result.to(torch_result_dtype)`):
// the operand is the tensor before that cast.
bool same_dtype_operands_op(std::string_view base) {
  // Views made at compile time: this runs at every node of every walk.
  static constexpr std::string_view kOps[] = {
      "mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "_grouped_mm", "grouped_mm", "grouped_mm_fallback",
      "scaled_dot_product_attention", "_scaled_dot_product_flash_attention_for_cpu",
      "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
      "_scaled_dot_product_cudnn_attention"};
  return std::find(std::begin(kOps), std::end(kOps), base) != std::end(kOps);
}

bool valid(const std::vector<OpTensor>& meta, int32_t t) {
  return t >= 0 && static_cast<size_t>(t) < meta.size() && meta[static_cast<size_t>(t)].storage >= 0;
}

}  // namespace

void Retype::cast(const WalkNode& node, CallArgs& args) const {
  if (!active()) return;
  const std::string_view base = aten_op_base(node.op);
  if (base != "to" && base != "_to_copy") return;
  // `x.to(device)` records its dtype as x's own at trace time: a move, not a
  // cast (rotary's `inv_freq[...].float().to(x.device)` on an fp32 buffer,
  // which mixed precision leaves in fp32).
  if (node.op == "aten.to.device") return;
  const ArgValue* self = args.find("self");
  if (!self || self->kind != ArgValue::Kind::Tensor || !self->tensor || self->tensor->dtype != export_) return;
  for (auto& [name, v] : args.items)
    if (name == "dtype" && v.kind == ArgValue::Kind::Str && v.s == export_->name) v = ArgValue::of_str(compute_->name);
}

void Retype::same_dtype_operands(const WalkNode& node, CallArgs& args, std::vector<OpTensor>& subs,
                                 const std::vector<OpTensor>& meta) const {
  if (!active() || upcast_source_.empty() || !same_dtype_operands_op(aten_op_base(node.op))) return;
  bool compute = false;
  for (const auto& [name, v] : args.items)
    if (v.kind == ArgValue::Kind::Tensor && v.tensor && v.tensor->dtype == compute_) compute = true;
  if (!compute) return;
  subs.reserve(args.items.size());
  for (auto& [name, v] : args.items) {
    if (v.kind != ArgValue::Kind::Tensor || !v.tensor || v.tensor->dtype != export_) continue;
    auto it = upcast_source_.find(v.tensor->storage);
    if (it == upcast_source_.end()) continue;
    // The same view, of the storage before the cast.
    const OpTensor& src = meta[static_cast<size_t>(it->second)];
    OpTensor t = *v.tensor;
    t.dtype = src.dtype;
    t.storage = src.storage;
    t.storage_bytes = src.storage_bytes;
    subs.push_back(std::move(t));
    v.tensor = &subs.back();
  }
}

void Retype::note_upcast(const WalkNode& node, std::string_view base, const std::vector<OpTensor>& meta) {
  if (!active() || (base != "to" && base != "_to_copy") || node.outputs.size() != 1 || !valid(meta, node.outputs[0]))
    return;
  for (const WalkArg& a : node.args) {
    if (a.name != "self" || a.tensors.size() != 1 || !valid(meta, a.tensors[0])) continue;
    const OpTensor& in = meta[static_cast<size_t>(a.tensors[0])];
    const OpTensor& out = meta[static_cast<size_t>(node.outputs[0])];
    if (in.dtype == compute_ && out.dtype == export_ && out.storage != in.storage)
      upcast_source_.emplace(out.storage, a.tensors[0]);
  }
}

const DtypeInfo* Retype::run_dtype(const CallArgs& args, const DtypeInfo* recorded) const {
  if (!active() || recorded != export_) return recorded;
  if (const ArgValue* d = args.find("dtype"); d && d->kind == ArgValue::Kind::Str) {
    for (const DtypeInfo* x : {compute_, export_})
      if (d->s == x->name) return x;
    return recorded;
  }
  bool compute = false;
  for (const auto& [name, v] : args.items)
    v.for_each_tensor([&](const OpTensor& t) { compute = compute || t.dtype == compute_; });
  return compute ? compute_ : recorded;
}

}  // namespace fsdp_plan
