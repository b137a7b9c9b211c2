#include "accelerate/config.h"

#include <re2/re2.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <optional>

#include "accelerate/py_value.h"
#include "accelerate/python_regex.h"
#include "accelerate/pyyaml.h"
#include "mesh/device_mesh.h"
#include "model/loaders/printable.h"
#include "util/checked.h"
#include "util/errors.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isdigit(c); });
}

// ClusterConfig's dataclass fields (plus fp16 and dynamo_backend, which
// process_config converts): any other top-level key is an error.
const std::vector<std::string> kTopKeys = {
    "compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug", "num_processes",
    "machine_rank", "num_machines", "gpu_ids", "main_process_ip", "main_process_port", "rdzv_backend",
    "same_network", "main_training_function", "enable_cpu_affinity", "fp8_config", "deepspeed_config",
    "fsdp_config", "parallelism_config", "megatron_lm_config", "mpirun_config", "downcast_bf16", "tpu_name",
    "tpu_zone", "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands", "tpu_vm", "tpu_env",
    "dynamo_config", "fp16", "dynamo_backend"};

// The launcher's FSDP arguments and their argparse defaults (None: not set).
struct LauncherKey {
  const char* key;
  const char* fallback;  // nullptr: None
};
const std::vector<LauncherKey> kFsdpKeys = {
    {"fsdp_version", "1"},
    {"fsdp_offload_params", "false"},
    {"fsdp_min_num_params", "100000000"},
    {"fsdp_sharding_strategy", "FULL_SHARD"},
    {"fsdp_reshard_after_forward", "true"},
    {"fsdp_auto_wrap_policy", nullptr},
    {"fsdp_transformer_layer_cls_to_wrap", nullptr},
    {"fsdp_backward_prefetch", nullptr},
    {"fsdp_state_dict_type", nullptr},
    {"fsdp_forward_prefetch", "false"},
    {"fsdp_use_orig_params", "true"},
    {"fsdp_cpu_ram_efficient_loading", "true"},
    {"fsdp_sync_module_states", "true"},
    {"fsdp_activation_checkpointing", "false"},
    {"fsdp_activation_checkpointing_offload", "false"},
    {"fsdp_ignored_modules", nullptr},  // no CLI flag; read from the file only
};

// Keys from older Accelerate releases and what became of them.
const std::map<std::string, std::string> kStaleKeys = {
    {"fsdp_backward_prefetch_policy",
     "renamed fsdp_backward_prefetch in Accelerate 0.26 (PR #2288) and dropped in 1.0; Accelerate copies it onto "
     "the launch arguments and never reads it, so backward prefetch stays as fsdp_backward_prefetch says"},
    {"fsdp_limit_all_gathers",
     "not a launcher setting: only FullyShardedDataParallelPlugin(limit_all_gathers=...) in Python sets it; "
     "Accelerate copies the key onto the launch arguments and never reads it"},
    {"fsdp_cpu_offload", "not an Accelerate key (Transformers' Trainer spells it that way); the launcher's key is "
                         "fsdp_offload_params, so parameters are not offloaded by this key"},
};

const std::vector<std::string> kStrategies = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD",
                                              "HYBRID_SHARD_ZERO2"};
const std::vector<std::string> kWrapPolicies = {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"};
const std::vector<std::string> kPrefetch = {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"};
const std::vector<std::string> kStateDicts = {"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"};

std::string py_list(const std::vector<std::string>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", '" : "'") + v[i] + "'";
  return out + "]";
}

class Reader {
 public:
  Reader(std::string file, AccelerateOverrides overrides) : file_(std::move(file)), overrides_(std::move(overrides)) {}

  [[noreturn]] void fail(const std::string& what) const { throw InputError(file_, what); }
  // Where accelerate launch (or the plugin it feeds) raises.
  [[noreturn]] void refuse(const std::string& what) const {
    throw InputError(file_, "accelerate launch would stop: " + what);
  }

  AccelerateConfig read(const std::string& text) {
    PyValue top = pyyaml_safe_load(text, file_);
    if (top.kind != PyValue::Dict) fail(not_a_mapping(top, text));
    return read_top(top);
  }

  // ClusterConfig.from_json_file: json.load's values, no YAML resolving.
  AccelerateConfig read_json(const nlohmann::json& doc) { return read_top(py_value_from_json(doc)); }

 private:
  // What the file is instead of the mapping Accelerate's from_yaml_file needs.
  static std::string not_a_mapping(const PyValue& top, const std::string& text) {
    const std::string want = ", not a mapping: an Accelerate config is one (distributed_type: FSDP, fsdp_config: ...)";
    if (top.kind == PyValue::List) return "is a YAML list" + want;
    if (top.kind != PyValue::None) {
      // A file that is not JSON at all (binary, a truncated policy) lands here: show the start, printable.
      std::string shown = py_str(top, true);
      if (shown.size() > 40) shown = shown.substr(0, 36) + "...'";
      for (char& c : shown)
        if (c < 0x20 || c > 0x7e) c = '?';
      return "is a YAML scalar (" + shown + ")" + want + "; a JSON policy starts with {";
    }
    for (size_t at = 0; at < text.size();) {
      size_t end = std::min(text.find('\n', at), text.size());
      size_t first = text.find_first_not_of(" \t\r", at);
      if (first < end && text[first] != '#') return "is a YAML null" + want;
      at = end + 1;
    }
    return "holds no YAML document, only comments or blank lines: an Accelerate config is a mapping "
           "(distributed_type: FSDP, fsdp_config: ...)";
  }

  AccelerateConfig read_top(const PyValue& top) {
    // Keys of neither ClusterConfig nor anything else Accelerate reads: not meant for it.
    if (std::none_of(top.entries.begin(), top.entries.end(), [](const auto& kv) {
          return std::find(kTopKeys.begin(), kTopKeys.end(), kv.first) != kTopKeys.end();
        }))
      fail("a YAML mapping without any of Accelerate's keys (distributed_type, fsdp_config, ...), so not an Accelerate "
           "config; a policy is JSON (policies/policy.schema.json)");
    for (auto& [k, v] : top.entries) top_[k] = v;

    if (top_.count("compute_environment") && py_str(top_["compute_environment"]) == "AMAZON_SAGEMAKER")
      fail("compute_environment AMAZON_SAGEMAKER: fsdp-plan reads LOCAL_MACHINE configs only");
    if (top_.count("compute_environment") && py_str(top_["compute_environment"]) != "LOCAL_MACHINE")
      refuse("ValueError: '" + py_str(top_["compute_environment"]) + "' is not a valid ComputeEnvironment");
    if (!top_.count("distributed_type")) refuse("ValueError: A `distributed_type` must be specified in the config file.");
    std::vector<std::string> extra;
    for (const auto& [k, v] : top_)
      if (std::find(kTopKeys.begin(), kTopKeys.end(), k) == kTopKeys.end()) extra.push_back(k);
    if (!extra.empty())
      refuse("ValueError: The config file at " + file_ + " had unknown keys (" + py_list(extra) +
             "), please try upgrading your `accelerate` version or fix (and potentially remove) these keys from "
             "your config file." +
             [&] {
               auto near = closest(extra[0], kTopKeys, 1);
               return near.empty() ? std::string() : " Did you mean \"" + near[0] + "\"?";
             }());
    const std::string dtype = py_str(top_["distributed_type"]);
    if (dtype != "FSDP")
      fail("distributed_type is " + dtype + ", not FSDP: accelerate launch would not use FSDP here");

    read_world();
    read_fsdp_config();
    read_mixed_precision();
    read_parallelism();
    not_modelled();
    out_.warnings.insert(out_.warnings.begin(),
                         make_warning("accelerate_config", "Accelerate " + std::string(kAccelerateVersion) +
                                                               " (accelerate launch) effective values: " +
                                                               join(out_.effective, "; ")));
    return std::move(out_);
  }

  void note(const std::string& key, const std::string& value, bool given) {
    out_.effective.push_back(key + "=" + value + (given ? "" : " (launcher default)"));
  }

  void key_warning(const std::string& key, const std::string& message, std::vector<std::string> suggestions = {}) {
    Warning w = make_warning("accelerate_config_key", key + ": " + message);
    w.suggestions = std::move(suggestions);
    out_.warnings.push_back(std::move(w));
  }

  int64_t parse_int(const PyValue& v, const std::string& key) const {
    // The launcher passes str(value); the plugin calls int() on it.
    std::string s = py_str(v);
    std::string t = s;
    t.erase(0, t.find_first_not_of(" \t"));
    t.erase(t.find_last_not_of(" \t") + 1);
    if (!python_int(t)) refuse(key + ": ValueError: invalid literal for int() with base 10: '" + s + "'");
    t.erase(std::remove(t.begin(), t.end(), '_'), t.end());
    try {
      return std::stoll(t);
    } catch (const std::exception&) {
      fail(key + " is too large: " + s);
    }
  }

  void read_world() {
    int64_t n = -1;
    if (top_.count("num_processes") && top_["num_processes"].kind != PyValue::None)
      n = parse_int(top_["num_processes"], "num_processes");
    if (top_.count("num_machines") && top_["num_machines"].kind != PyValue::None)
      out_.num_machines = parse_int(top_["num_machines"], "num_machines");
    if (out_.num_machines < 1) fail("num_machines must be at least 1, not " + std::to_string(out_.num_machines));
    if (n == -1) {
      key_warning("num_processes",
                  "not set: accelerate launch stops with \"You need to manually pass in `--num_processes` using "
                  "this config yaml.\" unless --num_processes is given; the world size is --world-size (or 1)");
      return;
    }
    if (n < 1 || n > kMaxWorldSize) fail("num_processes must be from 1 to " + std::to_string(kMaxWorldSize));
    // num_processes is the total over all machines (nproc_per_node = num_processes // num_machines).
    out_.policy.fsdp.world_size = n;
    out_.policy.fsdp.world_size_given = true;
    note("num_processes", std::to_string(n), true);
    if (out_.num_machines > 1) {
      // prepare_multi_gpu_env: nproc_per_node = num_processes // num_machines, so torchrun
      // starts fewer ranks than num_processes says, and HYBRID_SHARD's groups (one per
      // machine) follow nproc_per_node: no plan at num_processes would be the run's.
      const int64_t m = out_.num_machines;
      if (n % m != 0)
        fail("num_processes " + std::to_string(n) + " is not a multiple of num_machines " + std::to_string(m) +
             ": accelerate launch would start " + std::to_string(n / m) + " processes on each of the " +
             std::to_string(m) + " machines, " + std::to_string(n / m * m) + " in all, not " + std::to_string(n) +
             "; set num_processes to a multiple of num_machines");
      note("num_machines", std::to_string(m), true);
      out_.policy.hardware.gpus_per_node = n / m;  // nproc_per_node: a node of the time model
    }
  }

  // The value the launcher exports for `key` ("" and false when it exports nothing).
  struct Env {
    bool set = false;
    bool given = false;  // in the file, not the launcher default
    std::string value;
    PyValue raw;  // the launcher's argument before str()
  };

  Env env(const std::string& key) const {
    Env e;
    auto it = fsdp_.find(key);
    if (it != fsdp_.end()) {
      e.given = true;
      e.raw = it->second;
      if (it->second.kind == PyValue::None) return e;  // None: nothing exported (for the keys that check)
      e.set = true;
      e.value = py_str(it->second);
      return e;
    }
    for (const auto& k : kFsdpKeys)
      if (key == k.key && k.fallback) {
        e.set = true;
        e.value = k.fallback;
        e.raw.kind = PyValue::Str;
        e.raw.text = k.fallback;
      }
    return e;
  }

  // The launcher always exports these, None included (as "None").
  Env always(const std::string& key) const {
    Env e = env(key);
    if (!e.set) {
      e.set = true;
      e.value = "None";
    }
    return e;
  }

  bool to_bool(const Env& e, const std::string& key) const {
    std::string v = lower(e.value);
    if (is_one_of(v, {"y", "yes", "t", "true", "on", "1"})) return true;
    if (is_one_of(v, {"n", "no", "f", "false", "off", "0"})) return false;
    refuse(key + ": ValueError: invalid truth value " + v);
  }

  // A name Accelerate maps through its own list (index + 1) or a torch enum.
  int enum_index(const Env& e, const std::string& key, const std::vector<std::string>& names,
                 const std::vector<std::string>& torch_names) const {
    std::string u = upper(e.value);
    auto it = std::find(names.begin(), names.end(), u);
    if (it != names.end()) return static_cast<int>(it - names.begin());
    if (all_digits(e.value)) {
      int i = std::stoi(e.value.substr(0, 6));
      if (i >= 1 && i <= static_cast<int>(torch_names.size())) return i - 1;
      refuse(key + ": ValueError: " + e.value + " is not a valid value");
    }
    auto t = std::find(torch_names.begin(), torch_names.end(), u);
    if (t != torch_names.end()) return static_cast<int>(t - torch_names.begin());
    auto near = closest(u, names, 1);
    refuse(key + ": KeyError: '" + u + "'" + (near.empty() ? " (one of " + join(names) + ")" : "; did you mean " + near[0] + "?"));
  }

  void read_fsdp_config() {
    if (top_.count("fsdp_config") && top_["fsdp_config"].kind != PyValue::None) {
      const PyValue& fc = top_["fsdp_config"];
      if (fc.kind != PyValue::Dict) fail("fsdp_config must be a mapping, not " + py_str(fc));
      for (const auto& [k, v] : fc.entries) {
        // _validate_launch_command: defaults.fsdp_config.x -> args.fsdp_x
        std::string key = k.rfind("fsdp", 0) == 0 ? k : "fsdp_" + k;
        fsdp_[key] = v;
        order_.push_back(key);
      }
    }
    // The version decides what every other key means.
    Env version = always("fsdp_version");
    if (version.value != "1" && version.value != "2")
      refuse("fsdp_version: FSDP_VERSION=" + version.value + " (1 or 2)");
    out_.policy.fsdp.version = version.value == "2" ? FsdpVersion::V2 : FsdpVersion::V1;
    note("fsdp_version", version.value, version.given);
    const bool v2 = out_.policy.fsdp.v2();
    unknown_and_stale_keys(v2);

    // The launcher's own check, on the raw values (Python truthiness).
    Env ram = env("fsdp_cpu_ram_efficient_loading"), sync = env("fsdp_sync_module_states");
    if (py_truthy(ram.raw) && !py_truthy(sync.raw))
      refuse("ValueError: When using `--fsdp_cpu_ram_efficient_loading` set `--fsdp_sync_module_states` to `True`");

    FsdpSettings& fsdp = out_.policy.fsdp;
    if (!v2) {
      Env strategy = always("fsdp_sharding_strategy");
      int i = enum_index(strategy, "fsdp_sharding_strategy", kStrategies,
                         {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "_HYBRID_SHARD_ZERO2"});
      const ShardingStrategy ours[] = {ShardingStrategy::FullShard, ShardingStrategy::ShardGradOp,
                                       ShardingStrategy::NoShard, ShardingStrategy::HybridShard,
                                       ShardingStrategy::HybridShard};
      fsdp.strategy = ours[i];
      note("sharding_strategy", kStrategies[static_cast<size_t>(i)], strategy.given);
      if (i == 4)
        key_warning("fsdp_sharding_strategy",
                    "HYBRID_SHARD_ZERO2 keeps parameters gathered between forward and backward within a node; "
                    "fsdp-plan models its memory as HYBRID_SHARD");
      if (i >= 3) fsdp.shard_group_size = fsdp.world_size / out_.num_machines;
      if (fsdp_.count("fsdp_reshard_after_forward")) {
        Env raf = env("fsdp_reshard_after_forward");
        if (upper(raf.value) != kStrategies[static_cast<size_t>(i)])
          key_warning("fsdp_reshard_after_forward",
                      "\"" + raf.value + "\" does nothing under FSDP1 with accelerate launch: the launcher always "
                      "exports FSDP_SHARDING_STRATEGY (fsdp_sharding_strategy, default FULL_SHARD) and the plugin "
                      "takes that; the effective strategy is " + kStrategies[static_cast<size_t>(i)] +
                      ". Write the strategy under fsdp_sharding_strategy",
                      {"fsdp_sharding_strategy"});
      }
      Env orig = env("fsdp_use_orig_params");
      fsdp.use_orig_params = to_bool(orig, "fsdp_use_orig_params");
      note("use_orig_params", fsdp.use_orig_params ? "true" : "false", orig.given);
      to_bool(env("fsdp_forward_prefetch"), "fsdp_forward_prefetch");
      to_bool(env("fsdp_sync_module_states"), "fsdp_sync_module_states");
      Env prefetch = env("fsdp_backward_prefetch");
      if (prefetch.set && upper(prefetch.value) != "NO_PREFETCH")
        enum_index(prefetch, "fsdp_backward_prefetch", kPrefetch, {"BACKWARD_PRE", "BACKWARD_POST"});
    } else {
      Env raf = always("fsdp_reshard_after_forward");
      std::string v = lower(raf.value);
      if (!is_one_of(v, {"y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0"}))
        refuse("fsdp_reshard_after_forward: ValueError: invalid truth value " + v +
               " (FSDP2 takes true or false; to-fsdp2 maps FULL_SHARD/HYBRID_SHARD to true, the others to false)");
      out_.reshard_after_forward = to_bool(raf, "fsdp_reshard_after_forward");
      out_.policy.fsdp.reshard_after_forward.kind =
          out_.reshard_after_forward ? ReshardAfterForward::Kind::True : ReshardAfterForward::Kind::False;
      note("reshard_after_forward", out_.reshard_after_forward ? "true" : "false", raf.given);
    }
    Env offload = env("fsdp_offload_params");
    if (to_bool(offload, "fsdp_offload_params")) {
      note("offload_params", "true", offload.given);
      if (v2) out_.policy.fsdp.cpu_offload = true;
    }
    Env sd = env("fsdp_state_dict_type");
    if (sd.set) {
      int i = enum_index(sd, "fsdp_state_dict_type", kStateDicts, kStateDicts);
      if (v2 && i == 1)
        refuse("ValueError: FSDP2 does not support LOCAL_STATE_DICT. Please set `fsdp_state_dict_type` to "
               "`SHARDED_STATE_DICT` or `FULL_STATE_DICT`.");
    }
    to_bool(env("fsdp_cpu_ram_efficient_loading"), "fsdp_cpu_ram_efficient_loading");
    bool ac = to_bool(env("fsdp_activation_checkpointing"), "fsdp_activation_checkpointing");
    bool ac_offload = to_bool(env("fsdp_activation_checkpointing_offload"), "fsdp_activation_checkpointing_offload");
    if (ac_offload && !ac)
      refuse("ValueError: `activation_checkpointing_offload=True` requires `activation_checkpointing=True`.");
    if (ac_offload && !v2) refuse("ValueError: `activation_checkpointing_offload=True` requires `fsdp_version=2`.");
    out_.activation_checkpointing = ac;
    out_.activation_checkpointing_offload = ac_offload;
    if (ac) note("activation_checkpointing", "true", true);
    if (ac_offload) note("activation_checkpointing_offload", "true", true);

    read_wrap_policy();
    Env ignored = env("fsdp_ignored_modules");
    if (ignored.set) {
      out_.ignored_modules_regex = ignored.value;
      std::string why;
      if (!compile_python_regex(ignored.value, why))
        fail("fsdp_ignored_modules \"" + quoted_input(ignored.value) + "\" " + why);
      note("ignored_modules", "\"" + quoted_input(ignored.value) + "\"", true);
    }
  }

  void read_wrap_policy() {
    Env pol = env("fsdp_auto_wrap_policy");
    std::string name = pol.set ? upper(pol.value) : "NO_WRAP";
    if (std::find(kWrapPolicies.begin(), kWrapPolicies.end(), name) == kWrapPolicies.end()) {
      auto near = closest(name, kWrapPolicies, 1);
      refuse("ValueError: Invalid auto wrap policy: " + pol.value + ". Must be one of " + py_list(kWrapPolicies) +
             (near.empty() ? "" : "; did you mean " + near[0] + "?"));
    }
    out_.auto_wrap_policy = name;
    note("auto_wrap_policy", name, pol.set);
    const bool by_class = name == "TRANSFORMER_BASED_WRAP", by_size = name == "SIZE_BASED_WRAP";
    Env cls = env("fsdp_transformer_layer_cls_to_wrap");
    if (const auto& given = overrides_.transformer_layer_cls_to_wrap) {
      // `accelerate launch --fsdp_transformer_layer_cls_to_wrap A,B` wins over the file, but only
      // TRANSFORMER_BASED_WRAP reads it: rather than plan classes that would do nothing, refuse.
      if (!by_class)
        fail("--module-classes names the classes TRANSFORMER_BASED_WRAP wraps, but this config's "
             "fsdp_auto_wrap_policy is " + name + (pol.set ? "" : " (not set)") +
             ", which wraps no class: set fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP in it");
      out_.class_names = *given;
      out_.policy.module_classes = *given;
      out_.effective.push_back("transformer_layer_cls_to_wrap=\"" + join(*given, ",") + "\" (--module-classes)");
    } else if (by_class) {
      if (cls.set) {
        // str(value).split(","): a YAML list becomes "['A', 'B']", names are not stripped.
        std::vector<std::string> names;
        size_t pos = 0;
        while (true) {
          size_t comma = cls.value.find(',', pos);
          names.push_back(cls.value.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
          if (comma == std::string::npos) break;
          pos = comma + 1;
        }
        out_.class_names = names;
        if (cls.raw.kind == PyValue::List)
          key_warning("fsdp_transformer_layer_cls_to_wrap",
                      "is a YAML list; Accelerate takes str() of it (\"" + cls.value +
                          "\") and splits that at commas; write one comma-separated string instead");
        note("transformer_layer_cls_to_wrap", "\"" + cls.value + "\"", true);
        out_.policy.module_classes = out_.class_names;
      } else {
        // model._no_split_modules: resolve_accelerate_config looks for it in the file.
        out_.policy.module_classes = std::vector<std::string>{};
      }
    } else if (cls.set) {
      key_warning("fsdp_transformer_layer_cls_to_wrap", "does nothing with auto_wrap_policy " + name +
                                                            " (only TRANSFORMER_BASED_WRAP reads it)");
    }
    Env min = env("fsdp_min_num_params");
    if (by_size) {
      int64_t n = parse_int(min.raw.kind == PyValue::None ? PyValue{PyValue::Str, false, "None", {}, {}, 0, 0} : min.raw,
                            "fsdp_min_num_params");
      note("min_num_params", std::to_string(n), min.given);
      if (!out_.policy.fsdp.v2()) {
        if (n > 0) {
          out_.policy.min_num_params = n;
        } else {
          key_warning("fsdp_min_num_params",
                      std::to_string(n) + ": Accelerate (\"If zero, we silently ignore it.\") sets no auto-wrap "
                      "policy at all, so the root is the only unit");
        }
      } else {
        out_.policy.min_num_params = n;  // FSDP2: Accelerate's own rule, numel > n
      }
    } else if (fsdp_.count("fsdp_min_num_params")) {
      key_warning("fsdp_min_num_params", "does nothing with auto_wrap_policy " + name +
                                             " (only SIZE_BASED_WRAP reads it)");
    }
  }

  void unknown_and_stale_keys(bool v2) {
    std::vector<std::string> known;
    for (const auto& k : kFsdpKeys) known.push_back(k.key);
    for (const auto& key : order_) {
      if (auto s = kStaleKeys.find(key); s != kStaleKeys.end()) {
        key_warning(key, s->second);
        continue;
      }
      if (std::find(known.begin(), known.end(), key) == known.end()) {
        auto near = closest(key, known, 1);
        key_warning(key,
                    "not an Accelerate key: accelerate launch copies it onto its arguments and nothing reads it" +
                        (near.empty() ? std::string() : "; did you mean " + near[0] + "?"),
                    near);
        continue;
      }
      if (!v2) continue;
      if (key == "fsdp_sharding_strategy") {
        key_warning(key, "does nothing under fsdp_version 2 (the plugin reads it for FSDP1 only); FSDP2 takes "
                         "fsdp_reshard_after_forward: true (was FULL_SHARD/HYBRID_SHARD) or false",
                    {"fsdp_reshard_after_forward"});
      } else if (key == "fsdp_backward_prefetch") {
        key_warning(key, "does nothing under fsdp_version 2: Accelerate warns \"backward_prefetch is not supported "
                         "in FSDP2. Setting backward prefetch to None.\"");
      } else if (key == "fsdp_forward_prefetch") {
        key_warning(key, "does nothing under fsdp_version 2: the plugin does not read it (and refuses "
                         "forward_prefetch=True given in Python: not yet implemented in FSDP2)");
      } else if (key == "fsdp_use_orig_params") {
        key_warning(key, "does nothing under fsdp_version 2: \"use_orig_params is obsolete in FSDP2, as FSDP2 "
                         "always uses the original parameters.\"");
      } else if (key == "fsdp_sync_module_states") {
        key_warning(key, "does nothing under fsdp_version 2 (\"sync_module_states is obsolete in FSDP2\"); "
                         "the launcher still requires it true when fsdp_cpu_ram_efficient_loading is true");
      }
    }
  }

  void read_mixed_precision() {
    std::string mp = "no";
    bool given = false;
    if (top_.count("mixed_precision") && top_["mixed_precision"].kind != PyValue::None) {
      const PyValue& v = top_["mixed_precision"];
      given = true;
      // YAML 1.1 reads an unquoted no as false; prepare_multi_gpu_env then calls .lower() on a bool.
      if (v.kind == PyValue::Bool)
        refuse("mixed_precision: AttributeError: 'bool' object has no attribute 'lower' (YAML reads an unquoted " +
               v.text + " as a boolean; write 'no' in quotes)");
      mp = lower(py_str(v));
    }
    if (!is_one_of(mp, {"no", "fp8", "fp16", "bf16"}))
      refuse("ValueError: Unknown mixed_precision mode: " + mp + ". Choose between ['no', 'fp8', 'fp16', 'bf16'].");
    note("mixed_precision", mp, given);
    out_.mixed_precision = mp;
    out_.policy.mixed_precision = accelerate_dtypes(mp, out_.policy.fsdp.version);
    // Accelerate then keeps fp32 master weights (plan/master_weights.h).
    out_.policy.fsdp.fp32_master_weights = mp != "no";
  }

  // What the file asks for and the plan does not model (issue 41, item 10):
  // fp8 mixed precision (planned as bf16) and torch.compile (dynamo_backend,
  // dynamo_config.dynamo_backend other than NO).
  void not_modelled() {
    if (out_.mixed_precision == "fp8")
      out_.warnings.push_back(make_warning(
          "not_modelled", "mixed_precision: fp8: not modelled: planned as bf16 (parameters gathered and matmuls "
                          "run in bf16); the float8 all-gathers and the fp8 matmul peak are not counted"));
    std::string backend;
    if (top_.count("dynamo_backend") && top_["dynamo_backend"].kind == PyValue::Str)
      backend = py_str(top_["dynamo_backend"]);
    if (top_.count("dynamo_config") && top_["dynamo_config"].kind == PyValue::Dict)
      for (const auto& [k, v] : top_["dynamo_config"].entries)
        if (k == "dynamo_backend" && v.kind == PyValue::Str) backend = py_str(v);
    if (!backend.empty() && lower(backend) != "no")
      out_.warnings.push_back(make_warning(
          "not_modelled", "dynamo_backend " + backend + ": torch.compile is not modelled: the plan's activations, "
                          "peak and step time are eager PyTorch's (compiled kernels fuse ops and save less)"));
  }

  // The launcher exports every size, one the file leaves out as its default 1, dp_shard_size included
  // (commands/launch.py; utils/launch.py: prepare_extend_env_parallelism_config).
  void read_parallelism() {
    if (!top_.count("parallelism_config") || top_["parallelism_config"].kind == PyValue::None) return;
    const PyValue& pc = top_["parallelism_config"];
    if (pc.kind != PyValue::Dict) fail("parallelism_config must be a mapping");
    if (pc.entries.empty()) return;  // _validate_launch_command: parallelism_config != {}
    int64_t replicate = 1, shard = 1, tp = 1, cp = 1;
    bool shard_given = false;
    std::string cp_comm = "allgather";  // ParallelismConfig's cp_handler default (utils/dataclasses.py)
    for (const auto& [k, v] : pc.entries) {
      if (k == "parallelism_config_dp_replicate_size") replicate = parse_int(v, k);
      else if (k == "parallelism_config_dp_shard_size") {
        shard = parse_int(v, k);
        shard_given = true;
      }
      else if (k == "parallelism_config_tp_size") tp = parse_int(v, k);
      else if (k == "parallelism_config_cp_size") cp = parse_int(v, k);
      else if (k == "parallelism_config_cp_comm_strategy" && v.kind != PyValue::None) cp_comm = py_str(v);
      else if (k == "parallelism_config_sp_size" && parse_int(v, k) != 1)
        fail(k + " is " + py_str(v) + ": fsdp-plan plans data, tensor and context parallelism (the sequence "
                                      "parallel size must be 1)");
    }
    check_parallelism(replicate, shard, tp, cp, shard_given);
    if (cp != 1) read_context_parallel(cp, cp_comm);
    if (tp != 1) return read_tensor_parallel(replicate, shard, tp);
    FsdpSettings& fsdp = out_.policy.fsdp;
    if (!fsdp.v2()) {  // every size 1, else check_parallelism refused
      key_warning("parallelism_config", "does nothing: every size is 1, so Accelerate builds no mesh; a size above 1 "
                                        "is its error under fsdp_version 1 (FSDP1's hybrid sharding is "
                                        "fsdp_sharding_strategy: HYBRID_SHARD)");
      return;
    }
    if (replicate > 1) {
      // FSDP2 shards over dp_shard x cp (Accelerate's flattened "dp_shard_cp").
      fsdp.strategy = ShardingStrategy::HybridShard;
      fsdp.shard_group_size = shard * cp;
      note("parallelism_config", "dp_replicate " + std::to_string(replicate) + " x dp_shard " + std::to_string(shard),
           true);
    }
  }

  // parallelism_config_cp_size: Accelerator.maybe_context_parallel runs the
  // step in torch's context_parallel on the "cp" mesh dimension, with the
  // head-tail load balancer and cp_handler's rotate method (accelerator.py:
  // set_rotate_method(cp_comm_strategy)).
  void read_context_parallel(int64_t cp, const std::string& comm) {
    if (comm != "allgather" && comm != "alltoall")
      fail("parallelism_config_cp_comm_strategy is " + comm + ": torch's set_rotate_method takes allgather or "
                                                                "alltoall");
    ContextParallel c;
    c.degree = cp;
    c.rotate = comm == "alltoall" ? ContextParallel::Rotate::AllToAll : ContextParallel::Rotate::AllGather;
    out_.policy.context_parallel = c;
    note("parallelism_config", "cp " + std::to_string(cp) + " (context_parallel, " + comm + ")", true);
  }

  // What Accelerator.__init__ raises for these sizes, in its order: ParallelismConfig() (__post_init__),
  // get_device_mesh (torch's init_device_mesh), _validate_accelerator (accelerate/parallelism_config.py).
  void check_parallelism(int64_t replicate, int64_t shard, int64_t tp, int64_t cp, bool shard_given) {
    for (const auto& [name, size] : {std::pair<const char*, int64_t>{"dp_replicate_size", replicate},
                                     {"dp_shard_size", shard}, {"tp_size", tp}, {"cp_size", cp}})
      if (size < 1)
        refuse("ValueError: " + std::string(name) + " must be at least 1, but got " + std::to_string(size));
    if ((tp > 1 || cp > 1) && replicate > 1 && shard == 1)
      refuse("ValueError: Tensor/Context parallelism (tp/cp_size > 1) cannot be used with pure data parallelism "
             "(dp_replicate_size > 1 and dp_shard_size == 1). Please set dp_shard_size > 1 and dp_replicate_size "
             "== 1 to compose FSDP + TP/CP for 2D parallel, or set dp_replicate_size == 1 and dp_shard_size > 1 to "
             "compose HSDP + TP/CP for 3D parallel.");
    const FsdpSettings& fsdp = out_.policy.fsdp;
    // Python's int: a product past int64 is bigger than any world, never wrapped to it (util/checked.h).
    const std::optional<int64_t> exact = checked_product({replicate, shard, tp, cp});
    const int64_t total = exact ? *exact : INT64_MAX, world = fsdp.world_size;
    const std::string total_text = exact_product_text({replicate, shard, tp, cp});
    if (total == 1) return;  // no mesh; _validate_accelerator returns at once (not multi_device under FSDP)
    // The fixes, after Accelerate's words.
    std::vector<std::string> fix;
    if (!shard_given) {
      const int64_t others = checked_product({replicate, tp, cp}).value_or(INT64_MAX);
      const int64_t fits = world % others == 0 ? world / others : 0;
      fix.push_back("parallelism_config_dp_shard_size is 1, the launcher's default, when the file leaves it out" +
                    (fits > 1 ? ": set it to " + std::to_string(fits) : std::string()));
    }
    if (!fsdp.v2())
      fix.push_back("parallelism_config is for fsdp_version 2: set fsdp_version: 2, or remove parallelism_config "
                    "and take fsdp_sharding_strategy: HYBRID_SHARD for FSDP1's hybrid sharding");
    const std::string why = fix.empty() ? "" : " (" + join(fix, "; ") + ")";
    if (total > world) {  // Accelerator builds the mesh before it checks the sizes
      fix.insert(fix.begin(), "torch's init_device_mesh, for the parallelism_config sizes, whose product " +
                                  total_text + " must be num_processes");
      refuse("RuntimeError: Mesh should not be bigger than default world size " + std::to_string(world) +
             ", but found " + total_text + " ranks! (" + join(fix, "; ") + ")");
    }
    if (total != world)
      refuse("ValueError: ParallelismConfig total_size (" + std::to_string(total) + ") does not match num_processes (" +
             std::to_string(world) + "). Please adjust dp_replicate_size/ dp_shard_size/tp_size/cp_size/"
             "sp_size." + why);
    if (fsdp.v2() && shard == 1 && cp == 1)
      refuse("ValueError: FSDP is enabled but the parallelism config has no dimension for FSDP to shard across (both "
             "`dp_shard_size` and `cp_size` are 1). This usually means a model that is already parallelized another "
             "way -- e.g. loaded with `DistributedConfig(tp_size=N)` or `enable_expert_parallel=True`, which makes the "
             "whole world size tensor/expert parallel -- was launched under an FSDP config. Either launch it without "
             "the FSDP config, or leave ranks for FSDP to use by lowering `tp_size`." + why);
    if (!fsdp.v2())
      refuse("ValueError: ParallelismConfig is only compatible DistributedType.FSDP (version 2) or "
             "DistributedType.Multi{Device} or DistributedType.DEEPSPEED, but got DistributedType.FSDP." + why);
  }

  // parallelism_config_tp_size other than 1, sizes that check_parallelism
  // let through. What Accelerate then shards is a model transformers
  // already split with its own plan
  // (from_pretrained(..., tp_plan="auto"); Accelerator.prepare_model checks
  // the model's tp size, _prepare_tp applies no plan): "plan": "model" on the
  // (dp_replicate, dp_shard, tp) mesh, the dims of size 1 left out as
  // Accelerate's _get_mesh leaves them out.
  void read_tensor_parallel(int64_t replicate, int64_t shard, int64_t tp) {
    TensorParallel section;
    section.degree = tp;
    section.from_model = true;
    section.dp_replicate = replicate;
    section.dp_shard = shard;
    out_.policy.tensor_parallel = section;
    note("parallelism_config", "dp_replicate " + std::to_string(replicate) + " x dp_shard " + std::to_string(shard) +
                                   " x tp " + std::to_string(tp) + " (the model's own tp plan)", true);
    // accelerator.py: Accelerator._prepare_tp, under FSDP2, on a model with DTensor parameters.
    out_.warnings.push_back(make_warning(
        "accelerate_tp_refused",
        "Accelerate would stop: ImportError: cannot import name 'ReplicateParallel' from "
        "'transformers.integrations.tensor_parallel' (Accelerator.prepare with FSDP2 and tp_size " +
            std::to_string(tp) + " imports it in _prepare_tp; transformers 5.24 no longer has it). Planned as the "
            "config sets it up: the model split by its own tp plan (from_pretrained(..., tp_plan=\"auto\")), then "
            "Accelerate's fully_shard calls on the data-parallel mesh dimensions"));
  }

  std::string file_;
  AccelerateOverrides overrides_;
  std::map<std::string, PyValue> top_;
  std::map<std::string, PyValue> fsdp_;
  std::vector<std::string> order_;  // fsdp_config keys in file order, prefixed
  AccelerateConfig out_;
};

}  // namespace

bool is_accelerate_config_json(const nlohmann::json& doc) {
  return doc.is_object() && (doc.contains("distributed_type") || doc.contains("fsdp_config") ||
                             doc.contains("compute_environment"));
}

std::optional<MixedPrecision> accelerate_dtypes(const std::string& mode, FsdpVersion version) {
  if (mode == "no") return std::nullopt;
  MixedPrecision p;
  const std::string d = mode == "fp16" ? "float16" : "bfloat16";
  p.param_dtype = p.reduce_dtype = p.buffer_dtype = d;
  if (version == FsdpVersion::V2) p.output_dtype = d;  // MixedPrecisionPolicy(..., output_dtype=d)
  return p;
}

AccelerateConfig parse_accelerate_config(const std::string& text, const std::string& file,
                                         const AccelerateOverrides& overrides) {
  return Reader(file, overrides).read(text);
}

AccelerateConfig parse_accelerate_config_json(const nlohmann::json& doc, const std::string& file,
                                              const AccelerateOverrides& overrides) {
  return Reader(file, overrides).read_json(doc);
}

}  // namespace fsdp_plan
