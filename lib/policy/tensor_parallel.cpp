#include "policy/tensor_parallel.h"

#include <algorithm>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/loaders/printable.h"
#include "util/errors.h"
#include "util/json_input.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

using json = nlohmann::json;

const std::vector<std::string> kKeys = {"degree", "plan", "mesh"};
constexpr size_t kMaxTpPlanKeys = 100000;  // docs/limits.md: as a policy list
constexpr size_t kMaxTpPlanKey = 4096;     // as a policy string
constexpr int kMaxTensorDims = 64;         // torch's limit on a tensor's dimensions
const std::vector<std::string> kMeshKeys = {"dp_replicate", "dp_shard"};
const std::vector<std::string> kStyleKeys = {"style",           "input_layouts",         "output_layouts",
                                             "use_local_output", "sequence_dim",         "desired_input_layouts",
                                             "desired_output_layouts"};

// torch's layouts as a plan writes them: Replicate() or Shard(d), spelled
// "replicate" or "shard(N)" with N an optional '-' and ASCII digits. By hand,
// not std::regex: its instantiations were a fifth of this unity batch's code.
bool valid_layout(const std::string& s) {
  if (s == "replicate") return true;
  const std::string open = "shard(";
  if (s.size() <= open.size() + 1 || s.compare(0, open.size(), open) != 0 || s.back() != ')') return false;
  size_t i = open.size();
  const size_t end = s.size() - 1;
  if (s[i] == '-') ++i;
  if (i == end || end - i > 2) return false;  // a tensor has at most 64 dimensions (torch's limit)
  int d = 0;
  for (; i < end; ++i) {
    if (s[i] < '0' || s[i] > '9') return false;
    d = d * 10 + (s[i] - '0');
  }
  return d < kMaxTensorDims;
}

std::string layout_python(const std::string& s) {
  if (s == "replicate") return "Replicate()";
  return "Shard(" + s.substr(6, s.size() - 7) + ")";
}

class TpReader {
 public:
  explicit TpReader(const std::string& file) : file_(file) {}
  [[noreturn]] void fail(const std::string& what) const { throw InputError(file_, what); }

  void check_keys(const json& obj, const std::vector<std::string>& allowed, const std::string& where) const {
    for (const auto& [key, value] : obj.items()) {
      (void)value;
      if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
      auto near = closest(key, allowed, 1);
      fail("unknown key \"" + key + "\" in \"" + where + "\"" +
           (near.empty() ? " (valid keys: " + join(allowed) + ")" : "; did you mean \"" + near[0] + "\"?"));
    }
  }

  // A plan key is a module path pattern: echoed in warnings, written into
  // --emit torch's Python and matched against every module, so bounded and
  // free of control characters as the policy's other paths are (a newline
  // in one made Python that does not parse).
  void plan_key(const std::string& key) const {
    if (key.size() > kMaxTpPlanKey)
      fail("\"tensor_parallel.plan\" has a key of " + std::to_string(key.size()) + " bytes (\"" + quoted_input(key) +
           "\"), longer than a module path pattern can be here (" + std::to_string(kMaxTpPlanKey) + ")");
    if (std::any_of(key.begin(), key.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
      fail("\"tensor_parallel.plan\" has the key \"" + quoted_input(key) +
           "\", which has a control character: not a module path pattern");
  }

  int64_t size(const json& v, const std::string& key) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxWorldSize)
      fail("\"" + key + "\" must be a number of ranks from 1 to " + std::to_string(kMaxWorldSize) + ", not " +
           v.dump());
    return v.get<int64_t>();
  }

  TpStyleSpec style(const json& v, const std::string& where) const {
    TpStyleSpec spec;
    const json* name = &v;
    if (v.is_object()) {
      check_keys(v, kStyleKeys, where);
      auto it = v.find("style");
      if (it == v.end()) fail("\"" + where + "\" has no \"style\"");
      name = &*it;
    } else if (!v.is_string()) {
      fail("\"" + where + "\" must be a style name or an object with \"style\", not " + json_type_name(v));
    }
    if (!name->is_string()) fail("\"" + where + ".style\" must be a string, not " + json_type_name(*name));
    const std::string s = name->get<std::string>();
    auto parsed = tp_style_names().parse(s);
    if (!parsed) {
      auto near = closest(s, tp_style_names().names(), 1);
      fail("\"" + where + "\" names the style \"" + s + "\"" +
           (near.empty() ? ", not one of " + join(tp_style_names().names()) : "; did you mean \"" + near[0] + "\"?"));
    }
    spec.style = *parsed;
    if (spec.style == TpStyle::PrepareModuleInput || spec.style == TpStyle::PrepareModuleOutput)
      return prepare(v, where, spec);
    if (transformers_only_style(spec.style))
      fail("\"" + where + "\" names " + s + ", one of transformers' own styles, which transformers applies "
           "(apply_tensor_parallelism) and parallelize_module does not have; for a model's own plan, give "
           "\"plan\": \"model\"");
    if (!v.is_object()) return spec;
    for (auto [key, field] : {std::pair{"input_layouts", &TpStyleSpec::input_layouts},
                              std::pair{"output_layouts", &TpStyleSpec::output_layouts}}) {
      auto it = v.find(key);
      if (it == v.end()) continue;
      if (!it->is_string() || !valid_layout(it->get<std::string>()))
        fail("\"" + where + "." + key + "\" must be \"replicate\" or \"shard(DIM)\", not " + it->dump());
      spec.*field = it->get<std::string>();
    }
    if (auto it = v.find("use_local_output"); it != v.end()) {
      if (!it->is_boolean()) fail("\"" + where + ".use_local_output\" must be true or false, not " + json_type_name(*it));
      spec.use_local_output = it->get<bool>();
    }
    if (auto it = v.find("sequence_dim"); it != v.end()) {
      if (spec.style != TpStyle::SequenceParallel)
        fail("\"" + where + ".sequence_dim\" is SequenceParallel's: the style here is " + s);
      if (!it->is_number_integer()) fail("\"" + where + ".sequence_dim\" must be an integer, not " + json_type_name(*it));
      const int64_t d = it->get<int64_t>();
      if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(kMaxTensorDims)) {
        fail("\"" + where + ".sequence_dim\" is " + it->dump() + ": a tensor has at most 64 dimensions");
      }
      if (d <= -kMaxTensorDims || d >= kMaxTensorDims)
        fail("\"" + where + ".sequence_dim\" is " + std::to_string(d) + ": a tensor has at most 64 dimensions");
      spec.sequence_dim = d;
    }
    // The layouts each style's constructor takes (torch/distributed/tensor/parallel/style.py).
    const bool io = spec.style == TpStyle::Colwise || spec.style == TpStyle::Rowwise;
    if (spec.input_layouts && !io)
      fail("\"" + where + ".input_layouts\": the style " + s + " takes no input_layouts");
    if (spec.output_layouts && !io)
      fail("\"" + where + ".output_layouts\": the style " + s + " takes no output_layouts");
    for (const char* key : {"desired_input_layouts", "desired_output_layouts"})
      if (v.contains(key)) fail("\"" + where + "." + key + "\": the style " + s + " takes no " + key);
    return spec;
  }

  // PrepareModuleInput(input_layouts, desired_input_layouts, use_local_output)
  // and PrepareModuleOutput(output_layouts, desired_output_layouts, ...): a
  // layout or a list of layouts and nulls, the two lists as long as each other
  // (style.py: the constructor's AssertionErrors).
  TpStyleSpec prepare(const json& v, const std::string& where, TpStyleSpec spec) const {
    const bool in = spec.style == TpStyle::PrepareModuleInput;
    const std::string have = in ? "input_layouts" : "output_layouts", want = "desired_" + have;
    if (v.is_object()) {
      for (const char* key : {"input_layouts", "output_layouts", "desired_input_layouts", "desired_output_layouts",
                              "sequence_dim"})
        if (v.contains(key) && key != have && key != want)
          fail("\"" + where + "." + key + "\": " + tp_style_names().name(spec.style) + " takes " + have + " and " +
               want);
      if (v.contains(have)) spec.prepare_layouts = layouts(v[have], where + "." + have);
      if (v.contains(want)) spec.prepare_desired = layouts(v[want], where + "." + want);
      if (auto it = v.find("use_local_output"); it != v.end()) {
        if (!it->is_boolean())
          fail("\"" + where + ".use_local_output\" must be true or false, not " + json_type_name(*it));
        spec.use_local_output = it->get<bool>();
      }
    }
    if (!spec.prepare_layouts.empty() && spec.prepare_desired.empty())
      fail("\"" + where + "\" has " + have + " but no " + want + " (torch: AssertionError \"desired module " +
           (in ? "inputs" : "outputs") + " should not be None!\")");
    if (spec.prepare_layouts.size() != spec.prepare_desired.size())
      fail("\"" + where + "." + have + "\" and \"" + want + "\" must be as long as each other (torch: " +
           "AssertionError \"" + have + " and " + want + " should have same length!\")");
    return spec;
  }

  TpStyleSpec::Layouts layouts(const json& v, const std::string& where) const {
    TpStyleSpec::Layouts out;
    auto one = [&](const json& x) {
      if (x.is_null()) return std::optional<std::string>();
      if (!x.is_string() || !valid_layout(x.get<std::string>()))
        fail("\"" + where + "\" must be \"replicate\", \"shard(DIM)\" or a list of those and nulls, not " + x.dump());
      return std::optional<std::string>(x.get<std::string>());
    };
    if (v.is_array()) {
      if (v.empty()) fail("\"" + where + "\" is an empty list");
      for (const json& x : v) out.push_back(one(x));
    } else {
      out.push_back(one(v));
      if (!out.back()) fail("\"" + where + "\" must be a layout or a list, not null");
    }
    return out;
  }

 private:
  const std::string& file_;
};

}  // namespace

const NameTable<TpStyle>& tp_style_names() {
  static const NameTable<TpStyle> table({{"colwise", TpStyle::Colwise},
                                         {"rowwise", TpStyle::Rowwise},
                                         {"sequence_parallel", TpStyle::SequenceParallel},
                                         {"replicate", TpStyle::Replicate},
                                         {"prepare_module_input", TpStyle::PrepareModuleInput},
                                         {"prepare_module_output", TpStyle::PrepareModuleOutput},
                                         {"embedding_rowwise", TpStyle::EmbeddingRowwise},
                                         {"packed_colwise", TpStyle::PackedColwise},
                                         {"packed_rowwise", TpStyle::PackedRowwise},
                                         {"moe_tp_experts", TpStyle::MoeExperts},
                                         {"replicated_with_grad_allreduce", TpStyle::GradAllReduce}});
  return table;
}

bool transformers_only_style(TpStyle s) {
  return s == TpStyle::EmbeddingRowwise || s == TpStyle::PackedColwise || s == TpStyle::PackedRowwise ||
         s == TpStyle::MoeExperts || s == TpStyle::GradAllReduce;
}

TpMeshSizes tp_mesh_sizes(const TensorParallel& tp, int64_t world_size) {
  TpMeshSizes m;
  m.tp = tp.degree;
  m.dp_replicate = tp.dp_replicate > 0 ? tp.dp_replicate : 1;
  m.dp_shard = tp.dp_shard > 0 ? tp.dp_shard : std::max<int64_t>(1, world_size / (m.tp * m.dp_replicate));
  return m;
}

TensorParallel parse_tensor_parallel(const json& v, const std::string& file) {
  TpReader r(file);
  if (!v.is_object()) r.fail("\"tensor_parallel\" must be an object, not " + json_type_name(v));
  r.check_keys(v, kKeys, "tensor_parallel");
  TensorParallel tp;
  auto degree = v.find("degree");
  if (degree == v.end()) r.fail("\"tensor_parallel\" has no \"degree\" (the size of the mesh's tp dimension)");
  tp.degree = r.size(*degree, "tensor_parallel.degree");
  auto plan = v.find("plan");
  if (plan == v.end())
    r.fail("\"tensor_parallel\" has no \"plan\" (module-path patterns to styles, as parallelize_module takes)");
  if (plan->is_string() && plan->get<std::string>() == "model") {
    tp.from_model = true;  // the planner reads it from the model file's record (tp/model_plan.cpp)
  } else {
    if (!plan->is_object())
      r.fail("\"tensor_parallel.plan\" must be \"model\" or an object of patterns to styles, not " +
             json_type_name(*plan));
    if (plan->empty()) r.fail("\"tensor_parallel.plan\" is empty");
    if (plan->size() > kMaxTpPlanKeys)
      r.fail("\"tensor_parallel.plan\" has " + std::to_string(plan->size()) + " keys, more than a plan can (" +
             std::to_string(kMaxTpPlanKeys) + ")");
    for (const auto& [pattern, style] : plan->items()) {
      r.plan_key(pattern);
      tp.plan.emplace_back(pattern, r.style(style, "tensor_parallel.plan[\"" + pattern + "\"]"));
    }
  }
  if (auto mesh = v.find("mesh"); mesh != v.end() && !mesh->is_null()) {
    if (!mesh->is_object()) r.fail("\"tensor_parallel.mesh\" must be an object, not " + json_type_name(*mesh));
    r.check_keys(*mesh, kMeshKeys, "tensor_parallel.mesh");
    if (auto it = mesh->find("dp_replicate"); it != mesh->end())
      tp.dp_replicate = r.size(*it, "tensor_parallel.mesh.dp_replicate");
    if (auto it = mesh->find("dp_shard"); it != mesh->end())
      tp.dp_shard = r.size(*it, "tensor_parallel.mesh.dp_shard");
  }
  return tp;
}

std::string tensor_parallel_error(const TensorParallel& tp, const FsdpSettings& fsdp) {
  if (!fsdp.v2())
    return "\"tensor_parallel\" composes with FSDP2 (fully_shard on the mesh's dp_shard dimension), not "
           "FullyShardedDataParallel: plan FSDP2 (\"fsdp\": {\"version\": 2} or --fsdp-version 2)";
  if (fsdp.strategy == ShardingStrategy::HybridShard)
    return "with \"tensor_parallel\", the mesh says how FSDP2 replicates: give "
           "\"tensor_parallel.mesh.dp_replicate\" instead of HYBRID_SHARD";
  const TpMeshSizes m = tp_mesh_sizes(tp, fsdp.world_size);
  const int64_t product = m.dp_replicate * m.dp_shard * m.tp;
  const std::string shape = std::string("(") + (m.dp_replicate > 1 ? "dp_replicate " + std::to_string(m.dp_replicate) + ", " : "") +
                            "dp_shard " + std::to_string(m.dp_shard) + ", tp " + std::to_string(m.tp) + ")";
  if (product != fsdp.world_size)
    return "the mesh " + shape + " has " + std::to_string(product) + " ranks, the world size is " +
           std::to_string(fsdp.world_size) +
           (product > fsdp.world_size ? " (init_device_mesh: \"Mesh should not be bigger than default world size " +
                                            std::to_string(fsdp.world_size) + ", but found " + std::to_string(product) +
                                            " ranks!\")"
                                      : " (ranks outside the mesh would train nothing)") +
           "; make dp_replicate x dp_shard x tp the world size";
  if (m.dp_replicate * m.dp_shard == 1)
    return "tp " + std::to_string(m.tp) + " takes every rank: FSDP has no dimension left to shard across "
           "(Accelerate fails with KeyError: \"Invalid mesh_dim_names ('dp_shard_cp',) specified. Valid "
           "mesh_dim_names are ['tp'].\", huggingface/accelerate issue 3798); lower tp or plan without FSDP";
  return "";
}

static nlohmann::ordered_json layouts_json(const TpStyleSpec::Layouts& l) {
  if (l.size() == 1 && l[0]) return *l[0];
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const auto& x : l) a.push_back(x ? nlohmann::ordered_json(*x) : nlohmann::ordered_json());
  return a;
}

static nlohmann::ordered_json style_json(const TpStyleSpec& s) {
  const bool bare = !s.input_layouts && !s.output_layouts && !s.use_local_output && !s.sequence_dim &&
                    s.prepare_layouts.empty();
  if (bare) return tp_style_names().name(s.style);
  nlohmann::ordered_json j = {{"style", tp_style_names().name(s.style)}};
  if (s.input_layouts) j["input_layouts"] = *s.input_layouts;
  if (s.output_layouts) j["output_layouts"] = *s.output_layouts;
  if (!s.prepare_layouts.empty()) {
    const bool in = s.style == TpStyle::PrepareModuleInput;
    j[in ? "input_layouts" : "output_layouts"] = layouts_json(s.prepare_layouts);
    j[in ? "desired_input_layouts" : "desired_output_layouts"] = layouts_json(s.prepare_desired);
  }
  if (s.use_local_output) j["use_local_output"] = *s.use_local_output;
  if (s.sequence_dim) j["sequence_dim"] = *s.sequence_dim;
  return j;
}

// The plan as a JSON object in its order, a key given twice its last value (as
// operator[] would), in linear time: ordered_json's operator[] searches the
// object's keys, and 100,000 keys took minutes (issue 39).
static nlohmann::ordered_json plan_json(const TensorParallel& tp) {
  nlohmann::ordered_json plan = nlohmann::ordered_json::object();
  auto& entries = static_cast<std::vector<std::pair<const std::string, nlohmann::ordered_json>>&>(
      plan.get_ref<nlohmann::ordered_json::object_t&>());
  std::unordered_map<std::string, size_t> at;
  for (const auto& [pattern, spec] : tp.plan) {
    auto [it, fresh] = at.emplace(pattern, entries.size());
    if (fresh) entries.emplace_back(pattern, style_json(spec));
    else entries[it->second].second = style_json(spec);
  }
  return plan;
}

nlohmann::ordered_json tensor_parallel_file_json(const TensorParallel& tp) {
  nlohmann::ordered_json plan = plan_json(tp);
  nlohmann::ordered_json out = {{"degree", tp.degree}, {"plan", tp.from_model ? nlohmann::ordered_json("model") : plan}};
  nlohmann::ordered_json mesh = nlohmann::ordered_json::object();
  if (tp.dp_replicate > 0) mesh["dp_replicate"] = tp.dp_replicate;
  if (tp.dp_shard > 0) mesh["dp_shard"] = tp.dp_shard;
  if (!mesh.empty()) out["mesh"] = mesh;
  return out;
}

nlohmann::ordered_json tensor_parallel_to_json(const TensorParallel& tp, int64_t world_size) {
  nlohmann::ordered_json out = tensor_parallel_file_json(tp);
  if (tp.from_model && !tp.plan.empty()) out["plan"] = plan_json(tp);  // the plan's policy: the model's plan as read
  const TpMeshSizes m = tp_mesh_sizes(tp, world_size);
  out["mesh"] = {{"dp_replicate", m.dp_replicate}, {"dp_shard", m.dp_shard}};
  return out;
}

std::string tp_style_python(const TpStyleSpec& s) {
  std::vector<std::string> args;
  if (s.input_layouts) args.push_back("input_layouts=" + layout_python(*s.input_layouts));
  if (s.output_layouts) args.push_back("output_layouts=" + layout_python(*s.output_layouts));
  if (!s.prepare_layouts.empty()) {  // tuples: (Shard(1), None)
    auto tuple = [](const TpStyleSpec::Layouts& l) {
      std::vector<std::string> items;
      for (const auto& x : l) items.push_back(x ? layout_python(*x) : "None");
      return "(" + join(items, ", ") + (items.size() == 1 ? ",)" : ")");
    };
    const std::string side = s.style == TpStyle::PrepareModuleInput ? "input" : "output";
    args.push_back(side + "_layouts=" + tuple(s.prepare_layouts));
    args.push_back("desired_" + side + "_layouts=" + tuple(s.prepare_desired));
  }
  if (s.sequence_dim) args.push_back("sequence_dim=" + std::to_string(*s.sequence_dim));
  if (s.use_local_output) args.push_back(std::string("use_local_output=") + (*s.use_local_output ? "True" : "False"));
  const char* cls = "ColwiseParallel";
  switch (s.style) {
    case TpStyle::Colwise: cls = "ColwiseParallel"; break;
    case TpStyle::Rowwise: cls = "RowwiseParallel"; break;
    case TpStyle::SequenceParallel: cls = "SequenceParallel"; break;
    case TpStyle::Replicate: cls = "ReplicateParallel"; break;  // transformers' style, not torch's
    case TpStyle::PrepareModuleInput: cls = "PrepareModuleInput"; break;
    case TpStyle::PrepareModuleOutput: cls = "PrepareModuleOutput"; break;
    case TpStyle::EmbeddingRowwise: return "EmbeddingParallel(shard_dim=0)";  // transformers' classes
    case TpStyle::PackedColwise: cls = "PackedColwiseParallel"; break;
    case TpStyle::PackedRowwise: cls = "PackedRowwiseParallel"; break;
    case TpStyle::MoeExperts: cls = "MoeExpertsParallel"; break;
    case TpStyle::GradAllReduce: cls = "ReplicatedWithGradAllReduce"; break;
  }
  return std::string(cls) + "(" + join(args, ", ") + ")";
}

}  // namespace fsdp_plan
