// A minimum s-t cut by maximum flow (Dinic's algorithm), for the partitioner
// model (activations/partitioner.h), which mirrors networkx.minimum_cut as
// torch/_functorch/partitioners.py calls it. Capacities are integers; kInfinite
// marks an edge no cut may take.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fsdp_plan {

class MaxFlow {
 public:
  static constexpr int64_t kInfinite = int64_t{1} << 62;

  explicit MaxFlow(int32_t nodes) : adjacency_(static_cast<size_t>(nodes)) {}

  void add_edge(int32_t from, int32_t to, int64_t capacity);

  // The maximum flow from `source` to `sink` (kInfinite where no finite cut
  // separates them).
  int64_t run(int32_t source, int32_t sink);

  // After run(): per node, whether it stays on the source's side of the
  // minimum cut (reachable from the source in the residual graph).
  std::vector<bool> source_side(int32_t source) const;

 private:
  struct Edge {
    int32_t to;
    int64_t capacity;
  };
  bool levels(int32_t source, int32_t sink);
  int64_t push(int32_t node, int32_t sink, int64_t limit);

  std::vector<Edge> edges_;  // edge e's reverse is e ^ 1
  std::vector<std::vector<int32_t>> adjacency_;
  std::vector<int32_t> level_, next_;
};

}  // namespace fsdp_plan
