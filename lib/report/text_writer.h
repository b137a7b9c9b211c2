// The plan for people: a table of units as a tree, totals and warnings.
// Columns grow to fit their content, up to `width`; past it, unit paths are
// shortened in the middle ("blocks.0.*.0.*.window_attention", a glob that
// matches the path), never at the end that tells siblings apart.
#pragma once

#include <string>

#include "plan/plan.h"

namespace fsdp_plan {

struct TextOptions {
  size_t width = 100;  // the terminal's columns
  bool wide = false;   // never shorten anything
  bool unfold = false; // -v: every unit a row (no "layers.0 .. layers.79  x80"); --wide unfolds too
};

std::string plan_to_text(const Plan& plan, const TextOptions& options = {});

// Shortens a dotted path towards `width` characters by replacing runs of
// middle names with "*", the longest first. The first and last components and
// every index stay, as they tell siblings apart: the result may stay longer.
std::string shorten_path(const std::string& path, size_t width);

}  // namespace fsdp_plan
