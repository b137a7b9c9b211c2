#include "model/loaders/tree_loader.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <sys/stat.h>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "model/dtype.h"
#include "model/loaders/printable.h"
#include "util/errors.h"
#include "util/file_io.h"
#include "util/json_input.h"

namespace fsdp_plan {
namespace {

using Json = nlohmann::json;

constexpr size_t kMaxName = 4096;     // a module or tensor name, a class name
constexpr size_t kMaxBases = 1000;    // a class's MRO
constexpr size_t kMaxDims = 64;       // torch's own limit on a tensor's dimensions
constexpr int64_t kMaxBytes = int64_t{1} << 50;  // as the .pt2 reader: no storage is bigger

const char kAgain[] = "write it again with fsdp_plan.tree.module_tree(module)";

class Reader {
 public:
  explicit Reader(const std::string& file) : file_(file) {}

  ModuleTree read(const std::string& text) {
    Json doc = parse_json(text, file_);
    if (!doc.is_object()) fail("not a JSON object");
    auto format = doc.find("tree_format");
    if (format == doc.end()) not_a_tree(doc);
    if (!format->is_number_integer() || *format != kTreeFormat) {
      throw InputError(file_, "module tree JSON of tree_format " + printable(format->dump()) +
                                  ", but this fsdp-plan reads tree_format " + std::to_string(kTreeFormat) +
                                  ": use the fsdp-plan of the fsdp_plan package that wrote it");
    }
    auto modules = doc.find("modules");
    if (modules == doc.end() || !modules->is_array() || modules->empty()) damaged("no \"modules\" list");
    auto count = doc.find("num_tensors");
    int64_t num_tensors = 0;
    if (count == doc.end() || !count->is_number_integer() || (num_tensors = count->get<int64_t>()) < 0 ||
        static_cast<uint64_t>(num_tensors) > text.size())
      damaged("no \"num_tensors\" (a whole number of tensors)");
    // Every tensor is in a slot: more tensors than slots is damage, and the
    // tables below are then no larger than the slots already read (issue 39:
    // num_tensors from a 15 MB file allocated 1.08 GB up front).
    if (const size_t slots = count_slots(*modules); static_cast<uint64_t>(num_tensors) > slots)
      damaged("num_tensors is " + std::to_string(num_tensors) + ", but the modules hold " + std::to_string(slots) +
              " parameter and buffer slots");
    infos_.resize(static_cast<size_t>(num_tensors));
    seen_.assign(static_cast<size_t>(num_tensors), false);

    ModuleTree tree;
    std::unordered_map<std::string, ModuleId> by_path;
    std::vector<Pending> pending;  // slots, placed once every tensor is known
    for (size_t i = 0; i < modules->size(); ++i) {
      const Json& m = (*modules)[i];
      where_ = "modules[" + std::to_string(i) + "]";
      if (!m.is_object()) damaged("not an object");
      const std::string path = string(m, "path", true);
      where_ += path.empty() ? " (the root)" : " \"" + printable(path) + "\"";
      const std::string type = string(m, "type", false);
      ModuleId id = 0;
      if (i == 0) {
        if (!path.empty()) damaged("the first module must be the root, with path \"\"");
        tree.module(0).type_name = type;
      } else {
        if (path.empty()) damaged("a second root (path \"\")");
        if (by_path.count(path)) damaged("listed twice");
        const size_t dot = path.rfind('.');
        const std::string parent = dot == std::string::npos ? "" : path.substr(0, dot);
        const std::string name = dot == std::string::npos ? path : path.substr(dot + 1);
        if (name.empty()) damaged("an empty name in its path");
        auto p = parent.empty() ? by_path.end() : by_path.find(parent);
        if (!parent.empty() && p == by_path.end())
          damaged("its parent \"" + printable(parent) + "\" is not listed before it");
        id = tree.add_module(parent.empty() ? 0 : p->second, name, type);
      }
      by_path.emplace(path, id);
      if (auto b = m.find("bases"); b != m.end() && !b->is_null()) {
        if (!b->is_array() || b->size() > kMaxBases) damaged("\"bases\" is not a list of class names");
        std::vector<std::string> bases;
        for (const Json& c : *b) {
          if (!c.is_string() || c.get_ref<const std::string&>().empty() ||
              c.get_ref<const std::string&>().size() > kMaxName)
            damaged("\"bases\" is not a list of class names");
          bases.push_back(c.get<std::string>());
        }
        const std::vector<std::string>* known = tree.recorded_bases(type);
        if (known && *known != bases) damaged("class " + printable(type) + " with other bases than before");
        if (!known) tree.set_bases(type, std::move(bases));
      }
      for (const char* kind : {"params", "buffers"}) {
        auto list = m.find(kind);
        if (list == m.end() || !list->is_array()) damaged(std::string("no \"") + kind + "\" list");
        for (size_t j = 0; j < list->size(); ++j)
          pending.push_back({id, kind[0] == 'p', slot((*list)[j], std::string(kind) + "[" + std::to_string(j) + "]")});
      }
    }
    where_.clear();
    for (size_t t = 0; t < seen_.size(); ++t)
      if (!seen_[t]) damaged("num_tensors is " + std::to_string(num_tensors) + ", but no slot holds tensor " +
                             std::to_string(t));
    tree.reserve_tensors(infos_.size());
    for (auto& info : infos_) tree.add_tensor(std::move(info));
    for (auto& p : pending) {
      if (p.param)
        tree.add_param(p.module, std::move(p.name), p.tensor);
      else
        tree.add_buffer(p.module, std::move(p.name), p.tensor);
    }
    tree.set_record(record(doc, tree));
    return tree;
  }

 private:
  struct Pending {
    ModuleId module;
    bool param;
    std::string name;
    TensorId tensor;
    Pending(ModuleId m, bool p, std::pair<std::string, TensorId> s) : module(m), param(p), name(std::move(s.first)), tensor(s.second) {}
  };

  static size_t count_slots(const Json& modules) {
    size_t n = 0;
    for (const Json& m : modules) {
      if (!m.is_object()) continue;
      for (const char* kind : {"params", "buffers"})
        if (auto list = m.find(kind); list != m.end() && list->is_array()) n += list->size();
    }
    return n;
  }

  [[noreturn]] void fail(const std::string& why) const { throw InputError(file_, why); }
  [[noreturn]] void damaged(const std::string& why) const {
    fail("module tree JSON is damaged (" + (where_.empty() ? "" : where_ + ": ") + why + "); " + kAgain);
  }

  // A JSON object without "tree_format": say what it looks like instead.
  [[noreturn]] void not_a_tree(const Json& doc) const {
    for (const char* key : {"module_classes", "min_num_params", "mixed_precision", "fsdp", "ignored_modules"})
      if (doc.contains(key))
        fail("this is a policy JSON, not a model: give the model as the first argument and the policy with --policy");
    if (doc.contains("modules") && doc.contains("num_tensors"))
      fail("a module tree without \"tree_format\" (fsdp-plan --dump-tree output?): fsdp-plan plans the tree "
           "fsdp_plan.tree.module_tree(module) writes, which has \"tree_format\": 1");
    fail("a JSON file, not a model: fsdp-plan reads a torch.export .pt2, a TorchScript .pt, or a module tree "
         "JSON (\"tree_format\": 1, from fsdp_plan.tree.module_tree)");
  }

  std::string string(const Json& obj, const char* key, bool may_be_empty) const {
    auto it = obj.find(key);
    if (it == obj.end() || !it->is_string()) damaged(std::string("no \"") + key + "\" string");
    const std::string& s = it->get_ref<const std::string&>();
    if ((!may_be_empty && s.empty()) || s.size() > (may_be_empty ? size_t{1} << 20 : kMaxName))
      damaged(std::string("\"") + key + "\" is " + (s.empty() ? "empty" : "too long"));
    return s;
  }

  std::pair<std::string, TensorId> slot(const Json& s, const std::string& what) {
    const std::string outer = where_;
    where_ += ": " + what;
    if (!s.is_object()) damaged("not an object");
    std::string name = string(s, "name", false);
    if (name.find('.') != std::string::npos) damaged("the name \"" + printable(name) + "\" has a dot");
    where_ += " \"" + printable(name) + "\"";
    auto t = s.find("tensor");
    if (t == s.end() || !t->is_number_integer() || t->get<int64_t>() < 0 ||
        t->get<int64_t>() >= static_cast<int64_t>(infos_.size()))
      damaged("\"tensor\" is not a number below num_tensors (" + std::to_string(infos_.size()) + ")");
    const auto id = static_cast<TensorId>(t->get<int64_t>());
    TensorInfo info;
    auto shape = s.find("shape");
    if (shape == s.end() || !shape->is_array() || shape->size() > kMaxDims) damaged("no \"shape\" list");
    int64_t elements = 1;
    for (const Json& d : *shape) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0) damaged("an impossible shape");
      info.shape.push_back(d.get<int64_t>());
    }
    const std::string dtype = string(s, "dtype", false);
    const DtypeInfo* dt = dtype_from_name(dtype);
    if (!dt) damaged("unknown dtype \"" + printable(dtype) + "\"");
    info.dtype = dt->name;
    auto itemsize = s.find("itemsize");
    if (itemsize == s.end() || !itemsize->is_number_integer() || itemsize->get<int64_t>() != dt->itemsize)
      damaged("\"itemsize\" is not " + std::to_string(dt->itemsize) + ", the itemsize of " + dtype);
    info.itemsize = dt->itemsize;
    int64_t bytes = info.itemsize;
    for (int64_t d : info.shape)
      if (__builtin_mul_overflow(elements, d, &elements) || __builtin_mul_overflow(bytes, d, &bytes) ||
          bytes > kMaxBytes)
        damaged("an impossible shape");
    auto rg = s.find("requires_grad");
    if (rg == s.end() || !rg->is_boolean()) damaged("no \"requires_grad\" true or false");
    info.requires_grad = rg->get<bool>();
    if (auto p = s.find("persistent"); p != s.end() && !p->is_boolean()) damaged("\"persistent\" is not true or false");
    auto& known = infos_[static_cast<size_t>(id)];
    if (seen_[static_cast<size_t>(id)]) {
      if (known.shape != info.shape || known.dtype != info.dtype || known.requires_grad != info.requires_grad)
        damaged("tensor " + std::to_string(id) + " was listed before with another shape, dtype or requires_grad");
    } else {
      known = std::move(info);
      seen_[static_cast<size_t>(id)] = true;
    }
    where_ = outer;
    return {std::move(name), id};
  }

  ModelRecord record(const Json& doc, const ModuleTree& tree) const {
    ModelRecord r;
    r.source = "the module tree JSON";
    r.root_class = tree.module(0).type_name;
    if (auto p = doc.find("producer"); p != doc.end() && p->is_string()) r.producer = printable(p->get<std::string>());
    // The live module's _no_split_modules (fsdp_plan.tree); a tree without the key records nothing.
    auto ns = doc.find("no_split_modules");
    if (ns == doc.end()) return r;
    if (!ns->is_null()) {
      if (!ns->is_array() || ns->size() > kMaxBases) damaged("\"no_split_modules\" is not a list of class names");
      std::vector<std::string> names;
      for (const Json& n : *ns) {
        if (!n.is_string() || n.get_ref<const std::string&>().empty() || n.get_ref<const std::string&>().size() > kMaxName)
          damaged("\"no_split_modules\" is not a list of class names");
        names.push_back(n.get<std::string>());
      }
      r.no_split_modules = std::move(names);
    }
    return r;
  }

  const std::string& file_;
  std::string where_;
  std::vector<TensorInfo> infos_;
  std::vector<bool> seen_;
};

}  // namespace

bool looks_like_json_object(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char c = 0;
  for (int i = 0; i < 4096 && in.get(c); ++i) {
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') continue;
    return c == '{';
  }
  return false;
}

ModuleTree load_tree_json(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) > kMaxTreeFile) {
    throw InputError(path, "a JSON file of " + std::to_string(st.st_size) + " bytes, more than a module tree JSON can be (" +
                               std::to_string(kMaxTreeFile) + ")");
  }
  return parse_tree_json(read_text_file(path, kMaxTreeFile, "a module tree JSON"), path);
}

ModuleTree parse_tree_json(const std::string& text, const std::string& file) {
  try {
    return Reader(file).read(text);
  } catch (const std::bad_alloc&) {
    throw InputError(file, "cannot read the module tree JSON: out of memory; the file is damaged or too big");
  }
}

}  // namespace fsdp_plan
