// The walk's state that its stages share (walk.cpp; compiled_call.cpp reads
// and rewrites a compiled call's saves in it): the storages, each tensor's
// metadata and each node's saves.
#pragma once

#include <cstdint>
#include <vector>

#include "activations/saved_ops.h"
#include "activations/walk.h"
#include "activations/walk_rules.h"

namespace fsdp_plan {

enum class StorageKind : uint8_t { Activation, Param, Input };

struct Storage {
  int64_t bytes = 0;
  StorageKind kind = StorageKind::Activation;
  int32_t created = -1;      // node that made it (-1: before the first node)
  int32_t last_use = -1;     // last node reading it in the forward
  int32_t first_saver = -1;  // first node saving it (-1: not saved)
  ModuleId saved_module = -1;
  bool saved_outside = false;  // saved by a node outside every checkpointed call
  int32_t region_input = -1;   // the checkpointed call it is an input of (kept), -1: none
  bool output = false;         // a graph output
  int64_t mask_bytes = 0;      // dropout's noise: its bytes as the traced graph's bool mask
  bool loss = false;
  int owner = -1;              // a parameter's unit (WalkOptions::unit_of_param), -1: none known
  int32_t cached_in = -1;      // selective checkpointing: the call whose cache holds it, -1: none
};

struct WalkState {
  std::vector<OpTensor> meta;                    // per tensor (storage -1: none)
  std::vector<Storage> storages;
  std::vector<std::vector<int32_t>> node_saves;  // per node: the storages it saves
  std::vector<int32_t> node_storages;            // per node: the first storage it made (and, last, the end)
  std::vector<bool> node_view;                   // per node: its outputs alias an input
  std::vector<const char*> node_case;            // per node: the op table's case it took (nullptr: none)
  std::vector<bool> restrided;                   // per tensor: strides the walk corrected (a kernel's layout)
  std::vector<int32_t> recomputed;               // nodes a compiled call's backward runs again (ascending runs)

  int32_t new_storage(int64_t bytes, StorageKind kind, int32_t created) {
    Storage s;
    s.bytes = bytes;
    s.kind = kind;
    s.created = created;
    s.last_use = created;
    storages.push_back(s);
    return static_cast<int32_t>(storages.size()) - 1;
  }
  bool valid(int32_t t) const {
    return t >= 0 && static_cast<size_t>(t) < meta.size() && meta[static_cast<size_t>(t)].storage >= 0;
  }
  int64_t tensor_bytes(int32_t t) const {
    const OpTensor& m = meta[static_cast<size_t>(t)];
    return m.numel() * (m.dtype ? m.dtype->itemsize : 4);
  }
};

}  // namespace fsdp_plan
