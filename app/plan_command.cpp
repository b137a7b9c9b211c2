#include "plan_command.h"

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <optional>

#include "command.h"
#include "fsdp_plan_version.h"
#include "emit/emit.h"
#include "fsdp_options.h"
#include "gate.h"
#include "model/loaders/loader.h"
#include "model/loaders/printable.h"
#include "model/tree_json.h"
#include "model/tree_text.h"
#include "planner/planner.h"
#include "report/html_writer.h"
#include "report/json_writer.h"
#include "report/text_writer.h"
#include "report/warning_groups.h"
#include "util/errors.h"
#include "util/file_io.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

struct Options {
  std::string model;
  FsdpOptions fsdp;
  std::string format = "text";
  std::string output;
  std::string loader = "archive";
  std::string emit;  // "", "accelerate" or "torch"
  bool format_given = false;
  bool dump_tree = false;
  bool wide = false;
  bool dump_tree_text = false;  // --dump-tree with an explicit -f text
  std::optional<double> warn_root_share;  // root_too_large threshold; overrides checks.warn_root_share
  bool aliases = false;
  bool collectives = false;  // JSON / HTML: the step's events (PlanJsonOptions)
  std::optional<std::string> activation_bytes;  // --activation-bytes SIZE
  int verbosity = 0;
  bool quiet = false;
  GateOptions gate;
};

// Columns for the text plan: COLUMNS, else the terminal's width, else 100.
size_t text_width() {
  if (const char* env = std::getenv("COLUMNS")) {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);
    if (end != env && *end == '\0' && v > 0) return static_cast<size_t>(v);
  }
  struct winsize ws {};
  if (::isatty(STDOUT_FILENO) && ::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 100;
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// What -v leaves out: the policy and settings in effect, each unit, each alias (-vv).
// Then what must not be missed, at any verbosity: a policy class matching
// nothing, and a model with no parameter at all.
void log_plan_details(const Plan& plan) {
  spdlog::debug("policy in effect: {}", policy_to_json(plan.policy).dump());
  const FsdpSettings& s = plan.memory.settings;
  spdlog::debug("memory settings: world size {}, {} (runs as {}), shard group {}, optimizer {}{}", s.world_size,
                strategy_name(s.strategy), strategy_name(plan.memory.effective_strategy),
                plan.memory.shard_group_size, optimizer_name(s.optimizer),
                s.use_orig_params ? ", use_orig_params" : "");
  for (const auto& a : plan.aliases) spdlog::debug("alias: {} is {}, not visited", a.path, a.alias_of);
  for (size_t i = 0; i < plan.units.size(); ++i) {
    const Unit& u = plan.units[i];
    spdlog::debug("unit {} '{}': {} parameters ({} elements), {} buffers, depth {}", i, plan.tree->path(u.module),
                  u.params.size(), u.param_numel, u.buffers.size(), u.depth);
  }
  for (const auto& w : plan.warnings)
    if (w.kind == "unmatched_class") spdlog::warn("{}", printable(w.message, kMaxMessage));
  if (plan.model.param_numel == 0)
    spdlog::warn("{}: the model has no parameters, so FSDP has nothing to shard; a torch.jit.freeze'd model has its "
                 "parameters folded into constants: save the model before freezing it",
                 printable(plan.model.path, 1024));
}

int run(const Options& opt) {
  // The policy first: it is cheap, and a typo should not wait for a big model.
  if (!opt.emit.empty() && opt.format_given)
    throw UsageError("--emit writes " + std::string(opt.emit == "torch" ? "Python" : "YAML") +
                     " in place of the plan; --format does not apply to it");
  refuse_output_over_input(opt.output, {{opt.model, "model file"},
                                        {opt.fsdp.policy, "policy file"},
                                        {opt.gate.expect, "reviewed plan (--expect)"},
                                        {opt.fsdp.flops, "FLOP profile (--flops)"}});
  PolicyFile policy_file = load_policy(opt.fsdp);
  Policy& policy = policy_file.policy;
  if (opt.warn_root_share) policy.checks.warn_root_share = opt.warn_root_share;
  if (opt.aliases) policy.module_aliases = true;
  if (opt.activation_bytes) policy.activations.allowance_bytes = *parse_size(*opt.activation_bytes);

  auto t0 = std::chrono::steady_clock::now();
  check_readable_file(opt.model);
  ModuleTree tree;
  try {
    tree = load_model(opt.model, opt.loader == "jit" ? LoaderKind::Jit : LoaderKind::Archive);
  } catch (const JitPreflightError&) {
    throw;  // damaged or hostile: the default loader refuses it too
  } catch (const InputError& e) {
    if (opt.loader != "jit") throw;
    // TorchScript compiles every method, so a custom op (torchvision::nms) stops it.
    throw InputError(e.file(), std::string(e.what()) +
                                   "; the default loader reads only the structure and compiles nothing: "
                                   "plan it without --loader jit");
  }
  spdlog::info("loaded {} modules, {} tensors in {:.1f} ms ({} loader)", tree.num_modules(),
               tree.num_tensors(), ms_since(t0), opt.loader);

  std::string text;
  int code = kExitOk;
  std::vector<std::string> failures;  // why the exit is 1, one line each: said on stderr
  if (opt.dump_tree) {
    text = opt.dump_tree_text ? tree_to_text(tree) : tree_to_json(tree).dump(1) + "\n";
  } else {
    t0 = std::chrono::steady_clock::now();
    // Accelerate's class and ignored-module lookups need the model.
    std::vector<Warning> read_warnings = resolve_policy_file(policy_file, tree);
    const std::optional<FlopProfile> flops = load_flops(opt.fsdp, tree);
    Plan plan = make_plan(tree, policy, opt.model, ClassMatcher(), PlanPurpose::Report, flops ? &*flops : nullptr);
    plan.warnings.insert(plan.warnings.begin(), read_warnings.begin(), read_warnings.end());
    if (opt.gate.budgets.max_peak_bytes) plan.fit.max_peak_bytes = opt.gate.budgets.max_peak_bytes;
    spdlog::info("planned {} units in {:.1f} ms", plan.units.size(), ms_since(t0));
    log_plan_details(plan);
    // The JSON plan costs more than planning a big model: made whole only when checked (the gate's checks
    // and --expect need it) or for HTML; -f json writes it as it goes (report/json_sink.h).
    const PlanJsonOptions json_options{opt.collectives};
    const auto json =
        Gate::reads_plan(policy.checks, opt.gate) ? plan_to_json(plan, json_options) : nlohmann::ordered_json();
    Gate gate(json, policy.checks, opt.gate, opt.model);
    if (plan.has_errors() || !gate.passed()) code = kExitRefused;
    for (const WarningGroup& g :
         group_warnings(plan.warnings, [](const Warning& w) { return w.severity == Severity::Error; }))
      failures.push_back(printable(warning_group_text(g), kMaxMessage));
    for (auto& line : gate.failures()) failures.push_back(std::move(line));
    if (!opt.emit.empty()) {
      // The plan's findings still matter: on stderr, and no config for a plan FSDP would refuse.
      for (const WarningGroup& g :
           group_warnings(plan.warnings, [](const Warning& w) { return w.severity == Severity::Warning; }))
        spdlog::warn("{}", printable(warning_group_text(g), kMaxMessage));
      if (code != kExitOk) {
        for (const auto& line : failures) spdlog::error("{}", line);
        spdlog::error("--emit {}: nothing written: the plan has errors or fails a check", opt.emit);
        return code;
      }
      text = opt.emit == "torch" ? plan_to_torch(plan) : plan_to_accelerate(plan);
    } else {
      if (opt.format == "json") {
        // Here, while the plan lives; from it, not from `text`. The gate's keys after the plan's.
        OutputWriter out(opt.output, "plan");
        JsonTextSink sink([&out](std::string_view piece) { out.write(piece); });
        plan_json(sink, plan, gate.annotate(nlohmann::ordered_json::object()), json_options);
        sink.flush();
        out.write("\n");
        out.commit();
        for (const auto& line : failures) spdlog::error("{}", line);
        return code;
      }
      if (opt.format == "html")
        text = plan_to_html(gate.annotate(json.is_null() ? plan_to_json(plan, json_options) : json));
      else
        text = plan_to_text(plan, {text_width(), opt.wide, opt.verbosity > 0}) + gate.text();
    }
  }

  write_output(opt.output, text, "plan");
  // After the plan, so that on a terminal they close it; also under -q: they are what the user asked to know.
  for (const auto& line : failures) spdlog::error("{}", line);
  return code;
}

}  // namespace

int plan_main(int argc, char** argv) {
  Options opt;
  CLI::App app{"fsdp-plan: the PyTorch FSDP wrapping plan of a TorchScript (.pt) or torch.export (.pt2) model",
               "fsdp-plan"};
  app.set_version_flag("--version", "fsdp-plan " FSDP_PLAN_VERSION_STRING);
  app.add_option("model", opt.model,
                 "TorchScript file (torch.jit.save of a scripted or traced module) or torch.export archive "
                 "(torch.export.save, .pt2), told apart by content")
      ->required();
  add_fsdp_options(app, opt.fsdp,
                   "auto-wrap policy JSON (policies/policy.schema.json) or an Accelerate config (YAML, or JSON "
                   "as accelerate config saves it); without it, no auto-wrap: one root unit",
                   "1: FullyShardedDataParallel (default); 2: fully_shard, the policy selecting its calls");
  auto* format = app.add_option("-f,--format", opt.format, "output format (html: one self-contained page, works offline)")
      ->check(CLI::IsMember({"text", "json", "html"}))
      ->capture_default_str();
  app.add_option("--emit", opt.emit,
                 "instead of the plan, write what applies it: accelerate (an Accelerate config YAML) or "
                 "torch (a Python module with apply_fsdp(model))")
      ->check(CLI::IsMember({"accelerate", "torch"}));
  app.add_option("-o,--output", opt.output,
                 "write the plan to FILE (atomically; a symbolic link's target) instead of stdout; never one of "
                 "the input files");
  app.add_option("--loader", opt.loader,
                 "archive: read the structure only (no weights, no compiling); "
                 "jit: torch::jit::load, reads and compiles everything (TorchScript only: a .pt2 has one loader)")
      ->check(CLI::IsMember({"archive", "jit"}))
      ->capture_default_str();
  app.add_option("--warn-root-share", opt.warn_root_share,
                 "warn (root_too_large) when the root unit holds more than this share of the parameters "
                 "(default 0.5)")
      ->type_name("F")
      ->check(share_validator());
  app.add_flag("--aliases", opt.aliases,
               "a module with exactly the tensors of an earlier one is that module under a second name "
               "(transformers 4's T5/BART: encoder.embed_tokens = self.shared); FSDP visits it once");
  app.add_option("--activation-bytes", opt.activation_bytes,
                 "activations per rank as a flat allowance (e.g. 20GiB), held through forward and backward, in "
                 "place of what a .pt2 graph gives; a TorchScript file has no graph")
      ->check(CLI::Validator(
          [](std::string& v) { return activation_bytes_error(v); },
          "SIZE"))
      ->group("Activations (from a .pt2 graph)");
  app.add_flag("--wide", opt.wide,
               "text: never shorten unit paths (default: fit COLUMNS or the terminal) nor fold identical "
               "consecutive units into one row (as -v); also each unit's communication per step and exposed "
               "communication");
  app.add_flag("--collectives", opt.collectives,
               "json, html: also every collective of the step in issue order (comm.collectives) and, with FLOPs, "
               "the simulated timeline (time.timeline); without it, each unit's and the step's sums");
  app.add_flag("--dump-tree", opt.dump_tree,
               "print the loaded module tree as JSON instead of a plan (with -f text: as an indented tree)");
  app.add_flag("-v,--verbose", opt.verbosity,
               "log progress to stderr (-vv for more); text: every unit a row, none folded");
  app.add_flag("-q,--quiet", opt.quiet, "log only errors");
  add_gate_options(app, opt.gate);
  app.footer("Also: fsdp-plan diff OLD.json NEW.json (see fsdp-plan diff --help);\n"
             "      fsdp-plan suggest MODEL --budget SIZE (see fsdp-plan suggest --help).\n"
             "Exit codes: 0 plan produced; 1 FSDP would refuse the model, a budget is violated, or the plan "
             "differs from --expect (one line each on stderr, also with -q); 2 usage, input or output error; "
             "3 internal error.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    spdlog::error("{} (see fsdp-plan --help)",
                  printable(unknown_option_hint(app, argc, argv).value_or(e.what()), kMaxMessage));
    return kExitInputError;
  }
  opt.format_given = format->count() > 0;
  opt.dump_tree_text = opt.dump_tree && opt.format_given && opt.format == "text";
  setup_logging(opt.verbosity, opt.quiet);
  return run_guarded([&] {
    try {
      return run(opt);
    } catch (const UsageError& e) {
      spdlog::error("{}", printable(e.what(), kMaxMessage));
      return kExitInputError;
    } catch (const EmitError& e) {
      spdlog::error("--emit {}: {}", printable(opt.emit, kMaxMessage), printable(e.what(), kMaxMessage));
      return kExitInputError;
    }
  });
}

}  // namespace fsdp_plan
