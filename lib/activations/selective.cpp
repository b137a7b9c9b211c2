#include "activations/selective.h"

#include <algorithm>

namespace fsdp_plan {

const std::vector<std::string_view>& torchtitan_save_ops() {
  static const std::vector<std::string_view> ops = {
      // get_default_op_list().compute_intensive_ops, each op's .default
      // (torch/_functorch/partitioners.py, torch 2.13).
      "aten.mm.default", "aten.convolution.default", "aten.convolution_backward.default", "aten.bmm.default",
      "aten.addmm.default", "aten._scaled_dot_product_flash_attention.default",
      "aten._scaled_dot_product_efficient_attention.default", "aten._flash_attention_forward.default",
      "aten._efficient_attention_forward.default", "aten.upsample_bilinear2d.default", "aten._scaled_mm.default",
      // _get_default_save_ops' compute_ops (torchtitan 0.3.0).
      "aten._scaled_dot_product_cudnn_attention.default", "aten._scaled_dot_product_attention_math.default",
      "aten._scaled_dot_product_fused_attention_overrideable.default", "aten.max.default",
      "higher_order.flex_attention", "aten.linear.default", "aten.topk.default", "higher_order.inductor_compiled_code",
      // and its comm_ops.
      "_c10d_functional.reduce_scatter_tensor.default", "_c10d_functional.all_to_all_single.default"};
  return ops;
}

namespace {

bool sac_case_is(const char* s, std::string_view prefix) {
  return s && std::string_view(s).substr(0, prefix.size()) == prefix;
}

}  // namespace

std::vector<SacStep> sac_dispatch(std::string_view op, const char* case_name) {
  // aten/src/ATen/native/Linear.cpp: linear is addmm for a 2-D input with a
  // bias and for a contiguous 3-D one (_flatten_nd_linear), else matmul,
  // which folds the input into one mm (the op table's cases say which).
  if (op == "aten.linear.default")
    return {{sac_case_is(case_name, "addmm") || sac_case_is(case_name, "_flatten_nd_linear") ? "aten.addmm.default"
                                                                                               : "aten.mm.default"}};
  // LinearAlgebra.cpp: _matmul_impl folds into mm, or expands both to 3-D for bmm.
  if (op == "aten.matmul.default")
    return {{sac_case_is(case_name, "batched") ? "aten.bmm.default" : "aten.mm.default"}};
  if (op == "aten.conv1d.default" || op == "aten.conv2d.default" || op == "aten.conv3d.default" ||
      op == "aten._convolution.default")
    return {{"aten.convolution.default"}};
  if (op == "aten.scaled_dot_product_attention.default") {
    // native/transformers/attention.cpp: the kernel the row's case names. The
    // math path is itself composite: its two bmms (q @ k^T, probabilities @ v)
    // are what a dispatch mode sees of it.
    if (sac_case_is(case_name, "math") || sac_case_is(case_name, "CUDA fallback"))
      return {{"aten.bmm.default", SacProduct::AttentionScores}, {"aten.bmm.default", SacProduct::AttentionOutput}};
    if (sac_case_is(case_name, "CPU flash")) return {{"aten._scaled_dot_product_flash_attention_for_cpu.default"}};
    if (sac_case_is(case_name, "CUDA flash")) return {{"aten._scaled_dot_product_flash_attention.default"}};
    if (sac_case_is(case_name, "CUDA memory-efficient"))
      return {{"aten._scaled_dot_product_efficient_attention.default"}};
    if (sac_case_is(case_name, "CUDA cuDNN")) return {{"aten._scaled_dot_product_cudnn_attention.default"}};
  }
  return {{op}};
}

bool SacCallPolicy::saves(std::string_view op, std::optional<std::pair<int64_t, int64_t>> mm_rhs) {
  if (!policy_->torchtitan)
    return std::find(policy_->save_ops.begin(), policy_->save_ops.end(), op) != policy_->save_ops.end();
  // torchtitan 0.3.0, SelectiveAC._wrap_block's wrapped_policy: an mm whose
  // right-hand side has a forced shape is recomputed and not counted; the
  // others count, and of the saved ops an mm is recomputed when the count
  // is even (the 2nd, 4th, ... mm of the call), saved when odd. (aten.linear
  // counts too there, but on CPU and CUDA it decomposes before a dispatch
  // mode sees it.)
  const bool mm = op == "aten.mm.default" || op == "aten.linear.default";
  if (mm) {
    if (mm_rhs && std::find(policy_->recompute_mm_shapes.begin(), policy_->recompute_mm_shapes.end(), *mm_rhs) !=
                      policy_->recompute_mm_shapes.end())
      return false;
    ++forward_mm_count_;
  }
  const auto& ops = torchtitan_save_ops();
  if (std::find(ops.begin(), ops.end(), op) == ops.end()) return false;
  return !(mm && forward_mm_count_ % 2 == 0);
}

int64_t sac_attention_bytes(const OpTensor* q, const OpTensor* k, const OpTensor* v, SacProduct product) {
  if (!q || !k || !v || q->sizes.empty() || k->sizes.size() < 2 || v->sizes.empty() || !q->dtype) return 0;
  const int64_t itemsize = q->dtype->itemsize == 2 ? 4 : q->dtype->itemsize;
  if (product == SacProduct::AttentionOutput && q->dtype->itemsize != 2) return -1;
  int64_t numel = product == SacProduct::AttentionScores ? k->sizes[k->sizes.size() - 2] : v->sizes.back();
  for (size_t d = 0; d + 1 < q->sizes.size(); ++d) numel *= q->sizes[d];
  return numel * itemsize;
}

}  // namespace fsdp_plan
