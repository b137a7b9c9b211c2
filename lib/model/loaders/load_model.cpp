#include <cstring>
#include <filesystem>
#include <fstream>

#include "model/loaders/archive_loader.h"
#include "model/loaders/export_loader.h"
#include "model/loaders/loader.h"
#include "model/loaders/tree_loader.h"
#include "model/loaders/zip_reader.h"

namespace fsdp_plan {
namespace {

// The file's zip directory, or nullptr when it is not a readable zip (the
// loader then says what is wrong). Read once for the format check and the
// loader: on 150,000 records that costs more than planning.
std::unique_ptr<zip::Reader> open_if_zip(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return nullptr;
  char head[4] = {};
  {
    std::ifstream in(path, std::ios::binary);
    if (!in.read(head, 4) || std::memcmp(head, "PK\x03\x04", 4) != 0) return nullptr;
  }
  try {
    return zip::Reader::open_file(path);
  } catch (const std::exception&) {
    return nullptr;
  }
}

}  // namespace

ModuleTree load_model(const std::string& path, LoaderKind kind) {
  // A torch.export archive is recognised by its records, whatever its name;
  // it has one loader whatever --loader says (the choice is TorchScript's).
  std::unique_ptr<zip::Reader> zip = open_if_zip(path);
  if (zip && is_export_archive(*zip)) return load_export(path, std::move(zip));
  // A live module's tree (fsdp_plan.tree): JSON, which no model file is.
  if (!zip && looks_like_json_object(path)) return load_tree_json(path);
  switch (kind) {
    case LoaderKind::Archive: return zip ? load_archive(path, std::move(zip)) : load_archive(path);
    case LoaderKind::Jit:
      // LibTorch's reader and parser trust the file: our limits first.
      try {
        check_archive_for_jit(path, std::move(zip));
      } catch (const InputError& e) {
        throw JitPreflightError(e.file(), e.what());
      }
      return load_with_jit(path);
  }
  return load_archive(path);
}

}  // namespace fsdp_plan
