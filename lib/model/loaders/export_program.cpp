#include "model/loaders/export_program.h"

#include <future>
#include <system_error>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <nlohmann/json.hpp>
#include <simdjson.h>

#include "model/dtype.h"
#include "model/graph.h"
#include "model/graph_builder.h"
#include "model/loaders/export_configs.h"
#include "model/loaders/export_walk.h"
#include "util/errors.h"

namespace fsdp_plan {
namespace {

// models/model.json (9.4 MB for Llama-3-70B, most of it stack traces) is read
// in one pass by simdjson's On-Demand parser: what the tree and the graph
// need is taken as the walk meets it, everything else is skipped unparsed
// (its brackets and strings are still checked: a cut or unbalanced file is
// refused). The small weights and constants configs stay with nlohmann.
// std::map objects there: an ordered_json object checks every insertion
// against all its keys.
using Json = nlohmann::json;
namespace dom = simdjson::dom;

using pt2::Config;
using pt2::ConfigEntry;
using pt2::damaged_record;
using pt2::JsonFail;
using pt2::ProgramWalk;
using pt2::RawDim;
using pt2::RawMeta;
using pt2::RawSpec;
using pt2::RawProgram;
using pt2::read_export_config;

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

std::string dim_key(const RawDim& d) {
  switch (d.kind) {
    case RawDim::Int: return std::to_string(d.value);
    case RawDim::Expr: return "e:" + d.expr;
    case RawDim::Bad: return "?";
  }
  return "?";
}

// dtype, sizes, strides and offset: one tensor if the file and this agree.
std::string view_key(const RawMeta& m) {
  std::string out = std::to_string(m.dtype) + "|";
  for (const auto& d : m.sizes) out += dim_key(d) + ",";
  out += "|";
  if (m.strides_array)
    for (const auto& d : m.strides) out += dim_key(d) + ",";
  out += "|" + (m.has_offset ? dim_key(m.offset) : std::string());
  return out;
}

class ProgramReader {
 public:
  ProgramReader(const std::string& file, ExportRecords& rec)
      : file_(file),
        model_record_("models/" + rec.model_name + ".json"),
        weights_record_("data/weights/" + rec.model_name + "_weights_config.json"),
        constants_record_("data/constants/" + rec.model_name + "_constants_config.json"),
        rec_(rec),
        graph_(file, [this](const std::string& what) { return damaged_record(model_record_, what); }) {}

  ModuleTree build() {
    // The weights config needs nothing of the program: a second thread reads
    // it while this one walks models/model.json (its errors still come after
    // the program's, from get()). Without a thread to spare, it waits its turn.
    const auto weights_of = [this] { return read_export_config(rec_.weights, file_, weights_record_, true); };
    std::future<Config> weights_read;
    try {
      weights_read = std::async(std::launch::async, weights_of);
    } catch (const std::system_error&) {
      weights_read = std::async(std::launch::deferred, weights_of);
    }
    walk_model();
    check_version();
    if (!raw_.graph_module) damaged(model_record_, "no graph_module object");
    if (!raw_.graph) damaged(model_record_, "no graph object");
    build_modules();
    record_classes();
    const Config weights = weights_read.get();
    if (!weights.object) damaged(weights_record_, "no config object");
    Config constants;
    if (!rec_.constants.empty()) {
      constants = read_export_config(rec_.constants, file_, constants_record_, false);
      if (!constants.object) damaged(constants_record_, "no config object");
    }
    add_tensors(weights, rec_.constants.empty() ? nullptr : &constants);
    infer_missing_classes();
    tree_.set_graph(graph_.finish(
        [this](std::string_view path) {
          auto it = by_path_.find(std::string(path));
          return it == by_path_.end() ? kNone : it->second;
        },
        [this](std::string_view fqn, bool) {
          auto it = tensor_by_name_.find(std::string(fqn));
          return it == tensor_by_name_.end() ? kNone : it->second;
        }));
    return std::move(tree_);
  }

 private:
  [[noreturn]] void damaged(const std::string& record, const std::string& what) const {
    throw InputError(file_, damaged_record(record, what));
  }

  // One pass over models/model.json. Where simdjson refuses the text,
  // nlohmann's message says why, as it did when nlohmann read this record.
  void walk_model() {
    static_assert(kModelPadding >= simdjson::SIMDJSON_PADDING, "simdjson reads further past the end");
    const bool in_place = rec_.model_in_place.data() != nullptr;
    if (!in_place) {
      // simdjson reads up to SIMDJSON_PADDING bytes past the end: room for them, so the text is not copied.
      rec_.model.reserve(rec_.model.size() + simdjson::SIMDJSON_PADDING);
    }
    const std::string_view text = in_place ? rec_.model_in_place : std::string_view(rec_.model);
    // A top value other than an object has no schema_version; nlohmann says
    // whether it is JSON at all (200,000 nested arrays are).
    const size_t first = text.find_first_not_of(" \t\r\n");
    if (first == std::string::npos || text[first] != '{') {
      refuse_json(text, {simdjson::INCORRECT_TYPE, {}}, true);
      return;
    }
    dom::parser parser;
    try {
      dom::element doc;
      if (auto e = parser.parse(reinterpret_cast<const uint8_t*>(text.data()), text.size(), false).get(doc)) {
        throw JsonFail{e, {}};
      }
      // The first graph_module.graph.tensor_values is the one the walk meets
      // first (a key given twice is refused when the walk meets the second).
      std::future<ProgramWalk::TensorEntries> ahead;
      dom::element values;
      if (!doc["graph_module"]["graph"]["tensor_values"].get(values) && values.is_object()) {
        try {
          ahead = std::async(std::launch::async, [values] { return ProgramWalk::read_tensor_values(values); });
        } catch (const std::system_error&) {
          // no thread to spare: the walk reads them in turn
        }
      }
      ProgramWalk walk(raw_, graph_);
      walk.read_ahead(&ahead);
      walk.top(doc);
    } catch (const JsonFail& fail) {
      refuse_json(text, fail, false);
    }
    // The parser's strings go with it: keep what the tree reads later.
    // Runs of nodes share a stack (a few hundred bytes): the one before is
    // compared before the text is hashed.
    std::unordered_set<std::string_view> seen;
    std::string_view prev;
    for (const auto& s : raw_.node_stacks) {
      if (!s || (prev.data() && *s == prev)) continue;
      prev = *s;
      if (seen.insert(*s).second) stacks_.emplace_back(*s);
    }
    raw_.node_stacks.clear();
    for (const RawSpec& spec : raw_.input_specs) {
      for (const std::string* arg : {&spec.parameter_arg, &spec.buffer_arg}) {
        auto it = raw_.metas.find(*arg);
        if (it != raw_.metas.end()) metas_.emplace(*arg, it->second);
      }
    }
    raw_.metas.clear();
  }

  // Throws nlohmann's message for text it refuses; for text it reads, the
  // message of `fail` (simdjson refuses nesting deeper than 1024, and keys
  // given twice), or nothing when `accept` (the caller reports what is wrong).
  void refuse_json(std::string_view text, const JsonFail& fail, bool accept) const {
    std::string why = fail.what;
    try {
      const Json parsed = Json::parse(text.begin(), text.end());
      (void)parsed;
      if (accept) return;
    } catch (const Json::exception& e) {
      why = e.what();
      const auto tag = why.find("] ");
      if (why.rfind("[json.exception.", 0) == 0 && tag != std::string::npos) why = why.substr(tag + 2);
    }
    if (why.empty()) {
      why = fail.code == simdjson::DEPTH_ERROR
                ? "nested deeper than " + std::to_string(simdjson::DEFAULT_MAX_DEPTH) + " levels"
                : simdjson::error_message(fail.code);
    }
    damaged(model_record_, "invalid JSON: " + why);
  }

  // torch.export.load refuses another major schema version (0.0 means unversioned).
  void check_version() const {
    if (!raw_.schema || !raw_.major_ok || !raw_.minor_ok) damaged(model_record_, "no schema_version");
    if (raw_.major != kExportSchemaMajor && !(raw_.major == 0 && raw_.minor == 0)) {
      const auto& torch_version = raw_.torch_version;
      throw InputError(file_, "exported program schema version " + std::to_string(raw_.major) + "." +
                                  std::to_string(raw_.minor) +
                                  (torch_version ? " (torch " + *torch_version + ")" : std::string()) +
                                  ", but fsdp-plan reads version " + std::to_string(kExportSchemaMajor) +
                                  ".x, as torch 2.13 writes it; " + kSaveExportAgain + " under torch 2.13");
    }
  }

  // Paths in named_modules(remove_duplicate=False) order: torch.export records
  // the whole hierarchy in module_call_graph, called or not.
  void build_modules() {
    if (!raw_.calls || raw_.call_fqns.empty()) damaged(model_record_, "no module_call_graph");
    const auto& first = raw_.call_fqns.front();
    if (!first || !first->empty()) damaged(model_record_, "module_call_graph does not start with the root");
    by_path_.emplace("", 0);
    tree_.module(0).class_source = ClassSource::Unrecorded;
    for (const auto& entry : raw_.call_fqns) {
      if (!entry) damaged(model_record_, "a module_call_graph entry without fqn");
      const std::string& fqn = *entry;
      if (by_path_.count(fqn)) continue;
      const auto dot = fqn.rfind('.');
      const std::string parent = dot == std::string::npos ? "" : fqn.substr(0, dot);
      const std::string name = dot == std::string::npos ? fqn : fqn.substr(dot + 1);
      auto p = by_path_.find(parent);
      // Entries added for preserve_module_call_signature can name paths
      // outside the hierarchy; they are not modules of the tree.
      if (p == by_path_.end() || name.empty()) continue;
      const ModuleId id = tree_.add_module(p->second, name, "");
      tree_.module(id).class_source = ClassSource::Unrecorded;
      by_path_.emplace(fqn, id);
    }
  }

  // Each node's nn_module_stack names the modules whose forward it ran in,
  // with their classes.
  void record_classes() {
    if (!raw_.nodes) damaged(model_record_, "no graph nodes");
    std::unordered_set<std::string> seen;
    for (const std::string& stack : stacks_) {
      size_t start = 0;
      while (start <= stack.size()) {
        size_t end = stack.find(';', start);
        if (end == std::string::npos) end = stack.size();
        std::string item = stack.substr(start, end - start);
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
    bool on_meta = false;
  };

  Meta read_meta(const RawMeta& meta, const std::string& what, const std::string& record) {
    Meta out;
    if (!meta.has_dtype) damaged(record, what + " has no dtype");
    const int64_t code = meta.dtype;
    const DtypeInfo* dt = code > 0 && code <= 255 ? dtype_from_export_code(static_cast<int>(code)) : nullptr;
    if (!dt) damaged(record, what + " has unknown dtype code " + std::to_string(code));
    out.info.dtype = dt->name;
    out.info.itemsize = dt->itemsize;
    if (!meta.sizes_array) damaged(record, what + " has no sizes");
    int64_t bytes = dt->itemsize;
    for (const RawDim& s : meta.sizes) {
      if (s.kind == RawDim::Expr) {
        throw InputError(file_, what + " has a symbolic shape; parameters and buffers of an exported "
                                       "program have fixed shapes, so the file is damaged; " +
                                    std::string(kSaveExportAgain));
      }
      // The planner multiplies these out: refuse shapes no storage could have.
      int64_t d = s.value;
      if (s.kind != RawDim::Int || d < 0 || __builtin_mul_overflow(bytes, d, &bytes) || bytes > (int64_t{1} << 50)) {
        damaged(record, what + " has an impossible shape");
      }
      out.info.shape.push_back(d);
    }
    total_bytes_ += bytes;
    if (total_bytes_ > (int64_t{1} << 62)) damaged(record, "tensors add up to an impossible size");
    out.info.requires_grad = meta.requires_grad.value_or(true);
    out.on_meta = meta.device_type == "meta";
    return out;
  }

  // One tensor per (file, view): dtype, sizes, strides and offset (view_key,
  // made only here); tensors without a file are each their own.
  TensorId tensor_for(const std::string& file_key, Meta meta, const RawMeta& raw) {
    if (file_key.empty()) return tree_.add_tensor(std::move(meta.info));
    auto [it, fresh] = tensor_ids_.try_emplace(file_key + "|" + view_key(raw), 0);
    if (fresh) it->second = tree_.add_tensor(std::move(meta.info));
    return it->second;
  }

  void add_tensor(const std::string& fqn, bool is_param, const ConfigEntry* config_entry, const char* config_tag,
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
    const std::string* record = &config_record;
    const RawMeta* meta = nullptr;
    if (config_entry && config_entry->has_meta) {
      meta = &config_entry->meta;
    } else {
      auto it = raw_.tensor_values && !arg.empty() ? metas_.find(arg) : metas_.end();
      if (it == metas_.end()) damaged(config_record, what + " has no tensor metadata");
      meta = &it->second;
      record = &model_record_;
    }
    std::string file_key;
    if (config_entry) {
      if (!config_entry->path_name) damaged(config_record, what + " has no path_name");
      file_key = std::string(config_tag) + *config_entry->path_name;
    }
    Meta info = read_meta(*meta, what, *record);
    // Meta tensors have no storage: torch writes them all to one record, so
    // the record says nothing about ties (each is its own tensor here).
    if (info.on_meta) file_key.clear();
    const TensorId t = tensor_for(file_key, std::move(info), *meta);
    tensor_by_name_.emplace(fqn, t);
    if (is_param) {
      tree_.add_param(m->second, local, t);
    } else {
      tree_.add_buffer(m->second, local, t);
    }
  }

  // The graph signature lists parameters in named_parameters() order, then
  // buffers, each module's in registration order. Strict export leaves out
  // aliases and unused tensors; the weights config (the state_dict) has them.
  void add_tensors(const Config& wconfig, const Config* cconfig) {
    if (!raw_.specs) damaged(model_record_, "no graph signature input_specs");
    for (const RawSpec& spec : raw_.input_specs) {
      if (spec.parameter) {
        if (!spec.parameter_name) damaged(model_record_, "a parameter input without parameter_name");
        const std::string& fqn = *spec.parameter_name;
        add_tensor(fqn, true, wconfig.find(fqn), "w:", weights_record_, spec.parameter_arg);
      } else if (spec.buffer) {
        if (!spec.buffer_name) damaged(model_record_, "a buffer input without buffer_name");
        const std::string& fqn = *spec.buffer_name;
        const bool in_constants = spec.persistent && !*spec.persistent;
        if (in_constants) {
          add_tensor(fqn, false, cconfig ? cconfig->find(fqn) : nullptr, "c:", constants_record_, spec.buffer_arg);
        } else {
          add_tensor(fqn, false, wconfig.find(fqn), "w:", weights_record_, spec.buffer_arg);
        }
      }
    }
    for (const std::string& fqn : wconfig.order) {
      const ConfigEntry* entry = wconfig.find(fqn);
      if (!entry) continue;  // a key of another depth-2 object
      if (!entry->is_param) damaged(weights_record_, fqn + " has no is_param");
      add_tensor(fqn, *entry->is_param, entry, "w:", weights_record_, "");
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
  ExportRecords& rec_;
  RawProgram raw_;
  GraphBuilder graph_;
  std::vector<std::string> stacks_;  // the distinct nn_module_stack texts, in first-use order
  std::unordered_map<std::string, RawMeta> metas_;
  ModuleTree tree_;
  std::unordered_map<std::string, ModuleId> by_path_;
  std::unordered_set<std::string> seen_;
  std::unordered_map<std::string, TensorId> tensor_ids_, tensor_by_name_;
  int64_t total_bytes_ = 0;
};

}  // namespace

ModuleTree build_export_tree(const std::string& file, ExportRecords records) {
  return ProgramReader(file, records).build();
}

}  // namespace fsdp_plan
