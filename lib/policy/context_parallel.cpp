#include "policy/context_parallel.h"

#include <algorithm>
#include <string>
#include <vector>

#include "policy/settings.h"
#include "util/errors.h"
#include "util/json_input.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

using json = nlohmann::json;

const std::vector<std::string> kContextParallelKeys = {"degree", "load_balancer", "rotate_method"};

[[noreturn]] void cp_fail(const std::string& file, const std::string& what) { throw InputError(file, what); }

void check_keys(const json& v, const std::string& file) {
  for (const auto& [key, value] : v.items()) {
    (void)value;
    if (std::find(kContextParallelKeys.begin(), kContextParallelKeys.end(), key) != kContextParallelKeys.end())
      continue;
    auto near = closest(key, kContextParallelKeys, 1);
    cp_fail(file, "unknown key \"" + key + "\" in \"context_parallel\"" +
                      (near.empty() ? " (valid keys: " + join(kContextParallelKeys) + ")"
                                    : "; did you mean \"" + near[0] + "\"?"));
  }
}

}  // namespace

const char* rotate_name(ContextParallel::Rotate r) {
  return r == ContextParallel::Rotate::AllGather ? "allgather" : "alltoall";
}

ContextParallel parse_context_parallel(const json& v, const std::string& file) {
  if (!v.is_object()) cp_fail(file, "\"context_parallel\" must be an object, not " + json_type_name(v));
  check_keys(v, file);
  ContextParallel cp;
  auto degree = v.find("degree");
  if (degree == v.end()) cp_fail(file, "\"context_parallel\" has no \"degree\" (the size of the mesh's cp dimension)");
  if (!degree->is_number_integer() || degree->get<int64_t>() < 1 || degree->get<int64_t>() > kMaxWorldSize)
    cp_fail(file, "\"context_parallel.degree\" must be a number of ranks from 1 to " + std::to_string(kMaxWorldSize) +
                      ", not " + degree->dump());
  cp.degree = degree->get<int64_t>();
  if (auto it = v.find("load_balancer"); it != v.end()) {
    // torchtitan's context_parallel_load_balancer: "headtail" for SDPA, None; "ptrr" is FlexAttention's.
    if (it->is_null()) {
      cp.head_tail = false;
    } else if (!it->is_string() || it->get<std::string>() != "headtail") {
      cp_fail(file, "\"context_parallel.load_balancer\" must be \"headtail\" or null, not " + it->dump() +
                        (it->is_string() && it->get<std::string>() == "ptrr"
                             ? " (ptrr balances FlexAttention's block masks; fsdp-plan plans SDPA's ring)"
                             : ""));
    }
  }
  if (auto it = v.find("rotate_method"); it != v.end() && !it->is_null()) {
    const std::string r = it->is_string() ? it->get<std::string>() : "";
    if (r == "allgather") cp.rotate = ContextParallel::Rotate::AllGather;
    else if (r == "alltoall") cp.rotate = ContextParallel::Rotate::AllToAll;
    else
      cp_fail(file, "\"context_parallel.rotate_method\" must be \"allgather\" or \"alltoall\" (torch's "
                    "set_rotate_method), not " + it->dump());
  }
  return cp;
}

nlohmann::ordered_json context_parallel_json(const ContextParallel& cp) {
  nlohmann::ordered_json j = {{"degree", cp.degree}};
  j["load_balancer"] = cp.head_tail ? nlohmann::ordered_json("headtail") : nlohmann::ordered_json(nullptr);
  j["rotate_method"] = rotate_name(cp.rotate);
  return j;
}

}  // namespace fsdp_plan
