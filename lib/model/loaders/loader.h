// Model loaders: the only code that includes torch headers. Each turns a
// TorchScript archive into a ModuleTree, or throws InputError naming the file.
#pragma once

#include <string>

#include "model/module_tree.h"
#include "util/errors.h"

namespace fsdp_plan {

enum class LoaderKind {
  Archive,  // structure only: data.pkl and the class headers in code/, no weights, no compiling
  Jit,  // torch::jit::load: reads every byte, compiles every method
};

ModuleTree load_model(const std::string& path, LoaderKind kind);

// What the structure reader's checks refuse before --loader jit hands the
// file to LibTorch (check_archive_for_jit): a damaged or hostile file, which
// the default loader refuses too.
class JitPreflightError : public InputError {
 public:
  using InputError::InputError;
};

// One loader each; load_model dispatches.
ModuleTree load_with_jit(const std::string& path);
ModuleTree load_archive(const std::string& path);

}  // namespace fsdp_plan
