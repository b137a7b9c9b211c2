// The reports of `fsdp-plan suggest`: a table for people, JSON for scripts
// (docs/schemas/suggest.schema.json).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "model/module_tree.h"
#include "suggest/maximize.h"
#include "suggest/suggest.h"

namespace fsdp_plan {

struct SuggestContext {
  std::string model_path;
  const ModuleTree* tree = nullptr;
  const Policy* base = nullptr;
  SuggestOptions options;
  size_t top = 10;
};

std::string suggestion_to_text(const Suggestion& s, const SuggestContext& ctx);
nlohmann::ordered_json suggestion_to_json(const Suggestion& s, const SuggestContext& ctx);
// --maximize's answer: a line above the text report, a "maximize" object in the JSON.
std::string maximized_text(const Maximized& m, int64_t budget_bytes);
nlohmann::ordered_json maximized_json(const Maximized& m);

}  // namespace fsdp_plan
