#include "loader.h"

namespace fsdp_plan {

ModuleTree load_model(const std::string& path, LoaderKind kind) {
  switch (kind) {
    case LoaderKind::Jit: return load_with_jit(path);
  }
  return load_with_jit(path);
}

}  // namespace fsdp_plan
