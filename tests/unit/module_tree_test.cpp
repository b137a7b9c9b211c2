// The module tree's per-tensor sizes, kept when a tensor is added.
#include <doctest/doctest.h>

#include "tree_builder.h"

using namespace fsdp_plan;
using namespace fsdp_plan::test;

TEST_CASE("the tree keeps each tensor's numel, dim 0, bytes and whether a module holds it as a parameter") {
  TreeBuilder b;
  b.add("a", "Linear");
  TensorId w = b.param("a", "weight", {6, 4});
  TensorId s = b.param("a", "scale", {});
  TensorId e = b.param("a", "empty", {0, 3});
  TensorId buf = b.buffer("a", "running", {5});
  b.add("c", "Linear");
  b.tie("c", "weight", buf);  // a buffer elsewhere held as a parameter here is a parameter
  TensorId loose = b.tree.add_tensor({{2, 3}, "bfloat16", 2});

  CHECK(b.tree.numel(w) == 24);
  CHECK(b.tree.dim0(w) == 6);
  CHECK(b.tree.bytes(w) == 96);
  CHECK(b.tree.numel(s) == 1);
  CHECK(b.tree.dim0(s) == 1);  // 0-dim: one row
  CHECK(b.tree.numel(e) == 0);
  CHECK(b.tree.dim0(e) == 0);
  CHECK(b.tree.bytes(loose) == 12);
  for (TensorId t : {w, s, e, buf}) CHECK(b.tree.numel(t) == b.tree.tensor(t).numel());
  CHECK(b.tree.is_param(w));
  CHECK(b.tree.is_param(buf));
  CHECK_FALSE(b.tree.is_param(loose));
}

TEST_CASE("a buffer only is no parameter") {
  TreeBuilder b;
  b.add("n", "BatchNorm1d");
  TensorId buf = b.buffer("n", "running_mean", {4});
  CHECK_FALSE(b.tree.is_param(buf));
  CHECK(b.tree.numel(buf) == 4);
}
