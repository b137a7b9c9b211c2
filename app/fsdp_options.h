// The options of every command that plans (fsdp-plan, fsdp-plan suggest):
// the policy file and the FSDP settings that override its "fsdp" object,
// added to a command line and applied to the policy in one place.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "plan/flops.h"
#include "planner/policy_file.h"

namespace fsdp_plan {

// A command line that parses but makes no sense (exit 2, no file to name).
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct FsdpOptions {
  std::string policy;  // --policy: a JSON policy or an Accelerate config
  std::optional<std::string> module_classes;  // --module-classes A,B
  std::optional<std::string> compile;         // --compile A,B: the policy's compile.module_classes
  std::optional<int64_t> world_size, shard_group_size;
  std::optional<std::string> strategy, optimizer, optimizer_impl;
  std::optional<int> fsdp_version;
  bool use_orig_params = false;
  std::optional<int64_t> grad_accumulation;  // --grad-accum N: fsdp.gradient_accumulation_steps
  bool no_sync = false;                       // --no-sync: fsdp.no_sync
  // Activations from a .pt2 graph: whose kernels (--device) and which attention kernel (--sdpa).
  std::optional<std::string> device, sdpa;
  std::vector<std::string> dims;  // --dim NAME=VALUE, repeatable: a dynamic export's dimensions
  std::optional<double> moe_imbalance;  // --moe-imbalance F: expert_parallel.imbalance
  // The step-time estimate (override the policy's "hardware"): --hardware,
  // --gpus-per-node, and one option per row of hardware_fields().
  std::optional<std::string> hardware;
  std::optional<int64_t> gpus_per_node;
  std::vector<std::optional<double>> hardware_figures;  // parallel to hardware_fields()
  std::string flops;  // --flops FILE (time/flop_file.h)
};

// `policy_help` and `version_help` say what the policy and --fsdp-version
// mean to the command.
void add_fsdp_options(CLI::App& app, FsdpOptions& opt, const std::string& policy_help,
                      const std::string& version_help);

// Reads --flops, when given, for `tree`'s modules: nullopt without it.
// Throws InputError naming the file.
std::optional<FlopProfile> load_flops(const FsdpOptions& opt, const ModuleTree& tree);

// --activation-bytes SIZE, as CLI11 validators return it: "" when it is a size
// of at most ActivationSettings::kMaxAllowanceBytes, else why not.
std::string activation_bytes_error(const std::string& text);

// Reads the policy file and applies the settings given on the command line.
// Throws InputError for a bad file, UsageError for settings FSDP would refuse.
PolicyFile load_policy(const FsdpOptions& opt);

}  // namespace fsdp_plan
