// Builds ModuleTrees by path for tests: add("blocks.0", "Block") adds a child
// "0" under the existing module "blocks".
#pragma once

#include <map>
#include <string>
#include <vector>

#include "model/module_tree.h"
#include "plan/plan.h"
#include "planner/planner.h"
#include "policy/policy.h"

namespace fsdp_plan::test {

class TreeBuilder {
 public:
  explicit TreeBuilder(const std::string& root_class = "__torch__.Model") {
    tree.module(0).type_name = root_class;
    ids_[""] = 0;
  }

  // `cls` may be short ("Linear" -> torch.nn.modules.linear.Linear for the
  // torch.nn classes listed below) or a full TorchScript type name.
  TreeBuilder& add(const std::string& path, const std::string& cls) {
    auto dot = path.rfind('.');
    std::string parent = dot == std::string::npos ? "" : path.substr(0, dot);
    std::string name = dot == std::string::npos ? path : path.substr(dot + 1);
    ids_[path] = tree.add_module(ids_.at(parent), name, expand(cls));
    return *this;
  }

  // A new tensor, registered as parameter `name` of module `path`.
  TensorId param(const std::string& path, const std::string& name, std::vector<int64_t> shape,
                 const std::string& dtype = "float32", int64_t itemsize = 4) {
    TensorId t = tree.add_tensor({std::move(shape), dtype, itemsize});
    tree.add_param(ids_.at(path), name, t);
    return t;
  }
  TensorId buffer(const std::string& path, const std::string& name, std::vector<int64_t> shape) {
    TensorId t = tree.add_tensor({std::move(shape), "float32", 4});
    tree.add_buffer(ids_.at(path), name, t);
    return t;
  }
  // Registers an existing tensor again: tied weights.
  void tie(const std::string& path, const std::string& name, TensorId t) { tree.add_param(ids_.at(path), name, t); }

  ModuleId id(const std::string& path) const { return ids_.at(path); }

  // A Linear with weight [out, in] and bias [out].
  TreeBuilder& linear(const std::string& path, int64_t in, int64_t out, const std::string& cls = "Linear") {
    add(path, cls);
    param(path, "weight", {out, in});
    param(path, "bias", {out});
    return *this;
  }

  static std::string expand(const std::string& cls) {
    static const std::map<std::string, std::string> known = {
        {"Linear", "__torch__.torch.nn.modules.linear.Linear"},
        {"NonDynamicallyQuantizableLinear", "__torch__.torch.nn.modules.linear.NonDynamicallyQuantizableLinear"},
        {"Embedding", "__torch__.torch.nn.modules.sparse.Embedding"},
        {"BatchNorm2d", "__torch__.torch.nn.modules.batchnorm.BatchNorm2d"},
        {"BatchNorm1d", "__torch__.torch.nn.modules.batchnorm.___torch_mangle_4.BatchNorm1d"},
        {"LayerNorm", "__torch__.torch.nn.modules.normalization.LayerNorm"},
        {"Conv2d", "__torch__.torch.nn.modules.conv.Conv2d"},
        {"ReLU", "__torch__.torch.nn.modules.activation.ReLU"},
        {"MultiheadAttention", "__torch__.torch.nn.modules.activation.MultiheadAttention"},
        {"Sequential", "__torch__.torch.nn.modules.container.Sequential"},
        {"ModuleList", "__torch__.torch.nn.modules.container.ModuleList"},
        {"ModuleDict", "__torch__.torch.nn.modules.container.ModuleDict"},
    };
    auto it = known.find(cls);
    if (it != known.end()) return it->second;
    return cls.find('.') == std::string::npos ? "__torch__." + cls : cls;
  }

  ModuleTree tree;

 private:
  std::map<std::string, ModuleId> ids_;
};

inline Policy policy(const std::string& json) { return parse_policy(json, "policy.json"); }

// The builder must outlive the plan, which points into its tree.
inline Plan plan_of(const TreeBuilder& b, const std::string& json) { return make_plan(b.tree, policy(json), "m.pt"); }
Plan plan_of(TreeBuilder&& b, const std::string& json) = delete;

// Unit paths in order.
inline std::vector<std::string> unit_paths(const Plan& plan) {
  std::vector<std::string> out;
  for (const auto& u : plan.units) out.push_back(plan.tree->path(u.module));
  return out;
}
inline std::vector<std::string> param_names(const Plan& plan, size_t unit) {
  std::vector<std::string> out;
  for (const auto& o : plan.units.at(unit).params) out.push_back(plan.param_name(o));
  return out;
}
inline std::vector<std::string> buffer_names(const Plan& plan, size_t unit) {
  std::vector<std::string> out;
  for (const auto& o : plan.units.at(unit).buffers) out.push_back(plan.buffer_name(o));
  return out;
}
inline const Warning* find_warning(const Plan& plan, const std::string& kind) {
  for (const auto& w : plan.warnings)
    if (w.kind == kind) return &w;
  return nullptr;
}
inline size_t count_warnings(const Plan& plan, const std::string& kind) {
  size_t n = 0;
  for (const auto& w : plan.warnings) n += w.kind == kind;
  return n;
}

using Names = std::vector<std::string>;

// Net > blocks (ModuleList) > two Blocks, each with fc = Linear(4, 4), and head =
// Linear(1, 4): with module_classes ["Block"] the root owns 8, each block 20.
inline TreeBuilder two_blocks_and_a_head() {
  TreeBuilder b("__torch__.Net");
  b.add("blocks", "ModuleList");
  b.add("blocks.0", "Block");
  b.linear("blocks.0.fc", 4, 4);
  b.add("blocks.1", "Block");
  b.linear("blocks.1.fc", 4, 4);
  b.linear("head", 1, 4);
  return b;
}

// A parameter with requires_grad false.
inline TensorId frozen(TreeBuilder& b, const std::string& path, const std::string& name, std::vector<int64_t> shape,
                       const std::string& dtype = "float32", int64_t itemsize = 4) {
  TensorInfo t{std::move(shape), dtype, itemsize};
  t.requires_grad = false;
  TensorId id = b.tree.add_tensor(t);
  b.tree.add_param(b.id(path), name, id);
  return id;
}

// What peft's LoRA makes of a block: q = lora.Linear(base_layer frozen,
// lora_A.default and lora_B.default trainable), a frozen LayerNorm beside it.
inline TreeBuilder lora_blocks() {
  TreeBuilder b("__torch__.Net");
  b.add("embed", "Embedding");
  frozen(b, "embed", "weight", {100, 8});
  b.add("layers", "ModuleList");
  for (std::string i : {"0", "1"}) {
    std::string blk = "layers." + i;
    b.add(blk, "Block");
    b.add(blk + ".norm", "LayerNorm");
    frozen(b, blk + ".norm", "weight", {8});
    b.add(blk + ".q", "__torch__.peft.tuners.lora.layer.Linear");
    b.add(blk + ".q.base_layer", "Linear");
    frozen(b, blk + ".q.base_layer", "weight", {8, 8});
    b.add(blk + ".q.lora_A", "ModuleDict");
    b.add(blk + ".q.lora_A.default", "Linear");
    b.param(blk + ".q.lora_A.default", "weight", {2, 8});
    b.add(blk + ".q.lora_B", "ModuleDict");
    b.add(blk + ".q.lora_B.default", "Linear");
    b.param(blk + ".q.lora_B.default", "weight", {8, 2});
  }
  return b;
}

// Unit paths of a plan: safe on a temporary builder, since nothing outlives the call.
inline Names units_of(const TreeBuilder& b, const std::string& json) { return unit_paths(plan_of(b, json)); }

}  // namespace fsdp_plan::test
