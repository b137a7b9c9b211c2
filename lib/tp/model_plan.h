// "plan": "model": the tensor-parallel plan a Hugging Face model carries, as
// fsdp-plan-export records it in a .pt2 (docs/export-metadata.md: the config's
// base_model_tp_plan, and "tp_model": base_model_prefix, the head's _tp_plan,
// the head counts). transformers 5 joins the two the same way
// (modeling_utils.py: PreTrainedModel.post_init: base_model_tp_plan under
// base_model_prefix, then the class's _tp_plan).
#pragma once

#include <string>

#include "model/module_tree.h"
#include "policy/tensor_parallel.h"

namespace fsdp_plan {

// Fills tp.plan from the tree's record (tp.from_model set). Throws InputError
// naming `model_path` when the file records no plan, or a style fsdp-plan does
// not plan (packed_colwise, moe_tp_experts, ...).
void resolve_model_tp_plan(TensorParallel& tp, const ModuleTree& tree, const std::string& model_path);

}  // namespace fsdp_plan
