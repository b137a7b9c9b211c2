#include "model/loaders/export_walk.h"

#include <algorithm>
#include <cctype>

#include "model/dtype.h"

namespace fsdp_plan::pt2 {

RawDim ProgramWalk::sym_int(dom::element v) {
  RawDim d;
  if (!v.is_object()) return d;
  // {"as_int": n} or {"as_expr": {"expr_str": ..., "hint": {"as_int": n}}}; the first key decides, as
  // nlohmann's member() lookups found as_expr before as_int.
  bool expr = false;
  int64_t iv = 0;
  bool int_ok = false;
  for_fields(v, {"as_int", "as_expr"}, [&](std::string_view k, dom::element x) {
    if (k == "as_int") int_ok = read_int(x, iv);
    if (k == "as_expr") {
      expr = true;
      if (!x.is_object()) return;
      for_fields(x, {"expr_str", "hint"}, [&](std::string_view ek, dom::element ex) {
        std::string_view s;
        if (ek == "expr_str" && read_string(ex, s)) d.expr = std::string(s);
        if (ek == "hint" && ex.is_object()) {
          for_fields(ex, {"as_int"}, [&](std::string_view hk, dom::element hx) {
            int64_t h = 0;
            if (hk == "as_int" && read_int(hx, h)) d.hint = h;
          });
        }
      });
    }
  });
  if (expr) {
    d.kind = RawDim::Expr;
  } else if (int_ok) {
    d.kind = RawDim::Int;
    d.value = iv;
  }
  return d;
}

// A sizes or strides list; `count` gets its length (each one an element
// of the graph, counted by apply_tensor_values).
void ProgramWalk::dims(dom::element v, bool& is_list, std::vector<RawDim>& out, size_t& count) {
  dom::array arr;
  if (v.get_array().get(arr)) return;
  is_list = true;
  out.reserve(std::min<size_t>(arr.size(), kMaxTensorRank + 1));  // a tensor's rank; more is damage
  for_elements(v, [&](dom::element e) {
    ++count;
    out.push_back(sym_int(e));
  });
}

// The part of tensor_values that reads only the DOM (half its cost, 7,000
// tensors for Llama-3-70B): a second thread does it while the nodes are walked.
ProgramWalk::TensorEntries ProgramWalk::read_tensor_values(dom::element v) {
  TensorEntries out;
  dom::object obj;
  if (v.get_object().get(obj)) return out;
  out.object = true;
  out.entries.reserve(obj.size());
  try {
    for (dom::key_value_pair field : obj) {
      TensorEntry e;
      e.name = field.key;
      dom::element x = field.value;
      RawMeta& m = e.m;
      e.object = x.is_object();
      if (e.object) {
        for_fields(x, {"dtype", "sizes", "requires_grad", "device", "strides", "storage_offset", "layout"},
                   [&](std::string_view k, dom::element f) {
                     if (k == "dtype") m.has_dtype = read_int(f, m.dtype);
                     else if (k == "sizes") dims(f, m.sizes_array, m.sizes, e.dims);
                     else if (k == "strides") dims(f, m.strides_array, m.strides, e.dims);
                     else if (k == "storage_offset") {
                       m.has_offset = true;
                       m.offset = sym_int(f);
                     } else if (k == "requires_grad") {
                       bool b = false;
                       if (read_bool(f, b)) m.requires_grad = b;
                     } else if (k == "device") {
                       if (!f.is_object()) return;
                       for_fields(f, {"type", "index"}, [&](std::string_view dk, dom::element dv) {
                         std::string_view s;
                         int64_t idx = 0;
                         if (dk == "type" && read_string(dv, s)) m.device_type = std::string(s);
                         if (dk == "index" && read_int(dv, idx)) m.device_index = idx;
                       });
                     } else if (k == "layout") {
                       read_int(f, m.layout);
                     }
                   });
      }
      out.entries.push_back(std::move(e));
    }
  } catch (const JsonFail& fail) {
    out.fail = fail;
  }
  return out;
}

void ProgramWalk::tensor_values(dom::element v) {
  if (ahead_ && ahead_->valid()) {
    std::future<TensorEntries>* ahead = ahead_;
    ahead_ = nullptr;
    return apply_tensor_values(ahead->get());
  }
  apply_tensor_values(read_tensor_values(v));
}

// In file order, as one pass did: each entry's dimensions counted, its
// graph value set, its name checked against the earlier ones.
void ProgramWalk::apply_tensor_values(TensorEntries t) {
  if (!t.object) return;
  raw_.tensor_values = true;
  raw_.metas.reserve(t.entries.size());
  for (TensorEntry& e : t.entries) {
    for (size_t i = 0; i < e.dims; ++i) g_.count_element();
    to_graph(e.name, e.m, e.object);
    if (!raw_.metas.emplace(e.name, std::move(e.m)).second) {
      throw JsonFail{simdjson::SUCCESS, "key \"" + std::string(e.name) + "\" given twice in one object"};
    }
  }
  if (t.fail) throw *t.fail;
}

SymInt ProgramWalk::graph_dim(const RawDim& d, const What& what) {
  if (d.kind == RawDim::Int) return SymInt{d.value, kNone};
  if (d.kind == RawDim::Expr) return g_.expr(d.expr, d.hint, what.str());
  g_.damage(what + " is neither an integer nor an expression");
  return SymInt{};
}

void ProgramWalk::to_graph(std::string_view name, const RawMeta& m, bool object) {
  const What what("tensor ", name);
  if (!object) return g_.damage(what + ": its metadata is not an object");
  TensorMeta t;
  const DtypeInfo* dt = m.has_dtype && m.dtype > 0 && m.dtype <= 255 ? dtype_from_export_code(static_cast<int>(m.dtype)) : nullptr;
  if (!dt) return g_.damage(what + " has no known dtype");
  t.dtype = static_cast<uint8_t>(m.dtype);
  if (!m.sizes_array) return g_.damage(what + " has no sizes");
  if (m.sizes.size() > static_cast<size_t>(kMaxTensorRank)) {
    return g_.damage(what + " has more than " + std::to_string(kMaxTensorRank) + " dimensions");
  }
  if (m.strides_array && m.strides.size() != m.sizes.size()) {
    return g_.damage(what + " has " + std::to_string(m.strides.size()) + " strides for " +
                     std::to_string(m.sizes.size()) + " sizes");
  }
  // Scratch lists, kept between tensors (set_tensor copies them).
  std::vector<SymInt>& sizes = sizes_;
  std::vector<SymInt>& strides = strides_;
  sizes.clear();
  strides.clear();
  for (const RawDim& d : m.sizes) {
    sizes.push_back(graph_dim(d, what.with("'s size")));
    if (sizes.back().constant() && sizes.back().value < 0) return g_.damage(what + " has a negative size");
  }
  for (const RawDim& d : m.strides) strides.push_back(graph_dim(d, what.with("'s stride")));
  if (m.has_offset) t.storage_offset = graph_dim(m.offset, what.with("'s storage offset"));
  t.requires_grad = m.requires_grad.value_or(false);
  t.layout = static_cast<uint8_t>(m.layout >= 0 && m.layout < 256 ? m.layout : 0);
  std::string dev = m.device_type;
  if (m.device_index) dev += ":" + std::to_string(*m.device_index);
  // Tensors come on one device or two: the last one's id is kept.
  if (last_device_id_ == kNone || dev != last_device_) {
    last_device_id_ = g_.intern(dev);
    last_device_ = std::move(dev);
  }
  t.device = last_device_id_;
  g_.set_tensor(g_.value(name), t, sizes, strides);
}

void ProgramWalk::sym_int_values(dom::element v) {
  if (!v.is_object()) return;
  dom::object obj;
  if (v.get_object().get(obj)) return;
  for (dom::key_value_pair field : obj) {
    const std::string_view name = field.key;
    const RawDim d = sym_int(field.value);
    g_.set_sym_int(g_.value(name), graph_dim(d, What("symbolic int ", name)));
  }
}

void ProgramWalk::range_constraints(dom::element v) {
  if (!v.is_object()) return;
  dom::object obj;
  if (v.get_object().get(obj)) return;
  for (dom::key_value_pair field : obj) {
    const std::string_view name = field.key;
    dom::element x = field.value;
    int64_t min = 0;
    std::optional<int64_t> max;
    bool min_ok = false;
    if (x.is_object()) {
      for_fields(x, {"min_val", "max_val"}, [&](std::string_view k, dom::element r) {
        int64_t n = 0;
        if (k == "min_val") min_ok = read_int(r, n) ? (min = n, true) : r.is_null();
        // Beyond int64 (torch's int_oo written as a number) is no bound.
        if (k == "max_val" && read_int(r, n)) max = n;
      });
    }
    bool plain = !name.empty() && name.size() <= 256;
    for (char c : name) plain &= std::isalnum(static_cast<unsigned char>(c)) || c == '_';
    if (!plain) {
      g_.damage("range_constraints names something that is not a symbol");
      continue;
    }
    if (!min_ok) g_.damage("range_constraints of " + std::string(name) + " has no min_val");
    g_.add_range(name, min, max);
  }
}

}  // namespace fsdp_plan::pt2
