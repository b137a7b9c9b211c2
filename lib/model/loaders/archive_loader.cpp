// Structure-only loader: reads a TorchScript archive's module tree from
// data.pkl and the class headers under code/, without compiling any method and
// without reading any tensor storage, and without LibTorch: the zip through
// libzip (zip_reader.h), data.pkl through our own unpickler (unpickler.h),
// which keeps the pickle memo's identity (tied weights are one tensor).
#include "model/loaders/archive_loader.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string_view>
#include <unordered_map>

#include "model/dtype.h"
#include "model/loaders/class_decls.h"
#include "model/loaders/loader.h"
#include "model/loaders/printable.h"
#include "model/loaders/unpickler.h"
#include "model/loaders/zip_reader.h"
#include "util/errors.h"

namespace fsdp_plan {
namespace {

using pickle::Kind;
using pickle::NodeId;

const char kHowToExport[] =
    "export the model as TorchScript: torch.jit.save(torch.jit.script(model), "
    "\"model.pt\") (or torch.jit.trace(model, example_inputs) instead of script)";

// No record that describes structure (data.pkl, a code/ file, the version)
// comes anywhere near this (data.pkl of 50,000 modules and 150,000 tensors is
// 10 MB, its largest code file 2.2 MB); a bigger claim means a damaged or
// hostile file. All of them together are bounded too: they stay in memory.
constexpr uint64_t kMaxStructureRecord = uint64_t{64} << 20;
constexpr uint64_t kMaxStructureTotal = uint64_t{256} << 20;
// torch.jit.save stores every record; a deflated one was zipped again by
// hand. Structure deflates 3 to 22 times at zlib's level 9 (tiny_gpt's and
// the 50k-module model's data.pkl 2.9 and 5.9, code 3.4 and 17.7, a .pt2's
// model.json 21.6); deflate itself reaches 1032 on zeros, so a 1.8 MB file
// could claim a 1 GiB data.pkl and have it inflated before any check failed.
constexpr uint64_t kMaxStructureRatio = 100;

const char kCopyAgain[] = "copy or save it again";

// Checks the first bytes before handing the file to the zip reader.
void check_head(const std::string& path, const unsigned char* head, size_t got) {
  if (got == 0) throw InputError(path, "empty file, not a TorchScript archive");
  if (got >= 4 && std::memcmp(head, "PK\x03\x04", 4) == 0) return;
  if (head[0] == 0x80 && got > 1 && head[1] >= 2 && head[1] <= 5) {
    // Legacy torch.save files open with a pickled magic number: LONG1 of 10 bytes, 0x1950a86a20f9469cfc6c.
    static const unsigned char kLegacyMagic[] = {0x8a, 0x0a, 0x6c, 0xfc, 0x9c, 0x46, 0xf9, 0x20, 0x6a, 0xa8, 0x50, 0x19};
    const bool legacy = got >= 2 + sizeof kLegacyMagic && std::memcmp(head + 2, kLegacyMagic, sizeof kLegacyMagic) == 0;
    throw InputError(path, std::string(legacy ? "a legacy torch.save() checkpoint" : "a Python pickle") +
                               ", not a TorchScript archive; " + kHowToExport);
  }
  throw InputError(path, std::string("not a zip archive, so not a TorchScript model; ") +
                             kHowToExport);
}

void check_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw InputError(path, "cannot open file: no such file");
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw InputError(path, "cannot open file: not a regular file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path, "cannot open file");
  unsigned char head[16] = {};
  in.read(reinterpret_cast<char*>(head), sizeof head);
  check_head(path, head, static_cast<size_t>(in.gcount()));
}

class ArchiveLoader {
 public:
  ArchiveLoader(std::string path, std::function<std::unique_ptr<zip::Reader>()> open_zip,
                ArchiveReadStats& stats, const ArchiveOptions& options)
      : path_(std::move(path)), open_zip_(std::move(open_zip)), stats_(stats), options_(options) {}
  ~ArchiveLoader() { close_zip(); }

  // What --loader jit checks before LibTorch reads the file: the structure
  // reader's limits (record sizes, deflate ratios, the unpickler's nesting
  // and size, code nesting), and no deflated record past kMaxStructureRatio,
  // since LibTorch inflates every record, weights included, to its claimed size.
  void preflight() {
    open_directory();
    check_is_torchscript();
    for (const zip::Entry& e : dir_->entries())
      if (e.method != 0 && e.uncomp_size > e.comp_size * kMaxStructureRatio + 4096) {
        const std::string name(e.name.rfind(prefix_, 0) == 0 ? e.name.substr(prefix_.size()) : e.name);
        throw InputError(path_, "record " + name + " claims to be " + std::to_string(e.uncomp_size) +
                                    " bytes, more than " + std::to_string(kMaxStructureRatio) + " times its " +
                                    std::to_string(e.comp_size) + " compressed bytes, and LibTorch inflates every "
                                    "record whole (a deflate bomb?): the file is damaged; " + kCopyAgain);
      }
    std::string pkl = read_record("data.pkl");
    read_code();
    close_zip();
    try {
      (void)pickle::unpickle(pkl);
    } catch (const pickle::Error& e) {
      throw InputError(path_, e.what() + std::string("; ") + kCopyAgain);
    }
  }

  ModuleTree load() {
    open_directory();
    check_is_torchscript();
    const std::string version_record = has_record(".data/version") ? ".data/version" : "version";
    const std::string version = read_record(version_record);
    const auto digits = version.find_first_not_of("0123456789");
    if (digits == 0 || version.size() > 20 ||
        (digits != std::string::npos && version.find_first_not_of(" \r\n", digits) != std::string::npos)) {
      throw InputError(path_, "record " + version_record + " does not hold a format version number: "
                              "the file is damaged; " + kCopyAgain);
    }
    {
      std::string pkl = read_record("data.pkl");
      read_code();
      decls_.reserve(code_.size());  // about a class per file; mangled ones make 50,000
      // libzip's directory (an entry per storage: 150,000 for 150,000
      // tensors) is not needed any more: free it before the pickle grows.
      close_zip();
      try {
        pkl_ = pickle::unpickle(pkl);
      } catch (const pickle::Error& e) {
        throw InputError(path_, e.what() + std::string("; ") + kCopyAgain);
      }
    }
    stats_.storages_requested = static_cast<int64_t>(pkl_.storages.size());
    const NodeId root = pkl_.root;
    if (kind(root) != Kind::Object || !class_of(root).is_module) {
      throw InputError(path_, "data.pkl does not hold a module");
    }
    return build(root);
  }

 private:
  Kind kind(NodeId id) const { return pkl_.node(id).kind; }

  void open_directory() {
    try {
      dir_ = open_zip_();
    } catch (const zip::Error& e) {
      if (e.kind == zip::Error::kNoEnd) {
        throw InputError(path_, std::string("the zip's central directory is missing: the file is "
                                            "truncated or damaged; ") + kCopyAgain);
      }
      throw InputError(path_, std::string("the zip's central directory is damaged (") + e.what() +
                                  "): the file is truncated or damaged; " + kCopyAgain);
    }
    if (dir_->entries().empty()) {
      throw InputError(path_, std::string("an empty zip archive, not a TorchScript model; ") +
                                  kHowToExport);
    }
    // Records live under one top directory, named after the first entry's.
    const std::string_view first = dir_->entries().front().name;
    const auto slash = first.find('/');
    if (slash == std::string::npos) {
      throw InputError(path_, std::string("a zip archive whose files are not under one top "
                                          "directory, not a TorchScript model; ") + kHowToExport);
    }
    prefix_ = std::string(first.substr(0, slash + 1));
    // LibTorch's zip reader refuses impossible sizes with a vague message and
    // allocates whatever a record declares: check every entry first.
    for (const zip::Entry& e : dir_->entries()) {
      const bool stored = e.method == 0;
      const uint64_t limit = dir_->max_honest_size(e);
      const bool fits = e.comp_size <= dir_->file_size();
      if (!fits || e.uncomp_size > limit || (stored && e.comp_size != e.uncomp_size)) {
        const std::string name(e.name.rfind(prefix_, 0) == 0 ? e.name.substr(prefix_.size()) : e.name);
        throw InputError(path_, "record " + name + " claims to be " + std::to_string(e.uncomp_size) +
                                    " bytes, more than " +
                                    (stored ? "the file holds (" + std::to_string(dir_->file_size()) +
                                                  " bytes)"
                                            : "its compressed data can give") +
                                    ": the file is damaged; " + kCopyAgain);
      }
    }
  }

  bool has_record(const std::string& name) const { return dir_->find(prefix_ + name) != nullptr; }

  // The class declarations under code/, read while the zip is open.
  // A file with mangled classes has one per module: 50,000 records.
  void read_code() {
    const std::string code = prefix_ + "code/";
    for (const zip::Entry& e : dir_->entries()) {
      if (e.name.rfind(code, 0) == 0 && e.name.size() > 3 && e.name.compare(e.name.size() - 3, 3, ".py") == 0) {
        auto [it, added] = code_.try_emplace(std::string(e.name.substr(prefix_.size())));
        if (added) it->second = read_entry(e, it->first);  // entries in order: the first of a name, as find() gives
      }
    }
  }

  void close_zip() {
    if (!dir_) return;
    stats_.file_size = dir_->file_size();
    stats_.bytes_read = dir_->bytes_read();
    dir_.reset();
  }

  // A record's bytes, checked against the directory: a sane size that fits
  // in the file, and the stored CRC-32.
  std::string read_record(const std::string& name) {
    const zip::Entry* e = dir_->find(prefix_ + name);
    if (!e) {
      throw InputError(path_, "record " + name + " is missing: the file is incomplete or damaged; " +
                                  kCopyAgain);
    }
    return read_entry(*e, name);
  }

  std::string read_entry(const zip::Entry& e, const std::string& name) {
    check_structure_size(e, name);
    try {
      std::string out = dir_->read(e, options_.verify_crc);
      // LibTorch's parser recurses per bracket level (--loader jit died at 10^5).
      if (name.rfind("code/", 0) == 0 && code_nesting(out) > kMaxCodeNesting)
        throw InputError(path_, "record " + name + " nests brackets more than " + std::to_string(kMaxCodeNesting) +
                                    " deep, which printed TorchScript never does: the file is damaged; " + kCopyAgain);
      return out;
    } catch (const zip::Error& err) {
      throw InputError(path_, "record " + name + " is damaged (" + err.what() + "); " + kCopyAgain);
    }
  }

  // A structure record's size against what an honest archive of this size
  // holds: the file's bytes when stored, kMaxStructureRatio times its
  // compressed bytes when deflated, kMaxStructureRecord, and all of them
  // together kMaxStructureTotal. Checked before a byte is inflated.
  void check_structure_size(const zip::Entry& e, const std::string& name) {
    const auto refuse = [&](const std::string& than) {
      throw InputError(path_, "record " + name + " claims to be " + std::to_string(e.uncomp_size) +
                                  " bytes, more than " + than + ": the file is damaged; " + kCopyAgain);
    };
    if (e.uncomp_size > dir_->max_honest_size(e))
      refuse(e.method == 0 ? "the file holds (" + std::to_string(dir_->file_size()) + " bytes)"
                           : "its compressed data can give");
    if (e.method != 0 && e.uncomp_size > e.comp_size * kMaxStructureRatio + 4096)
      refuse(std::to_string(kMaxStructureRatio) + " times its " + std::to_string(e.comp_size) +
             " compressed bytes, which no honest record deflates to (a deflate bomb?)");
    if (e.uncomp_size > kMaxStructureRecord)
      refuse("a record that describes structure can be (" + std::to_string(kMaxStructureRecord >> 20) + " MiB)");
    structure_bytes_ += e.uncomp_size;
    if (structure_bytes_ > kMaxStructureTotal)
      throw InputError(path_, "data.pkl and the code/ records add up to more than " +
                                  std::to_string(kMaxStructureTotal >> 20) +
                                  " MiB, more than any model's structure: the file is damaged; " + kCopyAgain);
  }

  // Refuses files that are not TorchScript archives, saying what they are.
  void check_is_torchscript() {
    const std::string code = prefix_ + "code/";
    bool has_code = false;
    for (const auto& e : dir_->entries()) {
      if (e.name.rfind(code, 0) == 0) {
        has_code = true;
        break;
      }
    }
    if (!has_record("data.pkl")) {
      if (has_code) {
        throw InputError(path_, std::string("a TorchScript archive without data.pkl, which holds "
                                            "the module tree: the file is incomplete or damaged; ") +
                                    kCopyAgain);
      }
      throw InputError(path_, std::string("a zip archive without data.pkl, not a PyTorch model; ") +
                                  kHowToExport);
    }
    if (has_code) return;
    if (has_record("constants.pkl")) {
      throw InputError(path_, "a TorchScript archive without code/, which declares the module "
                              "classes: the file is incomplete or damaged; " + std::string(kCopyAgain));
    }
    // torch.save(): a state_dict pickles as collections.OrderedDict first thing.
    std::string head = read_record("data.pkl").substr(0, 64);
    const bool state_dict = head.find("collections\nOrderedDict") != std::string::npos;
    throw InputError(path_, std::string("a torch.save() checkpoint (") +
                                (state_dict ? "a state_dict" : "a pickled Python object") +
                                "), not a TorchScript archive; " + kHowToExport);
  }

  // The declaration of a class. __torch__.a.b.Cls is declared in
  // code/__torch__/a/b.py; the first lookup in a file records all its classes.
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
    auto source = code_.find(file);
    if (source == code_.end()) {
      throw InputError(path_, "class " + name + " has no declaration: record " + file +
                                  " is missing; the file is incomplete or damaged");
    }
    ClassDecls parsed;
    try {
      parsed = parse_class_decls(source->second);
    } catch (const std::exception& e) {
      // torch.jit.load compiles the file and stops there too; skipping the line would plan another tree.
      throw InputError(path_, "record " + file + " is damaged (" + e.what() + "); " + kCopyAgain);
    }
    for (auto& [cls, decl] : parsed) decls_.emplace(prefix + "." + cls, std::move(decl));
    it = decls_.find(name);
    if (it == decls_.end()) throw InputError(path_, "class " + name + " is not declared in " + file);
    return it->second;
  }

  // The declaration of an object's class, remembered by the pickle's string
  // for the class name: a hash of the name per module costs more than planning.
  const ClassDecl& class_of(NodeId object) {
    if (class_cache_.empty()) class_cache_.assign(pkl_.strings.size(), nullptr);
    const ClassDecl*& decl = class_cache_[pkl_.node(pkl_.object(object).cls).ref];
    if (!decl) decl = &decl_of(pkl_.class_name(object));  // unordered_map elements stay put
    return *decl;
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

  // A submodule's slot is typed with the submodule's own class (possibly
  // inside Optional[...]), or with an interface it implements; anything else
  // is an edited declaration.
  void check_slot(const AttributeDecl& attr, const std::string& cls, const std::string& value_cls) {
    for (size_t at = attr.type.find(value_cls); at != std::string::npos; at = attr.type.find(value_cls, at + 1)) {
      const size_t end = at + value_cls.size();
      const auto boundary = [](char c) { return c == '[' || c == ']' || c == ',' || c == ' '; };
      if ((at == 0 || boundary(attr.type[at - 1])) && (end == attr.type.size() || boundary(attr.type[end]))) return;
    }
    try {
      if (attr.type.rfind("__torch__.", 0) == 0 && decl_of(attr.type).is_interface) return;
    } catch (const InputError&) {
    }
    throw InputError(path_, "attribute " + attr.name + " of " + cls + " is declared as " + attr.type +
                                " but data.pkl holds a " + value_cls + ": the file is damaged; " + kCopyAgain);
  }

  // Whether a declared type is exactly a module class of this archive.
  bool names_module_class(const std::string& type) {
    if (type.rfind("__torch__.", 0) != 0 || type.find_first_of("[], ") != std::string::npos ||
        type.rfind("__torch__.torch.classes.", 0) == 0)
      return false;
    try {
      return decl_of(type).is_module;
    } catch (const InputError&) {
      return false;
    }
  }

  // An object's state as attribute name -> value; null if it is not a dict.
  // Big dicts (a Sequential of 50,000 modules) get a hash map.
  class State {
   public:
    State(const pickle::Pickle& p, NodeId state) : p_(p) {
      if (state == pickle::kNoNode || p.node(state).kind != Kind::Dict) return;
      is_dict_ = true;
      items_ = p.elems(state);
      if (items_.size() > 32) {
        map_.reserve(items_.size() / 2);
        for (size_t i = 0; i + 1 < items_.size(); i += 2) {
          const NodeId k = items_[i];
          if (p.node(k).kind == Kind::String) map_.emplace(p.str(k), items_[i + 1]);
        }
      }
    }
    bool is_dict() const { return is_dict_; }
    size_t size() const { return items_.size() / 2; }
    NodeId key(size_t i) const { return items_[2 * i]; }
    NodeId find(const std::string& name) const {
      if (items_.size() > 32) {
        auto it = map_.find(name);
        return it == map_.end() ? pickle::kNoNode : it->second;
      }
      for (size_t i = 0; i + 1 < items_.size(); i += 2) {
        const NodeId k = items_[i];
        if (p_.node(k).kind == Kind::String && p_.str(k) == name) return items_[i + 1];
      }
      return pickle::kNoNode;
    }

   private:
    const pickle::Pickle& p_;
    bool is_dict_ = false;
    pickle::Span<NodeId> items_;
    std::unordered_map<std::string_view, NodeId> map_;  // first wins, as in a dict built in order
  };

  // Pre-order walk with an explicit stack, visiting attributes in declaration
  // (slot) order exactly as the JIT loader's TreeBuilder does.
  ModuleTree build(NodeId root) {
    ModuleTree tree;
    tree.reserve_tensors(pkl_.tensors.size());  // at most one tree tensor per pickled one
    tree.module(0).type_name = pkl_.class_name(root);
    std::vector<std::pair<NodeId, ModuleId>> stack{{root, 0}};
    std::vector<std::pair<NodeId, ModuleId>> children;
    while (!stack.empty()) {
      auto [obj, id] = stack.back();
      stack.pop_back();
      children.clear();
      const std::string& cls = pkl_.class_name(obj);
      const ClassDecl& decl = class_of(obj);
      const State state(pkl_, pkl_.object(obj).state);
      if (!state.is_dict()) {
        // A __setstate__ class pickles whatever its __getstate__ returned and
        // the JIT loader runs __setstate__ to fill the slots. We cannot run
        // it; that is harmless when no slot could hold a parameter, buffer or
        // submodule (quantized modules and their packed params), and we
        // refuse otherwise rather than guess.
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
      size_t found = 0;
      for (const AttributeDecl& attr : decl.attributes) {
        const NodeId v = state.find(attr.name);
        if (v == pickle::kNoNode) {
          if (decl.has_setstate) continue;  // __setstate__ may fill it from another key
          throw InputError(path_, "data.pkl lacks attribute " + attr.name + " of " + cls);
        }
        ++found;
        if (attr.is_param) {
          if (kind(v) == Kind::Tensor) tree.add_param(id, attr.name, tensor_id(tree, v));
        } else if (attr.is_buffer) {
          if (kind(v) == Kind::Tensor) tree.add_buffer(id, attr.name, tensor_id(tree, v));
        } else if (kind(v) == Kind::Object && class_of(v).is_module) {
          check_slot(attr, cls, pkl_.class_name(v));
          ModuleId cid = tree.add_module(id, attr.name, pkl_.class_name(v));
          children.emplace_back(v, cid);
        } else if (names_module_class(attr.type)) {
          throw InputError(path_, "attribute " + attr.name + " of " + cls + " is declared as module " + attr.type +
                                      " but data.pkl holds no module there: the file is damaged; " + kCopyAgain);
        }
      }
      // The pickled state and the declaration list the same attributes:
      // torch.jit.load fills the class's slots from it and refuses a mismatch.
      if (!decl.has_setstate && found != state.size()) {
        std::string extra;
        for (size_t i = 0; i < state.size() && extra.empty(); ++i) {
          const NodeId k = state.key(i);
          const std::string name = kind(k) == Kind::String ? pkl_.str(k) : "(a key that is not a string)";
          if (std::none_of(decl.attributes.begin(), decl.attributes.end(),
                           [&](const AttributeDecl& a) { return a.name == name; }) || kind(k) != Kind::String)
            extra = name;
        }
        throw InputError(path_, "data.pkl holds " + (extra.empty() ? std::string("an attribute twice") :
                                                     "attribute " + extra) + " of " + cls +
                                    ", which its declaration in code/ does not list: the file is damaged; " +
                                    kCopyAgain);
      }
      for (auto it = children.rbegin(); it != children.rend(); ++it) stack.push_back(*it);
    }
    return tree;
  }

  TensorId tensor_id(ModuleTree& tree, NodeId node) {
    if (tensor_ids_.empty()) tensor_ids_.assign(pkl_.tensors.size(), -1);
    TensorId& id = tensor_ids_[pkl_.node(node).ref];
    if (id < 0) {
      const pickle::Tensor& t = pkl_.tensor(node);
      const pickle::Storage& s = pkl_.storage(t.storage);
      const DtypeInfo* dtype = s.dtype;
      TensorInfo info;
      const auto shape = pkl_.shape(t);
      info.shape.assign(shape.begin(), shape.end());
      // The planner multiplies these out: refuse shapes no storage could have.
      int64_t bytes = dtype->itemsize;
      for (int64_t d : info.shape) {
        if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes) || bytes > (int64_t{1} << 50)) {
          throw InputError(path_, "data.pkl is damaged: a tensor has an impossible shape; " +
                                      std::string(kCopyAgain));
        }
      }
      // 2^50 bytes each and at most 2^12 such: totals stay far from overflow.
      total_bytes_ += bytes;
      if (total_bytes_ > (int64_t{1} << 62)) {
        throw InputError(path_, "data.pkl is damaged: its tensors add up to an impossible size; " +
                                    std::string(kCopyAgain));
      }
      info.dtype = dtype->name;
      info.itemsize = dtype->itemsize;
      info.requires_grad = t.requires_grad;
      id = tree.add_tensor(std::move(info));
    }
    return id;
  }

  std::string path_;
  std::function<std::unique_ptr<zip::Reader>()> open_zip_;
  ArchiveReadStats& stats_;
  ArchiveOptions options_;
  std::unique_ptr<zip::Reader> dir_;
  std::string prefix_;  // "archive/"
  pickle::Pickle pkl_;
  std::unordered_map<std::string, ClassDecl> decls_;
  std::vector<const ClassDecl*> class_cache_;  // by pickle string index; see class_of
  std::unordered_map<std::string, std::string> code_;  // "code/__torch__/a.py" -> source
  std::vector<TensorId> tensor_ids_;  // by pickle tensor; -1 until added to the tree
  int64_t total_bytes_ = 0;
  uint64_t structure_bytes_ = 0;  // structure records read so far (kMaxStructureTotal)
};

ModuleTree load_from(const std::string& path, const std::function<std::unique_ptr<zip::Reader>()>& open_zip,
                     ArchiveReadStats& s, const ArchiveOptions& options) {
  try {
    return ArchiveLoader(path, open_zip, s, options).load();
  } catch (const InputError& e) {
    throw InputError(path, printable(e.what()));
  } catch (const std::bad_alloc&) {
    throw InputError(path, "cannot read TorchScript archive: out of memory; the file is damaged "
                           "or too big");
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw InputError(path, "cannot read TorchScript archive: " + printable(what.substr(0, what.find('\n'))));
  }
}

}  // namespace

ModuleTree load_archive(const std::string& path, ArchiveReadStats* stats,
                        const ArchiveOptions& options) {
  ArchiveReadStats local;
  check_file(path);
  return load_from(path, [&] { return zip::Reader::open_file(path); }, stats ? *stats : local, options);
}

ModuleTree load_archive(const std::string& path, std::unique_ptr<zip::Reader> zip) {
  ArchiveReadStats local;
  check_file(path);
  return load_from(path, [&] { return std::move(zip); }, local, ArchiveOptions{});
}

ModuleTree load_archive(const std::string& path, ArchiveReadStats* stats) {
  return load_archive(path, stats, ArchiveOptions{});
}

void check_archive_for_jit(const std::string& path, std::unique_ptr<zip::Reader> zip) {
  ArchiveReadStats local;
  check_file(path);
  auto open = [&] { return zip ? std::move(zip) : zip::Reader::open_file(path); };
  try {
    ArchiveLoader(path, open, local, ArchiveOptions{}).preflight();
  } catch (const InputError& e) {
    throw InputError(path, printable(e.what()));
  } catch (const std::bad_alloc&) {
    throw InputError(path, "cannot read TorchScript archive: out of memory; the file is damaged or too big");
  } catch (const std::exception& e) {
    std::string what = e.what();
    throw InputError(path, "cannot read TorchScript archive: " + printable(what.substr(0, what.find('\n'))));
  }
}

ModuleTree load_archive_bytes(const std::string& name, const void* data, size_t size,
                              ArchiveReadStats* stats, const ArchiveOptions& options) {
  ArchiveReadStats local;
  const auto* head = static_cast<const unsigned char*>(data);
  check_head(name, head, std::min<size_t>(size, 16));
  return load_from(name, [&] { return zip::Reader::open_memory(data, size); }, stats ? *stats : local,
                   options);
}

ModuleTree load_archive(const std::string& path) { return load_archive(path, nullptr); }

}  // namespace fsdp_plan
