#include "accelerate/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <regex>
#include <set>

#include "model/class_names.h"
#include "util/errors.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

// A YAML value as PyYAML's safe_load gives it to Accelerate (YAML 1.1: plain
// yes/no/on/off are booleans, "1e8" without a dot is a string).
struct PyValue {
  enum Kind { None, Bool, Int, Float, Str, List, Dict } kind = None;
  bool b = false;
  std::string text;  // scalars: the scalar as written
  std::vector<PyValue> items;
  std::vector<std::pair<std::string, PyValue>> entries;
};

bool is_one_of(const std::string& s, std::initializer_list<const char*> words) {
  for (const char* w : words)
    if (s == w) return true;
  return false;
}

PyValue to_py(const YAML::Node& node) {
  PyValue v;
  if (!node || node.IsNull()) return v;
  if (node.IsSequence()) {
    v.kind = PyValue::List;
    for (const auto& item : node) v.items.push_back(to_py(item));
    return v;
  }
  if (node.IsMap()) {
    v.kind = PyValue::Dict;
    for (const auto& kv : node) v.entries.emplace_back(kv.first.Scalar(), to_py(kv.second));
    return v;
  }
  v.text = node.Scalar();
  v.kind = PyValue::Str;
  if (node.Tag() == "!") return v;  // quoted: always a string
  const std::string& s = v.text;
  static const std::regex kInt("[-+]?(0|[1-9][0-9_]*)");
  static const std::regex kFloat("[-+]?([0-9][0-9_]*)?\\.[0-9_]*([eE][-+][0-9]+)?|[-+]?\\.(inf|Inf|INF)|\\.(nan|NaN|NAN)");
  if (is_one_of(s, {"~", "null", "Null", "NULL", ""})) {
    v.kind = PyValue::None;
  } else if (is_one_of(s, {"yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"})) {
    v.kind = PyValue::Bool;
    v.b = true;
  } else if (is_one_of(s, {"no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"})) {
    v.kind = PyValue::Bool;
  } else if (std::regex_match(s, kInt)) {
    v.kind = PyValue::Int;
    v.text.erase(std::remove(v.text.begin(), v.text.end(), '_'), v.text.end());
    if (v.text[0] == '+') v.text.erase(0, 1);
  } else if (std::regex_match(s, kFloat)) {
    v.kind = PyValue::Float;
  }
  return v;
}

// str(value) in Python, which is what the launcher puts in the environment.
std::string py_str(const PyValue& v, bool repr = false) {
  switch (v.kind) {
    case PyValue::None: return "None";
    case PyValue::Bool: return v.b ? "True" : "False";
    case PyValue::Int: return v.text;
    case PyValue::Float: {
      try {
        double d = std::stod(v.text);
        std::string s = std::to_string(d);  // close to Python's repr for the values people write
        while (s.size() > 1 && s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
        return s;
      } catch (const std::exception&) {
        return v.text;
      }
    }
    case PyValue::Str: return repr ? "'" + v.text + "'" : v.text;
    case PyValue::List: {
      std::string out = "[";
      for (size_t i = 0; i < v.items.size(); ++i) out += (i ? ", " : "") + py_str(v.items[i], true);
      return out + "]";
    }
    case PyValue::Dict: {
      std::string out = "{";
      for (size_t i = 0; i < v.entries.size(); ++i)
        out += (i ? ", " : "") + std::string("'") + v.entries[i].first + "': " + py_str(v.entries[i].second, true);
      return out + "}";
    }
  }
  return "";
}

bool py_truthy(const PyValue& v) {
  switch (v.kind) {
    case PyValue::None: return false;
    case PyValue::Bool: return v.b;
    case PyValue::Int: return v.text != "0" && v.text != "-0";
    case PyValue::Float: return std::stod(v.text) != 0.0;
    case PyValue::Str: return !v.text.empty();
    case PyValue::List: return !v.items.empty();
    case PyValue::Dict: return !v.entries.empty();
  }
  return false;
}

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
  Reader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& what) const { throw InputError(file_, what); }
  // Where accelerate launch (or the plugin it feeds) raises.
  [[noreturn]] void refuse(const std::string& what) const {
    throw InputError(file_, "accelerate launch would stop: " + what);
  }

  AccelerateConfig read(const std::string& text) {
    YAML::Node doc;
    try {
      doc = YAML::Load(text);
    } catch (const YAML::Exception& e) {
      fail("not valid YAML: " + e.msg + " (line " + std::to_string(e.mark.line + 1) + ")");
    }
    if (!doc.IsMap()) fail("an Accelerate config must be a YAML mapping");
    PyValue top = to_py(doc);
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
    out_.warnings.insert(out_.warnings.begin(),
                         make_warning("accelerate_config", "Accelerate " + std::string(kAccelerateVersion) +
                                                               " (accelerate launch) effective values: " +
                                                               join(out_.effective, "; ")));
    return std::move(out_);
  }

 private:
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
    static const std::regex kPyInt("[-+]?[0-9](_?[0-9])*");
    if (!std::regex_match(t, kPyInt)) refuse(key + ": ValueError: invalid literal for int() with base 10: '" + s + "'");
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
    note("num_processes", std::to_string(n), true);
    if (out_.num_machines > 1) {
      if (n % out_.num_machines != 0)
        key_warning("num_machines", std::to_string(n) + " processes do not split evenly over " +
                                        std::to_string(out_.num_machines) + " machines; accelerate launch starts " +
                                        std::to_string(n / out_.num_machines) + " per machine");
      note("num_machines", std::to_string(out_.num_machines), true);
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

    read_wrap_policy();
    Env ignored = env("fsdp_ignored_modules");
    if (ignored.set) {
      out_.ignored_modules_regex = ignored.value;
      try {
        std::regex check(ignored.value);
      } catch (const std::regex_error&) {
        fail("fsdp_ignored_modules \"" + ignored.value + "\" is not a regular expression fsdp-plan can read");
      }
      note("ignored_modules", "\"" + ignored.value + "\"", true);
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
    if (by_class) {
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
      } else {
        key_warning("fsdp_transformer_layer_cls_to_wrap",
                    "not set: Accelerate wraps the classes in model._no_split_modules, which a TorchScript file "
                    "does not record; planned with no class, as Accelerate does for a model without "
                    "_no_split_modules (only the root unit). Name the classes in fsdp_transformer_layer_cls_to_wrap");
        out_.class_names = std::vector<std::string>{};
      }
      out_.policy.module_classes = out_.class_names;
    } else if (cls.set) {
      key_warning("fsdp_transformer_layer_cls_to_wrap", "does nothing with auto_wrap_policy " + name +
                                                            " (only TRANSFORMER_BASED_WRAP reads it)");
    }
    Env min = env("fsdp_min_num_params");
    if (by_size) {
      int64_t n = parse_int(min.raw.kind == PyValue::None ? PyValue{PyValue::Str, false, "None", {}, {}} : min.raw,
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
  }

  void read_parallelism() {
    if (!top_.count("parallelism_config") || top_["parallelism_config"].kind == PyValue::None) return;
    const PyValue& pc = top_["parallelism_config"];
    if (pc.kind != PyValue::Dict) fail("parallelism_config must be a mapping");
    if (pc.entries.empty()) return;
    if (!out_.policy.fsdp.v2()) {
      key_warning("parallelism_config", "is for FSDP2 (fsdp_version 2); under FSDP1 hybrid sharding is "
                                        "fsdp_sharding_strategy: HYBRID_SHARD. fsdp-plan ignores it");
      return;
    }
    int64_t replicate = 1, shard = -1;
    for (const auto& [k, v] : pc.entries) {
      if (k == "parallelism_config_dp_replicate_size") replicate = parse_int(v, k);
      else if (k == "parallelism_config_dp_shard_size") shard = parse_int(v, k);
      else if ((k == "parallelism_config_tp_size" || k == "parallelism_config_cp_size" ||
                k == "parallelism_config_sp_size") && parse_int(v, k) != 1)
        fail(k + " is " + py_str(v) + ": fsdp-plan plans data parallelism only (tensor, context and sequence "
                                      "parallel sizes must be 1)");
    }
    if (replicate < 1) fail("parallelism_config_dp_replicate_size must be at least 1");
    FsdpSettings& fsdp = out_.policy.fsdp;
    if (shard == -1) shard = fsdp.world_size / replicate;
    if (shard < 1 || replicate * shard != fsdp.world_size)
      refuse("parallelism_config: dp_replicate_size " + std::to_string(replicate) + " x dp_shard_size " +
             std::to_string(shard) + " is not num_processes " + std::to_string(fsdp.world_size));
    if (replicate > 1) {
      fsdp.strategy = ShardingStrategy::HybridShard;
      fsdp.shard_group_size = shard;
      note("parallelism_config", "dp_replicate " + std::to_string(replicate) + " x dp_shard " + std::to_string(shard),
           true);
    }
  }

  std::string file_;
  std::map<std::string, PyValue> top_;
  std::map<std::string, PyValue> fsdp_;
  std::vector<std::string> order_;  // fsdp_config keys in file order, prefixed
  AccelerateConfig out_;
};

}  // namespace

bool is_accelerate_config(const std::string& text) {
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] == '{' || text[first] == '[') return false;
  try {
    YAML::Node doc = YAML::Load(text);
    return doc.IsMap() && (doc["distributed_type"] || doc["fsdp_config"] || doc["compute_environment"]);
  } catch (const YAML::Exception&) {
    return false;
  }
}

std::optional<MixedPrecision> accelerate_dtypes(const std::string& mode, FsdpVersion version) {
  if (mode == "no") return std::nullopt;
  MixedPrecision p;
  const std::string d = mode == "fp16" ? "float16" : "bfloat16";
  p.param_dtype = p.reduce_dtype = p.buffer_dtype = d;
  if (version == FsdpVersion::V2) p.output_dtype = d;  // MixedPrecisionPolicy(..., output_dtype=d)
  return p;
}

AccelerateConfig parse_accelerate_config(const std::string& text, const std::string& file) {
  return Reader(file).read(text);
}

void resolve_accelerate_config(AccelerateConfig& config, const ModuleTree& tree) {
  const std::vector<ModuleId> order = tree.preorder();
  if (config.class_names) {
    // get_module_class_from_name: the first module in pre-order whose bare
    // class name equals the name; then isinstance() against that class.
    std::vector<std::string> resolved;
    std::set<std::string> model_classes;
    std::map<std::string, std::set<std::string>> by_short;  // bare name -> qualified classes
    for (ModuleId m : order) {
      std::string q = demangle(tree.module(m).type_name);
      model_classes.insert(std::string(short_name(q)));
      by_short[std::string(short_name(q))].insert(q);
    }
    for (const auto& name : *config.class_names) {
      std::string found;
      for (ModuleId m : order) {
        std::string q = demangle(tree.module(m).type_name);
        if (short_name(q) == name) {
          found = q;
          break;
        }
      }
      if (found.empty()) {
        std::vector<std::string> candidates(model_classes.begin(), model_classes.end());
        auto near = closest(name, candidates);
        Warning w = make_warning("accelerate_class_missing",
                                 "Accelerate would stop: ValueError: Could not find the transformer layer class " +
                                     name + " in the model." +
                                     (near.empty() ? "" : " Closest class names in the model: " + join(near) + "."));
        w.classes = {name};
        w.suggestions = std::move(near);
        config.warnings.push_back(std::move(w));
        continue;
      }
      // The bare name is exact unless another class in the model shares it.
      resolved.push_back(by_short[name].size() > 1 ? found : name);
    }
    config.policy.module_classes = resolved;
  }
  if (config.ignored_modules_regex) {
    // Accelerate: [m for name, m in named_modules() if re.fullmatch(regex, name)].
    std::regex re(*config.ignored_modules_regex);
    std::vector<std::string> paths;
    for (ModuleId m : order) {
      std::string path = tree.path(m);
      if (std::regex_match(path, re)) paths.push_back(path);
    }
    if (paths.empty()) {
      config.warnings.push_back(make_warning("accelerate_config_key",
                                             "fsdp_ignored_modules: \"" + *config.ignored_modules_regex +
                                                 "\" fully matches no module path, so Accelerate ignores no module"));
    }
    config.policy.ignored_modules = paths;
  }
}

}  // namespace fsdp_plan
