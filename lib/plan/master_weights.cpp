#include "plan/master_weights.h"

#include <string>

#include "model/dtype.h"
#include "util/strings.h"

namespace fsdp_plan {

namespace {

// Accelerate casts `param.dtype != torch.float32`; only floating parameters can require grad.
bool cast_to_float32(const TensorInfo& t) { return t.dtype != "float32" && is_floating_dtype(t.dtype); }

// The first parameter name of `t` in tree order, for the note.
std::string first_name(const ModuleTree& tree, TensorId t) {
  for (ModuleId m : tree.preorder())
    for (const auto& slot : tree.module(m).params)
      if (slot.tensor == t) return tree.qualify(m, slot.name);
  return "";
}

}  // namespace

std::vector<TensorId> fsdp2_master_weight_casts(const ModuleTree& tree) {
  std::vector<TensorId> out;
  for (TensorId t = 0; t < static_cast<TensorId>(tree.num_tensors()); ++t)
    if (tree.is_param(t) && tree.tensor(t).requires_grad && cast_to_float32(tree.tensor(t))) out.push_back(t);
  return out;
}

std::vector<TensorId> fsdp1_master_weight_casts(const ModuleTree& tree, const std::vector<Unit>& units) {
  std::vector<TensorId> out;
  for (const Unit& u : units) {
    if (u.params.empty() || !one_dtype(tree, u.params)) continue;
    bool requires_grad = false;
    for (const Owned& o : u.params) requires_grad = requires_grad || tree.tensor(o.tensor).requires_grad;
    if (!requires_grad || !cast_to_float32(tree.tensor(u.params.front().tensor))) continue;
    for (const Owned& o : u.params) out.push_back(o.tensor);
  }
  return out;
}

std::shared_ptr<const ModuleTree> with_float32(const ModuleTree& tree, const std::vector<TensorId>& cast) {
  if (cast.empty()) return nullptr;
  auto out = std::make_shared<ModuleTree>(tree);
  for (TensorId t : cast) out->set_dtype(t, "float32", 4);
  return out;
}

Warning master_weights_note(const ModuleTree& before, const std::vector<TensorId>& cast, const Policy& policy) {
  int64_t numel = 0, bytes = 0;
  std::string from;
  for (TensorId t : cast) {
    numel += before.numel(t);
    bytes += before.bytes(t);
    if (from.find(before.tensor(t).dtype) == std::string::npos) from += (from.empty() ? "" : ", ") + before.tensor(t).dtype;
  }
  const auto& mp = policy.mixed_precision;
  const std::string compute = mp && mp->param_dtype ? *mp->param_dtype : "the parameters' dtype";
  const std::string count = std::to_string(cast.size()) + (cast.size() == 1 ? " parameter (" : " parameters (");
  const std::string names = count + first_name(before, cast.front()) + (cast.size() > 1 ? ", ..." : "");
  const char* where = policy.fsdp.v2()
                          ? "as Accelerate's fsdp2_prepare_model does (\"Upcast to fp32 master weights\": every "
                            "trainable parameter not in float32; frozen ones keep their dtype)"
                          : "as Accelerate's prepare_model does after wrapping (each unit's flat parameter that "
                            "requires grad, whole, frozen parameters in it too)";
  Warning w = make_warning(
      "fp32_master_weights",
      names + "; " + std::to_string(numel) + " elements, " + format_bytes(bytes) + " in " + from + ", " +
          format_bytes(numel * 4) + " in float32) cast to float32 before sharding, " + where +
          "; sharded parameters, gradients and optimizer state are float32, the forward and the all-gathers " +
          compute);
  return w;
}

}  // namespace fsdp_plan
