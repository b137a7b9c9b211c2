#include "accelerate/py_value.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>

namespace fsdp_plan {
namespace {

// PyYAML's construct_yaml_float: '_' dropped, .inf and .nan in any case, else
// float() (std::stod threw on ".INF", which the fuzzer found: exit 3).
double yaml_float_value(const std::string& text) {
  std::string t;
  for (const char c : text)
    if (c != '_') t += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool sign = !t.empty() && (t[0] == '-' || t[0] == '+');
  const std::string body = t.substr(sign ? 1 : 0);
  if (body == ".inf") return t[0] == '-' ? -HUGE_VAL : HUGE_VAL;
  if (body == ".nan") return std::nan("");
  if (body.find(':') != std::string::npos) {  // sexagesimal: "1:30.5" is 90.5
    double value = 0;
    size_t at = 0;
    while (at <= body.size()) {
      const size_t colon = std::min(body.find(':', at), body.size());
      value = value * 60 + std::strtod(body.substr(at, colon - at).c_str(), nullptr);
      at = colon + 1;
    }
    return t[0] == '-' ? -value : value;
  }
  return std::strtod(t.c_str(), nullptr);  // past a double: +-HUGE_VAL, inf as Python's float() gives
}

}  // namespace

std::string py_str(const PyValue& v, bool repr) {
  switch (v.kind) {
    case PyValue::None: return "None";
    case PyValue::Bool: return v.b ? "True" : "False";
    case PyValue::Int: return v.text;
    case PyValue::Float: {
      const double d = yaml_float_value(v.text);
      if (std::isnan(d)) return "nan";
      if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
      std::string s = std::to_string(d);  // close to Python's repr for the values people write
      while (s.size() > 1 && s.back() == '0' && s[s.size() - 2] != '.') s.pop_back();
      return s;
    }
    case PyValue::Str: return repr ? "'" + v.text + "'" : v.text;
    case PyValue::List: {
      std::string out = "[";
      for (size_t i = 0; i < v.items.size(); ++i) out += (i ? ", " : "") + py_str(v.items[i], true);
      return out + "]";
    }
    case PyValue::Dict: {
      std::string out = "{";
      for (size_t i = 0; i < v.entries.size(); ++i)
        out += (i ? ", " : "") + std::string("'") + v.entries[i].first + "': " + py_str(v.entries[i].second, true);
      return out + "}";
    }
  }
  return "";
}

bool py_truthy(const PyValue& v) {
  switch (v.kind) {
    case PyValue::None: return false;
    case PyValue::Bool: return v.b;
    case PyValue::Int: return v.text != "0" && v.text != "-0";
    case PyValue::Float: return yaml_float_value(v.text) != 0.0;  // nan is true, as in Python
    case PyValue::Str: return !v.text.empty();
    case PyValue::List: return !v.items.empty();
    case PyValue::Dict: return !v.entries.empty();
  }
  return false;
}

PyValue py_value_from_json(const nlohmann::json& j) {
  PyValue v;
  switch (j.type()) {
    case nlohmann::json::value_t::boolean: v.kind = PyValue::Bool, v.b = j.get<bool>(); break;
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned: v.kind = PyValue::Int, v.text = j.dump(); break;
    case nlohmann::json::value_t::number_float: v.kind = PyValue::Float, v.text = j.dump(); break;
    case nlohmann::json::value_t::string: v.kind = PyValue::Str, v.text = j.get<std::string>(); break;
    case nlohmann::json::value_t::array:
      v.kind = PyValue::List;
      for (const auto& item : j) v.items.push_back(py_value_from_json(item));
      break;
    case nlohmann::json::value_t::object:
      v.kind = PyValue::Dict;
      for (auto it = j.begin(); it != j.end(); ++it) v.entries.emplace_back(it.key(), py_value_from_json(it.value()));
      break;
    default: break;  // null
  }
  return v;
}

bool python_int(const std::string& t) {
  size_t i = !t.empty() && (t[0] == '-' || t[0] == '+');
  if (i >= t.size() || !ascii_digit(t[i])) return false;
  for (++i; i < t.size(); ++i) {
    if (t[i] == '_') ++i;
    if (i >= t.size() || !ascii_digit(t[i])) return false;
  }
  return true;
}

}  // namespace fsdp_plan
