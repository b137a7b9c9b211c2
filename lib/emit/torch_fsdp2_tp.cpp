// --emit torch for a 2-D plan (FSDP2 with tensor parallelism): a Python module
// whose apply_fsdp(model) does what torchtitan's parallelize_llama does
// (torchtitan/models/llama3/infra/parallelize.py: apply_tp, then apply_fsdp):
// init_device_mesh with the plan's (dp_replicate,) dp_shard and tp dimensions,
// parallelize_module on mesh["tp"] with the policy's plan, in the order
// written, then the plan's fully_shard calls bottom-up on the dp sub-mesh,
// the root last. It checks the modules fully_shard was applied to, as the 1-D
// form does. A file of its own: the 1-D writer (torch_fsdp2.cpp) keeps its
// output byte for byte, and the two change for different reasons.
#include <algorithm>
#include <set>
#include <sstream>

#include "emit/emit.h"
#include "emit/emit_text.h"
#include "policy/ignored.h"
#include "tp/placements.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

// "from M import a, b" as isort (ruff's I001) writes it: one line if it fits in
// 88 columns, else one name a line.
std::string py_import(const std::string& module, std::vector<std::string> names) {
  std::sort(names.begin(), names.end(), [](const std::string& a, const std::string& b) {
    // isort's force_sort_within_sections off, case-sensitive: CONSTANTS, Classes, functions.
    auto rank = [](const std::string& s) {
      bool upper = std::all_of(s.begin(), s.end(), [](char c) { return !std::islower(static_cast<unsigned char>(c)); });
      return upper ? 0 : std::isupper(static_cast<unsigned char>(s[0])) ? 1 : 2;
    };
    return rank(a) != rank(b) ? rank(a) < rank(b) : a < b;
  });
  std::string line = "from " + module + " import " + join(names) + "\n";
  if (line.size() <= 89) return line;
  std::string out = "from " + module + " import (\n";
  for (const auto& n : names) out += "    " + n + ",\n";
  return out + ")\n";
}

// What the 2-D module imports and writes, worked out once from the plan.
class Fsdp2TpWriter {
 public:
  explicit Fsdp2TpWriter(const Plan& plan)
      : plan_(plan), p_(plan.policy), tree_(*plan.tree), tp_(*p_.tensor_parallel), m_(plan.mesh),
        s_(plan.memory.settings), hsdp_(m_.named(MeshDim::DpReplicate)), hf_(tp_.from_model) {}

  // checkpoint_wrapper before parallelize_module would move the module paths TP_PLAN names
  // (under _checkpoint_wrapped_module); torchtitan applies it between TP and FSDP. Not written yet.
  void refuse_checkpointing() const {
    if (!checkpointed_paths(plan_).empty())
      throw EmitError("the code for a 2-D plan with activation checkpointing is not written yet: plan it without "
                      "\"activation_checkpointing\" to emit, and wrap the blocks with checkpoint_wrapper between "
                      "parallelize_module and fully_shard, as torchtitan's parallelize_llama does");
  }

  // The style classes and placements the plan uses. Styles torch itself does
  // not have: refuse rather than write code that does something else.
  void find_styles() {
    for (const auto& [pattern, spec] : tp_.plan) {
      switch (spec.style) {
        case TpStyle::Replicate:
          throw EmitError("the tensor_parallel plan key '" + pattern + "' is planned \"replicate\", transformers' "
                          "ReplicateParallel, which torch's parallelize_module has no style for (and transformers "
                          "5.24 no longer exports); plan the module's parameters sequence_parallel, or leave the "
                          "key out (its parameters then stay plain tensors on the dp_shard mesh)");
        default: break;
      }
      const std::string py = tp_style_python(spec);
      style_classes_.insert(py.substr(0, py.find('(')));
      std::vector<std::optional<std::string>> used{spec.input_layouts, spec.output_layouts};
      used.insert(used.end(), spec.prepare_layouts.begin(), spec.prepare_layouts.end());
      used.insert(used.end(), spec.prepare_desired.begin(), spec.prepare_desired.end());
      for (const auto& l : used)
        if (l) (*l == "replicate" ? replicate_layout_ : shard_layout_) = true;
    }
  }

  // FSDP2's MixedPrecisionPolicy from the plan's mixed_precision.
  void find_mp_policy() {
    if (!p_.mixed_precision) return;
    const MixedPrecision& x = *p_.mixed_precision;
    mp_ = "MixedPrecisionPolicy(param_dtype=" + py_dtype(x.param_dtype) + ", reduce_dtype=" + py_dtype(x.reduce_dtype);
    if (x.output_dtype) mp_ += ", output_dtype=" + py_dtype(x.output_dtype);
    if (!x.casts_forward_inputs(FsdpVersion::V2)) mp_ += ", cast_forward_inputs=False";
    mp_ += ")";
  }

  // The module's docstring comment and its imports.
  void write_header(std::ostringstream& o) const {
    std::vector<std::string> fsdp_names{"FSDPModule", "MixedPrecisionPolicy", "fully_shard"};
    if (s_.cpu_offload) fsdp_names.push_back("CPUOffloadPolicy");
    std::vector<std::string> layout_names;
    if (replicate_layout_) layout_names.push_back("Replicate");
    if (shard_layout_) layout_names.push_back("Shard");
    std::vector<std::string> tp_names(style_classes_.begin(), style_classes_.end());
    tp_names.push_back("parallelize_module");
    // The model's own plan: transformers applies it (policy/tensor_parallel.h: from_model).
    if (hf_) layout_names.clear();
    o << "# Generated by fsdp-plan from " << plan_.model.path << ": a 2-D plan, tensor parallelism on a\n"
      << "# " << m_.text() << " device mesh, then the plan's " << plan_.units.size()
      << " FSDP2 groups on its " << (hsdp_ ? "(dp_replicate, dp_shard)" : "dp_shard") << " dimension"
      << (hsdp_ ? "s" : "") << "\n"
      << "# (torch 2.7 or later). Call after torch.distributed.init_process_group:\n"
         "#     model = apply_fsdp(model, device_type=\"cuda\")\n"
      << (hf_ ? "# Tensor parallelism on mesh[\"tp\"] first (transformers' apply_tensor_parallelism), then fully_shard\n"
              : "# As torchtitan's parallelize_llama: parallelize_module on mesh[\"tp\"] first, then fully_shard\n")
      << "# bottom-up in the plan's order, the root last. Extra keyword arguments go to every\n"
         "# fully_shard call; apply_fsdp raises if the modules fully_shard was applied to are not\n"
         "# the plan's (a different model, say).\n"
      << (mp_.find("torch.") != std::string::npos ? "import torch\n" : "")
      << "from torch.distributed.device_mesh import init_device_mesh\n"
      << py_import("torch.distributed.fsdp", fsdp_names)
      << (layout_names.empty() ? "" : py_import("torch.distributed.tensor", layout_names))
      << (hf_ ? "from transformers.distributed.tensor_parallel import apply_tensor_parallelism\n"
              : py_import("torch.distributed.tensor.parallel", tp_names))
      << "\n";
  }

  // The device mesh's shape and names, and the tensor-parallel plan.
  void write_mesh_and_tp_plan(std::ostringstream& o) const {
    std::vector<std::string> shape, names;  // init_device_mesh's mesh_shape and mesh_dim_names
    for (MeshDim d : m_.dim_names()) {
      shape.push_back(std::to_string(m_.size(d)));
      names.push_back(std::string("\"") + mesh_dim_name(d) + "\"");
    }
    const std::string mesh_shape = "(" + join(shape, ", ") + ")";
    const std::string dim_names = "(" + join(names, ", ") + ")";
    o << "# The device mesh: (" << (hsdp_ ? "dp_replicate, " : "") << "dp_shard, tp).\n"
      << "MESH_SHAPE = " << mesh_shape << "\n"
      << "MESH_DIM_NAMES = " << dim_names << "\n";
    if (hf_) {
      o << "# The model's own tensor-parallel plan (model.tp_plan), applied as transformers applies it in\n"
           "# from_pretrained(distributed_config=...): expanded to the model's modules and parameters,\n"
           "# then apply_tensor_parallelism on mesh[\"tp\"]. Its keys, as planned:\n"
           "TP_PLAN_KEYS = [\n";
      for (const auto& entry : tp_.plan) o << "    " << py_string(entry.first) << ",\n";
      o << "]\n";
    } else {
      o << "# parallelize_module's plan, applied in this order (module-path patterns, fnmatch per token).\n"
           "TP_PLAN = {\n";
      for (const auto& [pattern, spec] : tp_.plan) o << "    " << py_string(pattern) << ": " << tp_style_python(spec) << ",\n";
      o << "}\n";
    }
  }

  // The fully_shard calls in call order, and the ignored parameters.
  void write_calls(std::ostringstream& o) const {
    const std::vector<std::string> ignored = ignored_param_names(tree_, resolve_ignored(tree_, p_));
    o << fully_shard_calls_text(plan_) << "IGNORED_PARAMS = " << py_list(ignored, "") << "\n\n\n";
  }

  // built_groups and apply_fsdp: the mesh checked, tensor parallelism applied, then fully_shard.
  void write_apply_fsdp(std::ostringstream& o) const {
    o << "def built_groups(model):\n"
         "    \"\"\"Module paths of the modules fully_shard was applied to.\"\"\"\n"
         "    return sorted(name for name, m in model.named_modules() if isinstance(m, FSDPModule))\n\n\n"
      << "def apply_fsdp(model, device_type=\"cuda\", mesh=None, **fully_shard_kwargs):\n"
         "    if mesh is None:\n"
         "        mesh = init_device_mesh(device_type, MESH_SHAPE, mesh_dim_names=MESH_DIM_NAMES)\n"
         "    if tuple(mesh.shape) != MESH_SHAPE or tuple(mesh.mesh_dim_names or ()) != MESH_DIM_NAMES:\n"
         "        raise RuntimeError(\n"
         "            f\"the plan is for a mesh {MESH_DIM_NAMES} of shape {MESH_SHAPE}, \"\n"
         "            f\"not {mesh.mesh_dim_names} of shape {tuple(mesh.shape)}\"\n"
         "        )\n"
      << (hf_ ? "    if sorted(model.tp_plan) != sorted(TP_PLAN_KEYS):\n"
                "        raise RuntimeError(f\"the model's tp_plan {sorted(model.tp_plan)} is not the plan's {TP_PLAN_KEYS}\")\n"
                "    apply_tensor_parallelism(model, mesh[\"tp\"], model._expand_parallel_plan(model.tp_plan))\n"
              : "    parallelize_module(model, mesh[\"tp\"], TP_PLAN)\n")
      << "    kwargs = {\"mesh\": mesh[" << (hsdp_ ? "(\"dp_replicate\", \"dp_shard\")" : "\"dp_shard\"")
      << "], \"mp_policy\": " << mp_ << "}\n";
    if (p_.mixed_precision && p_.mixed_precision->buffer_dtype)
      o << "    # FSDP2 casts no buffers: the plan's buffer_dtype (" << *p_.mixed_precision->buffer_dtype
        << ") has no equivalent.\n";
    if (s_.cpu_offload) o << "    kwargs[\"offload_policy\"] = CPUOffloadPolicy()\n";
    o << "    if IGNORED_PARAMS:\n"
         "        kwargs[\"ignored_params\"] = {model.get_parameter(name) for name in IGNORED_PARAMS}\n"
         "    for paths, reshard_after_forward in CALLS:\n"
         "        modules = [model.get_submodule(path) for path in paths]\n"
      << kFullyShardCallsAndCheck;
  }

 private:
  const Plan& plan_;
  const Policy& p_;
  const ModuleTree& tree_;
  const TensorParallel& tp_;
  const DeviceMesh& m_;  // the plan's (dp_replicate,) dp_shard, tp mesh
  const FsdpSettings& s_;
  const bool hsdp_;
  const bool hf_;  // the model's own plan, which transformers applies
  std::set<std::string> style_classes_;
  bool replicate_layout_ = false, shard_layout_ = false;
  std::string mp_ = "MixedPrecisionPolicy()";
};

}  // namespace

std::string plan_to_torch_fsdp2_tp(const Plan& plan) {
  Fsdp2TpWriter w(plan);
  w.refuse_checkpointing();
  w.find_styles();
  w.find_mp_policy();
  std::ostringstream o;
  w.write_header(o);
  w.write_mesh_and_tp_plan(o);
  w.write_calls(o);
  w.write_apply_fsdp(o);
  return o.str();
}

}  // namespace fsdp_plan
