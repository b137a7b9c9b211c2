#include "util/json_input.h"

#include "util/errors.h"

namespace fsdp_plan {

nlohmann::json parse_json(const std::string& text, const std::string& file) {
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // "[json.exception.parse_error.101] parse error at line 3, column 5: ...",
    // "[json.exception.out_of_range.406] number overflow parsing '1e400'": keep what follows the tag.
    std::string msg = e.what();
    auto tag_end = msg.find("] ");
    throw InputError(file, "invalid JSON: " + (tag_end == std::string::npos ? msg : msg.substr(tag_end + 2)));
  }
}

}  // namespace fsdp_plan
