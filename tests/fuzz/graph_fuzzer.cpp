// libFuzzer target: any bytes as a .pt2, then, where the loader returns a
// tree with a graph, planned with the graph's activations at the traced sizes
// and at a large value of each dynamic dimension: walk_input's checked sizes
// and byte counts (activations/graph_input.cpp) and the walk itself, and once
// with the whole model compiled under a memory budget (the partitioner's cut). It must
// plan or throw InputError (TooLargeError included); anything else is a bug.
// export_fuzzer covers the loader alone.
#include <cstddef>
#include <cstdint>
#include <string>

#include "model/class_names.h"
#include "model/graph.h"
#include "model/loaders/export_loader.h"
#include "planner/planner.h"
#include "util/errors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fsdp_plan::ExportOptions options;
  options.verify_crc = false;
  try {
    fsdp_plan::ModuleTree tree = fsdp_plan::load_export_bytes("fuzz.pt2", data, size, nullptr, options);
    if (!tree.graph()) return 0;
    fsdp_plan::Policy policy;
    (void)fsdp_plan::make_plan(tree, policy, "fuzz.pt2");
    // Compiled (issue 42): the whole model as one compiled call, its cut and,
    // under a memory budget, the relaxed cuts and the knapsack.
    fsdp_plan::Policy compiled = policy;
    compiled.compile = fsdp_plan::CompileConfig{{fsdp_plan::bare_class(tree, 0)}, 0.5, true};
    (void)fsdp_plan::make_plan(tree, compiled, "fuzz.pt2");
    const fsdp_plan::Graph& g = *tree.graph();
    for (int32_t s = 0; s < static_cast<int32_t>(g.num_symbols()) && s < 4; ++s) {
      fsdp_plan::Policy at = policy;
      at.activations.dims = {{g.symbol(s).dim, int64_t{1} << 40}};
      try {
        (void)fsdp_plan::make_plan(tree, at, "fuzz.pt2");
      } catch (const fsdp_plan::InputError&) {
      }
    }
  } catch (const fsdp_plan::InputError&) {
  }
  return 0;
}
