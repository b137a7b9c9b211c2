#include "report/plan_diff.h"

#include <cstdint>
#include <map>
#include <set>

#include "util/errors.h"
#include "util/file_io.h"
#include "util/json_input.h"

namespace fsdp_plan {
namespace {

using json = nlohmann::json;

// Sections that are not the plan itself: the verdicts of one run.
// "comm" follows from the units and settings (its changes show there, like the
// memory timeline's); "time" is an ESTIMATE: a changed estimate is not a
// different plan (docs/time-model.md), so neither is compared, nor listed.
const std::set<std::string> kNotPlan = {"checks", "expect", "comm", "time"};
const std::set<std::string> kPlanSections = {"schema_version", "model", "policy", "units", "warnings"};

int64_t int_or_zero(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_number() ? it->get<int64_t>() : 0;
}

std::string str_or_empty(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

// Leaves of a JSON value, by dotted path: {"a": {"b": 1}} -> a.b = 1.
void flatten(const json& v, const std::string& prefix, std::map<std::string, json>& out) {
  if (v.is_object() && !v.empty()) {
    for (const auto& [k, sub] : v.items()) flatten(sub, prefix + "." + k, out);
  } else {
    out[prefix] = v;
  }
}

// Fields of two objects, compared where both sides have them; a field only
// one side has is noted once per `where`, not counted as a difference.
void compare_fields(const json& a, const json& b, const std::set<std::string>& skip, const std::string& where,
                    std::vector<FieldChange>& out, std::set<std::string>& noted_fields,
                    std::vector<std::string>& notes) {
  std::set<std::string> keys;
  for (const auto& [k, v] : a.items()) keys.insert(k), (void)v;
  for (const auto& [k, v] : b.items()) keys.insert(k), (void)v;
  for (const auto& k : keys) {
    if (skip.count(k)) continue;
    auto ia = a.find(k), ib = b.find(k);
    if (ia == a.end() || ib == b.end()) {
      if (noted_fields.insert(where + "." + k).second)
        notes.push_back(where + "." + k + " is only in the " + (ia == a.end() ? "new" : "old") +
                        " plan; not compared");
      continue;
    }
    if (*ia == *ib) continue;
    if (ia->is_object() && ib->is_object()) {  // nested sections leaf by leaf: "memory.sharded_numel"
      std::map<std::string, json> fa, fb;
      flatten(*ia, k, fa);
      flatten(*ib, k, fb);
      for (const auto& [path, v] : fb) {
        auto old = fa.find(path);
        if (old != fa.end() && old->second != v) out.push_back({path, old->second, v});
      }
      continue;
    }
    out.push_back({k, *ia, *ib});
  }
}


struct TensorAt {
  std::string unit;
  json shape, dtype;
  int64_t numel = 0;
};

std::map<std::string, TensorAt> params_by_name(const json& plan) {
  std::map<std::string, TensorAt> out;
  for (const auto& u : plan.at("units")) {
    auto ps = u.find("params");
    if (ps == u.end()) continue;
    for (const auto& p : *ps)
      out.emplace(str_or_empty(p, "name"),
                  TensorAt{u.at("path").get<std::string>(), p.value("shape", json()), p.value("dtype", json()),
                           int_or_zero(p, "numel")});
  }
  return out;
}

// What makes two warnings the same warning: kind, severity and subjects, but
// not the wording, which may change between versions. A warning with no
// structured subject (an unmatched pattern) is told apart by its message.
std::string warning_identity(const json& w) {
  json id = {{"kind", w.value("kind", json())}, {"severity", w.value("severity", json())}};
  bool subject = false;
  for (const char* key : {"modules", "classes", "params"})
    if (auto it = w.find(key); it != w.end()) id[key] = *it, subject = true;
  if (!subject) id["message"] = w.value("message", json());
  return id.dump();
}

// Each side's warnings minus the other's, as multisets.
void diff_warnings(const json& a, const json& b, PlanDiff& d) {
  std::map<std::string, int> count;
  for (const auto& w : a) ++count[warning_identity(w)];
  for (const auto& w : b)
    if (--count[warning_identity(w)] < 0) d.warnings_appeared.push_back(w);
  count.clear();
  for (const auto& w : b) ++count[warning_identity(w)];
  for (const auto& w : a)
    if (--count[warning_identity(w)] < 0) d.warnings_gone.push_back(w);
}

std::string parent_path(const json& units, const json& u) {
  auto p = u.find("parent");
  if (p == u.end() || !p->is_number_integer()) return "";
  auto i = p->get<size_t>();
  return i < units.size() ? str_or_empty(units[i], "path") : "";
}

UnitSummary summarize(const json& u) {
  return {str_or_empty(u, "path"),        str_or_empty(u, "class"),        int_or_zero(u, "param_numel"),
          int_or_zero(u, "param_bytes"),  int_or_zero(u, "buffer_numel"), int_or_zero(u, "buffer_bytes")};
}

}  // namespace

bool same_compared_fields(int old_schema, int new_schema) {
  // Version 2 changed only "comm" and "time" (docs/plan-format.md, "Changes
  // from version 1"), which the diff does not compare (kNotPlan).
  const auto v1_or_v2 = [](int v) { return v == 1 || v == 2; };
  return old_schema == new_schema || (v1_or_v2(old_schema) && v1_or_v2(new_schema));
}

bool PlanDiff::equal() const {
  return same_compared_fields(old_schema, new_schema) && model.empty() && policy.empty() && units_added.empty() &&
         units_removed.empty() && units_changed.empty() && params_moved.empty() && params_added.empty() &&
         params_removed.empty() && params_changed.empty() && warnings_appeared.empty() &&
         warnings_gone.empty() && other.empty();
}

namespace {

// docs/schemas/plan.schema.json's rules, for what the diff reads: types,
// counts that are whole numbers from 0 to 2^63 - 1 (a numel of [] or 2^64 + 7
// passed before), each unit path and each parameter once, parents that
// exist. Fields the schema does not know are compared as they are (a newer
// fsdp-plan may write them), fields it does not require may be missing (an
// older one did not write them).
class PlanChecker {
 public:
  explicit PlanChecker(const json& doc) : doc_(doc) {}

  std::string error() {
    try {
      check();
    } catch (const std::string& why) {
      return "not a plan fsdp-plan wrote: " + why;
    }
    return "";
  }

 private:
  [[noreturn]] static void bad(const std::string& where, const std::string& what) { throw where + " " + what; }

  static void count(const json& v, const std::string& where) {
    if (!v.is_number_integer()) bad(where, "is not a whole number");
    if (!v.is_number_unsigned() && v.get<int64_t>() < 0) bad(where, "is negative");
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) bad(where, "is too large");
  }
  static void text(const json& v, const std::string& where) {
    if (!v.is_string()) bad(where, "is not a string");
    // diff prints names and paths: keep escape sequences off the terminal.
    for (const char c : v.get_ref<const std::string&>())
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) bad(where, "holds a control character");
  }
  static void flag(const json& v, const std::string& where) {
    if (!v.is_boolean()) bad(where, "is not true or false");
  }
  static void strings(const json& v, const std::string& where) {
    if (!v.is_array()) bad(where, "is not a list");
    for (size_t i = 0; i < v.size(); ++i) text(v[i], where + "[" + std::to_string(i) + "]");
  }
  static void counts(const json& v, const std::string& where) {
    if (!v.is_array()) bad(where, "is not a list");
    for (size_t i = 0; i < v.size(); ++i) count(v[i], where + "[" + std::to_string(i) + "]");
  }
  static const json* field(const json& obj, const char* key) {
    auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }
  // Every number under a section must be a count; strings carry no control characters.
  static void leaves(const json& v, const std::string& where) {
    if (v.is_object()) {
      for (const auto& [k, sub] : v.items()) leaves(sub, where + "." + k);
    } else if (v.is_array()) {
      for (size_t i = 0; i < v.size(); ++i) leaves(v[i], where + "[" + std::to_string(i) + "]");
    } else if (v.is_number()) {
      count(v, where);
    } else if (v.is_string()) {
      text(v, where);
    }
  }

  void tensor(const json& t, const std::string& where) {
    if (!t.is_object()) bad(where, "is not an object");
    if (const json* f = field(t, "shape")) counts(*f, where + ".shape");
    if (const json* f = field(t, "sharded_shape")) counts(*f, where + ".sharded_shape");
    if (const json* f = field(t, "numel")) count(*f, where + ".numel");
    if (const json* f = field(t, "dtype")) text(*f, where + ".dtype");
    if (const json* f = field(t, "requires_grad")) flag(*f, where + ".requires_grad");
  }

  void check() {
    const json& units = doc_["units"];
    std::set<std::string> paths, names;
    for (size_t i = 0; i < units.size(); ++i) {
      const json& u = units[i];
      const std::string where = "units[" + std::to_string(i) + "]";
      text(u["path"], where + ".path");
      if (!paths.insert(u["path"].get<std::string>()).second)
        bad(where + ".path", "\"" + u["path"].get<std::string>() + "\" is listed twice");
      for (const char* key : {"class", "qualified_class"})
        if (const json* f = field(u, key)) text(*f, where + "." + key);
      for (const char* key : {"index", "depth", "param_numel", "param_bytes", "buffer_numel", "buffer_bytes",
                              "trainable_numel", "frozen_numel", "call"})
        if (const json* f = field(u, key)) count(*f, where + "." + key);
      if (const json* f = field(u, "parent"); f && !f->is_null()) {
        count(*f, where + ".parent");
        if (f->get<uint64_t>() >= units.size()) bad(where + ".parent", "is not a unit's index");
      }
      if (const json* f = field(u, "mixed_precision"); f && !f->is_null()) flag(*f, where + ".mixed_precision");
      if (const json* f = field(u, "modules")) strings(*f, where + ".modules");
      if (const json* f = field(u, "reshard_after_forward"); f && !f->is_boolean()) count(*f, where + ".reshard_after_forward");
      if (const json* f = field(u, "memory")) {
        if (!f->is_object()) bad(where + ".memory", "is not an object");
        for (const auto& [k, v] : f->items()) count(v, where + ".memory." + k);
      }
      for (const char* key : {"params", "buffers"}) {
        const json* list = field(u, key);
        if (!list) continue;
        if (!list->is_array()) bad(where + "." + key, "is not a list");
        for (size_t j = 0; j < list->size(); ++j) {
          const std::string at = where + "." + key + "[" + std::to_string(j) + "]";
          tensor((*list)[j], at);
          if (const json* n = field((*list)[j], "name")) {
            text(*n, at + ".name");
            // A parameter is owned by one unit (a tied one is listed once).
            if (std::string(key) == "params" && !names.insert(n->get<std::string>()).second)
              bad(at + ".name", "\"" + n->get<std::string>() + "\" is in two units");
          }
        }
      }
    }
    const json& warnings = doc_["warnings"];
    for (size_t i = 0; i < warnings.size(); ++i) {
      const json& w = warnings[i];
      const std::string where = "warnings[" + std::to_string(i) + "]";
      for (const char* key : {"kind", "severity", "message"})
        if (const json* f = field(w, key)) text(*f, where + "." + key);
      if (const json* f = field(w, "severity"); f && *f != "error" && *f != "warning" && *f != "info")
        bad(where + ".severity", "is not error, warning or info");
      for (const char* key : {"modules", "classes", "params", "suggestions"})
        if (const json* f = field(w, key)) strings(*f, where + "." + key);
    }
    leaves(doc_["model"], "model");
    if (const json* f = field(doc_, "memory")) {
      if (!f->is_object()) bad("memory", "is not an object");
      leaves(*f, "memory");
    }
    if (const json* f = field(doc_, "fsdp_version"); f && *f != 1 && *f != 2) bad("fsdp_version", "is not 1 or 2");
    const json& v = doc_["schema_version"];
    count(v, "schema_version");
    if (v.get<uint64_t>() > 1000000) bad("schema_version", "is not a schema version");
    // The policy is compared leaf by leaf: no control characters in what it echoes.
    leaves(doc_["policy"], "policy");
  }

  const json& doc_;
};

}  // namespace

std::string plan_shape_error(const json& doc) {
  if (!doc.is_object()) return "not a plan: the top level is not a JSON object";
  auto v = doc.find("schema_version");
  if (v == doc.end() || !v->is_number_integer())
    return "not a plan: no integer \"schema_version\" (write one with fsdp-plan MODEL --format json)";
  for (const char* key : {"model", "policy"})
    if (!doc.contains(key) || !doc[key].is_object()) return std::string("not a plan: no \"") + key + "\" object";
  for (const char* key : {"units", "warnings"})
    if (!doc.contains(key) || !doc[key].is_array()) return std::string("not a plan: no \"") + key + "\" list";
  if (doc["units"].empty()) return "not a plan: \"units\" is empty (there is always a root unit)";
  for (const auto& u : doc["units"]) {
    if (!u.is_object() || !u.contains("path") || !u["path"].is_string())
      return "not a plan: a unit without a \"path\" string";
    if (auto ps = u.find("params"); ps != u.end()) {
      if (!ps->is_array()) return "not a plan: a unit's \"params\" is not a list";
      for (const auto& p : *ps)
        if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
          return "not a plan: a parameter without a \"name\" string";
    }
  }
  for (const auto& w : doc["warnings"])
    if (!w.is_object()) return "not a plan: a warning that is not an object";
  return PlanChecker(doc).error();
}

PlanDiff diff_plans(const json& a, const json& b) {
  PlanDiff d;
  d.old_schema = a.at("schema_version").get<int>();
  d.new_schema = b.at("schema_version").get<int>();
  std::set<std::string> noted;

  compare_fields(a.at("model"), b.at("model"), {"path"}, "model", d.model, noted, d.notes);
  compare_fields(a.at("policy"), b.at("policy"), {}, "policy", d.policy, noted, d.notes);

  // Units, matched by path.
  const json &ua = a.at("units"), &ub = b.at("units");
  std::map<std::string, const json*> old_units;
  for (const auto& u : ua) old_units.emplace(u.at("path").get<std::string>(), &u);
  std::set<std::string> new_paths;
  for (const auto& u : ub) {
    std::string path = u.at("path").get<std::string>();
    new_paths.insert(path);
    auto it = old_units.find(path);
    if (it == old_units.end()) {
      d.units_added.push_back(summarize(u));
      continue;
    }
    UnitChange c{path, {}};
    compare_fields(*it->second, u, {"index", "path", "parent", "params", "buffers", "comm", "time"}, "units[]",
                   c.changes, noted,
                   d.notes);
    // The parent by path: its index shifts whenever a unit is added before it.
    std::string pa = parent_path(ua, *it->second), pb = parent_path(ub, u);
    if (pa != pb) c.changes.push_back({"parent", pa, pb});
    if (!c.changes.empty()) d.units_changed.push_back(std::move(c));
  }
  for (const auto& u : ua)
    if (!new_paths.count(u.at("path").get<std::string>())) d.units_removed.push_back(summarize(u));

  // Parameters, by name; reported in the new plan's order, then the old one's.
  auto pa = params_by_name(a), pb = params_by_name(b);
  for (const auto& u : ub) {
    auto ps = u.find("params");
    if (ps == u.end()) continue;
    for (const auto& p : *ps) {
      std::string name = p.at("name").get<std::string>();
      const TensorAt& now = pb.at(name);
      auto was = pa.find(name);
      if (was == pa.end()) {
        d.params_added.push_back({name, now.unit, now.numel});
        continue;
      }
      if (was->second.unit != now.unit) d.params_moved.push_back({name, was->second.unit, now.unit, now.numel});
      if (was->second.shape != now.shape || was->second.dtype != now.dtype)
        d.params_changed.push_back(
            {name, now.unit,
             {{"shape", was->second.shape}, {"dtype", was->second.dtype}, {"numel", was->second.numel}},
             {{"shape", now.shape}, {"dtype", now.dtype}, {"numel", now.numel}}});
    }
  }
  for (const auto& u : ua) {
    auto ps = u.find("params");
    if (ps == u.end()) continue;
    for (const auto& p : *ps) {
      std::string name = p.at("name").get<std::string>();
      if (!pb.count(name)) d.params_removed.push_back({name, u.at("path").get<std::string>(), int_or_zero(p, "numel")});
    }
  }

  diff_warnings(a.at("warnings"), b.at("warnings"), d);

  // Any other section (the memory model's, for one): leaf by leaf when both
  // plans have it; a section new in this version is not a change of plan.
  std::set<std::string> sections;
  for (const auto& [k, v] : a.items()) sections.insert(k), (void)v;
  for (const auto& [k, v] : b.items()) sections.insert(k), (void)v;
  for (const auto& s : sections) {
    if (kPlanSections.count(s) || kNotPlan.count(s)) continue;
    if (!a.contains(s) || !b.contains(s)) {
      d.notes.push_back("\"" + s + "\" is only in the " + (a.contains(s) ? "old" : "new") + " plan; not compared");
      continue;
    }
    std::map<std::string, json> fa, fb;
    flatten(a[s], s, fa);
    flatten(b[s], s, fb);
    // The memory timeline follows from units and settings: its changes show there.
    fa.erase("memory.timeline");
    fb.erase("memory.timeline");
    for (const auto& [path, v] : fb) {
      auto it = fa.find(path);
      if (it != fa.end() && it->second != v) d.other.push_back({path, it->second, v});
    }
  }
  if (d.old_schema != d.new_schema)
    d.notes.push_back("schema_version " + std::to_string(d.old_schema) + " -> " + std::to_string(d.new_schema) +
                      (same_compared_fields(d.old_schema, d.new_schema)
                           ? ": the versions differ only in comm and time, which diff does not compare"
                           : ": some fields changed meaning, so the plans count as different"));
  return d;
}

nlohmann::json load_plan_file(const std::string& file) {
  nlohmann::json doc = parse_json(read_text_file(file, kMaxPlanFileBytes, "a plan"), file);
  if (std::string why = plan_shape_error(doc); !why.empty()) throw InputError(file, why);
  return doc;
}

}  // namespace fsdp_plan
