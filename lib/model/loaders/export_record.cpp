#include "model/loaders/export_record.h"

#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/loaders/printable.h"
#include "util/errors.h"

namespace fsdp_plan {
namespace {

// Bounds on what one record may hold: far past any model (Llama's
// no_split_modules is one name, a tensor-parallel plan a few dozen globs).
constexpr size_t kMaxNames = 100000;
constexpr size_t kMaxName = 4096;

class Reader {
 public:
  explicit Reader(const std::string& file) : file_(file) {}

  [[noreturn]] void damaged(const std::string& why) const {
    throw InputError(file_, std::string("record ") + kExportRecordName + " is damaged (" + why +
                                "); export the model again with fsdp-plan-export");
  }

  ModelRecord read(const std::string& text) {
    nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) damaged("invalid JSON");
    if (!doc.is_object()) damaged("not a JSON object");
    auto format = doc.find("format");
    if (format == doc.end() || !format->is_string() || *format != "fsdp-plan-export")
      damaged("its \"format\" is not \"fsdp-plan-export\"");
    auto version = doc.find("format_version");
    if (version == doc.end() || !version->is_number_integer()) damaged("no integer \"format_version\"");
    if (*version != kExportRecordFormat) {
      throw InputError(file_, std::string("record ") + kExportRecordName + " has format_version " +
                                  printable(version->dump()) + ", but this fsdp-plan reads version " +
                                  std::to_string(kExportRecordFormat) +
                                  ": use the fsdp-plan of the fsdp-plan-export that wrote it");
    }
    ModelRecord r;
    r.source = std::string("the .pt2's ") + kExportRecordName;
    if (auto it = doc.find("no_split_modules"); it != doc.end() && !it->is_null())
      r.no_split_modules = names(*it, "no_split_modules");
    else if (it == doc.end())
      damaged("no \"no_split_modules\"");
    r.dtype = optional_string(doc, "dtype");
    r.root_class = optional_string(doc, "root_class");
    if (auto it = doc.find("exporter"); it != doc.end() && !it->is_null()) {
      if (!it->is_object()) damaged("\"exporter\" is not an object");
      for (auto& [k, v] : it->items()) {
        if (!v.is_string()) damaged("\"exporter\"." + printable(k) + " is not a string");
        r.producer += (r.producer.empty() ? "" : ", ") + printable(k) + " " + printable(v.get<std::string>());
      }
    }
    if (auto it = doc.find("base_model_tp_plan"); it != doc.end() && !it->is_null()) {
      if (!it->is_object() || it->size() > kMaxNames) damaged("\"base_model_tp_plan\" is not an object of strings");
      for (auto& [k, v] : it->items()) {
        if (!v.is_string() || k.size() > kMaxName) damaged("\"base_model_tp_plan\" is not an object of strings");
        r.tp_plan.emplace_back(k, v.get<std::string>());
      }
    }
    if (auto it = doc.find("tp_model"); it != doc.end() && !it->is_null()) {
      if (!it->is_object()) damaged("\"tp_model\" is not an object");
      r.has_tp_model = true;
      r.base_model_prefix = optional_string(*it, "base_model_prefix");
      if (auto h = it->find("head_tp_plan"); h != it->end() && !h->is_null()) {
        if (!h->is_object() || h->size() > kMaxNames) damaged("\"tp_model.head_tp_plan\" is not an object of strings");
        for (auto& [k, v] : h->items()) {
          if (!v.is_string() || k.size() > kMaxName) damaged("\"tp_model.head_tp_plan\" is not an object of strings");
          r.head_tp_plan.emplace_back(k, v.get<std::string>());
        }
      }
      for (auto [key, field] : {std::pair{"num_attention_heads", &ModelRecord::num_attention_heads},
                                std::pair{"num_key_value_heads", &ModelRecord::num_key_value_heads},
                                std::pair{"head_dim", &ModelRecord::head_dim}}) {
        auto f = it->find(key);
        if (f == it->end() || f->is_null()) continue;
        if (!f->is_number_integer() || f->get<int64_t>() < 1 || f->get<int64_t>() > (int64_t{1} << 40))
          damaged(std::string("\"tp_model.") + key + "\" is not a positive integer");
        r.*field = f->get<int64_t>();
      }
    }
    r.hf_attention_trace = optional_string(doc, "hf_attention");
    if (auto it = doc.find("module_classes"); it != doc.end() && !it->is_null()) {
      // One per module: no count bound past the record's size (kMaxExportRecord).
      if (!it->is_object()) damaged("\"module_classes\" is not an object of class names");
      for (auto& [k, v] : it->items()) {
        const bool name = v.is_string() && !v.get_ref<const std::string&>().empty() &&
                          v.get_ref<const std::string&>().size() <= kMaxName;
        if (!name) damaged("\"module_classes\" is not an object of class names");
        r.module_classes.emplace_back(k, v.get<std::string>());
      }
    }
    return r;
  }

 private:
  std::vector<std::string> names(const nlohmann::json& v, const std::string& key) const {
    if (!v.is_array() || v.size() > kMaxNames) damaged("\"" + key + "\" is not a list of class names");
    std::vector<std::string> out;
    for (const auto& n : v) {
      if (!n.is_string() || n.get_ref<const std::string&>().empty() || n.get_ref<const std::string&>().size() > kMaxName)
        damaged("\"" + key + "\" is not a list of class names");
      out.push_back(n.get<std::string>());
    }
    return out;
  }

  std::string optional_string(const nlohmann::json& doc, const std::string& key) const {
    auto it = doc.find(key);
    if (it == doc.end() || it->is_null()) return "";
    if (!it->is_string()) damaged("\"" + key + "\" is not a string");
    return it->get<std::string>();
  }

  const std::string& file_;
};

}  // namespace

ModelRecord parse_export_record(const std::string& text, const std::string& file) {
  return Reader(file).read(text);
}

void adopt_listed_classes(ModuleTree& tree) {
  const ModelRecord* record = tree.record();
  if (!record || record->module_classes.empty()) return;
  std::unordered_map<std::string_view, const std::string*> listed;
  for (const auto& [path, cls] : record->module_classes) listed.emplace(path, &cls);
  const std::vector<std::string> paths = tree.paths();
  for (ModuleId m = 0; m < static_cast<ModuleId>(tree.num_modules()); ++m) {
    Module& mod = tree.module(m);
    if (mod.class_source == ClassSource::Recorded) continue;
    auto it = listed.find(paths[static_cast<size_t>(m)]);
    if (it == listed.end()) continue;
    mod.type_name = *it->second;
    mod.class_source = ClassSource::Listed;
  }
}

}  // namespace fsdp_plan
