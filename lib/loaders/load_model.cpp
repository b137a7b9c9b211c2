#include "loader.h"

namespace fsdp_plan {

ModuleTree load_model(const std::string& path, LoaderKind kind) {
  switch (kind) {
    case LoaderKind::Archive: return load_archive(path);
    case LoaderKind::Jit: return load_with_jit(path);
  }
  return load_archive(path);
}

}  // namespace fsdp_plan
