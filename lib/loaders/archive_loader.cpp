// Structure-only loader: reads a TorchScript archive's module tree from
// data.pkl and the class headers under code/, without compiling any method and
// without reading any tensor storage. Tensors are rebuilt by LibTorch's
// unpickler on storages that have the right byte size but no bytes, so shape,
// dtype and identity (the pickle memo: tied weights are one object) are exact.
#include "archive_loader.h"

#include <caffe2/serialize/file_adapter.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/compilation_unit.h>
#include <torch/csrc/jit/serialization/unpickler.h>

#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include "../errors.h"
#include "class_decls.h"
#include "dtype.h"
#include "loader.h"

namespace fsdp_plan {
namespace {

using caffe2::serialize::PyTorchStreamReader;
using ObjectPtr = c10::intrusive_ptr<c10::ivalue::Object>;

const char kHowToExport[] =
    "export the model as TorchScript: torch.jit.save(torch.jit.script(model), "
    "\"model.pt\") (or torch.jit.trace(model, example_inputs) instead of script)";

// LibTorch's message, first line only, without its "[enforce fail at ...] ."
// prefix and "(Could this error message be improved? ...)" suffix.
std::string torch_message(const std::string& what) {
  std::string s = what.substr(0, what.find('\n'));
  if (s.rfind("[enforce fail at ", 0) == 0) {
    auto end = s.find("] ");
    if (end != std::string::npos) s = s.substr(end + 2);
    if (s.rfind(". ", 0) == 0) s = s.substr(2);
  }
  auto junk = s.find("  (Could this error message be improved?");
  if (junk != std::string::npos) s = s.substr(0, junk);
  return s;
}

// Messages can quote names from a corrupt file: keep them one line of ASCII.
std::string printable(const std::string& s) {
  static const char hex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
  }
  return out;
}

// A FileAdapter that counts what the zip reader pulls from disk.
class CountingAdapter final : public caffe2::serialize::ReadAdapterInterface {
 public:
  CountingAdapter(const std::string& path, ArchiveReadStats& stats) : file_(path), stats_(stats) {
    stats_.file_size = file_.size();
  }
  size_t size() const override { return file_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* what) const override {
    size_t got = file_.read(pos, buf, n, what);
    stats_.bytes_read += got;
    return got;
  }

 private:
  caffe2::serialize::FileAdapter file_;
  ArchiveReadStats& stats_;
};

std::string read_record(PyTorchStreamReader& reader, const std::string& name) {
  auto [ptr, size] = reader.getRecord(name);
  return std::string(static_cast<const char*>(ptr.get()), size);
}

// Refuses files that are not TorchScript archives, saying what they are.
void check_is_torchscript(const std::string& path, PyTorchStreamReader& reader) {
  bool has_code = false;
  for (const auto& r : reader.getAllRecords()) {
    if (r.rfind("code/", 0) == 0) has_code = true;
  }
  if (!reader.hasRecord("data.pkl")) {
    throw InputError(path, std::string("a zip archive without data.pkl, not a PyTorch model; ") +
                               kHowToExport);
  }
  if (has_code) return;
  if (reader.hasRecord("constants.pkl")) {
    throw InputError(path, "a TorchScript archive without code/, cannot tell modules apart");
  }
  // torch.save(): a state_dict pickles as collections.OrderedDict first thing.
  std::string head = read_record(reader, "data.pkl").substr(0, 64);
  const bool state_dict = head.find("collections\nOrderedDict") != std::string::npos;
  throw InputError(path, std::string("a torch.save() checkpoint (") +
                             (state_dict ? "a state_dict" : "a pickled Python object") +
                             "), not a TorchScript archive; " + kHowToExport);
}

// Checks the first bytes before handing the file to the zip reader.
void sniff(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw InputError(path, "cannot open file: no such file");
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError(path, "cannot open file: not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "cannot open file");
  unsigned char head[4] = {0, 0, 0, 0};
  in.read(reinterpret_cast<char*>(head), 4);
  const auto got = in.gcount();
  if (got == 0) throw InputError(path, "empty file, not a TorchScript archive");
  if (got == 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) return;
  if (head[0] == 0x80 && got > 1 && head[1] >= 2 && head[1] <= 5) {
    throw InputError(path, std::string("a legacy torch.save() pickle, not a TorchScript archive; ") +
                               kHowToExport);
  }
  throw InputError(path, std::string("not a zip archive, so not a TorchScript model; ") +
                             kHowToExport);
}

class ArchiveLoader {
 public:
  ArchiveLoader(std::string path, ArchiveReadStats& stats)
      : path_(std::move(path)),
        stats_(stats),
        reader_(std::make_shared<CountingAdapter>(path_, stats)),
        cu_(std::make_shared<torch::jit::CompilationUnit>()) {}

  ModuleTree load() {
    check_is_torchscript(path_, reader_);
    c10::IValue root = unpickle();
    if (!root.isObject() || !decl_of(*root.toObject()).is_module) {
      throw InputError(path_, "data.pkl does not hold a module");
    }
    return build(root.toObject());
  }

 private:
  c10::IValue unpickle() {
    const std::string pickle = read_record(reader_, "data.pkl");
    size_t pos = 0;
    auto read = [&](char* buf, size_t n) {
      // A well-formed pickle stops before its end; asking for more means it
      // is truncated. Throw rather than return 0: the unpickler's string
      // reader would loop on an empty refill.
      if (pos >= pickle.size()) throw std::runtime_error("data.pkl ends early");
      n = std::min(n, pickle.size() - pos);
      std::memcpy(buf, pickle.data() + pos, n);
      pos += n;
      return n;
    };
    // Class names resolve to empty ClassTypes; what a class holds comes from
    // code/. The unpickler also asks for container types ("List[int]") to tag
    // lists and dicts; any element type will do for us.
    auto resolve = [this](const c10::QualifiedName& qn) -> c10::StrongTypePtr {
      const std::string& name = qn.qualifiedName();
      if (name.rfind("List[", 0) == 0) return {cu_, c10::ListType::create(c10::AnyType::get())};
      if (name.rfind("Dict[", 0) == 0) {
        return {cu_, c10::DictType::create(c10::AnyType::get(), c10::AnyType::get())};
      }
      auto& type = types_[name];
      if (!type) type = c10::ClassType::create(qn, cu_);
      return {cu_, type};
    };
    // Objects keep no slots: their pickled state (a dict for ordinary
    // classes) is kept aside. So no object owns another, and tearing down a
    // 100,000-deep chain does not recurse.
    auto load_object = [this](const c10::StrongTypePtr& type, const c10::IValue& state) {
      auto obj = c10::ivalue::Object::create(type, 0);
      states_.emplace(obj.get(), std::make_pair(obj, state));
      return obj;
    };
    // The storage gets its byte size but no bytes: nothing under data/ is read.
    auto no_bytes = [this](const std::string&) {
      ++stats_.storages_requested;
      return at::DataPtr(nullptr, c10::Device(c10::kCPU));
    };
    torch::jit::Unpickler unpickler(read, resolve, load_object, no_bytes, c10::Device(c10::kCPU));
    unpickler.set_version(reader_.version());
    return unpickler.parse_ivalue();
  }

  // The declaration of obj's class. __torch__.a.b.Cls is declared in
  // code/__torch__/a/b.py; the first lookup in a file records all its classes.
  const ClassDecl& decl_of(const c10::ivalue::Object& obj) {
    return decl_of(obj.type()->name()->qualifiedName());
  }
  const ClassDecl& decl_of(const std::string& name) {
    auto it = decls_.find(name);
    if (it != decls_.end()) return it->second;
    // TorchBind classes (__torch__.torch.classes.*) live in the binary, not in
    // code/ (their file is written empty); they are never modules.
    if (name.rfind("__torch__.torch.classes.", 0) == 0) return decls_[name];
    const auto dot = name.rfind('.');
    const std::string prefix = name.substr(0, dot == std::string::npos ? 0 : dot);
    std::string file = prefix;
    for (auto& c : file) c = c == '.' ? '/' : c;
    file = "code/" + file + ".py";
    if (!reader_.hasRecord(file)) {
      throw InputError(path_, "class " + name + " has no declaration: " + file + " is missing");
    }
    for (auto& [cls, decl] : parse_class_decls(read_record(reader_, file))) {
      decls_.emplace(prefix + "." + cls, std::move(decl));
    }
    it = decls_.find(name);
    if (it == decls_.end()) throw InputError(path_, "class " + name + " is not declared in " + file);
    return it->second;
  }

  // Whether an attribute annotated `type` could hold a module: it names a
  // module class, possibly inside Optional[...] or another container.
  bool may_hold_module(const std::string& type) {
    size_t pos = 0;
    while ((pos = type.find("__torch__.", pos)) != std::string::npos) {
      size_t end = pos;
      while (end < type.size() && (std::isalnum(static_cast<unsigned char>(type[end])) ||
                                   type[end] == '_' || type[end] == '.')) {
        ++end;
      }
      const std::string name = type.substr(pos, end - pos);
      pos = end;
      try {
        if (decl_of(name).is_module) return true;
      } catch (const InputError&) {
        return true;  // an interface or a class we cannot see: assume the worst
      }
    }
    return false;
  }

  // Pre-order walk with an explicit stack, visiting attributes in slot order
  // exactly as the JIT loader's TreeBuilder does.
  ModuleTree build(const ObjectPtr& root) {
    ModuleTree tree;
    tree.module(0).type_name = root->type()->name()->qualifiedName();
    std::vector<std::pair<ObjectPtr, ModuleId>> stack{{root, 0}};
    std::vector<std::pair<ObjectPtr, ModuleId>> children;
    while (!stack.empty()) {
      auto [obj, id] = stack.back();
      stack.pop_back();
      children.clear();
      const ClassDecl& decl = decl_of(*obj);
      const c10::IValue& state = states_.at(obj.get()).second;
      if (!state.isGenericDict()) {
        // A __setstate__ class pickles whatever its __getstate__ returned and
        // the JIT loader runs __setstate__ to fill the slots. We cannot run
        // it; that is harmless when no slot could hold a parameter, buffer or
        // submodule (quantized modules and their packed params), and we
        // refuse otherwise rather than guess.
        const std::string cls = obj->type()->name()->qualifiedName();
        if (!decl.has_setstate) throw InputError(path_, "pickled state of " + cls + " is not a dict");
        for (const AttributeDecl& attr : decl.attributes) {
          if (attr.is_param || attr.is_buffer || may_hold_module(attr.type)) {
            throw InputError(path_, "module " + cls + " restores attribute " + attr.name +
                                        " in its __setstate__ method, which only the jit "
                                        "loader can run");
          }
        }
        continue;
      }
      const auto dict = state.toGenericDict();
      for (const AttributeDecl& attr : decl.attributes) {
        auto found = dict.find(attr.name);
        if (found == dict.end()) {
          if (decl.has_setstate) continue;  // __setstate__ may fill it from another key
          throw InputError(path_, "data.pkl lacks attribute " + attr.name + " of " +
                                      obj->type()->name()->qualifiedName());
        }
        const c10::IValue& v = found->value();
        if (attr.is_param) {
          if (v.isTensor()) tree.add_param(id, attr.name, tensor_id(tree, v.toTensor()));
        } else if (attr.is_buffer) {
          if (v.isTensor()) tree.add_buffer(id, attr.name, tensor_id(tree, v.toTensor()));
        } else if (v.isObject() && decl_of(v.toObjectRef()).is_module) {
          ObjectPtr child = v.toObject();
          ModuleId cid = tree.add_module(id, attr.name, child->type()->name()->qualifiedName());
          children.emplace_back(std::move(child), cid);
        }
      }
      for (auto it = children.rbegin(); it != children.rend(); ++it) stack.push_back(*it);
    }
    return tree;
  }

  TensorId tensor_id(ModuleTree& tree, const at::Tensor& t) {
    auto [it, fresh] = tensor_ids_.try_emplace(t.unsafeGetTensorImpl(), 0);
    if (fresh) {
      TensorInfo info;
      info.shape = t.sizes().vec();
      info.dtype = dtype_name(t.scalar_type());
      info.itemsize = static_cast<int64_t>(t.element_size());
      it->second = tree.add_tensor(std::move(info));
    }
    return it->second;
  }

  std::string path_;
  ArchiveReadStats& stats_;
  PyTorchStreamReader reader_;
  std::shared_ptr<torch::jit::CompilationUnit> cu_;
  std::unordered_map<std::string, c10::ClassTypePtr> types_;
  std::unordered_map<const c10::ivalue::Object*, std::pair<ObjectPtr, c10::IValue>> states_;
  std::unordered_map<std::string, ClassDecl> decls_;
  std::unordered_map<const c10::TensorImpl*, TensorId> tensor_ids_;
};

}  // namespace

ModuleTree load_archive(const std::string& path, ArchiveReadStats* stats) {
  ArchiveReadStats local;
  ArchiveReadStats& s = stats ? *stats : local;
  sniff(path);
  try {
    std::unique_ptr<ArchiveLoader> loader;
    try {
      loader = std::make_unique<ArchiveLoader>(path, s);
    } catch (const c10::Error& e) {
      throw InputError(path, "a zip archive but not a PyTorch file (" +
                                 torch_message(e.what_without_backtrace()) +
                                 "); " + kHowToExport);
    }
    return loader->load();
  } catch (const InputError& e) {
    throw InputError(path, printable(e.what()));
  } catch (const c10::Error& e) {
    throw InputError(path, "cannot read TorchScript archive: " +
                               printable(torch_message(e.what_without_backtrace())));
  } catch (const std::exception& e) {
    throw InputError(path, "cannot read TorchScript archive: " + printable(torch_message(e.what())));
  }
}

ModuleTree load_archive(const std::string& path) { return load_archive(path, nullptr); }

}  // namespace fsdp_plan
