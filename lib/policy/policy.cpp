#include "policy/policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <unordered_map>
#include <utility>

#include "model/loaders/printable.h"
#include "util/errors.h"
#include "util/file_io.h"
#include "util/json_input.h"
#include "util/strings.h"
#include "util/warnings.h"

namespace fsdp_plan {
namespace {

using json = nlohmann::json;

// Bounds on what a policy lists (docs/limits.md): a real one names a few
// classes; suggest -o writes 37,000 FSDP2 groups for the 50k-module MoE.
constexpr size_t kMaxPolicyList = 100000;
constexpr size_t kMaxPolicyString = 4096;

const std::vector<std::string> kTopKeys = {"$schema", "module_classes", "min_num_params",
                                           "force_leaf_modules", "exclude_wrap_modules",
                                           "mixed_precision", "ignored_modules", "ignored_params",
                                           "fsdp", "checks", "groups", "tensor_parallel", "expert_parallel",
                                           "context_parallel",
                                           "activation_checkpointing", "compile", "hardware"};
const std::vector<std::string> kActivationCheckpointingKeys = {"module_classes", "modules", "mode", "save_ops",
                                                                "recompute_mm_fqns"};
const std::vector<std::string> kChecksKeys = {"max_unit_numel", "max_units", "max_root_share", "max_peak_bytes",
                                              "fail_on", "warn_root_share"};
const std::vector<std::string> kMixedPrecisionKeys = {"param_dtype", "reduce_dtype", "buffer_dtype",
                                                      "ignore_classes", "keep_low_precision_grads",
                                                      "cast_forward_inputs", "cast_root_forward_inputs",
                                                      "output_dtype"};
// The mixed_precision fields by kind, in the order they are read (and errors found).
const std::pair<const char*, std::optional<std::string> MixedPrecision::*> kDtypeFields[] = {
    {"param_dtype", &MixedPrecision::param_dtype},
    {"reduce_dtype", &MixedPrecision::reduce_dtype},
    {"buffer_dtype", &MixedPrecision::buffer_dtype},
    {"output_dtype", &MixedPrecision::output_dtype}};
const std::pair<const char*, std::optional<bool> MixedPrecision::*> kFlagFields[] = {
    {"keep_low_precision_grads", &MixedPrecision::keep_low_precision_grads},
    {"cast_forward_inputs", &MixedPrecision::cast_forward_inputs},
    {"cast_root_forward_inputs", &MixedPrecision::cast_root_forward_inputs}};
const std::vector<std::string> kFsdpKeys = {"world_size", "sharding_strategy", "shard_group_size",
                                            "use_orig_params", "optimizer", "optimizer_impl", "version",
                                            "reshard_after_forward", "cpu_offload", "fp32_master_weights",
                                            "gradient_accumulation_steps", "no_sync"};
std::vector<std::string> hardware_keys() {
  std::vector<std::string> out = {"preset", "gpus_per_node"};
  for (const auto& f : hardware_fields()) out.push_back(f.key);
  return out;
}
const std::vector<std::string> kGroupKeys = {"modules", "reshard_after_forward"};
// The dtypes a policy may name (kPolicyDtypes: model/dtype.cpp has a kDtypes of its own).
const std::vector<std::string> kPolicyDtypes = {"float32", "float16", "bfloat16", "float64"};


// The keys of the top-level "tensor_parallel" object's "plan" object, in the
// order the text writes them (nlohmann's SAX interface; the DOM parse before
// it has checked the text).
struct PlanKeyOrder : nlohmann::json_sax<json> {
  std::vector<std::string> order;
  std::vector<std::string> path;  // the key of each open object or array ("" for an array)
  std::string key_;

  bool open() {
    path.push_back(key_);
    key_.clear();
    return true;
  }
  bool in_plan() const { return path.size() == 3 && path[1] == "tensor_parallel" && path[2] == "plan"; }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return open(); }
  bool key(string_t& k) override {
    if (in_plan()) order.push_back(k);
    key_ = k;
    return true;
  }
  bool end_object() override {
    path.pop_back();
    key_.clear();
    return true;
  }
  bool start_array(std::size_t) override { return open(); }
  bool end_array() override {
    path.pop_back();
    key_.clear();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

class Parser {
 public:
  explicit Parser(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& what) const { throw InputError(file_, what); }

  void check_keys(const json& obj, const std::vector<std::string>& allowed, const std::string& where) const {
    for (const auto& [key, value] : obj.items()) {
      (void)value;
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
      std::string msg = "unknown key \"" + quoted_input(key) + "\"" + where;
      auto near = closest(key, allowed, 1);
      msg += near.empty() ? " (valid keys: " + join(allowed) + ")" : "; did you mean \"" + near[0] + "\"?";
      fail(msg);
    }
  }

  std::vector<std::string> string_list(const json& v, const std::string& key, bool names_classes) const {
    if (!v.is_array()) fail("\"" + key + "\" must be a list of strings, not " + json_type_name(v));
    if (v.size() > kMaxPolicyList)
      fail("\"" + key + "\" lists " + std::to_string(v.size()) + " items, more than a policy list can (" +
           std::to_string(kMaxPolicyList) + ")");
    std::vector<std::string> out;
    std::set<std::string> seen;
    for (const auto& item : v) {
      if (!item.is_string()) fail("\"" + key + "\" must be a list of strings, but holds " + json_type_name(item));
      std::string s = item.get<std::string>();
      // Names and paths are echoed in warnings and matched against every module:
      // bound them, and keep control characters off the terminal.
      if (s.size() > kMaxPolicyString)
        fail("\"" + key + "\" holds a string of " + std::to_string(s.size()) + " bytes (\"" + quoted_input(s) +
             "\"), longer than a class name or module path can be here (" + std::to_string(kMaxPolicyString) + ")");
      if (std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
        fail("\"" + key + "\" holds \"" + quoted_input(s) + "\", which has a control character: not a class "
             "name or module path");
      if (s.empty() && key == "ignored_modules")
        fail("\"ignored_modules\" holds an empty string, the root's path: the root cannot be named, but \"*\" "
             "matches every module, the root included (FSDP warns that ignoring the root is not well supported)");
      if (s.empty()) fail("\"" + key + "\" holds an empty string");
      if (names_classes && s.find_first_of(" */") != std::string::npos)
        fail("\"" + key + "\" holds \"" + quoted_input(s) + "\", which is not a class name");
      if (!seen.insert(s).second) fail("\"" + key + "\" lists \"" + quoted_input(s) + "\" twice");
      out.push_back(std::move(s));
    }
    return out;
  }

  int64_t count(const json& v, const std::string& key) const {
    constexpr double kMax = 9.0e18;  // within int64, with room for sums
    if (v.is_number_unsigned() || v.is_number_integer()) {
      if (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0)
        fail("\"" + key + "\" must be >= 0, not " + v.dump());
      if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(kMax))
        fail("\"" + key + "\" is too large: " + v.dump());
      return v.get<int64_t>();
    }
    if (v.is_number_float()) {  // 1e8 is a float in JSON; accept it when whole
      double d = v.get<double>();
      if (d < 0) fail("\"" + key + "\" must be >= 0, not " + v.dump());
      if (!std::isfinite(d) || d > kMax) fail("\"" + key + "\" is too large: " + v.dump());
      if (d != std::floor(d)) fail("\"" + key + "\" must be a whole number, not " + v.dump());
      return static_cast<int64_t>(d);
    }
    fail("\"" + key + "\" must be an integer, not " + json_type_name(v));
  }

  std::optional<std::string> dtype(const json& v, const std::string& key) const {
    if (v.is_null()) return std::nullopt;
    if (!v.is_string()) fail("\"mixed_precision." + key + "\" must be a dtype name or null, not " + json_type_name(v));
    std::string s = v.get<std::string>();
    if (s.rfind("torch.", 0) == 0) s = s.substr(6);
    if (std::find(kPolicyDtypes.begin(), kPolicyDtypes.end(), s) == kPolicyDtypes.end()) {
      auto near = closest(s, kPolicyDtypes, 1);
      fail("\"mixed_precision." + key + "\" is \"" + quoted_input(v.get<std::string>()) + "\", not a floating dtype" +
           (near.empty() ? " (one of " + join(kPolicyDtypes) + ")" : "; did you mean \"" + near[0] + "\"?"));
    }
    return s;
  }

  std::string one_of(const json& v, const std::string& key, const std::vector<std::string>& allowed) const {
    if (!v.is_string()) fail("\"" + key + "\" must be a string, not " + json_type_name(v));
    std::string s = v.get<std::string>();
    if (std::find(allowed.begin(), allowed.end(), s) != allowed.end()) return s;
    auto near = closest(s, allowed, 1);
    fail("\"" + key + "\" is \"" + quoted_input(s) + "\"" +
         (near.empty() ? ", not one of " + join(allowed) : "; did you mean \"" + near[0] + "\"?"));
  }

  // "hardware": the step-time estimate's GPU preset and overrides (settings.h hardware_fields).
  void parse_hardware(const json& v, HardwareSettings& out) const {
    if (!v.is_object()) fail("\"hardware\" must be an object, not " + json_type_name(v));
    check_keys(v, hardware_keys(), " in \"hardware\"");
    if (auto it = v.find("preset"); it != v.end()) {
      out.preset = *hardware_names().parse(one_of(*it, "hardware.preset", hardware_names().names()));
      out.preset_given = true;
    }
    if (auto it = v.find("gpus_per_node"); it != v.end()) {
      out.gpus_per_node = count(*it, "hardware.gpus_per_node");
      if (*out.gpus_per_node < 1 || *out.gpus_per_node > kMaxWorldSize)
        fail("\"hardware.gpus_per_node\" must be from 1 to " + std::to_string(kMaxWorldSize));
    }
    for (const auto& f : hardware_fields()) {
      auto it = v.find(f.key);
      if (it == v.end()) continue;
      const std::string where = std::string("\"hardware.") + f.key + "\"";
      if (!it->is_number()) fail(where + " must be a number, not " + json_type_name(*it));
      const double d = it->get<double>();
      if (std::string why = hardware_value_error(where, d, f.efficiency); !why.empty()) fail(why);
      out.*f.field = d;
    }
  }

  void parse_fsdp(const json& v, FsdpSettings& out) const {
    if (!v.is_object()) fail("\"fsdp\" must be an object, not " + json_type_name(v));
    check_keys(v, kFsdpKeys, " in \"fsdp\"");
    if (auto it = v.find("world_size"); it != v.end()) {
      out.world_size = count(*it, "fsdp.world_size");
      out.world_size_given = true;
      if (out.world_size < 1 || out.world_size > kMaxWorldSize)
        fail("\"fsdp.world_size\" must be from 1 to " + std::to_string(kMaxWorldSize));
    }
    if (auto it = v.find("sharding_strategy"); it != v.end())
      out.strategy = *strategy_names().parse(one_of(*it, "fsdp.sharding_strategy", strategy_names().names()));
    if (auto it = v.find("shard_group_size"); it != v.end()) {
      out.shard_group_size = count(*it, "fsdp.shard_group_size");
      if (out.shard_group_size < 1 || out.shard_group_size > kMaxWorldSize)
        fail("\"fsdp.shard_group_size\" must be from 1 to " + std::to_string(kMaxWorldSize));
    }
    if (auto it = v.find("use_orig_params"); it != v.end()) {
      if (!it->is_boolean()) fail("\"fsdp.use_orig_params\" must be true or false, not " + json_type_name(*it));
      out.use_orig_params = it->get<bool>();
    }
    if (auto it = v.find("fp32_master_weights"); it != v.end()) {
      if (!it->is_boolean()) fail("\"fsdp.fp32_master_weights\" must be true or false, not " + json_type_name(*it));
      out.fp32_master_weights = it->get<bool>();
    }
    if (auto it = v.find("gradient_accumulation_steps"); it != v.end()) {
      out.gradient_accumulation_steps = count(*it, "fsdp.gradient_accumulation_steps");
      if (out.gradient_accumulation_steps < 1 || out.gradient_accumulation_steps > kMaxAccumulationSteps)
        fail("\"fsdp.gradient_accumulation_steps\" must be from 1 to " + std::to_string(kMaxAccumulationSteps));
    }
    if (auto it = v.find("no_sync"); it != v.end()) {
      if (!it->is_boolean()) fail("\"fsdp.no_sync\" must be true or false, not " + json_type_name(*it));
      out.no_sync = it->get<bool>();
    }
    if (auto it = v.find("optimizer"); it != v.end())
      out.optimizer = *optimizer_names().parse(one_of(*it, "fsdp.optimizer", optimizer_names().names()));
    if (auto it = v.find("optimizer_impl"); it != v.end())
      out.optimizer_impl =
          *optimizer_impl_names().parse(one_of(*it, "fsdp.optimizer_impl", optimizer_impl_names().names()));
    if (auto it = v.find("version"); it != v.end()) {
      if (!it->is_number_integer() || (it->get<int64_t>() != 1 && it->get<int64_t>() != 2))
        fail("\"fsdp.version\" must be 1 (FullyShardedDataParallel) or 2 (fully_shard), not " + it->dump());
      out.version = *parse_version(it->get<int>());
    }
    if (auto it = v.find("reshard_after_forward"); it != v.end())
      out.reshard_after_forward = reshard(*it, "fsdp.reshard_after_forward");
    if (auto it = v.find("cpu_offload"); it != v.end()) {
      if (!it->is_boolean()) fail("\"fsdp.cpu_offload\" must be true or false, not " + json_type_name(*it));
      out.cpu_offload = it->get<bool>();
    }
  }

  // fully_shard's reshard_after_forward: true, false or a rank count >= 1
  // (whether it divides the shard size is checked against the mesh).
  ReshardAfterForward reshard(const json& v, const std::string& key) const {
    ReshardAfterForward r;
    if (v.is_boolean()) {
      r.kind = v.get<bool>() ? ReshardAfterForward::Kind::True : ReshardAfterForward::Kind::False;
      return r;
    }
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxWorldSize)
      fail("\"" + key + "\" must be true, false or a number of ranks from 1 to " + std::to_string(kMaxWorldSize) +
           ", not " + v.dump());
    r.kind = ReshardAfterForward::Kind::Ranks;
    r.ranks = v.get<int64_t>();
    return r;
  }

  std::vector<Fsdp2Group> groups(const json& v) const {
    if (!v.is_array()) fail("\"groups\" must be a list of objects, not " + json_type_name(v));
    if (v.size() > kMaxPolicyList)
      fail("\"groups\" lists " + std::to_string(v.size()) + " groups, more than a policy list can (" +
           std::to_string(kMaxPolicyList) + ")");
    std::vector<Fsdp2Group> out;
    for (size_t i = 0; i < v.size(); ++i) {
      const json& g = v[i];
      const std::string where = "groups[" + std::to_string(i) + "]";
      if (!g.is_object()) fail("\"" + where + "\" must be an object, not " + json_type_name(g));
      check_keys(g, kGroupKeys, " in \"" + where + "\"");
      auto m = g.find("modules");
      if (m == g.end()) fail("\"" + where + "\" has no \"modules\"");
      Fsdp2Group group;
      group.modules = string_list(*m, where + ".modules", false);
      if (group.modules.empty()) fail("\"" + where + ".modules\" is empty");
      for (const auto& path : group.modules)
        if (path.find('*') != std::string::npos)
          fail("\"" + where + ".modules\" holds \"" + path + "\": module paths here are exact, not globs");
      if (auto r = g.find("reshard_after_forward"); r != g.end() && !r->is_null())
        group.reshard_after_forward = reshard(*r, where + ".reshard_after_forward");
      out.push_back(std::move(group));
    }
    return out;
  }

  CompileConfig compile(const json& v) const {
    if (!v.is_object()) fail("\"compile\" must be an object or null, not " + json_type_name(v));
    check_keys(v, {"module_classes", "memory_budget"}, " in \"compile\"");
    CompileConfig c;
    if (auto it = v.find("module_classes"); it != v.end()) c.module_classes = string_list(*it, "compile.module_classes", true);
    if (auto it = v.find("memory_budget"); it != v.end() && !it->is_null()) {
      // choose_saved_values_set: "The valid ranges for memory budget are 0 <= m <= 1".
      if (!it->is_number() || it->get<double>() < 0 || it->get<double>() > 1)
        fail("\"compile.memory_budget\" must be a number from 0 to 1 (torch's activation_memory_budget), not " +
             it->dump());
      c.memory_budget = it->get<double>();
      c.memory_budget_given = true;
    }
    if (c.module_classes.empty())
      fail("\"compile\" names no module: give \"module_classes\" (e.g. [\"LlamaDecoderLayer\"]), the blocks "
           "torch.compile compiles one by one");
    return c;
  }

  ActivationCheckpointing activation_checkpointing(const json& v) const {
    if (!v.is_object()) fail("\"activation_checkpointing\" must be an object or null, not " + json_type_name(v));
    check_keys(v, kActivationCheckpointingKeys, " in \"activation_checkpointing\"");
    ActivationCheckpointing ac;
    if (auto it = v.find("module_classes"); it != v.end() && !it->is_null())
      ac.module_classes = string_list(*it, "activation_checkpointing.module_classes", true);
    if (auto it = v.find("modules"); it != v.end() && !it->is_null()) {
      // Exact paths, "" for the whole model: string_list refuses empty strings, so read them here.
      if (!it->is_array())
        fail("\"activation_checkpointing.modules\" must be a list of strings, not " + json_type_name(*it));
      std::set<std::string> seen;
      for (const auto& item : *it) {
        if (!item.is_string())
          fail("\"activation_checkpointing.modules\" must be a list of strings, but holds " + json_type_name(item));
        std::string path = item.get<std::string>();
        if (path.find('*') != std::string::npos)
          fail("\"activation_checkpointing.modules\" holds \"" + path + "\": module paths here are exact, not globs");
        if (!seen.insert(path).second) fail("\"activation_checkpointing.modules\" lists \"" + path + "\" twice");
        ac.modules.push_back(std::move(path));
      }
    }
    if (ac.module_classes.empty() && ac.modules.empty())
      fail("\"activation_checkpointing\" names no module: give \"module_classes\" (e.g. [\"LlamaDecoderLayer\"]) "
           "or \"modules\", or leave the key out");
    checkpoint_mode(v, ac);
    return ac;
  }

  // "mode", "save_ops", "recompute_mm_fqns" (issue 42: selective checkpointing).
  void checkpoint_mode(const json& v, ActivationCheckpointing& ac) const {
    if (auto it = v.find("mode"); it != v.end() && !it->is_null()) {
      if (!it->is_string() || (*it != "full" && *it != "selective"))
        fail("\"activation_checkpointing.mode\" must be \"full\" or \"selective\", not " + it->dump());
      ac.mode = *it == "selective" ? CheckpointMode::Selective : CheckpointMode::Full;
    }
    for (const char* key : {"save_ops", "recompute_mm_fqns"})
      if (auto it = v.find(key); it != v.end() && !it->is_null() && !ac.selective())
        fail(std::string("\"activation_checkpointing.") + key + "\" needs \"mode\": \"selective\"");
    if (auto it = v.find("save_ops"); it != v.end() && !it->is_null()) {
      if (it->is_string()) {
        if (*it != "torchtitan")
          fail("\"activation_checkpointing.save_ops\" must be \"torchtitan\" or a list of ATen overloads, not " +
               it->dump());
      } else {
        ac.torchtitan_policy = false;
        ac.save_ops = string_list(*it, "activation_checkpointing.save_ops", true);
        if (ac.save_ops.empty())
          fail("\"activation_checkpointing.save_ops\" is empty: give \"torchtitan\" or ATen overloads");
        for (const std::string& op : ac.save_ops)
          if (std::count(op.begin(), op.end(), '.') != 2 || op.front() == '.' || op.back() == '.' ||
              op.find("..") != std::string::npos || op.find_first_of(" */") != std::string::npos)
            fail("\"activation_checkpointing.save_ops\" holds \"" + op +
                 "\": name an ATen overload as torch.ops spells it without the prefix, e.g. \"aten.mm.default\"");
      }
    }
    if (auto it = v.find("recompute_mm_fqns"); it != v.end() && !it->is_null()) {
      if (!ac.torchtitan_policy)
        fail("\"activation_checkpointing.recompute_mm_fqns\" is part of torchtitan's policy: it needs "
             "\"save_ops\": \"torchtitan\"");
      ac.recompute_mm_fqns = string_list(*it, "activation_checkpointing.recompute_mm_fqns", true);
      ac.recompute_mm_fqns_given = true;
    }
  }

  double share(const json& v, const std::string& key) const {
    if (!v.is_number()) fail("\"" + key + "\" must be a number, not " + json_type_name(v));
    double share = v.get<double>();
    if (share < 0 || share > 1) fail("\"" + key + "\" is a share between 0 and 1, not " + v.dump());
    return share;
  }

  Budgets checks(const json& obj) const {
    if (!obj.is_object()) fail("\"checks\" must be an object, not " + json_type_name(obj));
    check_keys(obj, kChecksKeys, " in \"checks\"");
    Budgets b;
    if (auto it = obj.find("max_unit_numel"); it != obj.end()) b.max_unit_numel = count(*it, "checks.max_unit_numel");
    if (auto it = obj.find("max_units"); it != obj.end()) b.max_units = count(*it, "checks.max_units");
    if (auto it = obj.find("max_root_share"); it != obj.end()) b.max_root_share = share(*it, "checks.max_root_share");
    if (auto it = obj.find("warn_root_share"); it != obj.end())
      b.warn_root_share = share(*it, "checks.warn_root_share");
    if (auto it = obj.find("max_peak_bytes"); it != obj.end()) {
      if (it->is_string()) {
        auto size = parse_size(it->get<std::string>());
        if (!size) fail("\"checks.max_peak_bytes\" is " + it->dump() + ", not a size (e.g. 80GiB, 80GB, 1.5TiB)");
        b.max_peak_bytes = size;
      } else if (it->is_number()) {
        b.max_peak_bytes = count(*it, "checks.max_peak_bytes");
      } else {
        fail("\"checks.max_peak_bytes\" must be a byte count or a size string, not " + json_type_name(*it));
      }
    }
    if (auto it = obj.find("fail_on"); it != obj.end()) {
      b.fail_on = string_list(*it, "checks.fail_on", false);
      for (const auto& kind : b.fail_on) {
        std::string why = fail_on_error(kind);
        if (!why.empty()) fail("\"checks.fail_on\" " + why);
      }
    }
    return b;
  }

  // parallelize_module applies its plan's entries in the dict's order, and
  // the emitted code and the plan's JSON keep it; nlohmann::json sorts an
  // object's keys, so the order is taken from the text by a SAX pass that
  // keeps the keys of tensor_parallel.plan alone (an ordered_json parse
  // searched every object's keys on each insert: quadratic in the keys).
  static void in_written_order(TensorParallel& tp, const std::string& text) {
    if (tp.plan.size() < 2) return;
    PlanKeyOrder sax;
    if (!json::sax_parse(text, &sax) || sax.order.empty()) return;
    std::unordered_map<std::string, size_t> index;  // a table, not a search per comparison
    for (size_t i = 0; i < sax.order.size(); ++i) index.emplace(sax.order[i], i);
    auto rank = [&](const std::string& key) {
      auto it = index.find(key);
      return it == index.end() ? sax.order.size() : it->second;
    };
    std::stable_sort(tp.plan.begin(), tp.plan.end(),
                     [&](const auto& a, const auto& b) { return rank(a.first) < rank(b.first); });
  }

  Policy parse(const std::string& text) const {
    const json doc = parse_json(text, file_);
    if (!doc.is_object()) fail("a policy must be a JSON object, not " + json_type_name(doc));
    check_keys(doc, kTopKeys, "");

    Policy p;
    if (auto it = doc.find("module_classes"); it != doc.end() && !it->is_null()) {
      p.module_classes = string_list(*it, "module_classes", true);
      if (p.module_classes->empty())
        fail("\"module_classes\" is empty; leave the key out to wrap by size or not at all");
    }
    if (auto it = doc.find("min_num_params"); it != doc.end() && !it->is_null())
      p.min_num_params = count(*it, "min_num_params");
    if (auto it = doc.find("force_leaf_modules"); it != doc.end() && !it->is_null()) {
      p.force_leaf_modules = string_list(*it, "force_leaf_modules", true);
      p.force_leaf_given = true;
    }
    if (auto it = doc.find("exclude_wrap_modules"); it != doc.end() && !it->is_null()) {
      p.exclude_wrap_modules = string_list(*it, "exclude_wrap_modules", true);
      p.exclude_wrap_given = true;
    }
    if (auto it = doc.find("mixed_precision"); it != doc.end() && !it->is_null()) {
      if (!it->is_object()) fail("\"mixed_precision\" must be an object or null, not " + json_type_name(*it));
      check_keys(*it, kMixedPrecisionKeys, " in \"mixed_precision\"");
      MixedPrecision mp;
      for (const auto& [key, field] : kDtypeFields)
        if (auto f = it->find(key); f != it->end()) mp.*field = dtype(*f, key);
      for (const auto& [key, field] : kFlagFields) {
        auto f = it->find(key);
        if (f == it->end()) continue;
        if (!f->is_boolean())
          fail("\"mixed_precision." + std::string(key) + "\" must be true or false, not " + json_type_name(*f));
        mp.*field = f->get<bool>();
      }
      if (auto f = it->find("ignore_classes"); f != it->end() && !f->is_null()) {
        mp.ignore_classes = string_list(*f, "mixed_precision.ignore_classes", true);
        mp.ignore_classes_given = true;
      }
      p.mixed_precision = std::move(mp);
    }
    if (auto it = doc.find("fsdp"); it != doc.end() && !it->is_null()) parse_fsdp(*it, p.fsdp);
    if (auto it = doc.find("hardware"); it != doc.end() && !it->is_null()) parse_hardware(*it, p.hardware);
    if (auto it = doc.find("ignored_modules"); it != doc.end() && !it->is_null())
      p.ignored_modules = string_list(*it, "ignored_modules", false);
    if (auto it = doc.find("ignored_params"); it != doc.end() && !it->is_null())
      p.ignored_params = string_list(*it, "ignored_params", false);
    if (auto it = doc.find("checks"); it != doc.end() && !it->is_null()) p.checks = checks(*it);
    if (auto it = doc.find("groups"); it != doc.end() && !it->is_null()) p.groups = groups(*it);
    if (auto it = doc.find("tensor_parallel"); it != doc.end() && !it->is_null()) {
      p.tensor_parallel = parse_tensor_parallel(*it, file_);
      in_written_order(*p.tensor_parallel, text);
    }
    if (auto it = doc.find("expert_parallel"); it != doc.end() && !it->is_null())
      p.expert_parallel = parse_expert_parallel(*it, file_);
    if (auto it = doc.find("context_parallel"); it != doc.end() && !it->is_null())
      p.context_parallel = parse_context_parallel(*it, file_);
    if (auto it = doc.find("activation_checkpointing"); it != doc.end() && !it->is_null())
      p.activation_checkpointing = activation_checkpointing(*it);
    if (auto it = doc.find("compile"); it != doc.end() && !it->is_null()) p.compile = compile(*it);
    return p;
  }

 private:
  std::string file_;
};

}  // namespace

std::string fail_on_error(const std::string& kind) {
  std::vector<std::string> valid = warning_kinds();
  valid.push_back("any");
  if (std::find(valid.begin(), valid.end(), kind) != valid.end()) return "";
  auto near = closest(kind, valid, 1);
  return "names \"" + kind + "\", not a warning kind" +
         (near.empty() ? " (one of " + join(valid) + ")" : "; did you mean \"" + near[0] + "\"?");
}

Policy parse_policy(const std::string& text, const std::string& file) { return Parser(file).parse(text); }

void reject_model_file(const std::string& text, const std::string& file) {
  // A model where the policy goes: say so, rather than report its bytes as bad JSON.
  const bool zip = text.rfind("PK\x03\x04", 0) == 0, pickle = text.rfind("\x80", 0) == 0;
  if (zip || pickle)
    throw InputError(file, std::string("this is a model file (") + (zip ? "a zip archive" : "a pickle") +
                               "), not a policy: give the model as the first argument and a policy JSON "
                               "with --policy");
}

Policy load_policy_file(const std::string& file) {
  std::string text = read_text_file(file, kMaxPolicyFileBytes, "a policy");
  reject_model_file(text, file);
  return parse_policy(text, file);
}

std::string MixedPrecision::field_not_in(FsdpVersion version) const {
  if (version == FsdpVersion::V2) {
    if (keep_low_precision_grads) return "keep_low_precision_grads";
    if (cast_root_forward_inputs) return "cast_root_forward_inputs";
  } else if (output_dtype) {
    return "output_dtype";
  }
  return "";
}

std::string Policy::combination_error() const {
  if (mixed_precision) {
    const std::string field = mixed_precision->field_not_in(fsdp.version);
    if (!field.empty())
      return fsdp.v2()
                 ? "FSDP2's MixedPrecisionPolicy has no " + field + " (FSDP1's MixedPrecision has): remove "
                   "\"mixed_precision." + field + "\" or plan FSDP1"
                 : "FSDP1's MixedPrecision has no " + field + " (FSDP2's MixedPrecisionPolicy has): remove "
                   "\"mixed_precision." + field + "\" or plan FSDP2 (\"fsdp\": {\"version\": 2} or --fsdp-version 2)";
  }
  if (expert_parallel && !fsdp.v2())
    return "\"expert_parallel\" shards the routed experts with fully_shard on the (efsdp, ep) mesh: it needs FSDP2 "
           "(\"fsdp\": {\"version\": 2} or --fsdp-version 2)";
  if (context_parallel && !fsdp.v2())
    return "\"context_parallel\" shards parameters with fully_shard over the (dp_shard, cp) ranks: it needs FSDP2 "
           "(\"fsdp\": {\"version\": 2} or --fsdp-version 2)";
  if (expert_parallel && tensor_parallel)
    return "\"expert_parallel\" with \"tensor_parallel\": fsdp-plan plans expert parallelism over the data-parallel "
           "ranks only (torchtitan's ep borrowing tp ranks is not modelled); drop one of the two";
  if (!groups.empty() && !fsdp.v2())
    return "the policy's \"groups\" are fully_shard calls: they need FSDP2 (\"fsdp\": {\"version\": 2} or "
           "--fsdp-version 2)";
  if (fsdp.v2() &&
      (fsdp.strategy == ShardingStrategy::ShardGradOp || fsdp.strategy == ShardingStrategy::NoShard))
    return std::string("FSDP2 has no sharding strategy ") + strategy_name(fsdp.strategy) +
           ": use fsdp.reshard_after_forward false for SHARD_GRAD_OP's behaviour, HYBRID_SHARD for a "
           "(replicate, shard) mesh";
  return "";
}

nlohmann::ordered_json reshard_to_json(const ReshardAfterForward& r) {
  switch (r.kind) {
    case ReshardAfterForward::Kind::True: return true;
    case ReshardAfterForward::Kind::False: return false;
    case ReshardAfterForward::Kind::Ranks: return r.ranks;
  }
  return true;
}

namespace {

// The selective checkpointing fields, as the policy file spells them.
void add_selective(nlohmann::ordered_json& ac, const ActivationCheckpointing& c) {
  ac["mode"] = "selective";
  if (c.torchtitan_policy)
    ac["save_ops"] = "torchtitan";
  else
    ac["save_ops"] = c.save_ops;
  if (c.recompute_mm_fqns_given) ac["recompute_mm_fqns"] = c.recompute_mm_fqns;
}

}  // namespace

nlohmann::ordered_json policy_to_json(const Policy& p) {
  nlohmann::ordered_json out;
  out["auto_wrap"] = p.auto_wrap();
  out["module_classes"] = p.module_classes ? nlohmann::ordered_json(*p.module_classes) : nullptr;
  out["min_num_params"] = p.min_num_params ? nlohmann::ordered_json(*p.min_num_params) : nullptr;
  // FSDP2's size rule (Accelerate's) has neither set unless the policy names
  // exclude_wrap_modules (fsdp2/units.cpp): FSDP1's defaults do not apply to it.
  const bool fsdp2 = p.fsdp.v2();
  out["force_leaf_modules"] = fsdp2 ? nlohmann::ordered_json::array() : nlohmann::ordered_json(p.force_leaf_modules);
  out["exclude_wrap_modules"] = fsdp2 && !p.exclude_wrap_given ? nlohmann::ordered_json::array()
                                                               : nlohmann::ordered_json(p.exclude_wrap_modules);
  if (p.mixed_precision) {
    const auto& mp = *p.mixed_precision;
    auto opt = [](const std::optional<std::string>& s) { return s ? nlohmann::ordered_json(*s) : nullptr; };
    out["mixed_precision"] = {{"param_dtype", opt(mp.param_dtype)},
                              {"reduce_dtype", opt(mp.reduce_dtype)},
                              {"buffer_dtype", opt(mp.buffer_dtype)},
                              {"ignore_classes", mp.ignore_classes}};
    // The version's own fields, PyTorch's defaults filled in.
    auto& j = out["mixed_precision"];
    if (p.fsdp.v2()) {
      j["output_dtype"] = opt(mp.output_dtype);
      j["cast_forward_inputs"] = mp.casts_forward_inputs(FsdpVersion::V2);
    } else {
      j["keep_low_precision_grads"] = mp.keep_low_grads();
      j["cast_forward_inputs"] = mp.casts_forward_inputs(FsdpVersion::V1);
      j["cast_root_forward_inputs"] = mp.casts_root_forward_inputs();
    }
  } else {
    out["mixed_precision"] = nullptr;
  }
  out["ignored_modules"] = p.ignored_modules;
  out["ignored_params"] = p.ignored_params;
  // Only when set, so plans without it stay as they were.
  if (p.activation_checkpointing) {
    out["activation_checkpointing"] = {{"module_classes", p.activation_checkpointing->module_classes},
                                       {"modules", p.activation_checkpointing->modules}};
    // Selective only, so full-AC plans stay as they were.
    if (p.activation_checkpointing->selective())
      add_selective(out["activation_checkpointing"], *p.activation_checkpointing);
  }
  if (p.compile) {
    out["compile"] = {{"module_classes", p.compile->module_classes}};
    if (p.compile->memory_budget_given) out["compile"]["memory_budget"] = p.compile->memory_budget;
  }
  out["fsdp"] = {{"world_size", p.fsdp.world_size},
                 {"sharding_strategy", strategy_name(p.fsdp.strategy)},
                 {"shard_group_size", p.fsdp.shard_group_size > 0 ? nlohmann::ordered_json(p.fsdp.shard_group_size)
                                                                  : nlohmann::ordered_json(nullptr)},
                 {"use_orig_params", p.fsdp.use_orig_params},
                 {"optimizer", optimizer_name(p.fsdp.optimizer)}};
  if (p.fsdp.optimizer_impl) out["fsdp"]["optimizer_impl"] = optimizer_impl_name(*p.fsdp.optimizer_impl);
  if (p.fsdp.fp32_master_weights) out["fsdp"]["fp32_master_weights"] = true;  // only when set, as above
  if (p.fsdp.gradient_accumulation_steps > 1)
    out["fsdp"]["gradient_accumulation_steps"] = p.fsdp.gradient_accumulation_steps;
  if (p.fsdp.no_sync) out["fsdp"]["no_sync"] = true;
  if (p.fsdp.v2()) {
    out["fsdp"]["version"] = 2;
    out["fsdp"]["reshard_after_forward"] = reshard_to_json(p.fsdp.reshard_after_forward);
    out["fsdp"]["cpu_offload"] = p.fsdp.cpu_offload;
    nlohmann::ordered_json groups = nlohmann::ordered_json::array();
    for (const auto& g : p.groups)
      groups.push_back({{"modules", g.modules},
                        {"reshard_after_forward", g.reshard_after_forward ? reshard_to_json(*g.reshard_after_forward)
                                                                          : nlohmann::ordered_json(nullptr)}});
    out["groups"] = std::move(groups);
    // dp_shard is what tp, dp_replicate and cp leave of the world.
    if (p.tensor_parallel)
      out["tensor_parallel"] = tensor_parallel_to_json(
          *p.tensor_parallel, p.fsdp.world_size / (p.context_parallel ? std::max<int64_t>(1, p.context_parallel->degree) : 1));
    if (p.expert_parallel) out["expert_parallel"] = expert_parallel_json(*p.expert_parallel);
    if (p.context_parallel) out["context_parallel"] = context_parallel_json(*p.context_parallel);
  }
  return out;
}

nlohmann::ordered_json policy_file_json(const Policy& p) {
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  if (p.module_classes) out["module_classes"] = *p.module_classes;
  if (p.min_num_params) out["min_num_params"] = *p.min_num_params;
  if (p.force_leaf_given) out["force_leaf_modules"] = p.force_leaf_modules;
  if (p.exclude_wrap_given) out["exclude_wrap_modules"] = p.exclude_wrap_modules;
  if (p.mixed_precision) {
    const auto& mp = *p.mixed_precision;
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    for (const auto& [key, field] : kDtypeFields)
      if (mp.*field) j[key] = *(mp.*field);
    if (mp.ignore_classes_given) j["ignore_classes"] = mp.ignore_classes;
    for (const auto& [key, field] : kFlagFields)
      if (mp.*field) j[key] = *(mp.*field);
    out["mixed_precision"] = j;
  }
  if (!p.ignored_modules.empty()) out["ignored_modules"] = p.ignored_modules;
  if (!p.ignored_params.empty()) out["ignored_params"] = p.ignored_params;
  if (p.activation_checkpointing) {
    nlohmann::ordered_json ac = nlohmann::ordered_json::object();
    if (!p.activation_checkpointing->module_classes.empty())
      ac["module_classes"] = p.activation_checkpointing->module_classes;
    if (!p.activation_checkpointing->modules.empty()) ac["modules"] = p.activation_checkpointing->modules;
    if (p.activation_checkpointing->selective()) add_selective(ac, *p.activation_checkpointing);
    out["activation_checkpointing"] = std::move(ac);
  }
  if (p.compile) {
    out["compile"] = {{"module_classes", p.compile->module_classes}};
    if (p.compile->memory_budget_given) out["compile"]["memory_budget"] = p.compile->memory_budget;
  }
  if (!p.groups.empty()) {
    nlohmann::ordered_json groups = nlohmann::ordered_json::array();
    for (const auto& g : p.groups) {
      nlohmann::ordered_json j = {{"modules", g.modules}};
      if (g.reshard_after_forward) j["reshard_after_forward"] = reshard_to_json(*g.reshard_after_forward);
      groups.push_back(std::move(j));
    }
    out["groups"] = std::move(groups);
  }
  nlohmann::ordered_json fsdp = {{"world_size", p.fsdp.world_size},
                                 {"sharding_strategy", strategy_name(p.fsdp.strategy)}};
  if (p.fsdp.shard_group_size > 0) fsdp["shard_group_size"] = p.fsdp.shard_group_size;
  fsdp["use_orig_params"] = p.fsdp.use_orig_params;
  fsdp["optimizer"] = optimizer_name(p.fsdp.optimizer);
  if (p.fsdp.optimizer_impl) fsdp["optimizer_impl"] = optimizer_impl_name(*p.fsdp.optimizer_impl);
  if (p.fsdp.cpu_offload) fsdp["cpu_offload"] = true;
  if (p.fsdp.fp32_master_weights) fsdp["fp32_master_weights"] = true;
  if (p.fsdp.gradient_accumulation_steps > 1) fsdp["gradient_accumulation_steps"] = p.fsdp.gradient_accumulation_steps;
  if (p.fsdp.no_sync) fsdp["no_sync"] = true;
  if (p.fsdp.v2()) {
    fsdp["version"] = 2;
    if (!(p.fsdp.reshard_after_forward == ReshardAfterForward{}))
      fsdp["reshard_after_forward"] = reshard_to_json(p.fsdp.reshard_after_forward);
  }
  out["fsdp"] = fsdp;
  if (p.tensor_parallel) out["tensor_parallel"] = tensor_parallel_file_json(*p.tensor_parallel);
  if (p.expert_parallel) out["expert_parallel"] = expert_parallel_json(*p.expert_parallel);
  if (p.context_parallel) out["context_parallel"] = context_parallel_json(*p.context_parallel);
  if (p.hardware.any_given()) {
    nlohmann::ordered_json hw = nlohmann::ordered_json::object();
    if (p.hardware.preset_given) hw["preset"] = hardware_names().name(p.hardware.preset);
    if (p.hardware.gpus_per_node) hw["gpus_per_node"] = *p.hardware.gpus_per_node;
    for (const auto& f : hardware_fields())
      if (p.hardware.*f.field) hw[f.key] = *(p.hardware.*f.field);
    out["hardware"] = std::move(hw);
  }
  return out;
}

FsdpSettings memory_settings(const Policy& policy) {
  FsdpSettings s = policy.fsdp;
  if (!s.optimizer_impl) s.optimizer_impl = default_optimizer_impl(s, policy.activations.device);
  return s;
}

}  // namespace fsdp_plan
