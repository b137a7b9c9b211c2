#include "model/loaders/export_configs.h"

#include <cstdint>
#include <limits>
#include <type_traits>

#include <nlohmann/json.hpp>
#include <simdjson.h>

#include "util/errors.h"

namespace fsdp_plan::pt2 {

namespace {

using Json = nlohmann::json;
namespace dom = simdjson::dom;

// Exactly a Json: nlohmann's constructors would take a simdjson element too.
template <typename J, std::enable_if_t<std::is_same_v<J, Json>, int> = 0>
const Json* member(const J& obj, const char* key) {
  if (!obj.is_object()) return nullptr;
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

bool get_int(const Json* v, int64_t& out) {
  if (!v) return false;
  if (v->is_number_unsigned()) {
    const auto u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    out = static_cast<int64_t>(u);
    return true;
  }
  if (!v->is_number_integer()) return false;
  out = v->get<int64_t>();
  return true;
}

const std::string* get_string(const Json* v) { return v && v->is_string() ? v->get_ptr<const std::string*>() : nullptr; }

// The weights and constants configs are read by simdjson's DOM (nlohmann's
// std::map objects cost 170 instructions a byte: 42M for the 240 KB config of
// Llama-3-70B), with nlohmann's rules: a key given twice keeps its last value,
// member() takes the key up to a NUL as c_str() gave it. Text simdjson
// refuses goes to nlohmann, which either reads it (numbers past 64 bits,
// nesting past 1024) or says why not, in the words it always did.
std::optional<dom::element> member(dom::element obj, std::string_view key) {
  std::optional<dom::element> out;
  dom::object o;
  if (obj.get_object().get(o)) return out;
  for (dom::key_value_pair field : o)
    if (field.key == key) out = field.value;
  return out;
}

// nlohmann's is_number_integer within int64; its unsigned above int64 refused.
bool get_int(const std::optional<dom::element>& v, int64_t& out) {
  return v && v->type() == dom::element_type::INT64 && !v->get_int64().get(out);
}

std::optional<std::string_view> get_string(const std::optional<dom::element>& v) {
  std::string_view s;
  if (!v || !v->is_string() || v->get_string().get(s)) return std::nullopt;
  return s;
}

std::optional<bool> get_bool(const Json* v) {
  if (!v || !v->is_boolean()) return std::nullopt;
  return v->get<bool>();
}

std::optional<bool> get_bool(const std::optional<dom::element>& v) {
  bool b = false;
  if (!v || !v->is_bool() || v->get_bool().get(b)) return std::nullopt;
  return b;
}

bool is_array(const Json* v) { return v && v->is_array(); }
bool is_array(const std::optional<dom::element>& v) { return v && v->is_array(); }

template <typename F>
void each(const Json* v, F&& f) {
  for (const Json& e : *v) f(&e);
}

template <typename F>
void each(const std::optional<dom::element>& v, F&& f) {
  dom::array arr;
  if (v->get_array().get(arr)) return;
  for (dom::element e : arr) f(std::optional<dom::element>(e));
}

// One config entry's value of a member: a pointer (nlohmann) or an optional (simdjson).
template <typename V>
RawDim raw_dim(const V& s) {
  RawDim d;
  int64_t v = 0;
  if (const auto e = member(*s, "as_expr")) {
    d.kind = RawDim::Expr;
    if (const auto text = get_string(member(*e, "expr_str"))) d.expr = std::string(*text);
    if (const auto h = member(*e, "hint"); h && get_int(member(*h, "as_int"), v)) d.hint = v;
  } else if (get_int(member(*s, "as_int"), v)) {
    d.kind = RawDim::Int;
    d.value = v;
  }
  return d;
}

template <typename V>
RawMeta raw_meta(const V& meta) {
  RawMeta m;
  m.has_dtype = get_int(member(*meta, "dtype"), m.dtype);
  if (const auto sizes = member(*meta, "sizes"); is_array(sizes)) {
    m.sizes_array = true;
    each(sizes, [&](const auto& s) { m.sizes.push_back(raw_dim(s)); });
  }
  if (const auto strides = member(*meta, "strides"); is_array(strides)) {
    m.strides_array = true;
    each(strides, [&](const auto& s) { m.strides.push_back(raw_dim(s)); });
  }
  if (const auto off = member(*meta, "storage_offset")) {
    m.has_offset = true;
    m.offset = raw_dim(off);
  }
  m.requires_grad = get_bool(member(*meta, "requires_grad"));
  if (const auto dev = member(*meta, "device")) {
    if (const auto t = get_string(member(*dev, "type"))) m.device_type = std::string(*t);
  }
  return m;
}

template <typename V>
ConfigEntry config_entry(const V& v) {
  ConfigEntry c;
  if (const auto meta = member(*v, "tensor_meta")) {
    c.has_meta = true;
    c.meta = raw_meta(meta);
  }
  if (const auto p = get_string(member(*v, "path_name"))) c.path_name = std::string(*p);
  c.is_param = get_bool(member(*v, "is_param"));
  return c;
}

// `config_keys`, if given, gets the keys of the "config" object (depth 2)
// in file order, which the map forgets.
Json parse_config(const std::string& text, const std::string& file, const std::string& record,
                  std::vector<std::string>* config_keys) {
  try {
    if (!config_keys) return Json::parse(text);
    return Json::parse(text, [config_keys](int depth, Json::parse_event_t event, Json& parsed) {
      if (event == Json::parse_event_t::key && depth == 2 && parsed.is_string()) {
        config_keys->push_back(parsed.get<std::string>());
      }
      return true;
    });
  } catch (const Json::exception& e) {
    std::string what = e.what();
    const auto tag = what.find("] ");
    if (what.rfind("[json.exception.", 0) == 0 && tag != std::string::npos) what = what.substr(tag + 2);
    throw InputError(file, damaged_record(record, "invalid JSON: " + what));
  }
}

}  // namespace

Config read_export_config(std::string& text, const std::string& file, const std::string& record, bool want_order) {
  Config out;
  text.reserve(text.size() + simdjson::SIMDJSON_PADDING);  // simdjson then reads it in place
  dom::parser parser;
  dom::element doc;
  if (parser.parse(text).get(doc)) {
    std::vector<std::string> order;
    const Json parsed = parse_config(text, file, record, want_order ? &order : nullptr);
    const Json* config = member(parsed, "config");
    if (config && config->is_object()) {
      out.object = true;
      for (auto it = config->begin(); it != config->end(); ++it) out.entries.emplace(it.key(), config_entry(&*it));
    }
    out.order = std::move(order);
    return out;
  }
  dom::object top;
  if (doc.get_object().get(top)) return out;
  for (dom::key_value_pair field : top) {
    dom::object inner;
    if (field.value.get_object().get(inner)) continue;
    if (field.key == "config") {
      out.object = true;
      out.entries.clear();  // a second "config" replaces the first, as in nlohmann's map
      for (dom::key_value_pair e : inner) {
        out.entries.insert_or_assign(std::string(e.key), config_entry(std::optional<dom::element>(e.value)));
      }
    }
    if (want_order)
      for (dom::key_value_pair e : inner) out.order.emplace_back(e.key);
  }
  // A "config" that is not an object, after one that is: nlohmann kept the last.
  if (const auto last = member(doc, "config"); last && !last->is_object()) {
    out.object = false;
    out.entries.clear();
  }
  return out;
}

}  // namespace fsdp_plan::pt2
