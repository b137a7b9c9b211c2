#include "policy/expert_parallel.h"

#include <algorithm>
#include <cmath>

#include "policy/settings.h"
#include "util/errors.h"
#include "util/json_input.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

using json = nlohmann::json;

const std::vector<std::string> kExpertParallelKeys = {"degree", "imbalance", "module_classes", "top_k"};
constexpr size_t kMaxClasses = 100000;   // docs/limits.md: as a policy list
constexpr size_t kMaxClassName = 4096;   // as a policy string
constexpr int64_t kMaxTopK = 1 << 20;    // more than any router routes a token to

[[noreturn]] void ep_fail(const std::string& file, const std::string& what) { throw InputError(file, what); }

int64_t expert_count(const json& v, const std::string& key, int64_t most, const std::string& what,
                 const std::string& file) {
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > most)
    ep_fail(file, "\"" + key + "\" must be " + what + " from 1 to " + std::to_string(most) + ", not " + v.dump());
  return v.get<int64_t>();
}

std::vector<std::string> expert_class_list(const json& v, const std::string& file) {
  if (!v.is_array()) ep_fail(file, "\"expert_parallel.module_classes\" must be a list of class names, not " +
                                    json_type_name(v));
  if (v.size() > kMaxClasses)
    ep_fail(file, "\"expert_parallel.module_classes\" has " + std::to_string(v.size()) + " entries, more than a "
               "policy list can (" + std::to_string(kMaxClasses) + ")");
  std::vector<std::string> out;
  for (const auto& x : v) {
    if (!x.is_string() || x.get<std::string>().empty())
      ep_fail(file, "\"expert_parallel.module_classes\" must hold class names, not " + x.dump());
    const std::string s = x.get<std::string>();
    if (s.size() > kMaxClassName ||
        std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; }))
      ep_fail(file, "\"expert_parallel.module_classes\" has an entry that is no class name (" +
                     std::to_string(s.size()) + " bytes, or a control character)");
    out.push_back(s);
  }
  return out;
}

double imbalance_factor(const json& v, const std::string& file) {
  const double f = v.is_number() ? v.get<double>() : 0;
  if (std::string why = imbalance_error(f); !why.empty())
    ep_fail(file, "\"expert_parallel.imbalance\" " + why + ", not " + v.dump());
  return f;
}

}  // namespace

ExpertParallel parse_expert_parallel(const json& v, const std::string& file) {
  if (!v.is_object()) ep_fail(file, "\"expert_parallel\" must be an object, not " + json_type_name(v));
  for (const auto& [key, value] : v.items()) {
    (void)value;
    if (std::find(kExpertParallelKeys.begin(), kExpertParallelKeys.end(), key) != kExpertParallelKeys.end()) continue;
    auto near = closest(key, kExpertParallelKeys, 1);
    ep_fail(file, "unknown key \"" + key + "\" in \"expert_parallel\"" +
                   (near.empty() ? " (valid keys: " + join(kExpertParallelKeys) + ")" : "; did you mean \"" + near[0] + "\"?"));
  }
  ExpertParallel ep;
  auto degree = v.find("degree");
  if (degree == v.end()) ep_fail(file, "\"expert_parallel\" has no \"degree\" (the size of the mesh's ep dimension)");
  ep.degree = expert_count(*degree, "expert_parallel.degree", kMaxWorldSize, "a number of ranks", file);
  if (auto it = v.find("module_classes"); it != v.end() && !it->is_null()) ep.module_classes = expert_class_list(*it, file);
  if (auto it = v.find("top_k"); it != v.end() && !it->is_null())
    ep.top_k = expert_count(*it, "expert_parallel.top_k", kMaxTopK, "the experts per token", file);
  if (auto it = v.find("imbalance"); it != v.end() && !it->is_null()) ep.imbalance = imbalance_factor(*it, file);
  if (std::string why = imbalance_over_degree(ep); !why.empty()) ep_fail(file, "\"expert_parallel.imbalance\" " + why);
  return ep;
}

std::string imbalance_error(double f) {
  if (!std::isfinite(f) || f < 1 || f > static_cast<double>(kMaxWorldSize))
    return "must be a number from 1 (uniform routing) to the ep degree: the busiest rank's routed rows over the mean";
  return "";
}

std::string imbalance_over_degree(const ExpertParallel& ep) {
  if (ep.imbalance <= static_cast<double>(ep.degree)) return "";
  return "is " + format_factor(ep.imbalance) + ", more than the ep degree " + std::to_string(ep.degree) +
         ": the busiest rank receives at most every rank's rows (" + std::to_string(ep.degree) + " x the mean)";
}

nlohmann::ordered_json expert_parallel_json(const ExpertParallel& ep) {
  nlohmann::ordered_json j = {{"degree", ep.degree}};
  if (!ep.module_classes.empty()) j["module_classes"] = ep.module_classes;
  if (ep.top_k) j["top_k"] = *ep.top_k;
  if (ep.imbalance != 1.0) j["imbalance"] = ep.imbalance;
  return j;
}

}  // namespace fsdp_plan
