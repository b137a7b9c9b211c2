#include "fsdp_options.h"

#include <spdlog/spdlog.h>

#include <stdexcept>

#include "mesh/device_mesh.h"
#include "model/graph.h"
#include "policy/expert_parallel.h"
#include "time/flop_file.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

// CLI11's PositiveNumber prints its whole double range; say it plainly instead.
const CLI::Validator kPositiveCount(
    [](std::string& text) -> std::string {
      try {
        size_t used = 0;
        long long v = std::stoll(text, &used);
        if (used == text.size() && v >= 1 && v <= kMaxWorldSize) return "";
      } catch (const std::exception&) {
      }
      return "must be a whole number from 1 to " + std::to_string(kMaxWorldSize) + ", not " + text;
    },
    "N");

// --module-classes A,B (and --compile A,B): names split at commas, spaces around them dropped.
std::vector<std::string> class_list(const std::string& text, const std::string& option = "--module-classes") {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t comma = text.find(',', pos);
    std::string name = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    name.erase(0, name.find_first_not_of(" \t"));
    name.erase(name.find_last_not_of(" \t") + 1);
    if (name.empty())
      throw UsageError(option + " \"" + text + "\": an empty class name; give names separated by commas, "
                       "e.g. " + option + " LlamaDecoderLayer,LlamaRMSNorm");
    if (name.find_first_of(" \t") != std::string::npos)
      throw UsageError(option + " \"" + text + "\": \"" + name + "\" is not a class name (a space inside); "
                       "separate names with commas");
    out.push_back(std::move(name));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return out;
}

}  // namespace

void add_fsdp_options(CLI::App& app, FsdpOptions& opt, const std::string& policy_help,
                      const std::string& version_help) {
  app.add_option("-p,--policy", opt.policy, policy_help);
  app.add_option("--module-classes", opt.module_classes,
                 "wrap these classes, comma-separated (ModuleWrapPolicy; short or dotted names, matched as "
                 "isinstance): replaces the policy's module_classes, or an Accelerate config's "
                 "fsdp_transformer_layer_cls_to_wrap as accelerate launch's flag of that name does")
      ->type_name("A,B");
  app.add_option("--compile", opt.compile,
                 "compile these classes' modules, comma-separated (torch.compile per block, as torchtitan does): "
                 "replaces the policy's compile.module_classes; their saves are the min-cut partitioner's")
      ->type_name("A,B");
  const char* group = "FSDP settings (override the policy's \"fsdp\")";
  app.add_option("--world-size", opt.world_size, "ranks, for the memory model (default 1)")->check(kPositiveCount)->group(group);
  app.add_option("--sharding-strategy", opt.strategy, "FSDP sharding strategy (default FULL_SHARD)")
      ->check(CLI::IsMember(strategy_names().names()))->group(group);
  app.add_option("--shard-group-size", opt.shard_group_size,
                 "HYBRID_SHARD: ranks a parameter is sharded over (default min(8, world size))")
      ->check(kPositiveCount)
      ->group(group);
  app.add_flag("--use-orig-params", opt.use_orig_params, "FSDP use_orig_params=True (adds alignment padding)")
      ->group(group);
  app.add_option("--optimizer", opt.optimizer, "optimizer state for the memory model (default adam)")
      ->check(CLI::IsMember(optimizer_names().names()))->group(group);
  app.add_option("--optimizer-impl", opt.optimizer_impl,
                 "how torch.optim runs Adam's step, which decides its temporaries (default: PyTorch's choice, "
                 "foreach on CUDA for FSDP2 or use_orig_params, else for-loop)")
      ->check(CLI::IsMember(optimizer_impl_names().names()))->group(group);
  app.add_option("--grad-accum", opt.grad_accumulation,
                 "micro-steps per optimizer step (fsdp.gradient_accumulation_steps, default 1): the later ones run "
                 "with the earlier ones' gradients held")
      ->check(CLI::Range(int64_t{1}, kMaxAccumulationSteps))->group(group);
  app.add_flag("--no-sync", opt.no_sync,
               "with --grad-accum: all micro-steps but the last skip the reduce-scatter (FSDP1 no_sync(), FSDP2 "
               "set_requires_gradient_sync(False)), keeping every unsharded gradient (fsdp.no_sync)")
      ->group(group);
  app.add_option("--fsdp-version", opt.fsdp_version, version_help)->check(CLI::IsMember({1, 2}))->group(group);
  const char* acts = "Activations (from a .pt2 graph)";
  app.add_option("--device", opt.device,
                 "the device the training step runs on: its kernels decide what autograd saves (default cuda; "
                 "cpu: what the CPU-run tests measure)")
      ->check(CLI::IsMember(device_names().names()))
      ->group(acts);
  app.add_option("--sdpa", opt.sdpa,
                 "the attention kernel scaled_dot_product_attention runs: flash, efficient, cudnn or math (default: "
                 "what the device picks for each call); the math kernel keeps the seq x seq probabilities")
      ->check(CLI::IsMember(sdpa_names().names()))
      ->group(acts);
  app.add_option("--dim", opt.dims,
                 "a dynamic dimension of a .pt2 at the value to plan, e.g. --dim batch=2 --dim seq=8192 (repeatable; "
                 "default: the value the export traced; names: batch and seq of input_ids, or the input name and "
                 "index, e.g. input_ids.1)")
      ->type_name("NAME=VALUE")
      ->group(acts);
  // Read as text: CLI11 would take "nan" and "inf" for numbers.
  app.add_option_function<std::string>(
         "--moe-imbalance",
         [&opt](const std::string& text) {
           size_t used = 0;
           double v = 0;
           try {
             v = std::stod(text, &used);
           } catch (const std::exception&) {
             used = 0;
           }
           if (used != text.size() || text.empty() || !imbalance_error(v).empty())
             throw CLI::ValidationError("--moe-imbalance", imbalance_error(0) + ", not " + text);
           opt.moe_imbalance = v;
         },
         "skewed routing under expert_parallel: the busiest ep rank receives F x the mean routed rows (tokens x "
         "top_k); the plan is that rank's (default 1: uniform; at most the ep degree)")
      ->type_name("F")
      ->group(acts);

  const char* time = "Step-time estimate (override the policy's \"hardware\"; docs/time-model.md)";
  app.add_option("--hardware", opt.hardware, "GPU preset: peak FLOP/s, HBM, NVLink, network (default h100)")
      ->check(CLI::IsMember(hardware_names().names()))
      ->group(time);
  app.add_option("--gpus-per-node", opt.gpus_per_node, "GPUs per node (default 8): ranks r and s share NVLink when r / N "
                                                       "== s / N; suggest advises world sizes past one node in "
                                                       "whole nodes")
      ->check(kPositiveCount)  // the --world-size message, not CLI11's "Value 0 not in range"
      ->group(time);
  opt.hardware_figures.assign(hardware_fields().size(), std::nullopt);
  for (size_t i = 0; i < hardware_fields().size(); ++i) {
    const HardwareField& f = hardware_fields()[i];
    // Read as text: CLI11 would take "nan" and "inf" for numbers; load_policy says why they are refused.
    app.add_option_function<std::string>(
           f.option,
           [&opt, i, f](const std::string& text) {
             double v = 0;
             size_t used = 0;
             const char* what = f.efficiency ? "a fraction of the peak, e.g. 0.5" : "GB/s, e.g. 400";
             try {
               v = std::stod(text, &used);
             } catch (const std::out_of_range&) {  // 1e400: a number, but no double holds it
               throw CLI::ValidationError(f.option, std::string("must be a finite number (") + what + "), not " + text);
             } catch (const std::exception&) {
               used = 0;
             }
             if (used != text.size() || text.empty())
               throw CLI::ValidationError(f.option, std::string("must be a number (") + what + "), not " + text);
             opt.hardware_figures[i] = v;
           },
           f.help)
        ->type_name(f.efficiency ? "F" : "GBPS")
        ->group(time);
  }
  app.add_option("--flops", opt.flops,
                 "FLOPs of one training step per module, as JSON ({\"modules\": {path: {\"forward\", "
                 "\"backward\"}}}, FlopCounterMode's figures; tests/timing/flop_oracle.py writes them): gives the "
                 "estimate its compute time; without it a TorchScript model gets exposed communication only")
      ->type_name("FILE")
      ->group(time);
}

std::string activation_bytes_error(const std::string& text) {
  const std::optional<int64_t> v = parse_size(text);
  if (!v) return "\"" + text + "\" is not a size (e.g. 20GiB)";
  if (*v > ActivationSettings::kMaxAllowanceBytes)
    return "\"" + text + "\" is more than an allowance can be (4PiB, 2^52 bytes; docs/limits.md)";
  return "";
}

std::optional<FlopProfile> load_flops(const FsdpOptions& opt, const ModuleTree& tree) {
  if (opt.flops.empty()) return std::nullopt;
  return load_flop_file(opt.flops, tree);
}

PolicyFile load_policy(const FsdpOptions& opt) {
  PolicyOverrides overrides;
  if (opt.module_classes) overrides.module_classes = class_list(*opt.module_classes);
  PolicyFile file = read_policy_file(opt.policy, overrides);
  FsdpSettings& fsdp = file.policy.fsdp;
  if (opt.world_size) {
    fsdp.world_size = *opt.world_size;
    fsdp.world_size_given = true;
  }
  if (opt.shard_group_size) fsdp.shard_group_size = *opt.shard_group_size;
  if (opt.strategy) fsdp.strategy = *strategy_names().parse(*opt.strategy);
  if (opt.optimizer) fsdp.optimizer = *optimizer_names().parse(*opt.optimizer);
  if (opt.optimizer_impl) fsdp.optimizer_impl = *optimizer_impl_names().parse(*opt.optimizer_impl);
  if (opt.use_orig_params) fsdp.use_orig_params = true;
  if (opt.grad_accumulation) fsdp.gradient_accumulation_steps = *opt.grad_accumulation;
  if (opt.no_sync) fsdp.no_sync = true;
  if (opt.fsdp_version) set_fsdp_version(file, *parse_version(*opt.fsdp_version));
  if (opt.device) file.policy.activations.device = *device_names().parse(*opt.device);
  if (opt.sdpa) file.policy.activations.sdpa = *sdpa_names().parse(*opt.sdpa);
  for (const std::string& d : opt.dims) {
    try {
      file.policy.activations.dims.push_back(parse_dim_arg(d));
    } catch (const std::invalid_argument& e) {
      throw UsageError("--dim " + d + ": " + e.what());
    }
  }
  if (opt.compile) file.policy.compile = CompileConfig{class_list(*opt.compile, "--compile")};
  if (std::string why = device_mesh_error(fsdp); !why.empty()) throw UsageError(why);
  if (opt.moe_imbalance) {
    if (!file.policy.expert_parallel)
      throw UsageError("--moe-imbalance: the policy has no \"expert_parallel\" section; skewed routing only "
                       "changes a plan whose experts are split over ep ranks");
    file.policy.expert_parallel->imbalance = *opt.moe_imbalance;
    if (std::string why = imbalance_over_degree(*file.policy.expert_parallel); !why.empty())
      throw UsageError("--moe-imbalance " + why);
  }
  HardwareSettings& hw = file.policy.hardware;
  if (opt.hardware) {
    hw.preset = *hardware_names().parse(*opt.hardware);
    hw.preset_given = true;
  }
  if (opt.gpus_per_node) hw.gpus_per_node = *opt.gpus_per_node;
  for (size_t i = 0; i < opt.hardware_figures.size(); ++i) {
    if (!opt.hardware_figures[i]) continue;
    const HardwareField& f = hardware_fields()[i];
    if (std::string why = hardware_value_error(f.option, *opt.hardware_figures[i], f.efficiency); !why.empty())
      throw UsageError(why);
    hw.*f.field = *opt.hardware_figures[i];
  }
  if (fsdp.shard_group_size > 0 && fsdp.strategy != ShardingStrategy::HybridShard)
    spdlog::warn("the shard group size ({}) is ignored: only HYBRID_SHARD uses it, and the strategy is {}",
                 fsdp.shard_group_size, strategy_name(fsdp.strategy));
  if (std::string why = file.policy.combination_error(); !why.empty()) throw UsageError(why);
  const TensorParallel* tp = file.policy.tensor_parallel ? &*file.policy.tensor_parallel : nullptr;
  const ExpertParallel* ep = file.policy.expert_parallel ? &*file.policy.expert_parallel : nullptr;
  const ContextParallel* cp = file.policy.context_parallel ? &*file.policy.context_parallel : nullptr;
  if (std::string why = device_mesh_error(fsdp, tp, ep, cp); !why.empty()) throw UsageError(why);
  return file;
}

}  // namespace fsdp_plan
