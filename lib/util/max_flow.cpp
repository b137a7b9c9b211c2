#include "util/max_flow.h"

#include <algorithm>
#include <deque>

namespace fsdp_plan {

void MaxFlow::add_edge(int32_t from, int32_t to, int64_t capacity) {
  adjacency_[static_cast<size_t>(from)].push_back(static_cast<int32_t>(edges_.size()));
  edges_.push_back({to, std::min(capacity, kInfinite)});
  adjacency_[static_cast<size_t>(to)].push_back(static_cast<int32_t>(edges_.size()));
  edges_.push_back({from, 0});
}

bool MaxFlow::levels(int32_t source, int32_t sink) {
  level_.assign(adjacency_.size(), -1);
  std::deque<int32_t> todo{source};
  level_[static_cast<size_t>(source)] = 0;
  while (!todo.empty()) {
    const int32_t n = todo.front();
    todo.pop_front();
    for (int32_t e : adjacency_[static_cast<size_t>(n)]) {
      const Edge& edge = edges_[static_cast<size_t>(e)];
      if (edge.capacity <= 0 || level_[static_cast<size_t>(edge.to)] >= 0) continue;
      level_[static_cast<size_t>(edge.to)] = level_[static_cast<size_t>(n)] + 1;
      todo.push_back(edge.to);
    }
  }
  return level_[static_cast<size_t>(sink)] >= 0;
}

// One blocking-flow path search from `node`, at most `limit` (recursion depth:
// the BFS level of the sink, at most the number of nodes).
int64_t MaxFlow::push(int32_t node, int32_t sink, int64_t limit) {
  if (node == sink) return limit;
  const std::vector<int32_t>& out = adjacency_[static_cast<size_t>(node)];
  for (int32_t& i = next_[static_cast<size_t>(node)]; i < static_cast<int32_t>(out.size()); ++i) {
    const int32_t e = out[static_cast<size_t>(i)];
    Edge& edge = edges_[static_cast<size_t>(e)];
    if (edge.capacity <= 0 || level_[static_cast<size_t>(edge.to)] != level_[static_cast<size_t>(node)] + 1) continue;
    const int64_t pushed = push(edge.to, sink, std::min(limit, edge.capacity));
    if (pushed <= 0) continue;
    if (edge.capacity < kInfinite) edge.capacity -= pushed;
    Edge& back = edges_[static_cast<size_t>(e ^ 1)];
    back.capacity = std::min(kInfinite, back.capacity + pushed);
    return pushed;
  }
  return 0;
}

int64_t MaxFlow::run(int32_t source, int32_t sink) {
  int64_t flow = 0;
  while (levels(source, sink)) {
    next_.assign(adjacency_.size(), 0);
    while (const int64_t pushed = push(source, sink, kInfinite)) {
      if (pushed >= kInfinite) return kInfinite;
      flow = std::min(kInfinite, flow + pushed);
    }
  }
  return flow;
}

std::vector<bool> MaxFlow::source_side(int32_t source) const {
  std::vector<bool> seen(adjacency_.size(), false);
  std::vector<int32_t> todo{source};
  seen[static_cast<size_t>(source)] = true;
  while (!todo.empty()) {
    const int32_t n = todo.back();
    todo.pop_back();
    for (int32_t e : adjacency_[static_cast<size_t>(n)]) {
      const Edge& edge = edges_[static_cast<size_t>(e)];
      if (edge.capacity <= 0 || seen[static_cast<size_t>(edge.to)]) continue;
      seen[static_cast<size_t>(edge.to)] = true;
      todo.push_back(edge.to);
    }
  }
  return seen;
}

}  // namespace fsdp_plan
