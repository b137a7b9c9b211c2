// A value as Python holds it once yaml.safe_load (or json.load) has read an
// Accelerate config, and what Python does with it that the launcher relies
// on: str() (what it exports into the environment), truthiness, int().
#pragma once

#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace fsdp_plan {

// A YAML value as PyYAML's safe_load gives it to Accelerate (YAML 1.1: plain
// yes/no/on/off are booleans, "1e8" without a dot is a string).
struct PyValue {
  enum Kind { None, Bool, Int, Float, Str, List, Dict } kind = None;
  bool b = false;
  std::string text;  // scalars: the scalar as written
  std::vector<PyValue> items;
  std::vector<std::pair<std::string, PyValue>> entries;
  size_t line = 0, column = 0;  // where the node starts in the file (0-based, as libyaml counts)
};

// str(value) in Python, which is what the launcher puts in the environment;
// repr(value) when `repr` (a string quoted, as in a list's str()).
std::string py_str(const PyValue& v, bool repr = false);

// bool(value) in Python.
bool py_truthy(const PyValue& v);

// A value as Python's json.load gives it (ClusterConfig.from_json_file):
// strings stay strings, numbers keep their JSON spelling (1e8 is a float).
PyValue py_value_from_json(const nlohmann::json& j);

// What Python's int() takes after strip(): [-+]?[0-9](_?[0-9])*.
bool python_int(const std::string& t);

// `s in (words...)` in Python.
inline bool is_one_of(const std::string& s, std::initializer_list<const char*> words) {
  for (const char* w : words)
    if (s == w) return true;
  return false;
}

// [0-9], as Python's re, int() and PyYAML's resolver patterns read a digit.
inline bool ascii_digit(char c) { return c >= '0' && c <= '9'; }

}  // namespace fsdp_plan
