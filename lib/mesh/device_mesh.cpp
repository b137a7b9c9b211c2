#include "mesh/device_mesh.h"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "util/checked.h"

namespace fsdp_plan {
namespace {

constexpr std::array<const char*, kNumMeshDims> kMeshDimNames = {"dp_replicate", "dp_shard", "tp",
                                                                  "efsdp",        "ep",       "cp"};
// The two layouts, outermost first (torchtitan's dense and sparse meshes).
using Layout = std::vector<MeshDim>;
const Layout kDense = {MeshDim::DpReplicate, MeshDim::DpShard, MeshDim::Cp, MeshDim::Tp};
const Layout kSparse = {MeshDim::DpReplicate, MeshDim::Efsdp, MeshDim::Ep};

unsigned mesh_bit(MeshDim dim) { return 1u << static_cast<unsigned>(dim); }

// The layout a group's first dimension belongs to: dp_replicate's is the dense
// one unless an expert dimension follows it.
const Layout& layout_of(std::initializer_list<MeshDim> dims) {
  for (MeshDim d : dims)
    if (d == MeshDim::Efsdp || d == MeshDim::Ep) return kSparse;
  return kDense;
}

// The world size's check and HYBRID_SHARD's (FSDP1: dist.new_subgroups needs
// the node's device count to divide the world size; FSDP2: init_device_mesh's
// (world / g, g) shape).
std::string fsdp_mesh_error(const FsdpSettings& settings) {
  if (settings.world_size < 1 || settings.world_size > kMaxWorldSize)
    return "the world size must be from 1 to " + std::to_string(kMaxWorldSize);
  if (settings.strategy != ShardingStrategy::HybridShard) return "";
  const int64_t g = hybrid_group_size(settings);
  if (g <= settings.world_size && settings.world_size % g == 0) return "";
  std::string divisors;
  int shown = 0;
  for (int64_t d = 1; d <= settings.world_size && shown < 8; ++d)
    if (settings.world_size % d == 0) divisors += (shown++ ? ", " : "") + std::to_string(d);
  return "the hybrid shard group size (" + std::to_string(g) + ") must divide the world size (" +
         std::to_string(settings.world_size) + "): set --shard-group-size (or fsdp.shard_group_size) to the "
         "GPUs per node, one of " + divisors + (shown == 8 ? ", ..." : "");
}

// tensor_parallel's mesh (dp_replicate, dp_shard, tp), as init_device_mesh
// and Accelerate refuse it.
std::string tp_mesh_error(const DeviceMesh& mesh, const FsdpSettings& fsdp) {
  if (!fsdp.v2())
    return "\"tensor_parallel\" composes with FSDP2 (fully_shard on the mesh's dp_shard dimension), not "
           "FullyShardedDataParallel: plan FSDP2 (\"fsdp\": {\"version\": 2} or --fsdp-version 2)";
  if (fsdp.strategy == ShardingStrategy::HybridShard)
    return "with \"tensor_parallel\", the mesh says how FSDP2 replicates: give "
           "\"tensor_parallel.mesh.dp_replicate\" instead of HYBRID_SHARD";
  for (MeshDim d : kDense) {
    const int64_t size = mesh.size(d);
    if (size < 1 || size > kMaxWorldSize)
      return "the mesh's " + std::string(mesh_dim_name(d)) + " size (" + std::to_string(size) +
             ") must be from 1 to " + std::to_string(kMaxWorldSize);
  }
  const int64_t r = mesh.size(MeshDim::DpReplicate), s = mesh.size(MeshDim::DpShard), t = mesh.size(MeshDim::Tp);
  const int64_t c = mesh.size(MeshDim::Cp);
  // Exact, as Python's int: sizes whose product wraps to the world size are no mesh of it.
  const std::optional<int64_t> product = checked_product({r, s, c, t});
  if (!product || *product != fsdp.world_size) {
    const std::string ranks = exact_product_text({r, s, c, t});
    const bool bigger = !product || *product > fsdp.world_size;
    return "the mesh " + mesh.text() + " has " + ranks + " ranks, the world size is " +
           std::to_string(fsdp.world_size) +
           (bigger ? " (init_device_mesh: \"Mesh should not be bigger than default world size " +
                         std::to_string(fsdp.world_size) + ", but found " + ranks + " ranks!\")"
                   : " (ranks outside the mesh would train nothing)") +
           (mesh.context_parallel() ? "; make dp_replicate x dp_shard x cp x tp the world size"
                                    : "; make dp_replicate x dp_shard x tp the world size");
  }
  if (r * s * c == 1)
    return "tp " + std::to_string(t) + " takes every rank: FSDP has no dimension left to shard across "
           "(Accelerate fails with KeyError: \"Invalid mesh_dim_names ('dp_shard_cp',) specified. Valid "
           "mesh_dim_names are ['tp'].\", huggingface/accelerate issue 3798); lower tp or plan without FSDP";
  return "";
}

}  // namespace

const char* mesh_dim_name(MeshDim dim) { return kMeshDimNames[static_cast<size_t>(dim)]; }

std::vector<int64_t> RankGroup::ranks() const {
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(size, 0)));
  for (int64_t i = 0; i < size; ++i) out.push_back(i * stride);
  return out;
}

int64_t RankGroup::nodes(int64_t gpus_per_node) const {
  if (size <= 1) return 1;
  // Ranks 0, stride, 2 stride, ...: the distinct r / gpus_per_node. A stride
  // of a node or more puts every rank on its own node.
  if (stride >= gpus_per_node) return size;
  const int64_t last = (size - 1) * stride;
  if (gpus_per_node % stride == 0) return last / gpus_per_node + 1;  // every node in between holds some
  std::set<int64_t> seen;
  for (int64_t i = 0; i < size; ++i) seen.insert(i * stride / gpus_per_node);
  return static_cast<int64_t>(seen.size());
}

int64_t RankGroup::ranks_per_node(int64_t gpus_per_node) const {
  // Rank 0's node holds ranks 0 .. gpus_per_node - 1: i * stride below it.
  return std::min(size, (gpus_per_node + stride - 1) / stride);
}

static_assert(kNumMeshDims == 6, "DeviceMesh: one size per dimension below, and in sizes_'s initializer");

DeviceMesh::DeviceMesh(std::array<int64_t, 3> dense, std::initializer_list<MeshDim> named)
    : sizes_{dense[0], dense[1], dense[2], 1, 1, 1}, named_(0) {
  for (MeshDim d : named) named_ = static_cast<uint8_t>(named_ | mesh_bit(d));
}

DeviceMesh DeviceMesh::with_context(int64_t cp) const {
  DeviceMesh out = *this;
  out.sizes_[static_cast<size_t>(MeshDim::Cp)] = cp;
  out.named_ = static_cast<uint8_t>(out.named_ | mesh_bit(MeshDim::Cp));
  return out;
}

DeviceMesh DeviceMesh::with_experts(int64_t efsdp, int64_t ep) const {
  DeviceMesh out = *this;
  out.sizes_[static_cast<size_t>(MeshDim::Efsdp)] = efsdp;
  out.sizes_[static_cast<size_t>(MeshDim::Ep)] = ep;
  out.named_ = static_cast<uint8_t>(out.named_ | mesh_bit(MeshDim::Efsdp) | mesh_bit(MeshDim::Ep));
  return out;
}

int64_t DeviceMesh::world_size() const {
  // Held at INT64_MAX rather than wrapped (device_mesh_error refuses such a mesh first).
  int64_t n = 1;
  for (MeshDim d : kDense) n = saturating_mul(n, size(d));
  return n;
}

std::vector<MeshDim> DeviceMesh::dim_names() const {
  std::vector<MeshDim> out;
  for (MeshDim d : kDense)
    if (named(d)) out.push_back(d);
  return out;
}

std::vector<MeshDim> DeviceMesh::expert_dim_names() const {
  std::vector<MeshDim> out;
  if (!expert_parallel()) return out;
  for (MeshDim d : kSparse)
    if (d != MeshDim::DpReplicate || named(d)) out.push_back(d);
  return out;
}

RankGroup DeviceMesh::group(MeshDim dim) const { return group({dim}); }

RankGroup DeviceMesh::group(std::initializer_list<MeshDim> dims) const {
  // Row-major: a dimension's stride is the product of the sizes after it; adjacent
  // dimensions flatten to one group whose stride is the innermost one's.
  if (dims.size() == 0) throw std::logic_error("DeviceMesh::group: no dimension");
  const Layout& layout = layout_of(dims);
  size_t expect = static_cast<size_t>(std::find(layout.begin(), layout.end(), *dims.begin()) - layout.begin());
  RankGroup g{1, 1};
  for (MeshDim d : dims) {
    // A dimension the mesh does not name (size 1: cp without context parallelism) is no gap.
    while (expect < layout.size() && layout[expect] != d && !named(layout[expect]) && size(layout[expect]) == 1)
      ++expect;
    if (expect >= layout.size() || layout[expect++] != d)
      throw std::logic_error("DeviceMesh::group: dimensions must be adjacent, outermost first");
    g.size *= size(d);
  }
  for (size_t k = expect; k < layout.size(); ++k) g.stride *= size(layout[k]);
  return g;
}

std::string DeviceMesh::text() const {
  std::string out = "(";
  for (MeshDim d : dim_names()) {
    if (out.size() > 1) out += ", ";
    out += std::string(mesh_dim_name(d)) + " " + std::to_string(size(d));
  }
  if (expert_parallel())
    out += "; experts: efsdp " + std::to_string(size(MeshDim::Efsdp)) + ", ep " + std::to_string(size(MeshDim::Ep));
  return out + ")";
}

int64_t hybrid_group_size(const FsdpSettings& settings) {
  if (settings.shard_group_size > 0) return settings.shard_group_size;
  // FSDP1 without a process group shards within a node of device_count()
  // ranks and needs it to divide the world size (dist.new_subgroups): assume
  // the largest node of at most 8 devices that does.
  for (int64_t g = std::min<int64_t>(8, settings.world_size); g > 1; --g)
    if (settings.world_size % g == 0) return g;
  return 1;
}

namespace {

// (dp_replicate, dp_shard, tp) without cp: the ranks dp_shard and cp share.
DeviceMesh data_mesh(const FsdpSettings& settings, const TensorParallel* tp, int64_t c) {
  const int64_t world = settings.world_size;
  if (tp) {
    const int64_t r = tp->replicate_size();
    const int64_t s =
        tp->dp_shard > 0 ? tp->dp_shard : std::max<int64_t>(1, world / saturating_mul(tp->degree, saturating_mul(r, c)));
    if (r > 1) return DeviceMesh({r, s, tp->degree}, {MeshDim::DpReplicate, MeshDim::DpShard, MeshDim::Tp});
    return DeviceMesh({r, s, tp->degree}, {MeshDim::DpShard, MeshDim::Tp});
  }
  switch (settings.strategy) {
    case ShardingStrategy::HybridShard: {
      const int64_t g = std::max<int64_t>(1, hybrid_group_size(settings));
      return DeviceMesh({world / g, std::max<int64_t>(1, g / c), 1}, {MeshDim::DpReplicate, MeshDim::DpShard});
    }
    case ShardingStrategy::NoShard: return DeviceMesh({world, 1, 1}, {MeshDim::DpReplicate, MeshDim::DpShard});
    default: return DeviceMesh({1, std::max<int64_t>(1, world / c), 1}, {MeshDim::DpShard});
  }
}

DeviceMesh dense_mesh(const FsdpSettings& settings, const TensorParallel* tp, const ContextParallel* cp) {
  if (!cp) return data_mesh(settings, tp, 1);
  const int64_t c = std::max<int64_t>(1, cp->degree);
  return data_mesh(settings, tp, c).with_context(c);
}

// context_parallel's degree against the ranks tp and dp_replicate (or
// HYBRID_SHARD's group) leave: torchtitan's ParallelDims._validate.
std::string cp_mesh_error(const FsdpSettings& settings, const TensorParallel* tp, const ContextParallel& cp) {
  if (tp) return "";  // tp_mesh_error checks the whole product
  const int64_t ranks = settings.strategy == ShardingStrategy::HybridShard ? hybrid_group_size(settings)
                                                                           : settings.world_size;
  if (ranks % cp.degree == 0) return "";
  const std::string where = settings.strategy == ShardingStrategy::HybridShard
                                ? "the hybrid shard group (" + std::to_string(ranks) + " ranks, dp_shard x cp)"
                                : "the world size (" + std::to_string(ranks) + ")";
  return "context_parallel.degree (" + std::to_string(cp.degree) + ") must divide " + where +
         " (torchtitan's ParallelDims: dp_replicate * dp_shard * cp * tp == WORLD_SIZE)";
}

}  // namespace

DeviceMesh device_mesh(const FsdpSettings& settings, const TensorParallel* tp, const ExpertParallel* ep,
                       const ContextParallel* cp) {
  const DeviceMesh dense = dense_mesh(settings, tp, cp);
  if (!ep) return dense;
  // torchtitan: efsdp = dp_shard * cp * tp // ep, on (dp_replicate, efsdp, ep).
  const int64_t sparse = saturating_mul(dense.fsdp_shard_size(), dense.size(MeshDim::Tp));
  const int64_t efsdp = std::max<int64_t>(1, sparse / std::max<int64_t>(1, ep->degree));
  return dense.with_experts(efsdp, ep->degree);
}

std::string device_mesh_error(const FsdpSettings& settings, const TensorParallel* tp, const ExpertParallel* ep,
                              const ContextParallel* cp) {
  if (std::string why = fsdp_mesh_error(settings); !why.empty()) return why;
  if (cp)
    if (std::string why = cp_mesh_error(settings, tp, *cp); !why.empty()) return why;
  if (tp)
    if (std::string why = tp_mesh_error(dense_mesh(settings, tp, cp), settings); !why.empty()) return why;
  if (!ep) return "";
  const DeviceMesh dense = dense_mesh(settings, tp, cp);
  const int64_t sparse = saturating_mul(dense.fsdp_shard_size(), dense.size(MeshDim::Tp));
  if (ep->degree < 1 || sparse % ep->degree != 0)
    return "expert_parallel_degree (" + std::to_string(ep->degree) + ") must divide dp_shard * cp * tp (" +
           std::to_string(sparse) + ") (torchtitan's ParallelDims); the experts' ranks come from the mesh " +
           dense.text();
  return "";
}

std::string exact_product_text(std::initializer_list<int64_t> sizes) {
  if (std::optional<int64_t> n = checked_product(sizes)) return std::to_string(*n);
  // Past int64: base-10^9 limbs, least significant first (the sizes are positive here).
  std::vector<uint64_t> limbs{1};
  bool negative = false;
  for (int64_t s : sizes) {
    negative ^= s < 0;
    const uint64_t m = s < 0 ? 0 - static_cast<uint64_t>(s) : static_cast<uint64_t>(s);
    // A limb (< 10^9) times m (< 2^64) would not fit: multiply by m's base-10^9 digits.
    std::vector<uint64_t> digits;
    for (uint64_t x = m; x > 0; x /= 1000000000u) digits.push_back(x % 1000000000u);
    std::vector<uint64_t> out(limbs.size() + digits.size() + 1, 0);
    for (size_t i = 0; i < limbs.size(); ++i) {
      uint64_t carry = 0;
      for (size_t j = 0; j < digits.size(); ++j) {
        const uint64_t cur = out[i + j] + limbs[i] * digits[j] + carry;
        out[i + j] = cur % 1000000000u;
        carry = cur / 1000000000u;
      }
      for (size_t k = i + digits.size(); carry > 0; ++k) {
        const uint64_t cur = out[k] + carry;
        out[k] = cur % 1000000000u;
        carry = cur / 1000000000u;
      }
    }
    while (out.size() > 1 && out.back() == 0) out.pop_back();
    limbs = std::move(out);
  }
  std::string text = std::to_string(limbs.back());
  for (size_t i = limbs.size() - 1; i-- > 0;) {
    const std::string part = std::to_string(limbs[i]);
    text += std::string(9 - part.size(), '0') + part;
  }
  return (negative && text != "0" ? "-" : "") + text;
}

}  // namespace fsdp_plan
