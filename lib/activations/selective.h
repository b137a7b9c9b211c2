// Selective activation checkpointing in eager mode (issue 42): which ops of a
// checkpointed call keep their outputs under a policy. PyTorch runs the call
// under the pair of TorchDispatchModes create_selective_checkpoint_contexts
// returns (torch/utils/checkpoint.py): in the forward, _CachingTorchDispatchMode
// asks the policy for every op the dispatcher runs and holds the outputs of
// those it says MUST_SAVE / PREFER_SAVE in a cache; in the backward the call
// runs again under _CachedTorchDispatchMode, which hands those back (and lets
// go of them) and recomputes the rest. The walk (walk.h) holds what the cache
// holds from the op to the call's recompute, and counts the recompute.
//
// The graph is the exported one (pre-dispatch ATen): a CompositeImplicitAutograd
// op (linear, matmul, scaled_dot_product_attention) reaches the dispatch mode as
// the ops it decomposes into, so sac_dispatch() names them from the op table's
// case (saved_ops.yaml): linear as addmm or mm, SDPA as its kernel.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "activations/saved_ops.h"

namespace fsdp_plan {

// A policy, resolved against the model (activations.cpp: the policy's
// activation_checkpointing with mode "selective").
struct SacPolicy {
  // torchtitan's SelectiveAC (torchtitan/distributed/activation_checkpoint.py,
  // 0.3.0: _get_default_save_ops and the policy _get_custom_policy builds);
  // false: a list policy (save_ops).
  bool torchtitan = true;
  std::vector<std::string> save_ops;
  // force_recompute_mm_shapes_by_fqns resolved: the (in, out) shape of each
  // matching Linear's weight (torchtitan stores mm's right-hand side shape).
  std::vector<std::pair<int64_t, int64_t>> recompute_mm_shapes;
};

// torchtitan's save list as torch 2.13 registers it without optional backends
// (deepep, hybridep, torch_attn absent): get_default_op_list's
// compute_intensive_ops (torch/_functorch/partitioners.py) and the extra
// compute and communication ops _get_default_save_ops adds.
const std::vector<std::string_view>& torchtitan_save_ops();

// What one dispatched op of a graph node makes: the node's own outputs (and
// the kernel's extra outputs, such as the fused attention's logsumexp), or, for
// the math SDPA's decomposition, its two bmm outputs (the scores [.., L, S]
// and the attention output [.., L, Dv], in the math dtype).
enum class SacProduct : uint8_t { Outputs, AttentionScores, AttentionOutput };
struct SacStep {
  std::string_view op;  // the ATen overload the dispatch mode sees
  SacProduct product = SacProduct::Outputs;
};

// The ops the dispatch mode sees for a graph node that make its outputs (or,
// under the math SDPA, the tensors named above), from the node's op and its
// row's case name (saved_ops.yaml; nullptr: no case). Other ops of a
// decomposition (views, the scaling muls, softmax) are left out: no policy
// here saves them.
std::vector<SacStep> sac_dispatch(std::string_view op, const char* case_name);

// The bytes of what a math SDPA's decomposition makes for `product`
// (attention.cpp: _scaled_dot_product_attention_math, its bmms in float32 for
// bf16/fp16 inputs): the scores [.., L, S], a tensor of their own; the output
// [.., L, Dv], the node's own output (-1) unless cast back to bf16; 0 where q,
// k or v is missing.
int64_t sac_attention_bytes(const OpTensor* q, const OpTensor* k, const OpTensor* v, SacProduct product);

// One checkpointed call's policy: torchtitan builds a policy, with its own mm
// counter, for every call (context_fn runs per checkpoint call).
class SacCallPolicy {
 public:
  explicit SacCallPolicy(const SacPolicy& policy) : policy_(&policy) {}
  // Whether the op's outputs are cached (MUST_SAVE). `mm_rhs`: for aten.mm,
  // the shape of its second argument (for linear, weight.t()).
  bool saves(std::string_view op, std::optional<std::pair<int64_t, int64_t>> mm_rhs);
  int64_t mm_count() const { return forward_mm_count_; }

 private:
  const SacPolicy* policy_;
  int64_t forward_mm_count_ = 0;
};

}  // namespace fsdp_plan
