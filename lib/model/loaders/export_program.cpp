#include "model/loaders/export_program.h"

#include <limits>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/dtype.h"
#include "util/errors.h"

namespace fsdp_plan {
namespace {

// std::map objects: an ordered_json object checks every insertion against
// all its keys, quadratic in the thousands of tensor_values of a big model.
using Json = nlohmann::json;

const Json* member(const Json& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

// obj[key], or null when obj is not an object or lacks the key.
const Json& at(const Json& obj, const char* key) {
  static const Json kNull;
  const Json* v = member(obj, key);
  return v ? *v : kNull;
}

bool get_int(const Json* v, int64_t& out) {
  if (!v) return false;
  if (v->is_number_unsigned()) {
    const auto u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    out = static_cast<int64_t>(u);
    return true;
  }
  if (!v->is_number_integer()) return false;
  out = v->get<int64_t>();
  return true;
}

const std::string* get_string(const Json* v) { return v && v->is_string() ? v->get_ptr<const std::string*>() : nullptr; }

// nn_module_stack entries are "key,path,class"; torch splits them at commas
// outside brackets (a path may read "layers[0]").
std::vector<std::string> split_stack_entry(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  int depth = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '[' || c == '(') ++depth;
    else if (c == ']' || c == ')') --depth;
    else if (c == ',' && depth == 0) {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  }
  out.push_back(s.substr(start));
  return out;
}

class ProgramReader {
 public:
  ProgramReader(const std::string& file, const ExportRecords& rec)
      : file_(file),
        model_record_("models/" + rec.model_name + ".json"),
        weights_record_("data/weights/" + rec.model_name + "_weights_config.json"),
        constants_record_("data/constants/" + rec.model_name + "_constants_config.json"),
        rec_(rec) {}

  ModuleTree build() {
    const Json model = parse(rec_.model, model_record_);
    check_version(model);
    const Json* gm = member(model, "graph_module");
    if (!gm || !gm->is_object()) damaged(model_record_, "no graph_module object");
    graph_ = member(*gm, "graph");
    if (!graph_ || !graph_->is_object()) damaged(model_record_, "no graph object");
    tensor_values_ = member(*graph_, "tensor_values");
    build_modules(*gm);
    record_classes();
    std::vector<std::string> weight_order;
    const Json weights = parse(rec_.weights, weights_record_, &weight_order);
    const Json* wconfig = member(weights, "config");
    if (!wconfig || !wconfig->is_object()) damaged(weights_record_, "no config object");
    Json constants;
    const Json* cconfig = nullptr;
    if (!rec_.constants.empty()) {
      constants = parse(rec_.constants, constants_record_);
      cconfig = member(constants, "config");
      if (!cconfig || !cconfig->is_object()) damaged(constants_record_, "no config object");
    }
    add_tensors(*gm, *wconfig, weight_order, cconfig);
    infer_missing_classes();
    return std::move(tree_);
  }

 private:
  [[noreturn]] void damaged(const std::string& record, const std::string& what) const {
    throw InputError(file_, "record " + record + " is damaged (" + what + "); " + kSaveExportAgain);
  }

  // `config_keys`, if given, gets the keys of the "config" object (depth 2)
  // in file order, which the map forgets.
  Json parse(const std::string& text, const std::string& record,
             std::vector<std::string>* config_keys = nullptr) const {
    try {
      if (!config_keys) return Json::parse(text);
      return Json::parse(text, [config_keys](int depth, Json::parse_event_t event, Json& parsed) {
        if (event == Json::parse_event_t::key && depth == 2 && parsed.is_string()) {
          config_keys->push_back(parsed.get<std::string>());
        }
        return true;
      });
    } catch (const Json::exception& e) {
      std::string what = e.what();
      const auto tag = what.find("] ");
      if (what.rfind("[json.exception.", 0) == 0 && tag != std::string::npos) what = what.substr(tag + 2);
      damaged(record, "invalid JSON: " + what);
    }
  }

  // torch.export.load refuses another major schema version (0.0 means unversioned).
  void check_version(const Json& model) const {
    const Json* v = member(model, "schema_version");
    int64_t major = 0, minor = 0;
    if (!v || !get_int(member(*v, "major"), major) || !get_int(member(*v, "minor"), minor)) {
      damaged(model_record_, "no schema_version");
    }
    if (major != kExportSchemaMajor && !(major == 0 && minor == 0)) {
      const std::string* torch_version = get_string(member(model, "torch_version"));
      throw InputError(file_, "exported program schema version " + std::to_string(major) + "." +
                                  std::to_string(minor) +
                                  (torch_version ? " (torch " + *torch_version + ")" : std::string()) +
                                  ", but fsdp-plan reads version " +
                                  std::to_string(kExportSchemaMajor) +
                                  ".x, as torch 2.13 writes it; " + kSaveExportAgain + " under torch 2.13");
    }
  }

  // Paths in named_modules(remove_duplicate=False) order: torch.export records
  // the whole hierarchy in module_call_graph, called or not.
  void build_modules(const Json& gm) {
    const Json* calls = member(gm, "module_call_graph");
    if (!calls || !calls->is_array() || calls->empty()) damaged(model_record_, "no module_call_graph");
    const std::string* first = get_string(member(calls->front(), "fqn"));
    if (!first || !first->empty()) damaged(model_record_, "module_call_graph does not start with the root");
    by_path_.emplace("", 0);
    tree_.module(0).class_source = ClassSource::Unrecorded;
    for (const Json& entry : *calls) {
      const std::string* fqn = get_string(member(entry, "fqn"));
      if (!fqn) damaged(model_record_, "a module_call_graph entry without fqn");
      if (by_path_.count(*fqn)) continue;
      const auto dot = fqn->rfind('.');
      const std::string parent = dot == std::string::npos ? "" : fqn->substr(0, dot);
      const std::string name = dot == std::string::npos ? *fqn : fqn->substr(dot + 1);
      auto p = by_path_.find(parent);
      // Entries added for preserve_module_call_signature can name paths
      // outside the hierarchy; they are not modules of the tree.
      if (p == by_path_.end() || name.empty()) continue;
      const ModuleId id = tree_.add_module(p->second, name, "");
      tree_.module(id).class_source = ClassSource::Unrecorded;
      by_path_.emplace(*fqn, id);
    }
  }

  // Each node's nn_module_stack names the modules whose forward it ran in,
  // with their classes.
  void record_classes() {
    const Json* nodes = member(*graph_, "nodes");
    if (!nodes || !nodes->is_array()) damaged(model_record_, "no graph nodes");
    std::unordered_set<std::string> seen;
    for (const Json& node : *nodes) {
      const std::string* stack = get_string(member(at(node, "metadata"), "nn_module_stack"));
      if (!stack) continue;
      size_t start = 0;
      while (start <= stack->size()) {
        size_t end = stack->find(';', start);
        if (end == std::string::npos) end = stack->size();
        std::string item = stack->substr(start, end - start);
        start = end + 1;
        if (!seen.insert(item).second) continue;
        auto parts = split_stack_entry(item);
        if (parts.size() != 3 || parts[2].empty()) damaged(model_record_, "an nn_module_stack entry is not key,path,class");
        auto it = by_path_.find(parts[1]);
        if (it == by_path_.end()) continue;
        Module& m = tree_.module(it->second);
        if (m.class_source == ClassSource::Recorded) continue;
        m.type_name = parts[2];
        m.class_source = ClassSource::Recorded;
      }
    }
  }

  struct Meta {
    TensorInfo info;
    std::string view;  // dtype, sizes, strides and offset: one tensor if the file and view agree
    bool on_meta = false;
  };

  Meta read_meta(const Json& meta, const std::string& what, const std::string& record) {
    Meta out;
    int64_t code = 0;
    if (!get_int(member(meta, "dtype"), code)) damaged(record, what + " has no dtype");
    const DtypeInfo* dt = code > 0 && code <= 255 ? dtype_from_export_code(static_cast<int>(code)) : nullptr;
    if (!dt) damaged(record, what + " has unknown dtype code " + std::to_string(code));
    out.info.dtype = dt->name;
    out.info.itemsize = dt->itemsize;
    const Json* sizes = member(meta, "sizes");
    if (!sizes || !sizes->is_array()) damaged(record, what + " has no sizes");
    int64_t bytes = dt->itemsize;
    for (const Json& s : *sizes) {
      int64_t d = 0;
      if (member(s, "as_expr")) {
        throw InputError(file_, what + " has a symbolic shape; parameters and buffers of an exported "
                                       "program have fixed shapes, so the file is damaged; " +
                                    std::string(kSaveExportAgain));
      }
      // The planner multiplies these out: refuse shapes no storage could have.
      if (!get_int(member(s, "as_int"), d) || d < 0 || __builtin_mul_overflow(bytes, d, &bytes) ||
          bytes > (int64_t{1} << 50)) {
        damaged(record, what + " has an impossible shape");
      }
      out.info.shape.push_back(d);
    }
    total_bytes_ += bytes;
    if (total_bytes_ > (int64_t{1} << 62)) damaged(record, "tensors add up to an impossible size");
    const Json* rg = member(meta, "requires_grad");
    out.info.requires_grad = rg && rg->is_boolean() ? rg->get<bool>() : true;
    const std::string* device = get_string(member(at(meta, "device"), "type"));
    out.on_meta = device && *device == "meta";
    out.view = std::to_string(code) + "|" + sizes->dump();
    for (const char* k : {"strides", "storage_offset"}) {
      const Json* v = member(meta, k);
      out.view += std::string("|") + (v ? v->dump() : "");
    }
    return out;
  }

  // One tensor per (file, view); tensors without a file are each their own.
  TensorId tensor_for(const std::string& file_key, Meta meta) {
    if (file_key.empty()) return tree_.add_tensor(std::move(meta.info));
    auto [it, fresh] = tensor_ids_.try_emplace(file_key + "|" + meta.view, 0);
    if (fresh) it->second = tree_.add_tensor(std::move(meta.info));
    return it->second;
  }

  void add_tensor(const std::string& fqn, bool is_param, const Json* config_entry, const char* config_tag,
                  const std::string& config_record, const std::string& arg) {
    if (!seen_.insert(fqn).second) return;
    const auto dot = fqn.rfind('.');
    const std::string owner = dot == std::string::npos ? "" : fqn.substr(0, dot);
    const std::string local = dot == std::string::npos ? fqn : fqn.substr(dot + 1);
    auto m = by_path_.find(owner);
    if (m == by_path_.end() || local.empty()) {
      damaged(model_record_, (is_param ? "parameter " : "buffer ") + fqn +
                                 " belongs to no module of module_call_graph");
    }
    const std::string what = (is_param ? "parameter " : "buffer ") + fqn;
    const Json* meta = config_entry ? member(*config_entry, "tensor_meta") : nullptr;
    std::string record = config_record;
    if (!meta && tensor_values_ && !arg.empty()) {
      meta = member(*tensor_values_, arg.c_str());
      record = model_record_;
    }
    if (!meta) damaged(config_record, what + " has no tensor metadata");
    std::string file_key;
    if (config_entry) {
      const std::string* path_name = get_string(member(*config_entry, "path_name"));
      if (!path_name) damaged(config_record, what + " has no path_name");
      file_key = std::string(config_tag) + *path_name;
    }
    Meta info = read_meta(*meta, what, record);
    // Meta tensors have no storage: torch writes them all to one record, so
    // the record says nothing about ties (each is its own tensor here).
    if (info.on_meta) file_key.clear();
    const TensorId t = tensor_for(file_key, std::move(info));
    if (is_param) {
      tree_.add_param(m->second, local, t);
    } else {
      tree_.add_buffer(m->second, local, t);
    }
  }

  // The graph signature lists parameters in named_parameters() order, then
  // buffers, each module's in registration order. Strict export leaves out
  // aliases and unused tensors; the weights config (the state_dict) has them.
  void add_tensors(const Json& gm, const Json& wconfig, const std::vector<std::string>& weight_order,
                   const Json* cconfig) {
    const Json* specs = member(at(gm, "signature"), "input_specs");
    if (!specs || !specs->is_array()) damaged(model_record_, "no graph signature input_specs");
    auto arg_name = [](const Json& spec) {
      const std::string* s = get_string(member(at(spec, "arg"), "name"));
      return s ? *s : std::string();
    };
    for (const Json& spec : *specs) {
      if (const Json* p = member(spec, "parameter")) {
        const std::string* fqn = get_string(member(*p, "parameter_name"));
        if (!fqn) damaged(model_record_, "a parameter input without parameter_name");
        add_tensor(*fqn, true, member(wconfig, fqn->c_str()), "w:", weights_record_, arg_name(*p));
      } else if (const Json* b = member(spec, "buffer")) {
        const std::string* fqn = get_string(member(*b, "buffer_name"));
        if (!fqn) damaged(model_record_, "a buffer input without buffer_name");
        const Json* persistent = member(*b, "persistent");
        const bool in_constants = persistent && persistent->is_boolean() && !persistent->get<bool>();
        if (in_constants) {
          add_tensor(*fqn, false, cconfig ? member(*cconfig, fqn->c_str()) : nullptr, "c:",
                     constants_record_, arg_name(*b));
        } else {
          add_tensor(*fqn, false, member(wconfig, fqn->c_str()), "w:", weights_record_, arg_name(*b));
        }
      }
    }
    for (const std::string& fqn : weight_order) {
      const Json* entry = member(wconfig, fqn.c_str());
      if (!entry) continue;  // a key of another depth-2 object
      const Json* is_param = member(*entry, "is_param");
      if (!is_param || !is_param->is_boolean()) damaged(weights_record_, fqn + " has no is_param");
      add_tensor(fqn, is_param->get<bool>(), entry, "w:", weights_record_, "");
    }
  }

  // A module whose forward never ran has no recorded class. Two kinds are
  // told by their contents: containers that cannot be called at all (a
  // ModuleList holds only children named 0..n-1, a ModuleDict only other
  // children), and children torch.nn always makes of one class but never
  // calls (MultiheadAttention reads out_proj's weight directly).
  void infer_missing_classes() {
    for (ModuleId id = 0; id < static_cast<ModuleId>(tree_.num_modules()); ++id) {
      Module& m = tree_.module(id);
      if (m.class_source != ClassSource::Unrecorded) continue;
      const std::string inferred = infer_class(id);
      m.type_name = inferred.empty() ? kUnrecordedClass : inferred;
      m.class_source = inferred.empty() ? ClassSource::Unrecorded : ClassSource::Inferred;
    }
  }

  std::string infer_class(ModuleId id) const {
    const Module& m = tree_.module(id);
    if (m.parent >= 0 && m.name == "out_proj" &&
        tree_.module(m.parent).type_name == "torch.nn.modules.activation.MultiheadAttention") {
      return "torch.nn.modules.linear.NonDynamicallyQuantizableLinear";
    }
    if (m.children.empty() || !m.params.empty() || !m.buffers.empty()) return "";
    bool list = true;
    for (size_t i = 0; list && i < m.children.size(); ++i) {
      list = tree_.module(m.children[i]).name == std::to_string(i);
    }
    return list ? "torch.nn.modules.container.ModuleList" : "torch.nn.modules.container.ModuleDict";
  }

  const std::string& file_;
  const std::string model_record_, weights_record_, constants_record_;
  const ExportRecords& rec_;
  const Json* graph_ = nullptr;
  const Json* tensor_values_ = nullptr;
  ModuleTree tree_;
  std::unordered_map<std::string, ModuleId> by_path_;
  std::unordered_set<std::string> seen_;
  std::unordered_map<std::string, TensorId> tensor_ids_;
  int64_t total_bytes_ = 0;
};

}  // namespace

ModuleTree build_export_tree(const std::string& file, const ExportRecords& records) {
  return ProgramReader(file, records).build();
}

}  // namespace fsdp_plan
