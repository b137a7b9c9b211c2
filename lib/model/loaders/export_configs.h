// The weights and constants configs of a .pt2 (data/weights/NAME_weights_config.json,
// data/constants/NAME_constants_config.json): what the tree reads of each
// entry, read by simdjson's DOM with nlohmann's rules (see export_configs.cpp).
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/loaders/export_raw.h"

namespace fsdp_plan::pt2 {

// What the tree reads of one entry of a weights or constants config.
struct ConfigEntry {
  bool has_meta = false;  // a tensor_meta member, of any type
  RawMeta meta;
  std::optional<std::string> path_name;
  std::optional<bool> is_param;
};

// A config record: its "config" object's entries, each key's last value.
struct Config {
  bool object = false;  // "config" is an object
  std::unordered_map<std::string, ConfigEntry> entries;
  // The keys of every object one level down, in file order, repeats kept:
  // the order nlohmann's parse callback gave at depth 2.
  std::vector<std::string> order;

  // member(config, fqn.c_str()), as nlohmann's lookup went.
  const ConfigEntry* find(const std::string& fqn) const {
    auto it = entries.find(std::string(fqn.c_str()));
    return it == entries.end() ? nullptr : &it->second;
  }
};

// A weights or constants config: simdjson's reading, or nlohmann's where
// simdjson refuses the text. `want_order` fills Config::order. Throws
// InputError naming `file` for text neither reads (`record` says which).
// The text is taken, with room for simdjson's padding.
Config read_export_config(std::string& text, const std::string& file, const std::string& record, bool want_order);

}  // namespace fsdp_plan::pt2
