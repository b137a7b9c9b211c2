// A small model for the fuzzers that read a file about a model (--flops, a
// policy's tensor_parallel and activation_checkpointing sections): two blocks
// of attention and MLP Linears and a norm, as a module tree JSON.
#pragma once

#include <string>

#include "model/loaders/tree_loader.h"

namespace fsdp_plan::fuzz {

inline const ModuleTree& fuzz_tree() {
  static const ModuleTree tree = [] {
    auto linear = [](const std::string& path, int t, int rows, int cols) {
      return "{\"path\": \"" + path + "\", \"type\": \"torch.nn.modules.linear.Linear\", \"params\": [" +
             "{\"name\": \"weight\", \"tensor\": " + std::to_string(t) + ", \"shape\": [" + std::to_string(rows) +
             ", " + std::to_string(cols) + "], \"dtype\": \"float32\", \"itemsize\": 4, \"requires_grad\": true}" +
             "], \"buffers\": []}";
    };
    auto plain = [](const std::string& path, const std::string& type) {
      return "{\"path\": \"" + path + "\", \"type\": \"" + type + "\", \"params\": [], \"buffers\": []}";
    };
    std::string modules = plain("", "Net") + ", " + plain("blocks", "torch.nn.modules.container.ModuleList");
    int t = 0;
    for (int b = 0; b < 2; ++b) {
      const std::string p = "blocks." + std::to_string(b);
      modules += ", " + plain(p, "Block") + ", " + plain(p + ".attn", "Attention");
      for (const char* proj : {"q", "k", "v", "o"}) modules += ", " + linear(p + ".attn." + proj, t++, 8, 8);
      modules += ", " + plain(p + ".mlp", "MLP");
      modules += ", " + linear(p + ".mlp.fc1", t++, 32, 8);
      modules += ", " + linear(p + ".mlp.fc2", t++, 8, 32);
    }
    modules += ", " + linear("head", t++, 64, 8);
    return parse_tree_json("{\"tree_format\": 1, \"modules\": [" + modules + "], \"num_tensors\": " +
                               std::to_string(t) + "}",
                           "fuzz.tree.json");
  }();
  return tree;
}

}  // namespace fsdp_plan::fuzz
