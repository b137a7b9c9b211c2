#include "export_loader.h"
#include "loader.h"

namespace fsdp_plan {

ModuleTree load_model(const std::string& path, LoaderKind kind) {
  // A torch.export archive is recognised by its records, whatever its name;
  // it has one loader whatever --loader says (the choice is TorchScript's).
  if (is_export_archive(path)) return load_export(path);
  switch (kind) {
    case LoaderKind::Archive: return load_archive(path);
    case LoaderKind::Jit: return load_with_jit(path);
  }
  return load_archive(path);
}

}  // namespace fsdp_plan
