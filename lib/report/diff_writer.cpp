#include "report/diff_writer.h"

#include <algorithm>
#include <map>

#include "util/strings.h"

namespace fsdp_plan {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr size_t kMaxNamesPerGroup = 8;


std::string plural(size_t n, const std::string& word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

std::string signed_count(int64_t delta) { return (delta >= 0 ? "+" : "-") + format_count(delta >= 0 ? delta : -delta); }

constexpr size_t kMaxValueChars = 80;

// A JSON value on one line, its middle cut past kMaxValueChars.
std::string short_dump(const json& v) {
  std::string s = v.dump();
  if (s.size() <= kMaxValueChars) return s;
  return s.substr(0, kMaxValueChars / 2) + " ... " + s.substr(s.size() - kMaxValueChars / 2 + 5);
}

// A list that changed: its lengths and its first differing element, not the
// whole arrays (a 58 KB diff for one added layer was mostly these); the JSON
// diff keeps both whole.
std::string show_list_change(const json& a, const json& b) {
  std::string out = "list of " + std::to_string(a.size()) + " -> " + std::to_string(b.size());
  if (a.size() != b.size()) {
    const int64_t d = static_cast<int64_t>(b.size()) - static_cast<int64_t>(a.size());
    out += " (" + std::string(d > 0 ? "+" : "-") + std::to_string(d > 0 ? d : -d) + ")";
  }
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  if (i < a.size() && i < b.size())
    out += "; first difference at [" + std::to_string(i) + "]: " + short_dump(a[i]) + " -> " + short_dump(b[i]);
  else if (i < b.size())
    out += "; from [" + std::to_string(i) + "] added: " + short_dump(b[i]) + (b.size() - i > 1 ? ", ..." : "");
  else if (i < a.size())
    out += "; from [" + std::to_string(i) + "] removed: " + short_dump(a[i]) + (a.size() - i > 1 ? ", ..." : "");
  return out + " (--format json for both lists)";
}

// "34.94K -> 40.00K (+5.06K)" for counts, bytes likewise, lists by
// show_list_change, JSON otherwise (long values cut in the middle).
std::string show_change(const FieldChange& c) {
  bool numbers = c.old_value.is_number_integer() && c.new_value.is_number_integer();
  bool counts = c.field.find("numel") != std::string::npos;
  bool bytes = c.field.find("bytes") != std::string::npos;
  if (numbers && (counts || bytes)) {
    int64_t a = c.old_value.get<int64_t>(), b = c.new_value.get<int64_t>();
    if (bytes)
      return format_bytes(a) + " -> " + format_bytes(b) + " (" + (b >= a ? "+" : "-") + format_bytes(b >= a ? b - a : a - b) + ")";
    return format_count(a) + " -> " + format_count(b) + " (" + signed_count(b - a) + ")";
  }
  if (c.field == "parent") return path_or_root(c.old_value.get<std::string>()) + " -> " + path_or_root(c.new_value.get<std::string>());
  if (c.old_value.is_array() && c.new_value.is_array()) return show_list_change(c.old_value, c.new_value);
  return short_dump(c.old_value) + " -> " + short_dump(c.new_value);
}

// Unit fields in reading order; fields not listed (from newer versions) follow.
int field_rank(const std::string& f) {
  static const std::vector<std::string> order = {"class",        "qualified_class", "parent",       "depth",
                                                 "param_numel",  "param_bytes",     "buffer_numel", "buffer_bytes",
                                                 "mixed_precision"};
  auto it = std::find(order.begin(), order.end(), f);
  return static_cast<int>(it - order.begin());
}

std::string side_header(const char* mark, const DiffSide& s) {
  const json& p = *s.plan;
  const json& m = p.at("model");
  return std::string(mark) + " " + s.file + "  (" + m.value("root_class", std::string("?")) + ", " +
         plural(p.at("units").size(), "unit") + ", schema_version " + p.at("schema_version").dump() + ")\n";
}

std::string warning_line(const char* mark, const json& w) {
  // wrap_words drops leading blanks, so the margin goes in front of it.
  return std::string("  ") + wrap_words(std::string(mark) + " " + pad(w.value("severity", std::string("?")), 8) +
                                            w.value("kind", std::string("?")) + ": " + w.value("message", std::string()),
                                        98, std::string(12, ' '));
}

std::string unit_line(const char* mark, const UnitSummary& u) {
  return std::string("  ") + mark + " " + pad(path_or_root(u.path), 38) + "  " + pad(u.cls, 20) +
         pad(format_count(u.param_numel), 8) + "  " + format_bytes(u.param_bytes) + "\n";
}

std::string names_line(const std::vector<std::string>& names) {
  std::string out;
  size_t shown = std::min(names.size(), kMaxNamesPerGroup);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > shown) out += ", and " + std::to_string(names.size() - shown) + " more";
  return "      " + wrap_words(out, 94, std::string(6, ' '));
}

ojson changes_json(const std::vector<FieldChange>& v) {
  ojson out = ojson::array();
  for (const auto& c : v) out.push_back({{"field", c.field}, {"old", c.old_value}, {"new", c.new_value}});
  return out;
}

ojson unit_json(const UnitSummary& u) {
  return {{"path", u.path},
          {"class", u.cls},
          {"param_numel", u.param_numel},
          {"param_bytes", u.param_bytes},
          {"buffer_numel", u.buffer_numel},
          {"buffer_bytes", u.buffer_bytes}};
}

ojson side_json(const DiffSide& s) {
  const json& p = *s.plan;
  return {{"file", s.file},
          {"schema_version", p.at("schema_version")},
          {"root_class", p.at("model").value("root_class", json())},
          {"units", p.at("units").size()}};
}

}  // namespace

std::string diff_summary(const PlanDiff& d) {
  if (d.equal()) return "no difference";
  std::vector<std::string> parts;
  if (!same_compared_fields(d.old_schema, d.new_schema)) parts.push_back("schema_version changed");
  if (!d.model.empty()) parts.push_back("model changed");
  if (!d.policy.empty()) parts.push_back(plural(d.policy.size(), "policy field") + " changed");
  std::vector<std::string> units;
  if (!d.units_added.empty()) units.push_back(std::to_string(d.units_added.size()) + " added");
  if (!d.units_removed.empty()) units.push_back(std::to_string(d.units_removed.size()) + " removed");
  if (!d.units_changed.empty()) units.push_back(std::to_string(d.units_changed.size()) + " changed");
  if (!units.empty()) {
    parts.push_back("units: " + join(units));
  }
  if (!d.params_moved.empty()) parts.push_back(plural(d.params_moved.size(), "parameter") + " moved");
  if (!d.params_added.empty() || !d.params_removed.empty())
    parts.push_back(std::to_string(d.params_added.size()) + " parameters now in a unit, " +
                    std::to_string(d.params_removed.size()) + " no longer");
  if (!d.params_changed.empty()) parts.push_back(plural(d.params_changed.size(), "parameter") + " reshaped");
  if (!d.warnings_appeared.empty()) parts.push_back(plural(d.warnings_appeared.size(), "warning") + " appeared");
  if (!d.warnings_gone.empty()) parts.push_back(plural(d.warnings_gone.size(), "warning") + " gone");
  if (!d.other.empty()) parts.push_back(plural(d.other.size(), "other field") + " changed");
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : "") + parts[i];
  return out;
}

std::string diff_to_text(const PlanDiff& d, const DiffSide& old_side, const DiffSide& new_side) {
  std::string out = side_header("---", old_side) + side_header("+++", new_side);
  auto section = [&out](const std::string& title) { out += "\n" + title + "\n"; };

  if (!d.model.empty()) {
    section("model");
    for (const auto& c : d.model) out += "  ~ " + c.field + ": " + show_change(c) + "\n";
  }
  if (!d.policy.empty()) {
    section("policy");
    for (const auto& c : d.policy) out += "  ~ " + c.field + ": " + show_change(c) + "\n";
  }
  if (!d.units_added.empty()) {
    section("units added (" + std::to_string(d.units_added.size()) + ")");
    for (const auto& u : d.units_added) out += unit_line("+", u);
  }
  if (!d.units_removed.empty()) {
    section("units removed (" + std::to_string(d.units_removed.size()) + ")");
    for (const auto& u : d.units_removed) out += unit_line("-", u);
  }
  if (!d.units_changed.empty()) {
    section("units changed (" + std::to_string(d.units_changed.size()) + ")");
    for (const auto& c : d.units_changed) {
      out += "  ~ " + path_or_root(c.path) + "\n";
      auto fields = c.changes;
      std::stable_sort(fields.begin(), fields.end(), [](const FieldChange& x, const FieldChange& y) {
        return field_rank(x.field) < field_rank(y.field);
      });
      for (const auto& f : fields) out += "      " + pad(f.field + ":", 24) + " " + show_change(f) + "\n";
    }
  }
  if (!d.params_moved.empty()) {
    // Grouped by route: a policy change moves parameters in blocks.
    section("parameters moved (" + std::to_string(d.params_moved.size()) + ")");
    std::vector<std::pair<std::string, std::string>> routes;
    std::map<std::pair<std::string, std::string>, std::pair<std::vector<std::string>, int64_t>> groups;
    for (const auto& m : d.params_moved) {
      auto key = std::make_pair(m.from, m.to);
      auto [it, fresh] = groups.try_emplace(key);
      if (fresh) routes.push_back(key);
      it->second.first.push_back(m.name);
      it->second.second += m.numel;
    }
    for (const auto& r : routes) {
      const auto& [names, numel] = groups[r];
      out += "  " + path_or_root(r.first) + " -> " + path_or_root(r.second) + ": " + plural(names.size(), "parameter") +
             ", " + format_count(numel) + " elements\n" + names_line(names);
    }
  }
  if (!d.params_removed.empty()) {
    section("parameters no longer in any unit (" + std::to_string(d.params_removed.size()) + ")");
    for (const auto& p : d.params_removed) out += "  - " + p.name + "  (was in " + path_or_root(p.unit) + ")\n";
  }
  if (!d.params_added.empty()) {
    section("parameters newly in a unit (" + std::to_string(d.params_added.size()) + ")");
    for (const auto& p : d.params_added) out += "  + " + p.name + "  (in " + path_or_root(p.unit) + ")\n";
  }
  if (!d.params_changed.empty()) {
    section("parameters reshaped (" + std::to_string(d.params_changed.size()) + ")");
    for (const auto& p : d.params_changed)
      out += "  ~ " + p.name + ": " + p.old_value["dtype"].dump() + p.old_value["shape"].dump() + " -> " +
             p.new_value["dtype"].dump() + p.new_value["shape"].dump() + "\n";
  }
  if (!d.warnings_appeared.empty()) {
    section("warnings appeared (" + std::to_string(d.warnings_appeared.size()) + ")");
    for (const auto& w : d.warnings_appeared) out += warning_line("+", w);
  }
  if (!d.warnings_gone.empty()) {
    section("warnings gone (" + std::to_string(d.warnings_gone.size()) + ")");
    for (const auto& w : d.warnings_gone) out += warning_line("-", w);
  }
  if (!d.other.empty()) {
    section("other");
    for (const auto& c : d.other) out += "  ~ " + c.field + ": " + show_change(c) + "\n";
  }
  if (!d.notes.empty()) {
    section("notes");
    for (const auto& n : d.notes) out += "  " + n + "\n";
  }
  out += "\n" + wrap_words(diff_summary(d), 100, "  ");
  return out;
}

ojson diff_to_json(const PlanDiff& d, const DiffSide& old_side, const DiffSide& new_side) {
  ojson out;
  out["schema_version"] = kDiffSchemaVersion;
  out["old"] = side_json(old_side);
  out["new"] = side_json(new_side);
  out["equal"] = d.equal();
  out["summary"] = {{"text", diff_summary(d)},
                    {"units_added", d.units_added.size()},
                    {"units_removed", d.units_removed.size()},
                    {"units_changed", d.units_changed.size()},
                    {"params_moved", d.params_moved.size()},
                    {"params_added", d.params_added.size()},
                    {"params_removed", d.params_removed.size()},
                    {"params_changed", d.params_changed.size()},
                    {"warnings_appeared", d.warnings_appeared.size()},
                    {"warnings_gone", d.warnings_gone.size()}};
  out["model"] = changes_json(d.model);
  out["policy"] = changes_json(d.policy);

  ojson added = ojson::array(), removed = ojson::array(), changed = ojson::array();
  for (const auto& u : d.units_added) added.push_back(unit_json(u));
  for (const auto& u : d.units_removed) removed.push_back(unit_json(u));
  for (const auto& c : d.units_changed) changed.push_back({{"path", c.path}, {"changes", changes_json(c.changes)}});
  out["units"] = {{"added", added}, {"removed", removed}, {"changed", changed}};

  ojson moved = ojson::array(), padd = ojson::array(), prem = ojson::array(), pchg = ojson::array();
  for (const auto& m : d.params_moved) moved.push_back({{"name", m.name}, {"from", m.from}, {"to", m.to}, {"numel", m.numel}});
  for (const auto& p : d.params_added) padd.push_back({{"name", p.name}, {"unit", p.unit}, {"numel", p.numel}});
  for (const auto& p : d.params_removed) prem.push_back({{"name", p.name}, {"unit", p.unit}, {"numel", p.numel}});
  for (const auto& p : d.params_changed)
    pchg.push_back({{"name", p.name}, {"unit", p.unit}, {"old", p.old_value}, {"new", p.new_value}});
  out["params"] = {{"moved", moved}, {"added", padd}, {"removed", prem}, {"changed", pchg}};

  ojson appeared = ojson::array(), gone = ojson::array();
  for (const auto& w : d.warnings_appeared) appeared.push_back(ojson(w));
  for (const auto& w : d.warnings_gone) gone.push_back(ojson(w));
  out["warnings"] = {{"appeared", appeared}, {"gone", gone}};
  out["other"] = changes_json(d.other);
  out["notes"] = d.notes;
  return out;
}

}  // namespace fsdp_plan
