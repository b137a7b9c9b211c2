// The planner's view of a model: a plain tree of modules with their
// parameters and buffers. Loaders build it; nothing past the loaders sees torch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fsdp_plan {

// Index into ModuleTree::tensors. Two slots holding the same TensorId hold
// the same tensor object (tied weights), exactly as Python's `is` would say.
using TensorId = int32_t;
using ModuleId = int32_t;
class Graph;  // graph.h

struct TensorInfo {
  std::vector<int64_t> shape;
  std::string dtype;     // torch name without the prefix: "float32", "bfloat16", "qint8"
  int64_t itemsize = 0;  // bytes per element
  // Parameters only; TorchScript keeps it. Frozen parameters get no gradient
  // or optimizer state, and FSDP1 refuses to flatten them with trainable ones.
  bool requires_grad = true;
  int64_t numel() const;
  int64_t bytes() const { return numel() * itemsize; }
};

struct TensorSlot {
  std::string name;  // attribute name on the owning module, e.g. "weight"
  TensorId tensor;
};

// Whether the file says what class a module is. A torch.export archive
// records the class only of modules whose forward ran during export
// (Recorded); fsdp-plan-export's record lists the rest (Listed).
enum class ClassSource : uint8_t {
  Recorded,
  Listed,      // the exporter's module_classes names it, but its forward never ran
  Inferred,    // guessed from the module's contents (a never-called ModuleList)
  Unrecorded,  // unknown; type_name is kUnrecordedClass
};
inline constexpr const char* kUnrecordedClass = "(unrecorded)";

struct Module {
  std::string name;        // attribute name in the parent; "" for the root
  std::string type_name;   // qualified class as stored, mangling and all
  ClassSource class_source = ClassSource::Recorded;
  ModuleId parent = -1;
  std::vector<ModuleId> children;   // registration order
  std::vector<TensorSlot> params;   // registration order; None-valued slots left out
  std::vector<TensorSlot> buffers;
};

// What a file says of the model beyond its modules and tensors, where the
// file records it: fsdp-plan-export's extra/fsdp_plan.json in a .pt2
// (docs/export-metadata.md), or the header of a live module's tree JSON
// (fsdp_plan.tree). TorchScript files and plain torch.export archives have none.
struct ModelRecord {
  std::string source;  // what recorded it, for messages: "the .pt2's extra/fsdp_plan.json"
  // model._no_split_modules, the classes Accelerate wraps for TRANSFORMER_BASED_WRAP
  // without a class list; nullopt: the model has none (None).
  std::optional<std::vector<std::string>> no_split_modules;
  std::string dtype;       // the parameters' dtype ("bfloat16"), "" if not recorded
  std::string root_class;  // module.qualname of the root, "" if not recorded
  std::string producer;    // "fsdp_plan 0.1.0, torch 2.13.0+cpu"
  // The config's base_model_tp_plan (module glob -> "colwise", ...), for tensor parallelism.
  std::vector<std::pair<std::string, std::string>> tp_plan;
  // fsdp-plan-export's "tp_model" (docs/export-metadata.md), for "plan": "model": the
  // prefix tp_plan's keys sit under, the head's own plan (the class's _tp_plan), and the
  // attention's head counts and size (0: not recorded).
  bool has_tp_model = false;
  std::string base_model_prefix;
  std::vector<std::pair<std::string, std::string>> head_tp_plan;
  int64_t num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  // fsdp-plan-export traced HF's attention as eager training runs it (is_causal, no
  // materialised mask, no repeat_kv): "eager", "export" (a plain export), "" (not HF / unknown).
  std::string hf_attention_trace;
  // Every module's class by path ("" the root), from named_modules(): the
  // exporter's module_classes; empty when not recorded.
  std::vector<std::pair<std::string, std::string>> module_classes;
};

// modules[0] is the root. Children always have larger ids than their parent,
// so a forward sweep visits parents first and a backward sweep children first.
class ModuleTree {
 public:
  ModuleTree();  // a tree holding only an unnamed root

  ModuleId add_module(ModuleId parent, std::string name, std::string type_name);
  TensorId add_tensor(TensorInfo info);
  void add_param(ModuleId m, std::string name, TensorId t);
  void add_buffer(ModuleId m, std::string name, TensorId t);

  const Module& module(ModuleId m) const { return modules_[static_cast<size_t>(m)]; }
  Module& module(ModuleId m) { return modules_[static_cast<size_t>(m)]; }
  const TensorInfo& tensor(TensorId t) const { return tensors_[static_cast<size_t>(t)]; }
  // A tensor cast to another dtype (param.data = param.data.to(dtype)): its sizes stay.
  void set_dtype(TensorId t, std::string dtype, int64_t itemsize) {
    tensors_[static_cast<size_t>(t)].dtype = std::move(dtype);
    tensors_[static_cast<size_t>(t)].itemsize = itemsize;
  }
  size_t num_modules() const { return modules_.size(); }
  size_t num_tensors() const { return tensors_.size(); }
  // Sizes kept when a tensor is added (tensors do not change after): planning
  // reads them for every parameter of every candidate suggest tries, and the
  // shape behind TensorInfo::numel() is a pointer away.
  int64_t numel(TensorId t) const { return sizes_[static_cast<size_t>(t)].numel; }
  // shape[0], or 1 for a 0-dim tensor: FSDP2 shards parameters on dim 0.
  int64_t dim0(TensorId t) const { return sizes_[static_cast<size_t>(t)].dim0; }
  int64_t bytes(TensorId t) const { return numel(t) * tensor(t).itemsize; }
  // Whether some module holds it as a parameter (add_param).
  bool is_param(TensorId t) const { return sizes_[static_cast<size_t>(t)].param; }
  const std::vector<Module>& modules() const { return modules_; }
  // Room for n tensors, when a loader knows how many may come: 150,000
  // TensorInfos grown by doubling hold up to twice their size, copied once more.
  void reserve_tensors(size_t n);

  // Dotted path from the root ("" for the root), built on demand: storing
  // paths would cost memory quadratic in depth on deep chains.
  std::string path(ModuleId m) const;
  // Every module's path, by id: built parent first, so the time is the paths'
  // total length (path() per module walks each chain again: quadratic in depth).
  std::vector<std::string> paths() const;
  // path(m) joined with a local name: "layers.0" + "weight" -> "layers.0.weight".
  std::string qualify(ModuleId m, const std::string& local) const;
  int depth(ModuleId m) const;
  // Whether `m` is `root` or lies inside it (walks m's parents).
  bool within(ModuleId m, ModuleId root) const {
    for (; m >= 0; m = modules_[static_cast<size_t>(m)].parent)
      if (m == root) return true;
    return false;
  }

  // The torch.export graph the tree was read with (a .pt2), whose nodes name
  // this tree's modules and tensors; nullptr for TorchScript, which records
  // no shapes. Shared: copies of the tree share one graph.
  const std::shared_ptr<const Graph>& graph() const { return graph_; }
  void set_graph(std::shared_ptr<const Graph> g) { graph_ = std::move(g); }

  // The file's record of the model, or nullptr.
  const ModelRecord* record() const { return record_ ? &*record_ : nullptr; }
  void set_record(ModelRecord r) { record_ = std::move(r); }
  // A class's bases as the file records them (Python's MRO after the class,
  // `object` left out; only a live module's tree records them), or nullptr.
  // Keyed by Module::type_name.
  const std::vector<std::string>* recorded_bases(const std::string& type_name) const;
  void set_bases(const std::string& type_name, std::vector<std::string> bases);
  bool has_recorded_bases() const { return !bases_.empty(); }
  // Both of the above, from another tree (a tree rebuilt from this one).
  void copy_class_info(const ModuleTree& from);

  // Modules in `root.modules()` order: pre-order, children in registration
  // order. Iterative, so a 100,000-deep chain is fine.
  std::vector<ModuleId> preorder(ModuleId from = 0) const;
  // Children before their parent, in order; `from` last.
  std::vector<ModuleId> postorder(ModuleId from = 0) const;

 private:
  std::vector<Module> modules_;
  std::vector<TensorInfo> tensors_;
  struct Sizes {
    int64_t numel, dim0;
    bool param;
  };
  std::vector<Sizes> sizes_;  // parallel to tensors_
  std::shared_ptr<const Graph> graph_;
  std::optional<ModelRecord> record_;
  std::unordered_map<std::string, std::vector<std::string>> bases_;  // recorded_bases()
};

// numel of the parameters in each module's subtree, each tensor counted once
// (tied weights once) and ignored parameters left out: `sum(p.numel() for p
// in module.parameters() if p not in ignored_params)`.
std::vector<int64_t> subtree_numel(const ModuleTree& tree, const std::vector<bool>& ignored_tensor);

}  // namespace fsdp_plan
