// The zip side of the .pt2 loader: find the archive's JSON records, check
// them against the directory, and hand them to build_export_tree. Weight
// records (data/weights/weight_N, data/constants/tensor_N) are never opened.
#include "model/loaders/export_loader.h"

#include <functional>
#include <memory>
#include <optional>
#include <string_view>

#include "model/loaders/export_program.h"
#include "model/loaders/export_record.h"
#include "model/loaders/printable.h"
#include "model/loaders/zip_reader.h"
#include "util/errors.h"

namespace fsdp_plan {
namespace {

// No JSON record comes near this (tiny_gpt's model.json is 136 KB; nlohmann
// takes 3.4 times a record's size to read it); a bigger claim means a damaged
// or hostile file.
constexpr uint64_t kMaxRecord = uint64_t{128} << 20;
// torch.export.save stores its records; a deflated one was zipped again.
// JSON deflates 22 times at zlib's level 9 (tiny_gpt's model.json), spaces
// 1032 times: a 1.8 MB file claimed 1 GiB of model.json and took 4.1 GB.
constexpr uint64_t kMaxJsonRatio = 100;

// The folder all records live in ("model/": torch names it after the file),
// or "" when the first record is in none.
std::string top_folder(const zip::Reader& dir) {
  if (dir.entries().empty()) return "";
  const std::string_view first = dir.entries().front().name;
  const auto slash = first.find('/');
  return slash == std::string::npos ? "" : std::string(first.substr(0, slash + 1));
}

// Both scans run on every TorchScript file too (150,000 entries for 50,000
// modules): no string is built per entry.
bool has_models(const zip::Reader& dir, const std::string& prefix) {
  const std::string models = prefix + "models/";
  for (const auto& e : dir.entries())
    if (e.name.rfind(models, 0) == 0) return true;
  return false;
}

bool old_format(const zip::Reader& dir) {
  constexpr std::string_view kOld = "serialized_exported_program.json";
  for (const auto& e : dir.entries()) {
    const std::string_view n = e.name;
    if (n == kOld || (n.size() > kOld.size() && n.substr(n.size() - kOld.size()) == kOld &&
                      n[n.size() - kOld.size() - 1] == '/')) {
      return true;
    }
  }
  return false;
}

bool looks_exported(const zip::Reader& dir) {
  const std::string prefix = top_folder(dir);
  return !prefix.empty() &&
         (dir.find(prefix + "archive_format") || has_models(dir, prefix) || old_format(dir));
}

class Archive {
 public:
  using Open = std::function<std::unique_ptr<zip::Reader>()>;
  Archive(std::string name, Open open, ExportReadStats& stats, const ExportOptions& options)
      : name_(std::move(name)), open_(std::move(open)), stats_(stats), options_(options) {}
  ~Archive() {
    if (dir_) stats_.bytes_read = dir_->bytes_read();
  }

  // Throws zip::Error if there is no readable directory.
  void open() {
    dir_ = open_();
    stats_.file_size = dir_->file_size();
    prefix_ = top_folder(*dir_);
  }

  ModuleTree load() {
    try {
      open();
    } catch (const zip::Error& e) {
      throw InputError(name_, std::string(e.kind == zip::Error::kNoEnd
                                              ? "the zip's central directory is missing"
                                              : "the zip's central directory is damaged") +
                                  ": the file is truncated or damaged; copy or save it again");
    }
    if (old_format(*dir_)) {
      throw InputError(name_, "a torch.export archive in the older format "
                              "(serialized_exported_program.json); fsdp-plan reads the pt2 archive "
                              "format of newer PyTorch: load it with torch.export.load and save it "
                              "again with torch.export.save under torch 2.13");
    }
    if (has("archive_format")) {
      const std::string format = trimmed(read("archive_format", 64));
      if (format != "pt2") {
        throw InputError(name_, "record archive_format says \"" + format +
                                    "\", not \"pt2\": not a torch.export archive fsdp-plan knows");
      }
    }
    // torch.export.load refuses any other archive version.
    if (has("archive_version")) {
      const std::string version = trimmed(read("archive_version", 64));
      if (version != "0") {
        throw InputError(name_, "torch.export archive version \"" + version +
                                    "\", but fsdp-plan reads version 0, as torch 2.13 writes it; " +
                                    kSaveExportAgain + " under torch 2.13");
      }
    }
    ExportRecords rec;
    rec.model_name = pick_model();
    rec.model_in_place = read_in_place("models/" + rec.model_name + ".json", kMaxRecord, rec.model);
    const std::string weights = "data/weights/" + rec.model_name + "_weights_config.json";
    if (!has(weights)) missing(weights);
    rec.weights = read(weights, kMaxRecord);
    const std::string constants = "data/constants/" + rec.model_name + "_constants_config.json";
    if (has(constants)) rec.constants = read(constants, kMaxRecord);
    ModuleTree tree = build_export_tree(name_, std::move(rec));
    // fsdp-plan-export's record, when the file has one (export_record.h).
    if (has(kExportRecordName)) {
      tree.set_record(parse_export_record(read(kExportRecordName, kMaxExportRecord), name_));
      adopt_listed_classes(tree);
    }
    return tree;
  }

 private:
  [[noreturn]] void missing(const std::string& record) const {
    throw InputError(name_, "record " + record + " is missing: the file is incomplete or damaged; " +
                                kSaveExportAgain);
  }

  bool has(const std::string& record) const { return dir_->find(prefix_ + record) != nullptr; }


  static std::string trimmed(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
    return printable(s);
  }

  // torch.export.load takes the program named "model"; an archive from
  // package_pt2 with one program of another name is read too.
  std::string pick_model() const {
    const std::string dir = prefix_ + "models/";
    std::vector<std::string> names;
    for (const auto& e : dir_->entries()) {
      if (e.name.rfind(dir, 0) != 0 || e.name.size() < dir.size() + 6) continue;
      if (e.name.compare(e.name.size() - 5, 5, ".json") != 0) continue;
      const std::string n(e.name.substr(dir.size(), e.name.size() - dir.size() - 5));
      if (n.find('/') == std::string::npos) names.push_back(n);
    }
    for (const auto& n : names)
      if (n == "model") return n;
    if (names.size() == 1) return names.front();
    if (names.empty()) {
      for (const auto& e : dir_->entries()) {
        if (e.name.rfind(prefix_ + "data/aotinductor/", 0) == 0) {
          throw InputError(name_, "an AOTInductor package without an exported program "
                                  "(models/*.json): fsdp-plan reads the program that "
                                  "torch.export.save writes");
        }
      }
      missing("models/model.json");
    }
    std::string list;
    for (const auto& n : names) list += (list.empty() ? "" : ", ") + printable(n);
    throw InputError(name_, "a torch.export archive with several programs (" + list +
                                ") and none named \"model\"; fsdp-plan plans the one "
                                "torch.export.load would load");
  }

  // A record's bytes, checked against the directory: a sane size that fits
  // in the file, and the stored CRC-32.
  std::string read(const std::string& record, uint64_t max_size) {
    std::string out;
    read_in_place(record, max_size, out, false);
    return out;
  }

  // As read(), but where the record lies in the file when it can (stored,
  // with kModelPadding bytes after it): then `copy` stays empty. Else the
  // view is empty, with no data(), and `copy` holds the bytes.
  std::string_view read_in_place(const std::string& record, uint64_t max_size, std::string& copy,
                                 bool in_place = true) {
    const zip::Entry* e = dir_->find(prefix_ + record);
    if (!e) missing(record);
    const std::string damaged = "record " + record + " is damaged (";
    const std::string again = "); " + std::string(kSaveExportAgain);
    const uint64_t limit = dir_->max_honest_size(*e);
    const bool bomb = e->method != 0 && e->uncomp_size > e->comp_size * kMaxJsonRatio + 4096;
    if (e->uncomp_size > max_size || e->uncomp_size > limit || bomb) {
      throw InputError(name_, "record " + record + " claims to be " + std::to_string(e->uncomp_size) +
                                  " bytes, more than " +
                                  (e->uncomp_size > limit
                                       ? e->method == 0 ? "the file holds (" + std::to_string(dir_->file_size()) + " bytes)"
                                                        : std::string("its compressed data can give")
                                   : bomb ? std::to_string(kMaxJsonRatio) + " times its " + std::to_string(e->comp_size) +
                                                " compressed bytes, which no honest record deflates to (a deflate bomb?)"
                                          : "a JSON record of a model can be (" +
                                                (max_size >= (1u << 20) ? std::to_string(max_size >> 20) + " MiB)"
                                                                        : std::to_string(max_size) + " bytes)")) +
                                  ": the file is damaged; " + kSaveExportAgain);
    }
    std::optional<std::string_view> view;
    try {
      if (in_place) view = dir_->view(*e, options_.verify_crc, kModelPadding);
      if (!view) copy = dir_->read(*e, options_.verify_crc);
    } catch (const zip::Error& err) {
      throw InputError(name_, damaged + err.what() + again);
    }
    stats_.bytes_read = dir_->bytes_read();
    stats_.records_read.push_back(record);
    return view ? *view : std::string_view();
  }

  std::string name_;
  Open open_;
  ExportReadStats& stats_;
  ExportOptions options_;
  std::unique_ptr<zip::Reader> dir_;
  std::string prefix_;  // "model/": torch names the top folder after the file
};

ModuleTree guarded(const std::string& name, const std::function<ModuleTree()>& load) {
  try {
    return load();
  } catch (const InputError& e) {
    throw InputError(name, printable(e.what()));
  } catch (const std::bad_alloc&) {
    throw InputError(name, "cannot read torch.export archive: out of memory; the file is damaged or too big");
  } catch (const std::length_error&) {
    throw InputError(name, "cannot read torch.export archive: out of memory; the file is damaged or too big");
  }
}

}  // namespace

bool is_export_archive(const zip::Reader& zip) { return looks_exported(zip); }

ModuleTree load_export(const std::string& path, std::unique_ptr<zip::Reader> zip) {
  ExportReadStats local;
  return guarded(path, [&] { return Archive(path, [&] { return std::move(zip); }, local, {}).load(); });
}

ModuleTree load_export(const std::string& path, ExportReadStats* stats, const ExportOptions& options) {
  ExportReadStats local;
  return guarded(path, [&] {
    return Archive(path, [&] { return zip::Reader::open_file(path); }, stats ? *stats : local, options).load();
  });
}

ModuleTree load_export_bytes(const std::string& name, const void* data, size_t size,
                             ExportReadStats* stats, const ExportOptions& options) {
  ExportReadStats local;
  return guarded(name, [&] {
    return Archive(name, [&] { return zip::Reader::open_memory(data, size); }, stats ? *stats : local,
                   options).load();
  });
}

}  // namespace fsdp_plan
