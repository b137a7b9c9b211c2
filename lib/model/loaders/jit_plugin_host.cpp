// --loader jit: finds the LibTorch plugin and dlopens it, so that LibTorch is
// mapped only when asked for. Torch-free.
#include <dlfcn.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "model/dtype.h"
#include "model/loaders/jit_plugin.h"
#include "model/loaders/loader.h"
#include "util/errors.h"

#ifndef FSDP_PLAN_JIT_PLUGIN_BUILD_PATH
#define FSDP_PLAN_JIT_PLUGIN_BUILD_PATH ""
#endif

namespace fsdp_plan {
namespace {

const char kPluginName[] = "fsdp_plan_jit.so";

// $FSDP_PLAN_JIT_PLUGIN, then beside the executable, then ../lib/fsdp-plan/,
// then where the build put it.
std::vector<std::string> candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("FSDP_PLAN_JIT_PLUGIN"); env && *env) out.emplace_back(env);
  std::error_code ec;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / kPluginName).string());
    out.push_back((exe.parent_path().parent_path() / "lib" / "fsdp-plan" / kPluginName).string());
  }
  if (*FSDP_PLAN_JIT_PLUGIN_BUILD_PATH) out.emplace_back(FSDP_PLAN_JIT_PLUGIN_BUILD_PATH);
  return out;
}

struct Plugin {
  fsdp_plan_jit_load_fn load = nullptr;
};

Plugin open_plugin(const std::string& model) {
  for (const std::string& path : candidates()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) continue;
    // Never closed: LibTorch does not expect to be unloaded.
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      std::string why = dlerror();
      throw InputError(model, "--loader jit is not available: cannot load " + path + ": " +
                                  why.substr(0, why.find('\n')));
    }
    auto abi = reinterpret_cast<fsdp_plan_jit_abi_fn>(dlsym(h, "fsdp_plan_jit_abi"));
    Plugin p;
    p.load = reinterpret_cast<fsdp_plan_jit_load_fn>(dlsym(h, "fsdp_plan_jit_load"));
    if (!abi || !p.load || abi() != FSDP_PLAN_JIT_ABI) {
      throw InputError(model, "--loader jit is not available: " + path + " is not a plugin of this fsdp-plan");
    }
    return p;
  }
  throw InputError(model, "--loader jit is not available: this fsdp-plan was built without LibTorch "
                          "(no fsdp_plan_jit.so beside it); the default loader reads the same tree");
}

struct Builder {
  ModuleTree tree;
  std::vector<TensorId> tensors;
  std::string error;
};

fsdp_plan_jit_sink make_sink(Builder& b) {
  fsdp_plan_jit_sink s{};
  s.ctx = &b;
  s.set_root_type = [](void* ctx, const char* type) { static_cast<Builder*>(ctx)->tree.module(0).type_name = type; };
  s.add_module = [](void* ctx, int32_t parent, const char* name, const char* type) -> int32_t {
    return static_cast<int32_t>(static_cast<Builder*>(ctx)->tree.add_module(parent, name, type));
  };
  s.add_tensor = [](void* ctx, const int64_t* shape, size_t ndim, const char* stem, int grad) -> int64_t {
    auto& b = *static_cast<Builder*>(ctx);
    TensorInfo info;
    info.shape.assign(shape, shape + ndim);
    const DtypeInfo* d = dtype_from_stem(stem);
    info.dtype = d ? d->name : stem;
    info.itemsize = d ? d->itemsize : 0;
    if (!d && b.error.empty()) b.error = std::string("a tensor of dtype ") + stem + ", unknown to fsdp-plan";
    info.requires_grad = grad != 0;
    b.tensors.push_back(b.tree.add_tensor(std::move(info)));
    return static_cast<int64_t>(b.tensors.size() - 1);
  };
  s.add_param = [](void* ctx, int32_t m, const char* name, int64_t t) {
    auto& b = *static_cast<Builder*>(ctx);
    b.tree.add_param(m, name, b.tensors[static_cast<size_t>(t)]);
  };
  s.add_buffer = [](void* ctx, int32_t m, const char* name, int64_t t) {
    auto& b = *static_cast<Builder*>(ctx);
    b.tree.add_buffer(m, name, b.tensors[static_cast<size_t>(t)]);
  };
  return s;
}

}  // namespace

ModuleTree load_with_jit(const std::string& path) {
  static const Plugin plugin = open_plugin(path);
  Builder b;
  const fsdp_plan_jit_sink sink = make_sink(b);
  char err[1024] = "";
  if (plugin.load(path.c_str(), &sink, err, sizeof err) != 0) throw InputError(path, err);
  if (!b.error.empty()) throw InputError(path, b.error);
  return std::move(b.tree);
}

}  // namespace fsdp_plan
