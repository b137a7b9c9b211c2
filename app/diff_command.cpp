#include "diff_command.h"

#include <CLI/CLI.hpp>


#include "command.h"
#include "report/diff_writer.h"
#include "report/plan_diff.h"
#include "util/file_io.h"
#include "util/json_input.h"

namespace fsdp_plan {

int diff_main(int argc, char** argv) {
  std::string old_file, new_file, format = "text", output;
  CLI::App app{"fsdp-plan diff: what changed between two plans (units, parameters, sizes, warnings)",
               "fsdp-plan diff"};
  app.add_option("old", old_file, "the reviewed plan (fsdp-plan MODEL --format json)")->required();
  app.add_option("new", new_file, "the plan to compare with it")->required();
  app.add_option("-f,--format", format, "output format")->check(CLI::IsMember({"text", "json"}))->capture_default_str();
  app.add_option("-o,--output", output,
                 "write the difference to FILE (atomically; a symbolic link's target) instead of stdout; never "
                 "one of the two plans");
  app.footer("Not differences: the model's path, key order, unit indices, warning wording.\n"
             "Exit codes: 0 same plan; 1 the plans differ; 2 usage, input or output error; 3 internal error.");
  if (auto done = parse_command(app, argc, argv, "diff")) return *done;
  return run_guarded([&] {
    refuse_output_over_input(output, {{old_file, "old plan"}, {new_file, "new plan"}});
    nlohmann::json a = load_plan_file(old_file), b = load_plan_file(new_file);
    PlanDiff d = diff_plans(a, b);
    DiffSide old_side{old_file, &a}, new_side{new_file, &b};
    std::string text = format == "json" ? diff_to_json(d, old_side, new_side).dump(1) + "\n"
                                        : diff_to_text(d, old_side, new_side);
    write_output(output, text, "difference");
    return d.equal() ? kExitOk : kExitRefused;
  });
}

}  // namespace fsdp_plan
