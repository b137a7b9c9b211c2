// The parts of an Accelerate config that the FSDP1 and FSDP2 --emit accelerate
// writers share: keys in the order `accelerate config` writes them (sorted),
// bare class names as Accelerate looks them up, and the refusal message.
#pragma once

#include <string>
#include <vector>

#include "plan/plan.h"
#include "policy/policy.h"

namespace fsdp_plan {

// Throws EmitError: "Accelerate's config cannot say this plan: WHY; --emit torch ...".
[[noreturn]] void refuse_accelerate(const std::string& why);

// A unit as the refusals name it: its module's path or "(root)", and an FSDP2
// call on several modules as "[a, b]"; units_text: all of them, as "[...]".
std::string unit_text(const Plan& plan, const Unit& u);
std::string units_text(const Plan& plan);

// The policy's classes as Accelerate matches them: bare names, each once.
std::vector<std::string> bare_class_names(const Policy& p);

// mixed_precision for one dtype: bf16 or fp16; refused otherwise.
std::string accelerate_mixed_precision(const std::string& dtype);

// From compute_environment to fsdp_activation_checkpointing (inside fsdp_config),
// true when the plan checkpoints modules.
std::string accelerate_yaml_head(const std::string& comment, bool activation_checkpointing);
// Where the modules a read-back plan checkpoints (Accelerate's choice for the
// emitted config) differ from the plan's, or "".
std::string checkpointing_difference(const Plan& want, const Plan& got);
// fsdp_transformer_layer_cls_to_wrap's line, or "" for no classes.
std::string accelerate_yaml_classes(const std::vector<std::string>& classes);
// num_machines: world_size / gpus_per_node (an Accelerate config's num_machines
// reads into hardware.gpus_per_node = nproc_per_node), or 1 when not given or not a divisor.
int64_t accelerate_machines(const Plan& plan);
// machine_rank to num_processes.
std::string accelerate_yaml_launch(const std::string& mixed_precision, int64_t machines, int64_t processes);
// rdzv_backend to use_cpu.
std::string accelerate_yaml_tail();

}  // namespace fsdp_plan
