// A JSON document whose long arrays are made one element at a time, written
// exactly as nlohmann's dump(1) writes the whole value. A plan of 100,000
// units is 265 MB of JSON; built as one ordered_json it took 1.9 GB and 24 s,
// most of it page faults. Written from a JsonDocument it holds one element.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdp_plan {

// An array of the document made on demand: element(i) for i < size.
struct StreamedArray {
  std::vector<std::string> path;  // the object keys from the document's root to the array
  size_t size = 0;
  std::function<nlohmann::ordered_json(size_t)> element;
};

struct JsonDocument {
  // The document with each streamed array an empty [] where it belongs (so
  // that key order is kept); add keys to it as to any ordered_json.
  nlohmann::ordered_json skeleton = nlohmann::ordered_json::object();
  std::vector<StreamedArray> arrays;

  // The whole document as one value, the arrays filled in.
  nlohmann::ordered_json filled() const;
  // The bytes of filled().dump(1), in pieces, without building it.
  void write(const std::function<void(std::string_view)>& out) const;
};

}  // namespace fsdp_plan
