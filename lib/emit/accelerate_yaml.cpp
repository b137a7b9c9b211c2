#include "emit/accelerate_yaml.h"

#include <algorithm>

#include "emit/emit.h"
#include "model/class_names.h"
#include "util/strings.h"

namespace fsdp_plan {

void refuse_accelerate(const std::string& why) {
  throw EmitError("Accelerate's config cannot say this plan: " + why +
                  "; --emit torch writes PyTorch code for this plan");
}

std::string unit_text(const Plan& plan, const Unit& u) {
  auto path = [&](ModuleId m) { return path_or_root(plan.tree->path(m)); };
  if (u.modules.size() < 2) return path(u.module);
  std::string out;
  for (ModuleId m : u.modules) out += (out.empty() ? "" : ", ") + path(m);
  return "[" + out + "]";
}

std::string units_text(const Plan& plan) {
  std::string out;
  for (const Unit& u : plan.units) out += (out.empty() ? "" : ", ") + unit_text(plan, u);
  return "[" + out + "]";
}

std::vector<std::string> bare_class_names(const Policy& p) {
  std::vector<std::string> out;
  if (p.module_classes)
    for (const auto& c : *p.module_classes) {
      std::string bare(short_name(c));
      if (std::find(out.begin(), out.end(), bare) == out.end()) out.push_back(bare);
    }
  return out;
}

std::string accelerate_mixed_precision(const std::string& dtype) {
  if (dtype == "bfloat16") return "bf16";
  if (dtype == "float16") return "fp16";
  refuse_accelerate("mixed precision in " + dtype + "; Accelerate's mixed_precision is bf16 or fp16");
}

std::string accelerate_yaml_head(const std::string& comment, bool activation_checkpointing) {
  return "# " + comment + "\n"
         "compute_environment: LOCAL_MACHINE\n"
         "debug: false\n"
         "distributed_type: FSDP\n"
         "downcast_bf16: 'no'\n"
         "enable_cpu_affinity: false\n"
         "fsdp_config:\n"
         "  fsdp_activation_checkpointing: " + std::string(activation_checkpointing ? "true" : "false") + "\n";
}

std::string checkpointing_difference(const Plan& want, const Plan& got) {
  // fsdp_activation_checkpointing is full checkpointing: Accelerate 1.15 has no selective one.
  if (want.policy.activation_checkpointing && want.policy.activation_checkpointing->selective())
    return "activation checkpointing: the plan checkpoints selectively (\"mode\": \"selective\"), and Accelerate "
           "has no key for it (fsdp_activation_checkpointing checkpoints each module fully)";
  auto paths = [](const Plan& plan) {
    std::vector<std::string> out;
    for (const CheckpointedModule& c : plan.activations.checkpointed) out.push_back(plan.tree->path(c.module));
    return out;
  };
  const std::vector<std::string> a = paths(want), b = paths(got);
  if (a == b) return "";
  auto list = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& p : v) out += (out.empty() ? "" : ", ") + (p.empty() ? std::string("(root)") : p);
    return "[" + out + "]";
  };
  // fsdp_activation_checkpointing is one switch: Accelerate checkpoints what its wrap policy wraps
  // (accelerator.py prepare_model, FSDP1; utils/fsdp_utils.py fsdp2_apply_ac, FSDP2).
  return "activation checkpointing: Accelerate checkpoints the modules its wrap policy picks, " + list(b) +
         " for this config, and the plan checkpoints " + list(a);
}

std::string accelerate_yaml_classes(const std::vector<std::string>& classes) {
  if (classes.empty()) return "";
  std::string list;
  for (const auto& c : classes) list += (list.empty() ? "" : ",") + c;
  return "  fsdp_transformer_layer_cls_to_wrap: " + list + "\n";
}

int64_t accelerate_machines(const Plan& plan) {
  const int64_t world = plan.memory.settings.world_size;
  const auto& per_node = plan.policy.hardware.gpus_per_node;
  return per_node && *per_node > 0 && *per_node < world && world % *per_node == 0 ? world / *per_node : 1;
}

std::string accelerate_yaml_launch(const std::string& mixed_precision, int64_t machines, int64_t processes) {
  return "machine_rank: 0\n"
         "main_training_function: main\n"
         "mixed_precision: " + mixed_precision + "\n"
         "num_machines: " + std::to_string(machines) + "\n"
         "num_processes: " + std::to_string(processes) + "\n";
}

std::string accelerate_yaml_tail() {
  return "rdzv_backend: static\n"
         "same_network: true\n"
         "tpu_env: []\n"
         "tpu_use_cluster: false\n"
         "tpu_use_sudo: false\n"
         "use_cpu: false\n";
}

}  // namespace fsdp_plan
