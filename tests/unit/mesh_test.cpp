// The device mesh (lib/mesh/): its groups against what torch's init_device_mesh
// builds, the settings it is built from, and its refusals.
#include <doctest/doctest.h>

#include <stdexcept>

#include "mesh/device_mesh.h"
#include "util/checked.h"

using namespace fsdp_plan;

namespace {

FsdpSettings fsdp(int64_t world, ShardingStrategy strategy = ShardingStrategy::FullShard,
                  FsdpVersion version = FsdpVersion::V2) {
  FsdpSettings s;
  s.version = version;
  s.world_size = world;
  s.strategy = strategy;
  return s;
}

TensorParallel tp_of(int64_t degree, int64_t dp_replicate = 0, int64_t dp_shard = 0) {
  TensorParallel tp;
  tp.degree = degree;
  tp.dp_replicate = dp_replicate;
  tp.dp_shard = dp_shard;
  return tp;
}

using Ranks = std::vector<int64_t>;

}  // namespace

TEST_CASE("a mesh's groups are init_device_mesh's, rank 0's slice of the row-major layout") {
  // Each expectation printed by torch 2.13 on the fake backend (world size 16):
  // dist.get_process_group_ranks(init_device_mesh("cpu", shape, mesh_dim_names=...)[dims].get_group()),
  // flattened dimensions through mesh[dims]._flatten().
  const DeviceMesh m({2, 4, 2}, {MeshDim::DpReplicate, MeshDim::DpShard, MeshDim::Tp});
  CHECK(m.world_size() == 16);
  CHECK(m.group(MeshDim::DpReplicate).ranks() == Ranks{0, 8});
  CHECK(m.group(MeshDim::DpShard).ranks() == Ranks{0, 2, 4, 6});
  CHECK(m.group(MeshDim::Tp).ranks() == Ranks{0, 1});
  CHECK(m.group({MeshDim::DpReplicate, MeshDim::DpShard}).ranks() == Ranks{0, 2, 4, 6, 8, 10, 12, 14});
  CHECK(m.group({MeshDim::DpShard, MeshDim::Tp}).ranks() == Ranks{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(m.group(MeshDim::DpShard) == RankGroup{4, 2});
  CHECK(m.group(MeshDim::DpReplicate) == RankGroup{2, 8});
  CHECK(m.text() == "(dp_replicate 2, dp_shard 4, tp 2)");

  const DeviceMesh wide({2, 2, 4}, {MeshDim::DpReplicate, MeshDim::DpShard, MeshDim::Tp});
  CHECK(wide.group(MeshDim::DpReplicate).ranks() == Ranks{0, 8});
  CHECK(wide.group(MeshDim::DpShard).ranks() == Ranks{0, 4});
  CHECK(wide.group(MeshDim::Tp).ranks() == Ranks{0, 1, 2, 3});
  CHECK(wide.group({MeshDim::DpReplicate, MeshDim::DpShard}).ranks() == Ranks{0, 4, 8, 12});

  const DeviceMesh hsdp({4, 4, 1}, {MeshDim::DpReplicate, MeshDim::DpShard});
  CHECK(hsdp.group(MeshDim::DpReplicate).ranks() == Ranks{0, 4, 8, 12});
  CHECK(hsdp.group(MeshDim::DpShard).ranks() == Ranks{0, 1, 2, 3});
  CHECK(hsdp.text() == "(dp_replicate 4, dp_shard 4)");

  const DeviceMesh flat({1, 8, 2}, {MeshDim::DpShard, MeshDim::Tp});
  CHECK(flat.group(MeshDim::DpReplicate).ranks() == Ranks{0});
  CHECK(flat.group(MeshDim::DpShard).ranks() == Ranks{0, 2, 4, 6, 8, 10, 12, 14});
  CHECK(flat.text() == "(dp_shard 8, tp 2)");
  // Not adjacent: no one stride describes (dp_replicate, tp); outermost first only.
  CHECK_THROWS_AS(m.group({MeshDim::DpReplicate, MeshDim::Tp}), std::logic_error);
  CHECK_THROWS_AS(m.group({MeshDim::Tp, MeshDim::DpShard}), std::logic_error);
}

TEST_CASE("a group's nodes: intra-node when its ranks share one node of gpus_per_node") {
  const DeviceMesh m({2, 4, 2}, {MeshDim::DpReplicate, MeshDim::DpShard, MeshDim::Tp});
  CHECK(m.group(MeshDim::Tp).intra_node(8));
  CHECK(m.group(MeshDim::DpShard).intra_node(8));      // ranks 0..6 on node 0
  CHECK(m.group(MeshDim::DpShard).nodes(4) == 2);      // 0, 2 | 4, 6
  CHECK(m.group(MeshDim::DpShard).ranks_per_node(4) == 2);
  CHECK(m.group(MeshDim::DpReplicate).nodes(8) == 2);  // 0 | 8
  CHECK(m.group(MeshDim::DpReplicate).ranks_per_node(8) == 1);
  CHECK(RankGroup{6, 3}.nodes(4) == 4);                // 0, 3 | 6 | 9 | 12, 15: stride not dividing the node
  CHECK(RankGroup{1, 16}.nodes(8) == 1);
}

TEST_CASE("the settings build the mesh: FSDP's strategies and tensor_parallel's section") {
  CHECK(device_mesh(fsdp(8)).text() == "(dp_shard 8)");
  CHECK(device_mesh(fsdp(8)).group(MeshDim::DpShard) == RankGroup{8, 1});
  FsdpSettings hybrid = fsdp(16, ShardingStrategy::HybridShard);
  CHECK(device_mesh(hybrid).text() == "(dp_replicate 2, dp_shard 8)");  // one node of 8 by default
  hybrid.shard_group_size = 4;
  CHECK(device_mesh(hybrid).group(MeshDim::DpReplicate) == RankGroup{4, 4});  // FSDP1's _inter_node_pg
  // FSDP1's NO_SHARD all-reduces over every rank: the data-parallel group.
  const DeviceMesh none = device_mesh(fsdp(8, ShardingStrategy::NoShard, FsdpVersion::V1));
  CHECK(none.size(MeshDim::DpShard) == 1);
  CHECK(none.group({MeshDim::DpReplicate, MeshDim::DpShard}) == RankGroup{8, 1});
  CHECK(device_mesh(fsdp(1)).world_size() == 1);
  CHECK(DeviceMesh({16777216, 419021, 10496005}, {MeshDim::DpReplicate, MeshDim::DpShard, MeshDim::Tp}).world_size() ==
        INT64_MAX);  // 2^24 + 4 x 2^64: never wrapped to 2^24
  const TensorParallel tp = tp_of(2);
  CHECK(device_mesh(fsdp(8), &tp).text() == "(dp_shard 4, tp 2)");  // dp_shard: the rest
  const TensorParallel tp3 = tp_of(2, 2);
  const DeviceMesh m3 = device_mesh(fsdp(16), &tp3);
  CHECK(m3.text() == "(dp_replicate 2, dp_shard 4, tp 2)");
  CHECK(m3.group(MeshDim::DpShard) == RankGroup{4, 2});
  CHECK(device_mesh_error(fsdp(16), &tp3).empty());
}

TEST_CASE("the mesh refuses what the engines refuse, in their words") {
  const TensorParallel tp = tp_of(2, 2);
  CHECK(device_mesh_error(fsdp(6), &tp) ==
        "the mesh (dp_replicate 2, dp_shard 1, tp 2) has 4 ranks, the world size is 6 (ranks outside the mesh "
        "would train nothing); make dp_replicate x dp_shard x tp the world size");
  const TensorParallel big = tp_of(4, 0, 4);
  CHECK(device_mesh_error(fsdp(8), &big) ==
        "the mesh (dp_shard 4, tp 4) has 16 ranks, the world size is 8 (init_device_mesh: \"Mesh should not be "
        "bigger than default world size 8, but found 16 ranks!\"); make dp_replicate x dp_shard x tp the world size");
  const TensorParallel all = tp_of(2);
  CHECK(device_mesh_error(fsdp(2), &all).find("tp 2 takes every rank") == 0);
  CHECK(device_mesh_error(fsdp(8, ShardingStrategy::FullShard, FsdpVersion::V1), &all).find("composes with FSDP2") !=
        std::string::npos);
  CHECK(device_mesh_error(fsdp(8, ShardingStrategy::HybridShard), &all).find("instead of HYBRID_SHARD") !=
        std::string::npos);
  FsdpSettings hybrid = fsdp(12, ShardingStrategy::HybridShard);
  hybrid.shard_group_size = 8;
  CHECK(device_mesh_error(hybrid).find("the hybrid shard group size (8) must divide the world size (12)") == 0);
  CHECK(device_mesh_error(fsdp(0)) == "the world size must be from 1 to 16777216");
  const TensorParallel huge = tp_of(int64_t{1} << 25, 1, 1);
  CHECK(device_mesh_error(fsdp(8), &huge) == "the mesh's tp size (33554432) must be from 1 to 16777216");
}

TEST_CASE("sizes whose product wraps to the world size are refused, never wrapped (issue 39)") {
  // 2^24 x 419021 x 10496005 = 2^24 + 4 x 2^64: 64-bit arithmetic made it the world size 2^24.
  const TensorParallel wraps = tp_of(10496005, 16777216, 419021);
  const std::string why = device_mesh_error(fsdp(16777216), &wraps);
  CHECK(why.find("the mesh (dp_replicate 16777216, dp_shard 419021, tp 10496005) has 73786976294854983680 ranks, "
                 "the world size is 16777216 (init_device_mesh: \"Mesh should not be bigger than default world size "
                 "16777216, but found 73786976294854983680 ranks!\")") == 0);
  CHECK(checked_product({16777216, 419021, 10496005}) == std::nullopt);
  CHECK(checked_product({2, 3, 4}) == 24);
  CHECK(exact_product_text({(int64_t{1} << 62) + 1, 2, 4}) == "36893488147419103240");
  CHECK(exact_product_text({INT64_MAX, INT64_MAX, INT64_MAX}) ==
        "784637716923335095224261902710254454442933591094742482943");
  CHECK(exact_product_text({1000000000, 1000000000, 1000000000}) == "1000000000000000000000000000");
}

// torchtitan's sparse mesh, (dp_replicate, efsdp, ep) with efsdp x ep = dp_shard x tp, row-major like the dense
// one (parallel_dims.py build_mesh: init_device_mesh's layout, ep innermost).
TEST_CASE("expert parallelism: the sparse layout beside the dense one") {
  ExpertParallel ep;
  ep.degree = 4;
  const DeviceMesh m = device_mesh(fsdp(16), nullptr, &ep);
  CHECK(m.text() == "(dp_shard 16; experts: efsdp 4, ep 4)");
  CHECK(m.world_size() == 16);
  CHECK(m.dim_names() == std::vector<MeshDim>{MeshDim::DpShard});
  CHECK(m.expert_dim_names() == std::vector<MeshDim>{MeshDim::Efsdp, MeshDim::Ep});
  CHECK(m.group(MeshDim::Ep) == RankGroup{4, 1});     // ranks 0-3
  CHECK(m.group(MeshDim::Efsdp) == RankGroup{4, 4});  // ranks 0, 4, 8, 12
  CHECK(m.group({MeshDim::Efsdp, MeshDim::Ep}) == RankGroup{16, 1});
  CHECK(m.group(MeshDim::DpShard) == RankGroup{16, 1});
  CHECK_THROWS_AS(m.group({MeshDim::DpShard, MeshDim::Ep}), std::logic_error);
  // HSDP: the replicate dimension is both layouts' outermost.
  const DeviceMesh h = device_mesh(fsdp(16, ShardingStrategy::HybridShard), nullptr, &ep);
  CHECK(h.text() == "(dp_replicate 2, dp_shard 8; experts: efsdp 2, ep 4)");
  CHECK(h.group(MeshDim::DpReplicate) == RankGroup{2, 8});
  CHECK(h.group(MeshDim::Efsdp) == RankGroup{2, 4});
  CHECK(h.expert_dim_names() == std::vector<MeshDim>{MeshDim::DpReplicate, MeshDim::Efsdp, MeshDim::Ep});
  CHECK(device_mesh_error(fsdp(16), nullptr, &ep).empty());
  ep.degree = 3;
  CHECK(device_mesh_error(fsdp(16), nullptr, &ep) ==
        "expert_parallel_degree (3) must divide dp_shard * cp * tp (16) (torchtitan's ParallelDims); the experts' "
        "ranks come from the mesh (dp_shard 16)");
  ep.degree = 32;
  CHECK(device_mesh_error(fsdp(16), nullptr, &ep).find("must divide") != std::string::npos);
}

// torchtitan's dense mesh with cp between dp_shard and tp (parallel_dims.py: (dp_replicate, dp_shard, cp, tp)),
// FSDP over dp_shard x cp flattened ("dp_shard_cp"), the cp group strided by tp.
TEST_CASE("context parallelism: cp between dp_shard and tp, FSDP over both") {
  ContextParallel cp;
  cp.degree = 4;
  const DeviceMesh m = device_mesh(fsdp(16), nullptr, nullptr, &cp);
  CHECK(m.text() == "(dp_shard 4, cp 4)");
  CHECK(m.world_size() == 16);
  CHECK(m.context_parallel());
  CHECK(m.dim_names() == std::vector<MeshDim>{MeshDim::DpShard, MeshDim::Cp});
  CHECK(m.group(MeshDim::Cp) == RankGroup{4, 1});        // ranks 0-3: one node
  CHECK(m.group(MeshDim::DpShard) == RankGroup{4, 4});   // ranks 0, 4, 8, 12
  CHECK(m.fsdp_shard_group() == RankGroup{16, 1});
  CHECK(m.fsdp_shard_size() == 16);
  // With tp inside: cp strides over it; FSDP's group skips the tp ranks.
  TensorParallel tp;
  tp.degree = 2;
  const DeviceMesh t = device_mesh(fsdp(16), &tp, nullptr, &cp);
  CHECK(t.text() == "(dp_shard 2, cp 4, tp 2)");
  CHECK(t.group(MeshDim::Cp) == RankGroup{4, 2});
  CHECK(t.fsdp_shard_group() == RankGroup{8, 2});
  CHECK(device_mesh_error(fsdp(16), &tp, nullptr, &cp).empty());
  // HSDP: the hybrid group holds dp_shard x cp.
  const DeviceMesh h = device_mesh(fsdp(16, ShardingStrategy::HybridShard), nullptr, nullptr, &cp);
  CHECK(h.text() == "(dp_replicate 2, dp_shard 2, cp 4)");
  CHECK(h.fsdp_shard_group() == RankGroup{8, 1});
  // Without cp, FSDP's group is dp_shard's.
  CHECK(device_mesh(fsdp(16)).fsdp_shard_group() == RankGroup{16, 1});
  // EP's ranks come from dp_shard x cp.
  ExpertParallel ep;
  ep.degree = 8;
  const DeviceMesh e = device_mesh(fsdp(16), nullptr, &ep, &cp);
  CHECK(e.size(MeshDim::Efsdp) == 2);
  cp.degree = 3;
  CHECK(device_mesh_error(fsdp(16), nullptr, nullptr, &cp) ==
        "context_parallel.degree (3) must divide the world size (16) (torchtitan's ParallelDims: dp_replicate * "
        "dp_shard * cp * tp == WORLD_SIZE)");
  CHECK(device_mesh_error(fsdp(16, ShardingStrategy::HybridShard), nullptr, nullptr, &cp) ==
        "context_parallel.degree (3) must divide the hybrid shard group (8 ranks, dp_shard x cp) (torchtitan's "
        "ParallelDims: dp_replicate * dp_shard * cp * tp == WORLD_SIZE)");
  cp.degree = 8;
  tp.degree = 4;
  CHECK(device_mesh_error(fsdp(16), &tp, nullptr, &cp).find("cp 8, tp 4") != std::string::npos);
}
