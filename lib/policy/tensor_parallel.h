// The policy's "tensor_parallel" section: FSDP2 on a 2-D (dp_shard, tp) or
// 3-D (dp_replicate, dp_shard, tp) device mesh, with parallelize_module's plan
// on the "tp" dimension (torch/distributed/tensor/parallel/api.py:
// parallelize_module; the styles of torch/distributed/tensor/parallel/style.py).
// docs/tensor-parallel.md describes it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "policy/settings.h"

namespace fsdp_plan {

// The ParallelStyles a plan entry names. Replicate is Hugging Face's
// ReplicateParallel: every parameter a Replicate() DTensor on the tp mesh.
// The last five are transformers' own (transformers/distributed/
// tensor_parallel.py: EmbeddingParallel(shard_dim=0), PackedColwiseParallel,
// PackedRowwiseParallel, MoeExpertsParallel, ReplicatedWithGradAllReduce):
// only a model's recorded plan ("plan": "model") has them, applied as
// transformers applies it (TensorParallel::from_model).
enum class TpStyle {
  Colwise,
  Rowwise,
  SequenceParallel,
  Replicate,
  PrepareModuleInput,
  PrepareModuleOutput,
  EmbeddingRowwise,
  PackedColwise,
  PackedRowwise,
  MoeExperts,
  GradAllReduce,
};
const NameTable<TpStyle>& tp_style_names();  // colwise, rowwise, sequence_parallel, replicate, ...
// transformers' styles, which parallelize_module does not have.
bool transformers_only_style(TpStyle s);
// Styles that split a Linear's (or an Embedding's) output features, and those
// that split its input features with a Partial output: torch's and
// transformers' colwise / rowwise alike (embedding_rowwise is rowwise).
inline bool colwise_like(TpStyle s) { return s == TpStyle::Colwise; }
inline bool rowwise_like(TpStyle s) { return s == TpStyle::Rowwise || s == TpStyle::EmbeddingRowwise; }

// One plan entry's style and the layouts its constructor takes, as written
// ("replicate", "shard(1)"): they move activations, not parameters, so the
// plan keeps them for the code it writes and the activation model.
struct TpStyleSpec {
  TpStyle style = TpStyle::Colwise;
  std::optional<std::string> input_layouts, output_layouts;  // colwise / rowwise
  std::optional<bool> use_local_output;
  std::optional<int64_t> sequence_dim;  // sequence_parallel only
  // prepare_module_input / _output: one layout per positional input (output),
  // nullopt where torch's tuple has None, and the layouts to redistribute to.
  using Layouts = std::vector<std::optional<std::string>>;
  Layouts prepare_layouts, prepare_desired;
  bool operator==(const TpStyleSpec& o) const {
    return style == o.style && input_layouts == o.input_layouts && output_layouts == o.output_layouts &&
           use_local_output == o.use_local_output && sequence_dim == o.sequence_dim &&
           prepare_layouts == o.prepare_layouts && prepare_desired == o.prepare_desired;
  }
};

struct TensorParallel {
  int64_t degree = 1;  // the "tp" mesh dimension
  // Module-path patterns to styles, in the order written: parallelize_module
  // applies a dict's entries in order, each key matched token by token with
  // fnmatch against child names.
  std::vector<std::pair<std::string, TpStyleSpec>> plan;
  // "plan": "model": the model file's recorded plan (tp/model_plan.h fills
  // `plan`), applied as transformers applies it in from_pretrained with a
  // DistributedConfig (transformers/distributed/mixin.py: the plan expanded to
  // modules and parameters, then tensor_parallel.py: apply_tensor_parallelism),
  // not by parallelize_module: a key may name a parameter, and the styles are
  // transformers' classes.
  bool from_model = false;
  // The FSDP dimensions; 0: not given (dp_replicate 1, dp_shard the rest).
  int64_t dp_replicate = 0, dp_shard = 0;
  // The section's sizes with those defaults filled in (mesh/device_mesh.h builds the mesh from them).
  int64_t replicate_size() const { return dp_replicate > 0 ? dp_replicate : 1; }
  int64_t shard_size(int64_t world_size) const {
    return dp_shard > 0 ? dp_shard : std::max<int64_t>(1, world_size / (degree * replicate_size()));
  }
};

// Parses the "tensor_parallel" object; throws InputError naming `file`.
TensorParallel parse_tensor_parallel(const nlohmann::json& v, const std::string& file);
// The section as written (policy_file_json) and with defaults filled in at
// `world_size` (policy_to_json): the same keys, the mesh's sizes resolved.
nlohmann::ordered_json tensor_parallel_file_json(const TensorParallel& tp);
nlohmann::ordered_json tensor_parallel_to_json(const TensorParallel& tp, int64_t world_size);
// A style as parallelize_module's plan writes it: "ColwiseParallel(output_layouts=Replicate())".
std::string tp_style_python(const TpStyleSpec& spec);

}  // namespace fsdp_plan
