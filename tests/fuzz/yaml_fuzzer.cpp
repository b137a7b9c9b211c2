// libFuzzer target: any bytes as an Accelerate config (--policy CONFIG.yaml),
// read as accelerate launch reads it (libyaml under PyYAML's rules, then the
// launcher's and the plugin's checks), and resolved against a small model so
// that fsdp_ignored_modules goes through RE2. It must return a config or
// throw InputError; anything else (a crash, another exception, a sanitizer
// report, a hang or an allocation past libFuzzer's limits) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "accelerate/config.h"
#include "util/errors.h"

namespace {

const fsdp_plan::ModuleTree& model() {
  static const fsdp_plan::ModuleTree tree = [] {
    fsdp_plan::ModuleTree t;
    t.module(0).type_name = "__torch__.models.TinyGPT";
    const auto blocks = t.add_module(0, "blocks", "__torch__.torch.nn.modules.container.ModuleList");
    for (const char* b : {"0", "1"}) {
      const auto block = t.add_module(blocks, b, "__torch__.models.Block");
      t.add_module(block, "attn", "__torch__.models.CausalSelfAttention");
      t.add_module(block, "mlp", "__torch__.models.MLP");
    }
    t.add_module(0, "lm_head", "__torch__.torch.nn.modules.linear.Linear");
    return t;
  }();
  return tree;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    fsdp_plan::AccelerateConfig config = fsdp_plan::parse_accelerate_config(text, "fuzz.yaml");
    fsdp_plan::resolve_accelerate_config(config, model());
    if (config.policy.fsdp.v2()) fsdp_plan::apply_accelerate_fsdp2(config, model());
  } catch (const fsdp_plan::InputError&) {
  }
  return 0;
}
