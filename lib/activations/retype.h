// Mixed precision on an export traced in another floating dtype (walk.h:
// WalkOptions::compute_dtype): which dtype each tensor of the graph has in the
// run, and the casts that become no-ops there.
//
// FSDP runs the forward on parameters cast to param_dtype
// (torch/distributed/fsdp/_fully_shard/_fsdp_param.py:
// FSDPParam.init_unsharded_param; FSDP1 _flat_param.py:
// _use_low_precision_shard), so what the graph records in the export's dtype
// is, in the run, in param_dtype where it is computed from such tensors. The
// graph cannot say which explicit casts were `.float()` and which
// `.to(x.dtype)` (both record to(float32) in an fp32 export): a cast to the
// export's dtype of a tensor already in it is taken as the cast back
// (RMSNorm's `.to(input_dtype)`, rotary's `cos.to(x.dtype)`), a cast of a
// param_dtype tensor as the upcast it is (RMSNorm's `.to(float32)`, the loss's
// `logits.float()`).
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "activations/saved_ops.h"
#include "activations/walk.h"

namespace fsdp_plan {

class Retype {
 public:
  Retype(const DtypeInfo* compute, const DtypeInfo* exported) : compute_(compute), export_(exported) {}

  // Whether the run's floating dtype differs from the export's.
  bool active() const { return compute_ && export_ && compute_ != export_; }

  // A cast to the export's dtype of a tensor in it becomes a cast to param_dtype.
  void cast(const WalkNode& node, CallArgs& args) const;

  // A matmul's or attention's operand that is a retyped upcast is the tensor
  // before the cast; `subs` holds the operands put in place (reserved: args
  // point into it). `meta`: the walk's tensors.
  void same_dtype_operands(const WalkNode& node, CallArgs& args, std::vector<OpTensor>& subs,
                           const std::vector<OpTensor>& meta) const;

  // Remembers a retyped upcast (a param_dtype tensor copied to the export's dtype) by the copy's storage.
  void note_upcast(const WalkNode& node, std::string_view base, const std::vector<OpTensor>& meta);

  // The dtype an output recorded as `recorded` has in the run.
  const DtypeInfo* run_dtype(const CallArgs& args, const DtypeInfo* recorded) const;

  // A retyped upcast's storage -> the tensor it copied.
  const std::unordered_map<int32_t, int32_t>& upcasts() const { return upcast_source_; }

 private:
  const DtypeInfo* compute_;
  const DtypeInfo* export_;
  std::unordered_map<int32_t, int32_t> upcast_source_;
};

}  // namespace fsdp_plan
