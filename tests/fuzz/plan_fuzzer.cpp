// libFuzzer target: any bytes as a reviewed plan (fsdp-plan diff OLD NEW,
// --expect PLAN): the JSON reader with its limits, the plan checks, then the
// diff of the plan with itself and with the seed plan both ways, written as
// text and JSON. It must compare or throw InputError; anything else (a crash,
// another exception, a sanitizer report, a hang, an allocation past
// libFuzzer's limits) is a bug.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "report/diff_writer.h"
#include "report/plan_diff.h"
#include "util/errors.h"
#include "util/json_input.h"

#ifndef FSDP_PLAN_SOURCE_DIR
#define FSDP_PLAN_SOURCE_DIR "."
#endif

namespace {

const nlohmann::json& reference() {
  static const nlohmann::json plan = [] {
    std::ifstream in(std::string(FSDP_PLAN_SOURCE_DIR) + "/plans/tiny_gpt.json");
    std::stringstream ss;
    ss << in.rdbuf();
    return fsdp_plan::parse_json(ss.str(), "tiny_gpt.json");
  }();
  return plan;
}

void compare(const nlohmann::json& a, const nlohmann::json& b) {
  const fsdp_plan::PlanDiff d = fsdp_plan::diff_plans(a, b);
  (void)fsdp_plan::diff_to_text(d, {"old.json", &a}, {"new.json", &b});
  (void)fsdp_plan::diff_to_json(d, {"old.json", &a}, {"new.json", &b}).dump();
  (void)fsdp_plan::diff_summary(d);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const nlohmann::json doc = fsdp_plan::parse_json(text, "fuzz.json");
    if (!fsdp_plan::plan_shape_error(doc).empty()) return 0;
    compare(doc, doc);
    compare(doc, reference());
    compare(reference(), doc);
  } catch (const fsdp_plan::InputError&) {
  }
  return 0;
}
