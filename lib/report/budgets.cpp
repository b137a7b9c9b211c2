#include "report/budgets.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "util/errors.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

using ojson = nlohmann::ordered_json;

// How a limit or an actual value reads in the text output.
std::string show(const std::string& rule, const ojson& v) {
  if (v.is_string()) return v.get<std::string>();
  if (rule == "max_root_share") return percent(v.get<double>());
  if (rule == "max_peak_bytes") return format_bytes(v.get<int64_t>());
  if (rule == "max_unit_numel") return format_count(v.get<int64_t>());
  return v.dump();
}

}  // namespace

bool CheckReport::passed() const {
  return std::all_of(results.begin(), results.end(), [](const CheckResult& r) { return r.passed; });
}

CheckReport evaluate_checks(const ojson& plan, const Budgets& b, const std::string& plan_file) {
  CheckReport report;
  const ojson& units = plan.at("units");

  if (b.max_unit_numel) {
    CheckResult r{"max_unit_numel", *b.max_unit_numel, int64_t{0}, true, {}};
    int64_t largest = 0;
    for (const auto& u : units) {
      int64_t n = u.at("param_numel").get<int64_t>();
      largest = std::max(largest, n);
      if (n > *b.max_unit_numel) r.units.push_back(u.at("path").get<std::string>());
    }
    r.actual = largest;
    r.passed = r.units.empty();
    report.results.push_back(std::move(r));
  }
  if (b.max_units) {
    int64_t n = static_cast<int64_t>(units.size());
    report.results.push_back({"max_units", *b.max_units, n, n <= *b.max_units, {}});
  }
  if (b.max_root_share) {
    // The same share the text plan prints as "root unit N%": of the
    // parameters FSDP shards, ignored ones left out.
    int64_t total = 0;
    for (const auto& u : units) total += u.at("param_numel").get<int64_t>();
    int64_t root = units.empty() ? 0 : units.front().at("param_numel").get<int64_t>();
    double share = total > 0 ? static_cast<double>(root) / static_cast<double>(total) : 0.0;
    bool ok = share <= *b.max_root_share;
    report.results.push_back({"max_root_share", *b.max_root_share, share, ok,
                              ok ? std::vector<std::string>{} : std::vector<std::string>{""}});
  }
  if (b.max_peak_bytes) {
    const ojson* peak = nullptr;
    if (auto m = plan.find("memory"); m != plan.end() && m->is_object())
      if (auto pr = m->find("per_rank"); pr != m->end() && pr->is_object())
        if (auto p = pr->find("peak_bytes"); p != pr->end() && p->is_number()) peak = &*p;
    if (!peak)
      throw InputError(plan_file,
                       "max_peak_bytes needs the memory model, and this plan has no "
                       "memory.per_rank.peak_bytes; drop the budget or use a fsdp-plan that estimates memory");
    int64_t actual = peak->get<int64_t>();
    report.results.push_back({"max_peak_bytes", *b.max_peak_bytes, actual, actual <= *b.max_peak_bytes, {}});
  }
  for (const auto& kind : b.fail_on) {
    int64_t count = 0;
    std::set<std::string> seen;
    CheckResult r{"fail_on", kind, int64_t{0}, true, {}};
    for (const auto& w : plan.at("warnings")) {
      bool hit = kind == "any" ? w.at("severity") != "info" : w.at("kind") == kind;
      if (!hit) continue;
      ++count;
      if (auto m = w.find("modules"); m != w.end())
        for (const auto& path : *m)
          if (seen.insert(path.get<std::string>()).second) r.units.push_back(path.get<std::string>());
    }
    r.actual = count;
    r.passed = count == 0;
    report.results.push_back(std::move(r));
  }
  return report;
}

ojson checks_to_json(const CheckReport& report) {
  ojson results = ojson::array(), violations = ojson::array();
  for (const auto& r : report.results) {
    ojson j = {{"rule", r.rule}, {"limit", r.limit}, {"actual", r.actual}, {"passed", r.passed},
               {"units", r.units}};
    if (!r.passed) violations.push_back(j);
    results.push_back(std::move(j));
  }
  return {{"passed", report.passed()}, {"results", std::move(results)}, {"violations", std::move(violations)}};
}

namespace {

// "max_units: 5 > 2", with the units concerned: one line of the text block, and of stderr.
std::string check_line(const CheckResult& r) {
  std::string line = r.rule;
  if (r.rule == "fail_on")
    line += " " + show(r.rule, r.limit) + ": " + r.actual.dump() + " warning" + (r.actual == 1 ? "" : "s");
  else
    line += ": " + show(r.rule, r.actual) + (r.passed ? " <= " : " > ") + show(r.rule, r.limit);
  if (!r.units.empty()) {
    std::string names;
    for (size_t i = 0; i < r.units.size() && i < 6; ++i) names += (i ? ", " : "") + path_or_root(r.units[i]);
    if (r.units.size() > 6) names += ", and " + std::to_string(r.units.size() - 6) + " more";
    line += "  (" + names + ")";
  }
  return line;
}

}  // namespace

std::string checks_to_text(const CheckReport& report) {
  size_t failed = 0;
  for (const auto& r : report.results) failed += r.passed ? 0 : 1;
  std::string out = "\nchecks  " + std::to_string(report.results.size()) + " budget" +
                    (report.results.size() == 1 ? "" : "s") + ", " +
                    (failed == 0 ? "all met" : std::to_string(failed) + " violated") + "\n";
  for (const auto& r : report.results) out += std::string(r.passed ? "  ok    " : "  FAIL  ") + check_line(r) + "\n";
  return out;
}

std::vector<std::string> violation_lines(const CheckReport& report) {
  std::vector<std::string> out;
  for (const auto& r : report.results)
    if (!r.passed) out.push_back("budget violated: " + check_line(r));
  return out;
}

}  // namespace fsdp_plan
