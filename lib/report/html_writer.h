// The plan as one self-contained HTML page (--format html): a treemap of the
// units, the memory of one training step, warnings, checks and settings. The
// page embeds the plan's JSON (the same as --format json prints, checks
// included) and the vendored d3 modules; it makes no network request.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace fsdp_plan {

std::string plan_to_html(const nlohmann::ordered_json& plan_json);

}  // namespace fsdp_plan
