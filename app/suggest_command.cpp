#include "suggest_command.h"

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <optional>

#include "command.h"
#include "emit/emit.h"
#include "fsdp_options.h"
#include "model/loaders/loader.h"
#include "planner/planner.h"
#include "suggest/maximize.h"
#include "suggest/suggest.h"
#include "suggest/writer.h"
#include "util/errors.h"
#include "util/file_io.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

const CLI::Validator kSize(
    [](std::string& v) { return parse_size(v) ? std::string() : "\"" + v + "\" is not a size (e.g. 80GiB)"; }, "SIZE");

}  // namespace

int suggest_main(int argc, char** argv) {
  std::string model, format = "text", output, budget, activations = "0", emit, maximize;
  FsdpOptions fsdp;
  size_t top = 10;
  bool verbose = false, pin_wrapping = false;
  CLI::App app{"fsdp-plan suggest: the wrapping policies that fit a per-rank memory budget, ranked",
               "fsdp-plan suggest"};
  app.add_option("model", model, "model file, as for a plan: TorchScript (.pt) or torch.export (.pt2)")->required();
  app.add_option("--budget", budget, "memory per rank the plan must fit in, e.g. 80GiB, 24GB")
      ->required()->check(kSize);
  app.add_option("--activation-bytes", activations, "allowance added to each candidate's peak: a .pt2's "
                                                    "graph activations are in the peak already, a TorchScript file's "
                                                    "are not")
      ->check(CLI::Validator([](std::string& v) { return activation_bytes_error(v); }, "SIZE"))
      ->capture_default_str();
  add_fsdp_options(app, fsdp,
                   "base policy (JSON, or an Accelerate config): its settings (mixed precision, strategy, "
                   "ignored parameters, world size) are kept; what is wrapped varies",
                   "1: FullyShardedDataParallel (default); 2: fully_shard, every candidate planned and its "
                   "memory estimated as FSDP2's (the base policy's fsdp.version otherwise)");
  app.add_option("--top", top, "how many ranked policies to show")->check(CLI::Range(size_t{1}, size_t{100000}))
      ->capture_default_str();
  app.add_option("--maximize", maximize, "a dynamic dimension of a .pt2 (seq, batch): the largest value at "
                                         "which some policy fits the budget, and the ranking there (--dim "
                                         "values of the others stay)");
  app.add_flag("--pin-wrapping", pin_wrapping, "plan the --policy's wrapping as given, the only candidate (no search "
                                             "of classes, sizes, groups, tp degrees, checkpointing or fixes): with "
                                             "--maximize, the largest value at which your wrapping fits");
  app.add_flag("-v,--verbose", verbose, "timings on stderr");
  auto* emit_opt = app.add_option("--emit", emit, "instead of the report, write what applies the best fitting "
                                                  "policy: accelerate (Accelerate config YAML) or torch (Python "
                                                  "with apply_fsdp(model)); the report goes to stderr")
                       ->check(CLI::IsMember({"accelerate", "torch"}));
  auto* format_opt =
      app.add_option("-f,--format", format, "report format")->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  emit_opt->excludes(format_opt);
  app.add_option("-o,--output", output, "write the best fitting policy (JSON) to FILE; nothing is written "
                                        "when none fits, and never over an input file");
  app.footer("Candidates: each module class alone and in pairs (the model's own block classes first), size "
             "thresholds at the model's distinct subtree sizes; FSDP2 (--fsdp-version 2): also the block class with "
             "groups for the modules before and after the blocks (embeddings; final norm and head).\nDropped: those FSDP would refuse and those that "
             "split a tied weight; each comes back with the fix the refusal names (frozen parameters in units of their "
             "own, tied weights in one unit) as a candidate of its own. With a \"tensor_parallel\" section in the policy: each candidate at tp 1, 2, 4 and 8 "
             "(within --gpus-per-node), with the section's plan.\nRanked: fits the budget, then the estimated step time, then fewer units, then "
             "lower peak, then smaller root share.\nExit codes: 0 a policy fits; 1 none fits (said on stderr too); 2 usage, input or output error; 3 internal error.");
  if (auto done = parse_command(app, argc, argv, "suggest")) return *done;
  setup_logging(verbose ? 1 : 0, false);
  return run_guarded([&] {
    refuse_output_over_input(output, {{model, "model file"},
                                      {fsdp.policy, "policy file"},
                                      {fsdp.flops, "FLOP profile (--flops)"}});
    PolicyFile policy_file;
    try {
      policy_file = load_policy(fsdp);
    } catch (const UsageError& e) {
      spdlog::error("suggest: {}", e.what());
      return kExitInputError;
    }
    check_readable_file(model);
    ModuleTree tree = load_model(model, LoaderKind::Archive);
    // An Accelerate config's ignored modules are resolved on the model; its classes are what suggest varies.
    resolve_policy_file(policy_file, tree);
    const Policy& base = policy_file.policy;
    // A "tensor_parallel" section: the search varies tp too (1, 2, 4, 8 within --gpus-per-node;
    // suggest.h: suggest_candidates), each degree with the section's plan.

    SuggestContext ctx;
    ctx.model_path = model;
    ctx.tree = &tree;
    ctx.base = &base;
    ctx.options.budget_bytes = *parse_size(budget);
    ctx.options.activation_bytes = *parse_size(activations);
    ctx.options.pin_wrapping = pin_wrapping;
    // One --gpus-per-node (fsdp_options): the time model's placement and the advice's whole nodes.
    ctx.options.gpus_per_node = base.hardware.gpus_per_node.value_or(8);
    ctx.top = top;
    const std::optional<FlopProfile> flops = load_flops(fsdp, tree);
    ctx.options.flops = flops ? &*flops : nullptr;
    auto t0 = std::chrono::steady_clock::now();
    std::optional<Maximized> maxed;
    if (!maximize.empty()) maxed = maximize_dim(tree, base, ctx.options, maximize, model);
    Suggestion s = maxed ? std::move(maxed->suggestion) : suggest(tree, base, ctx.options);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    spdlog::info("suggest: {} candidates on {} modules evaluated in {} ms ({} candidates/s){}", s.tried,
                 tree.num_modules(), static_cast<int64_t>(ms),
                 static_cast<int64_t>(static_cast<double>(s.tried) * 1000.0 / std::max(ms, 1e-3)),
                 maxed ? ", " + std::to_string(maxed->probes) + " suggestions for --maximize" : std::string());
    bool fits = !s.ranked.empty() && s.ranked.front().fits;

    std::string report;
    if (format == "json") {
      nlohmann::ordered_json j = suggestion_to_json(s, ctx);
      if (maxed) j["maximize"] = maximized_json(*maxed);
      report = j.dump(1) + "\n";
    } else {
      report = (maxed ? maximized_text(*maxed, ctx.options.budget_bytes) : std::string()) + suggestion_to_text(s, ctx);
    }
    if (!emit.empty()) {
      // stdout carries only the hand-off (it is piped into a file); the ranking is for the person.
      std::cerr << report;
      if (!fits) {
        spdlog::error("suggest: --emit {}: nothing written: no policy fits the budget", emit);
        return kExitRefused;
      }
      const Candidate& best = s.ranked.front();
      Plan plan = make_plan(tree, best.policy, model);  // best.plan is for ranking: this one is whole
      std::string text;
      try {
        text = emit == "torch" ? plan_to_torch(plan) : plan_to_accelerate(plan);
      } catch (const EmitError& e) {
        spdlog::error("suggest: --emit {}: {}: {}", emit, best.label, e.what());
        return kExitInputError;
      }
      if (!output.empty()) write_output(output, policy_file_json(best.policy).dump(2) + "\n", "policy");
      write_output("", text, emit == "torch" ? "Python code" : "Accelerate config");
      return kExitOk;
    }
    // The policy file first: if it cannot be written, no report claims it was.
    if (!output.empty() && fits) write_output(output, policy_file_json(s.ranked.front().policy).dump(2) + "\n", "policy");
    write_output("", report, "report");
    if (fits) return kExitOk;
    // Exit 1 says why on stderr too: stdout may be a file no one reads.
    std::string nearest;
    if (!s.ranked.empty())
      nearest = "; nearest: " + s.ranked.front().label + ", " + format_bytes(s.ranked.front().needed_bytes);
    spdlog::error("suggest: no policy fits {} per rank{}{}", format_bytes(ctx.options.budget_bytes), nearest,
                  output.empty() ? "" : "; nothing written to " + output);
    return kExitRefused;
  });
}

}  // namespace fsdp_plan
