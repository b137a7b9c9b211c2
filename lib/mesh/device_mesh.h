// The device mesh: every parallelism dimension of a plan, their sizes, and
// the process groups they make, built once from the settings and validated
// there. FSDP1, FSDP2, tensor parallelism, communication and time ask it for
// their groups instead of deriving sizes, strides and node placement again.
//
// Modelled on torch's DeviceMesh / init_device_mesh (torch/distributed/
// device_mesh.py: ranks laid out row-major over the mesh shape, the last
// dimension innermost) and torchtitan's ParallelDims (torchtitan/distributed/
// parallel_dims.py: one object names every dimension, (dp_replicate,
// dp_shard, cp, tp) outermost first).
//
// The dimensions and where they come from:
// - dp_replicate, dp_shard, tp: FSDP's strategy and the tensor_parallel section.
// - cp (context parallelism): between dp_shard and tp (torchtitan's order);
//   FSDP shards over dp_shard x cp (torchtitan's flattened "dp_shard_cp"),
//   which is adjacent, so one stride still describes it: fsdp_shard_group().
// - ep with its efsdp: torchtitan's second factorization of the same
//   ranks, the sparse mesh (dp_replicate, efsdp, ep) with efsdp x ep ==
//   dp_shard x cp x tp. MeshDim::Efsdp and MeshDim::Ep are a second layout
//   that size() and group() read with the same row-major rule; the world is
//   the dense layout's product.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "policy/context_parallel.h"
#include "policy/expert_parallel.h"
#include "policy/settings.h"
#include "policy/tensor_parallel.h"

namespace fsdp_plan {

// The dimensions, outermost first: a rank's coordinate on the last one
// changes fastest (init_device_mesh's row-major layout). Two layouts of the
// same ranks: the dense one (dp_replicate, dp_shard, tp) every parameter but
// the routed experts' lives on, (dp_replicate, dp_shard, cp, tp), and with
// expert parallelism the sparse one (dp_replicate, efsdp, ep) (torchtitan's
// ParallelDims.build_mesh). The enum's order is not the layout's.
enum class MeshDim : uint8_t { DpReplicate, DpShard, Tp, Efsdp, Ep, Cp };
constexpr size_t kNumMeshDims = 6;
// "dp_replicate", "dp_shard", "tp", "efsdp", "ep", "cp": torchtitan's (and Accelerate's) mesh_dim_names.
const char* mesh_dim_name(MeshDim dim);

// A process group as rank 0 sees it: `size` ranks, rank 0 first, `stride`
// apart (a mesh dimension's group, or adjacent dimensions' flattened). The
// value a collective carries (plan/comm.h); DeviceMesh::group makes it.
struct RankGroup {
  int64_t size = 1;
  int64_t stride = 1;
  bool operator==(const RankGroup& o) const { return size == o.size && stride == o.stride; }
  bool operator<(const RankGroup& o) const { return size != o.size ? size < o.size : stride < o.stride; }
  // Rank 0's group: 0, stride, 2 stride, ... (DeviceMesh's rank 0 coordinate slice).
  std::vector<int64_t> ranks() const;
  // How many nodes of `gpus_per_node` the group's ranks lie on (rank r on node
  // r / gpus_per_node, torchrun's contiguous placement).
  int64_t nodes(int64_t gpus_per_node) const;
  // How many of its ranks share rank 0's node.
  int64_t ranks_per_node(int64_t gpus_per_node) const;
  bool intra_node(int64_t gpus_per_node) const { return nodes(gpus_per_node) == 1; }
};

class DeviceMesh {
 public:
  DeviceMesh() = default;  // one rank, FSDP's (dp_shard) mesh
  // The dense layout's sizes (dp_replicate, dp_shard, tp); `named`: the
  // dimensions init_device_mesh gets (mesh_dim_names), others are size 1 and
  // left out of dim_names(). No expert dimensions (efsdp and ep of size 1).
  DeviceMesh(std::array<int64_t, 3> dense, std::initializer_list<MeshDim> named);
  // This mesh with the sparse layout (dp_replicate, efsdp, ep) named too.
  DeviceMesh with_experts(int64_t efsdp, int64_t ep) const;
  // This mesh with a cp dimension of `cp` ranks named between dp_shard and tp.
  DeviceMesh with_context(int64_t cp) const;

  int64_t size(MeshDim dim) const { return sizes_[static_cast<size_t>(dim)]; }
  // The dense layout's product, saturated (util/checked.h), never wrapped.
  int64_t world_size() const;
  bool named(MeshDim dim) const { return (named_ >> static_cast<unsigned>(dim)) & 1u; }
  // The dense layout's named dimensions, outermost first: init_device_mesh's mesh_dim_names.
  std::vector<MeshDim> dim_names() const;
  // With expert parallelism: the sparse layout, (dp_replicate,) efsdp, ep.
  bool expert_parallel() const { return named(MeshDim::Ep); }
  bool context_parallel() const { return named(MeshDim::Cp); }
  // The ranks fully_shard shards a dense parameter over: dp_shard x cp
  // (torchtitan's "dp_shard_cp"; dp_shard alone without cp).
  RankGroup fsdp_shard_group() const { return group({MeshDim::DpShard, MeshDim::Cp}); }
  int64_t fsdp_shard_size() const { return fsdp_shard_group().size; }
  std::vector<MeshDim> expert_dim_names() const;
  // Rank 0's group along one dimension: mesh[dim].get_group(). Its stride is
  // the product of the sizes inside it.
  RankGroup group(MeshDim dim) const;
  // Rank 0's group over adjacent dimensions of one layout flattened, outermost
  // first (mesh["dp_replicate", "dp_shard"]._flatten()); std::logic_error if
  // the dimensions are not adjacent and in order (no one stride describes them); an unnamed dimension of
  // size 1 between two is no gap.
  RankGroup group(std::initializer_list<MeshDim> dims) const;
  // "(dp_replicate 2, dp_shard 4, cp 2, tp 2)": the named dimensions and sizes; with
  // expert parallelism "(dp_shard 8; experts: efsdp 2, ep 4)".
  std::string text() const;
  bool operator==(const DeviceMesh& o) const { return sizes_ == o.sizes_ && named_ == o.named_; }

 private:
  std::array<int64_t, kNumMeshDims> sizes_{1, 1, 1, 1, 1, 1};  // every dimension: kNumMeshDims ones
  uint8_t named_ = 1u << static_cast<unsigned>(MeshDim::DpShard);
};

// HYBRID_SHARD's shard group: as set, or one node: the largest divisor of the
// world size up to 8 (FSDP1 uses the node's device count, which must divide it).
int64_t hybrid_group_size(const FsdpSettings& settings);

// The mesh these settings describe (nothing is checked: device_mesh_error says
// whether the engines would build it). Without tensor parallelism, FSDP's:
// (dp_shard world) for FULL_SHARD and SHARD_GRAD_OP, (world / g, g) for
// HYBRID_SHARD (FSDP2's 2-D mesh; FSDP1's intra- and inter-node groups,
// torch/distributed/fsdp/_init_utils.py _init_intra_and_inter_node_groups),
// (dp_replicate world) for NO_SHARD (one all-reduce over every rank). With
// `tp`, its (dp_replicate, dp_shard, tp), dp_shard the rest when not given.
// With `cp`, a cp dimension of its degree, dp_shard what is left. With `ep`,
// the sparse layout too: ep its degree, efsdp the rest of dp_shard x cp x tp
// (rounded down where ep does not divide it: device_mesh_error refuses that).
// Cheap (a few integer operations): suggest builds one per estimate.
DeviceMesh device_mesh(const FsdpSettings& settings, const TensorParallel* tp = nullptr,
                       const ExpertParallel* ep = nullptr, const ContextParallel* cp = nullptr);

// Why the engines would not build that mesh, in their words, or "": the world
// size out of range, a hybrid shard group that does not divide it, then with
// `tp`: FSDP1, HYBRID_SHARD, a size out of range, sizes whose product
// (exact: past 2^63 it is refused, never wrapped) is not the world size, no
// dimension left for FSDP; with `cp`, a degree that does not divide the
// ranks left by tp and dp_replicate (or HYBRID_SHARD's group); with `ep`, a
// degree that does not divide dp_shard x cp x tp (torchtitan's
// ParallelDims._validate).
std::string device_mesh_error(const FsdpSettings& settings, const TensorParallel* tp = nullptr,
                              const ExpertParallel* ep = nullptr, const ContextParallel* cp = nullptr);

// The exact product of mesh sizes in decimal however large: Python's int, as
// Accelerate and torch compute a mesh's size (util/checked.h's
// checked_product says whether it fits in int64).
std::string exact_product_text(std::initializer_list<int64_t> sizes);

}  // namespace fsdp_plan
