#include "tp/placements.h"

#include <algorithm>

#include "model/class_names.h"
#include "plan/memory.h"
#include "util/strings.h"

namespace fsdp_plan {
namespace {

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i)
    if (i == s.size() || s[i] == '.') {
      out.push_back(s.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

// Python's fnmatch on [..] classes: "[abc]", "[a-z]", "[!x]"; returns the
// index past the class, or npos for an unclosed "[" (then a literal "[").
size_t match_class(const std::string& p, size_t i, char c, bool& matched) {
  size_t j = i + 1;
  bool negate = false;
  if (j < p.size() && p[j] == '!') negate = true, ++j;
  size_t first = j;
  bool hit = false;
  for (; j < p.size() && (p[j] != ']' || j == first); ++j) {
    if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
      hit = hit || (p[j] <= c && c <= p[j + 2]);
      j += 2;
    } else {
      hit = hit || p[j] == c;
    }
  }
  if (j >= p.size()) return std::string::npos;
  matched = hit != negate;
  return j + 1;
}

// One atom of a pattern (not `*`) against one character: `?`, a class, or
// itself; `next` gets the index past the atom.
bool atom_matches(const std::string& p, size_t pi, char c, size_t& next) {
  if (p[pi] == '?') {
    next = pi + 1;
    return true;
  }
  if (p[pi] == '[') {
    bool matched = false;
    const size_t past = match_class(p, pi, c, matched);
    if (past != std::string::npos) {
      next = past;
      return matched;
    }
  }
  next = pi + 1;
  return p[pi] == c;
}

// Python's fnmatch.fnmatchcase over a whole name, without backtracking
// search: every atom but `*` takes one character, so on a mismatch only the
// last `*` need take one character more (the earlier ones' choices cannot
// help). O(pattern x name) at worst, where the recursion it replaces was
// exponential in the stars (issue 39: 60 `*` and an `X` took 56 s).
bool fnmatch_linear(const std::string& p, const std::string& s) {
  size_t pi = 0, si = 0;
  size_t star_p = std::string::npos, star_s = 0;  // past the last `*`, and where its run ends
  while (si < s.size()) {
    size_t next = 0;
    if (pi < p.size() && p[pi] == '*') {
      star_p = ++pi;
      star_s = si;
    } else if (pi < p.size() && atom_matches(p, pi, s[si], next)) {
      pi = next;
      ++si;
    } else if (star_p != std::string::npos) {
      pi = star_p;
      si = ++star_s;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

bool is_a(const ModuleTree& tree, ModuleId m, const char* cls) {
  for (const auto& c : class_lineage(demangle(tree.module(m).type_name)))
    if (c == cls) return true;
  return false;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::vector<std::string> dims;
  for (int64_t d : shape) dims.push_back(std::to_string(d));
  return "[" + join(dims) + "]";
}

const char* style_class(TpStyle s) {
  return s == TpStyle::Colwise ? "ColwiseParallel" : "RowwiseParallel";
}

}  // namespace

bool fnmatch_token(const std::string& pattern, const std::string& name) { return fnmatch_linear(pattern, name); }

// A plan that shards the sequence (a sequence_parallel module, a rowwise
// output or a colwise / prepare_module_input input on shard(...)) on a model
// whose rotary embeddings are computed once, outside the layers (Hugging
// Face's LlamaRotaryEmbedding at model.rotary_emb): the layers get cos / sin
// for the whole sequence beside a sequence-sharded residual, and torch's first
// forward fails (docs/tensor-parallel.md, "Not modelled yet"; tests/
// tensor_parallel/tp_reference.py, llama_titan_4x2). The plan's figures would
// be for a step that cannot run: refused.
void tp_sequence_rotary_check(const ModuleTree& tree, const TensorParallel& tp, int64_t T,
                              std::vector<Warning>& warnings) {
  if (T <= 1 || tp.from_model) return;
  auto shard = [](const std::optional<std::string>& l) { return l && l->rfind("shard", 0) == 0; };
  std::string key;
  for (const auto& [pattern, spec] : tp.plan) {
    bool seq = spec.style == TpStyle::SequenceParallel || (rowwise_like(spec.style) && shard(spec.output_layouts)) ||
               (colwise_like(spec.style) && shard(spec.input_layouts));
    for (const auto& l : spec.prepare_layouts) seq = seq || (spec.style == TpStyle::PrepareModuleInput && shard(l));
    if (seq && key.empty()) key = pattern;
  }
  if (key.empty()) return;
  for (ModuleId m = 0; m < static_cast<ModuleId>(tree.num_modules()); ++m) {
    const std::string cls = bare_class(tree, m);
    const std::string path = tree.path(m);
    const std::string suffix = "RotaryEmbedding";
    if (cls.size() < suffix.size() || cls.compare(cls.size() - suffix.size(), suffix.size(), suffix) != 0) continue;
    bool in_layer = false;  // a numbered ancestor: computed in each layer, from its own input
    for (size_t b = 0, e; b <= path.size(); b = e + 1) {
      e = path.find('.', b);
      if (e == std::string::npos) e = path.size();
      in_layer = in_layer || (e > b && path.find_first_not_of("0123456789", b) >= e);
    }
    if (in_layer) continue;
    warnings.push_back(make_warning(
        "tp_sequence_rotary",
        "'" + key + "' shards the sequence, but " + path + " (" + cls +
            ") computes the rotary embeddings once for the whole sequence, outside the layers: each layer gets cos / "
            "sin for every position beside a sequence-sharded residual, and torch's first forward fails (torch 2.13, "
            "torchtitan's plan on Hugging Face's Llama at tp 2: RuntimeError: The size of tensor a (16) must match "
            "the size of tensor b (8) at non-singleton dimension 2); the plan's figures would be for a step that "
            "cannot run; fix: tensor parallelism without sequence parallelism (no sequence_parallel, no shard(1) "
            "layouts), e.g. the model's own plan (\"plan\": \"model\")"));
    return;
  }
}

// Where the file records the attention's head counts (fsdp-plan-export's
// "tp_model"): a colwise key projection must keep whole key-value heads, as
// transformers checks (transformers/distributed/tensor_parallel.py:
// get_kv_heads_per_rank: a "k_proj" / "qkv_proj" / "query_key_value" key
// planned colwise needs num_key_value_heads % tp == 0). Parameter shapes
// cannot show it: tp 4 splits 2 heads of 8 rows into 4 chunks of 4 rows.
void tp_heads_check(const ModuleTree& tree, const TensorParallel& tp, int64_t T, std::vector<Warning>& warnings) {
  const ModelRecord* r = tree.record();
  if (!r || r->num_key_value_heads < 1 || T <= 1) return;
  std::string key;
  for (const auto& [pattern, spec] : tp.plan) {
    const std::string last = pattern.substr(pattern.rfind('.') + 1);
    if (spec.style == TpStyle::Colwise && (last == "k_proj" || last == "qkv_proj" || last == "query_key_value"))
      key = pattern;
  }
  if (key.empty()) return;
  const int64_t kv = r->num_key_value_heads, heads = r->num_attention_heads;
  if (kv % T == 0 && (heads < 1 || heads % T == 0)) return;
  const bool kv_fails = kv % T != 0;
  warnings.push_back(make_warning(
      "tp_uneven_split",
      "tp " + std::to_string(T) + " does not divide the model's " +
          (kv_fails ? std::to_string(kv) + " key-value heads" : std::to_string(heads) + " attention heads") +
          " (" + r->source + ", head_dim " + std::to_string(r->head_dim) + "), and '" + key +
          "' is planned colwise: each tp rank would hold part of a head, and the first forward fails (torch 2.13 "
          "with tp 4 over a Llama's 2 key-value heads of 8: RuntimeError: shape '[1, 4, -1, 8]' is invalid for "
          "input of size 16; huggingface/transformers issue 48307, pytorch/torchtitan issue 2574); fix: a tp that "
          "divides " + std::to_string(kv_fails ? kv : heads)));
}


TensorParallelPlan untouched_tp_plan(const ModuleTree& tree, const DeviceMesh& mesh) {
  TensorParallelPlan out;
  out.mesh = mesh;
  out.placement.assign(tree.num_tensors(), TpPlacement{});
  out.local_shape.resize(tree.num_tensors());
  for (TensorId t = 0; t < static_cast<TensorId>(tree.num_tensors()); ++t)
    out.local_shape[static_cast<size_t>(t)] = tree.tensor(t).shape;
  return out;
}

TensorParallelPlan plan_tensor_parallel(const ModuleTree& tree, const TensorParallel& tp, const DeviceMesh& mesh,
                                        std::vector<Warning>& warnings) {
  if (tp.from_model) return plan_transformers_tensor_parallel(tree, tp, mesh, warnings);
  TensorParallelPlan out = untouched_tp_plan(tree, mesh);
  const int64_t T = mesh.size(MeshDim::Tp);
  // distribute_module refuses a module it has seen (torch/distributed/tensor/_api.py: distribute_module).
  std::vector<int> styled(tree.num_modules(), -1);
  for (int e = 0; e < static_cast<int>(tp.plan.size()); ++e) {
    const auto& [pattern, spec] = tp.plan[static_cast<size_t>(e)];
    // One tp_uneven_split per plan key: its first parameter, and how many more.
    std::string uneven;
    int64_t uneven_count = 0;
    // parallelize_module: level by level, each token fnmatch'ed against child names.
    std::vector<ModuleId> frontier{0};
    if (!pattern.empty()) {
      const std::vector<std::string> tokens = split_dots(pattern);
      for (size_t i = 0; i < tokens.size() && !frontier.empty(); ++i) {
        std::vector<ModuleId> next;
        for (ModuleId m : frontier)
          for (ModuleId c : tree.module(m).children)
            if (fnmatch_token(tokens[i], tree.module(c).name)) next.push_back(c);
        if (next.empty()) {
          std::vector<std::string> rest(tokens.begin() + static_cast<long>(i), tokens.end());
          warnings.push_back(make_warning(
              "tp_unmatched_pattern",
              "the tensor_parallel plan key '" + pattern + "' matches no module: parallelize_module warns "
              "\"Parallelize plan key '" + join(rest, ".") + "' could not be resolved: no submodule matching "
              "token '" + tokens[i] + "' ... skipping this plan entry\" and leaves those parameters whole on "
              "every tp rank; fix: write the key as the module paths are (\"" +
              (frontier.front() == 0 ? std::string("(root)") : tree.path(frontier.front())) +
              "\" has children " + [&] {
                std::vector<std::string> names;
                for (ModuleId c : tree.module(frontier.front()).children) names.push_back(tree.module(c).name);
                if (names.size() > 6) names.resize(6), names.push_back("...");
                return join(names);
              }() + ")"));
          frontier.clear();
        }
        frontier = std::move(next);
      }
    }
    for (ModuleId m : frontier) {
      const std::string where = "'" + (m == 0 ? std::string("(root)") : tree.path(m)) + "'";
      const TpStyle style = spec.style;
      if (style == TpStyle::PrepareModuleInput || style == TpStyle::PrepareModuleOutput) {
        out.modules.push_back({m, e});
        continue;  // hooks on activations only (PrepareModuleInput/Output register no parameters)
      }
      if (styled[static_cast<size_t>(m)] >= 0) {
        warnings.push_back(make_warning(
            "tp_applied_twice",
            "module " + where + " is matched by the tensor_parallel plan keys '" +
                tp.plan[static_cast<size_t>(styled[static_cast<size_t>(m)])].first + "' and '" + pattern +
                "': parallelize_module fails with RuntimeError: \"distribute_module should only be called once on "
                "a module, but it has already been called on this module!\"; fix: let one key match it"));
        continue;
      }
      styled[static_cast<size_t>(m)] = e;
      out.modules.push_back({m, e});
      const Module& mod = tree.module(m);
      if (style == TpStyle::Colwise || style == TpStyle::Rowwise) {
        const bool linear = is_a(tree, m, "torch.nn.modules.linear.Linear");
        const bool embedding = is_a(tree, m, "torch.nn.modules.sparse.Embedding");
        if (!linear && !embedding) {
          warnings.push_back(make_warning(
              "tp_style_class",
              "module " + where + " (" + bare_class(tree, m) + ") is planned " + tp_style_names().name(style) +
                  ": parallelize_module fails with NotImplementedError: \"" + style_class(style) +
                  " currently only support nn.Linear and nn.Embedding!\"; fix: plan its Linear children, or "
                  "sequence_parallel / replicate for a norm"));
          continue;
        }
        // style.py: ColwiseParallel shards Linear's weight and bias on dim 0 and
        // Embedding's weight on dim 1; RowwiseParallel shards Linear's weight on
        // dim 1 (its bias is replicated) and Embedding's weight on dim 0.
        for (const auto& slot : mod.params) {
          TpPlacement p;
          const bool bias = linear && slot.name == "bias";
          if (style == TpStyle::Rowwise && linear && slot.name != "weight" && !bias) continue;  // only weight, bias
          if (style == TpStyle::Rowwise && bias) {
            p.kind = TpPlacement::Kind::Replicate;
          } else {
            p.kind = TpPlacement::Kind::Shard;
            p.dim = style == TpStyle::Colwise ? (embedding ? 1 : 0) : (embedding ? 0 : 1);
          }
          const auto& shape = tree.tensor(slot.tensor).shape;
          const std::string pname = "'" + tree.qualify(m, slot.name) + "'";
          if (p.kind == TpPlacement::Kind::Shard) {
            if (static_cast<int>(shape.size()) <= p.dim) {
              warnings.push_back(make_warning(
                  "tp_style_class", "parameter " + pname + " has shape " + shape_text(shape) + ": " +
                                        style_class(style) + " shards it on dim " + std::to_string(p.dim) +
                                        ", which it does not have"));
              continue;
            }
            const int64_t n = shape[static_cast<size_t>(p.dim)];
            if (n % T != 0) {
              if (uneven.empty())
                uneven = "parameter " + pname + " " + shape_text(shape) + " is split on dim " + std::to_string(p.dim) +
                         " (" + std::to_string(n) + ") by tp " + std::to_string(T) + ", which does not divide it";
              ++uneven_count;
            }
          }
          out.placement[static_cast<size_t>(slot.tensor)] = p;
          if (p.kind == TpPlacement::Kind::Shard)
            out.local_shape[static_cast<size_t>(slot.tensor)][static_cast<size_t>(p.dim)] =
                ceil_div(shape[static_cast<size_t>(p.dim)], T);
        }
        continue;
      }
      // SequenceParallel and transformers' ReplicateParallel: every parameter a
      // Replicate() DTensor. SequenceParallel re-registers module.named_parameters()
      // under their dotted names, which nn.Module refuses for a nested one.
      if (style == TpStyle::SequenceParallel) {
        bool nested = false;
        for (ModuleId c : tree.preorder(m))
          if (c != m && !tree.module(c).params.empty()) nested = true;
        if (nested) {
          warnings.push_back(make_warning(
              "tp_style_class", "module " + where + " (" + bare_class(tree, m) + ") is planned sequence_parallel, "
                                "but its children hold parameters: parallelize_module fails with KeyError: "
                                "'parameter name can\\'t contain \".\"'; fix: plan its norms, not the module above them"));
          continue;
        }
      }
      for (ModuleId c : tree.preorder(m))
        for (const auto& slot : tree.module(c).params)
          out.placement[static_cast<size_t>(slot.tensor)] = TpPlacement{TpPlacement::Kind::Replicate, 0};
    }
    if (uneven_count > 0)
      warnings.push_back(make_warning(
          "tp_uneven_split",
          uneven + (uneven_count > 1 ? " (and " + std::to_string(uneven_count - 1) + " more under '" + pattern + "')" : "") +
              ": DTensor splits it like torch.chunk (ranks hold different sizes), and an attention projection's "
              "heads no longer fit (torch 2.13 with tp 3 over 4 heads: RuntimeError: shape '[1, 4, -1, 8]' is "
              "invalid for input of size 44, in the first forward); fix: a tp that divides the heads, the "
              "key-value heads, the FFN width and the vocabulary"));
  }
  tp_heads_check(tree, tp, T, warnings);
  tp_sequence_rotary_check(tree, tp, T, warnings);
  return out;
}

Fsdp2TpParam fsdp2_tp_param(const TensorParallelPlan& plan, const ModuleTree& tree, TensorId t) {
  (void)tree;
  Fsdp2TpParam out;
  const TpPlacement& p = plan.placement[static_cast<size_t>(t)];
  const bool hsdp = plan.mesh.size(MeshDim::DpReplicate) > 1;
  if (hsdp) out.placements.push_back("Replicate()"), out.mesh_dims.push_back("dp_replicate");
  out.mesh_dims.push_back("dp_shard");
  // _fsdp_param.py: FSDPParam._init_sharding_spec_tp: FSDP's Shard(0) on the dp
  // dimension, _StridedShard(0, split_factor=tp) when TP already shards dim 0,
  // then the parameter's own placement on tp. A plain parameter stays 1-D on dp.
  if (p.kind == TpPlacement::Kind::Shard && p.dim == 0)  // num_shards_map[0]: tp, strided or not
    out.placements.push_back("_StridedShard(dim=0, sf=" + std::to_string(plan.mesh.size(MeshDim::Tp)) + ")");
  else
    out.placements.push_back("Shard(dim=0)");
  if (p.kind != TpPlacement::Kind::None) {
    out.placements.push_back(tp_placement_repr(p));
    out.mesh_dims.push_back("tp");
  }
  const auto& local = plan.local_shape[static_cast<size_t>(t)];
  out.local_shape = local.empty() ? std::vector<int64_t>{1} : local;
  if (!local.empty()) out.local_shape[0] = ceil_div(local[0], plan.mesh.fsdp_shard_size());
  return out;
}

}  // namespace fsdp_plan
