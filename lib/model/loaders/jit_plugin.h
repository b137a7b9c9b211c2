// The C interface between fsdp-plan and the LibTorch plugin (fsdp_plan_jit.so,
// built from jit_loader.cpp only where LibTorch is found). Plain C, so the
// plugin may be built against another LibTorch, even another C++ ABI, than
// the one (if any) fsdp-plan was built next to; it is dlopen'ed only for
// --loader jit, so a default plan never maps LibTorch.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FSDP_PLAN_JIT_ABI 1

// Receives the tree as the plugin walks it, in the order ModuleTree wants.
struct fsdp_plan_jit_sink {
  void* ctx;
  void (*set_root_type)(void* ctx, const char* type_name);
  int32_t (*add_module)(void* ctx, int32_t parent, const char* name, const char* type_name);
  // dtype_stem as c10::toString(ScalarType) spells it: "Float", "BFloat16".
  int64_t (*add_tensor)(void* ctx, const int64_t* shape, size_t ndim, const char* dtype_stem,
                        int requires_grad);
  void (*add_param)(void* ctx, int32_t module, const char* name, int64_t tensor);
  void (*add_buffer)(void* ctx, int32_t module, const char* name, int64_t tensor);
};

// Returns FSDP_PLAN_JIT_ABI.
typedef int (*fsdp_plan_jit_abi_fn)(void);
// Loads path with torch::jit::load and walks it into sink. 0 on success;
// otherwise 2 and a one-line message in err (NUL-terminated, err_len bytes at most).
typedef int (*fsdp_plan_jit_load_fn)(const char* path, const struct fsdp_plan_jit_sink* sink,
                                     char* err, size_t err_len);
// The LibTorch version the plugin was built against, e.g. "1.13.1".
typedef const char* (*fsdp_plan_jit_version_fn)(void);

#ifdef __cplusplus
}
#endif
