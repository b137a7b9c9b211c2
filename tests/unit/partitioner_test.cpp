// The min-cut partitioner model (lib/activations/partitioner.h) and its max
// flow (lib/util/max_flow.h) on hand-built cut graphs: what a compiled call
// saves where eager autograd would save something else.
#include <doctest/doctest.h>

#include "activations/partitioner.h"
#include "util/max_flow.h"

using namespace fsdp_plan;

namespace {

CutValue value(int64_t bytes, std::vector<int32_t> users = {}) {
  CutValue v;
  v.bytes = bytes;
  v.users = std::move(users);
  return v;
}

std::vector<int> saved_indices(const std::vector<bool>& saved) {
  std::vector<int> out;
  for (size_t i = 0; i < saved.size(); ++i)
    if (saved[i]) out.push_back(static_cast<int>(i));
  return out;
}

}  // namespace

TEST_CASE("max flow: the minimum cut of a small graph and its source side") {
  // s -> a (3), s -> b (2), a -> b (1), a -> t (2), b -> t (3): max flow 5.
  MaxFlow f(4);
  f.add_edge(0, 1, 3);
  f.add_edge(0, 2, 2);
  f.add_edge(1, 2, 1);
  f.add_edge(1, 3, 2);
  f.add_edge(2, 3, 3);
  CHECK(f.run(0, 3) == 5);
  const std::vector<bool> side = f.source_side(0);
  CHECK(side[0]);
  CHECK_FALSE(side[3]);
}

TEST_CASE("max flow: no finite cut is infinite") {
  MaxFlow f(2);
  f.add_edge(0, 1, MaxFlow::kInfinite);
  CHECK(f.run(0, 1) == MaxFlow::kInfinite);
}

TEST_CASE("partitioner: a pointwise chain is recomputed from the banned matmul before it") {
  // x (input) -> mm (banned) -> silu -> mul; the backward reads silu's input
  // and mul's inputs. Saving mm's output alone lets silu be recomputed.
  std::vector<CutValue> v = {value(100, {1}), value(400, {2}), value(400, {3}), value(400)};
  v[0].input = true;
  v[1].compute = true;
  v[1].needed = true;  // silu's backward reads its input
  v[2].needed = true;  // mul's backward reads silu's output
  v[3].materialized = true;
  CHECK(saved_indices(partitioner_saves(v)) == std::vector<int>{1});
}

TEST_CASE("partitioner: a small banned reduction is saved in place of the big tensor it came from") {
  // x (input, big) -> mean (banned: a reduction) -> rsqrt -> mul(x, rsqrt);
  // the backward reads x and rsqrt: x is an input (kept anyway by the cut
  // only where needed), rsqrt is recomputed from the saved mean or saved.
  std::vector<CutValue> v = {value(1000, {1, 3}), value(10, {2}), value(10, {3}), value(1000)};
  v[0].input = true;
  v[0].needed = true;
  v[1].reduction = true;
  v[2].needed = true;
  v[3].materialized = true;
  const std::vector<int> saved = saved_indices(partitioner_saves(v));
  REQUIRE(saved.size() == 2);
  CHECK(saved[0] == 0);
  CHECK(saved[1] == 2);  // dist_from_bw 1 for rsqrt, 2 for the mean: 1.1 x 10 x 2 < 1.21 x 10 x 2
}

TEST_CASE("partitioner: parameters are free to save, values nothing reads are not saved") {
  std::vector<CutValue> v = {value(4096, {2}), value(64, {2}), value(64, {3}), value(64)};
  v[0].input = true;
  v[0].free = true;  // a weight the matmul's backward reads
  v[0].needed = true;
  v[1].input = true;
  v[1].needed = true;
  v[2].compute = true;
  CHECK(saved_indices(partitioner_saves(v)) == std::vector<int>{0, 1});
}

TEST_CASE("partitioner: a memory budget recomputes more, down to the inputs alone") {
  // x (input) -> mm1 (compute) -> mm2 (compute) -> silu; the backward reads
  // mm1's output (mm2's input), mm2's output (silu's input) and x (mm1's).
  std::vector<CutValue> v = {value(100, {1}), value(400, {2}), value(400, {3}), value(400)};
  v[0].input = true;
  v[0].needed = true;
  for (int k : {1, 2}) {
    v[static_cast<size_t>(k)].compute = true;
    v[static_cast<size_t>(k)].needed = true;
    v[static_cast<size_t>(k)].node = k;
    v[static_cast<size_t>(k)].flops = k == 1 ? 1000 : 10;
  }
  v[3].node = 3;
  v[3].materialized = true;
  CHECK(saved_indices(partitioner_saves(v, 1)) == std::vector<int>{0, 1, 2});
  CHECK(saved_indices(partitioner_saves(v, 0)) == std::vector<int>{0});
  // Half the 800 bytes between the inputs (100) and the default (900): the
  // knapsack keeps one of the two 400-byte matmuls (normalised 0.5 each, the
  // budget 0.6), the one with more FLOPs; the other is recomputed from it.
  CHECK(saved_indices(partitioner_saves(v, 0.6)) == std::vector<int>{0, 1});
  // What the backward runs again: nothing by default (silu's output is not
  // read); at 0.6 the second matmul; at 0 both (all the forward up to what is read).
  CHECK(saved_indices(partitioner_cut(v, 1).recomputed).empty());
  CHECK(saved_indices(partitioner_cut(v, 0.6).recomputed) == std::vector<int>{2});
  CHECK(saved_indices(partitioner_cut(v, 0).recomputed) == std::vector<int>{1, 2});
}

TEST_CASE("partitioner: the op lists") {
  WalkNode n;
  n.op = "aten.silu.default";
  CHECK(recomputable_node(n));
  n.op = "aten.linear.default";
  CHECK_FALSE(recomputable_node(n));
  CHECK_FALSE(fusible_node(n));
  n.op = "aten.scaled_dot_product_attention.default";
  CHECK_FALSE(recomputable_node(n));
  n.op = "aten.softmax.int";  // a composite: amax, sub, exp, sum, div under inductor's decompositions
  CHECK(recomputable_node(n));
  n.op = "aten.native_dropout.default";
  CHECK_FALSE(recomputable_node(n));
  CHECK(fusible_node(n));  // a random op fuses
  CHECK(compute_or_random_node(n, nullptr));
  n.op = "aten.linear.default";
  CHECK(compute_or_random_node(n, nullptr));
  n.op = "aten.scaled_dot_product_attention.default";  // by its kernel: the CPU's flash kernel is not on the list
  CHECK(compute_or_random_node(n, "CUDA flash (_scaled_dot_product_flash_attention)"));
  CHECK_FALSE(compute_or_random_node(n, "CPU flash (_scaled_dot_product_flash_attention_for_cpu)"));
}
