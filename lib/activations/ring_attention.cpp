#include "activations/ring_attention.h"

#include <algorithm>
#include <memory>

namespace fsdp_plan {
namespace {

constexpr int64_t kF32 = 4;

// The bytes live inside the call, and their most.
struct Level {
  int64_t now = 0, peak = 0;
};

// One storage: counted from its making until its last tensor lets go.
class Storage {
 public:
  Storage(Level& level, int64_t bytes) : level_(level), bytes_(bytes) {
    level_.now += bytes_;
    level_.peak = std::max(level_.peak, level_.now);
  }
  ~Storage() { level_.now -= bytes_; }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

 private:
  Level& level_;
  int64_t bytes_;
};

// A tensor as the ring's code holds it: its storage (none: the caller's), its
// elements, element size and whether it is contiguous. Copying a T is Python
// binding a name to the same tensor; a view shares the storage.
struct T {
  std::shared_ptr<Storage> storage;
  int64_t numel = 0, itemsize = kF32;
  bool contiguous = true;
};

// The operations the ring's code runs, each allocating what torch allocates.
class Tensors {
 public:
  T make(int64_t numel, int64_t itemsize, bool contiguous = true) {
    return T{std::make_shared<Storage>(level, numel * itemsize), numel, itemsize, contiguous};
  }
  static T view(const T& t, int64_t numel, bool contiguous = true) { return T{t.storage, numel, t.itemsize, contiguous}; }
  static T half(const T& t) { return view(t, t.numel / 2, false); }  // chunk(2, dim=seq)[i]
  T contiguous(const T& t) { return t.contiguous ? t : make(t.numel, t.itemsize); }
  T flatten(const T& t) { return t.contiguous ? view(t, t.numel) : make(t.numel, t.itemsize); }
  T to(const T& t, int64_t itemsize) { return itemsize == t.itemsize ? t : make(t.numel, itemsize); }
  T zeros_like(const T& t, int64_t itemsize) { return make(t.numel, itemsize, t.contiguous); }
  // The merger's elementwise float32 results (sub, mul, sigmoid, logsigmoid).
  T f32(const T& a, const T& b) { return make(std::max(a.numel, b.numel), kF32); }
  T f32(const T& a) { return make(a.numel, kF32); }
  // torch.cat([a.flatten(), b.flatten()]): the flattened copies live until the cat is made.
  T cat_flat(const T& a, const T& b) {
    const T fa = flatten(a), fb = flatten(b);
    return make(a.numel + b.numel, a.itemsize);
  }
  // _partial_update: the two halves of `original`, one replaced by (or added to) `update`, concatenated.
  T partial_update(const T& original, const T& update, bool add) {
    return make(add ? original.numel : original.numel / 2 + update.numel, original.itemsize);
  }
  Level level;
};

// _AllGatherRotater (gathers once, hands out views) or _AllToAllRotater (a permute each time).
class Rotater {
 public:
  Rotater(Tensors& ts, bool all_gather, int64_t cp) : ts_(ts), all_gather_(all_gather), cp_(cp) {}
  void exchange(const T& buffer) {
    if (all_gather_) {
      if (!gathered_.storage) gathered_ = ts_.make(buffer.numel * cp_, buffer.itemsize);
      return;
    }
    buffer_ = ts_.make(buffer.numel, buffer.itemsize);
  }
  T next() const { return all_gather_ ? Tensors::view(gathered_, gathered_.numel / cp_) : buffer_; }

 private:
  Tensors& ts_;
  bool all_gather_;
  int64_t cp_;
  T gathered_, buffer_;
};

// _SDPAMerger with convert_to_f32: the running output and logsumexp in float32.
class Merger {
 public:
  explicit Merger(Tensors& ts) : ts_(ts) {}
  void step(const T& out_in, const T& lse_in, bool partial) {
    out_itemsize_ = out_in.itemsize;
    const T out = ts_.to(out_in, kF32), lse = ts_.to(lse_in, kF32);
    merge_one(out, lse, partial);
  }
  // results(): the output back in its dtype, the logsumexp as is.
  std::pair<T, T> results() { return {ts_.to(out_, out_itemsize_), lse_}; }

 private:
  void merge_one(const T& block_out, const T& block_lse, bool partial) {
    if (!merged_) {
      lse_ = block_lse;
      out_ = block_out;
      merged_ = true;
      return;
    }
    T lse = partial ? Tensors::half(lse_) : lse_;
    T out = partial ? Tensors::half(out_) : out_;
    {  // out = out - sigmoid(block_lse - lse) * (out - block_out)
      T diff = ts_.f32(block_lse, lse);
      T sig = ts_.f32(diff);
      diff = T{};
      T delta = ts_.f32(out, block_out);
      T scaled = ts_.f32(sig, delta);
      sig = delta = T{};
      T next = ts_.f32(out, scaled);
      scaled = T{};
      out = next;
    }
    {  // lse = lse - logsigmoid(lse - block_lse)
      T diff = ts_.f32(lse, block_lse);
      T logsig = ts_.f32(diff);
      diff = T{};
      T next = ts_.f32(lse, logsig);
      logsig = T{};
      lse = next;
    }
    if (partial) {
      lse_ = ts_.partial_update(lse_, lse, false);
      out_ = ts_.partial_update(out_, out, false);
    } else {
      lse_ = lse;
      out_ = out;
    }
  }
  Tensors& ts_;
  T out_, lse_;
  bool merged_ = false;
  int64_t out_itemsize_ = kF32;
};

enum class Causal { Skip, Full, Causal };

// _is_causal_behavior: the first step causal, then a full block where the
// source rank precedes or the balancer runs, else nothing to compute.
Causal behaviour(const RingCall& c, int64_t i) {
  if (i == 0) return Causal::Causal;
  const int64_t source = ((c.rank - i) % c.cp + c.cp) % c.cp;
  return source < c.rank || c.head_tail ? Causal::Full : Causal::Skip;
}

// _templated_ring_attention.
void ring_forward(const RingCall& c, Tensors& ts, T& out_result, T& lse_result) {
  const T query{nullptr, c.q_numel, c.itemsize, c.q_contiguous};
  T key = ts.contiguous(T{nullptr, c.kv_numel, c.itemsize, c.kv_contiguous});
  T value = ts.contiguous(T{nullptr, c.kv_numel, c.itemsize, c.kv_contiguous});
  Merger merger(ts);
  Rotater rotater(ts, c.all_gather, c.cp);
  // The loop's locals, alive until rebound: k and v keep what they last took (the
  // contiguous copies, a rotated buffer) until the next computed step.
  T next_kv, out, logsumexp, k, v;
  for (int64_t i = 0; i < c.cp; ++i) {
    if (i > 0) {
      next_kv = rotater.next();
      key = Tensors::view(next_kv, c.kv_numel);
      value = Tensors::view(next_kv, c.kv_numel);
    }
    if (i < c.cp - 1) {
      next_kv = ts.cat_flat(key, value);
      rotater.exchange(next_kv);
      next_kv = T{};  // exchange_buffers returns None
    }
    const Causal b = behaviour(c, i);
    if (b == Causal::Skip) continue;
    const bool partial = i > 0 && c.head_tail && i > c.rank;
    const bool early = i > 0 && c.head_tail && i <= c.rank;  // the first half of K/V
    const T q = partial ? Tensors::half(query) : query;
    k = early ? Tensors::half(key) : key;
    v = early ? Tensors::half(value) : value;
    T new_out = ts.make(q.numel, c.itemsize);
    T new_lse = ts.make(q.numel / std::max<int64_t>(1, c.head_dim), kF32);
    out = new_out;
    logsumexp = new_lse;
    new_out = new_lse = T{};
    merger.step(out, logsumexp, partial);
  }
  std::tie(out_result, lse_result) = merger.results();
}

// The gradients' accumulation at step i (after the kernel or the zeros).
void accumulate(const RingCall& c, Tensors& ts, Rotater& dkv, int64_t i, const T& dq_, const T& dk_, const T& dv_,
                T& grad_query, T& grad_key, T& grad_value, T& next_grad_kv) {
  if (i > 0) {
    next_grad_kv = dkv.next();
    grad_key = Tensors::view(next_grad_kv, c.kv_numel);
    grad_value = Tensors::view(next_grad_kv, c.kv_numel);
    if (i <= c.rank && c.head_tail) {
      grad_key = ts.partial_update(grad_key, dk_, true);
      grad_value = ts.partial_update(grad_value, dv_, true);
    }
  }
  next_grad_kv = ts.cat_flat(grad_key, grad_value);
  dkv.exchange(next_grad_kv);
  if (!(i <= c.rank || !c.head_tail)) grad_query = ts.partial_update(grad_query, dq_, true);
}

// _templated_ring_attention_backward.
void ring_backward(const RingCall& c, Tensors& ts, T& dq_result, T& dkv_result) {
  const T grad_out{nullptr, c.q_numel, c.itemsize, c.q_contiguous};
  const T query{nullptr, c.q_numel, c.itemsize, c.q_contiguous};
  T grad_query = ts.zeros_like(query, kF32);
  T grad_key = ts.zeros_like(T{nullptr, c.kv_numel, c.itemsize, c.kv_contiguous}, kF32);
  T grad_value = ts.zeros_like(T{nullptr, c.kv_numel, c.itemsize, c.kv_contiguous}, kF32);
  T key = ts.contiguous(T{nullptr, c.kv_numel, c.itemsize, c.kv_contiguous});
  T value = ts.contiguous(T{nullptr, c.kv_numel, c.itemsize, c.kv_contiguous});
  Rotater kv(ts, c.all_gather, c.cp), dkv(ts, false, c.cp);
  const T logsumexp{nullptr, c.q_numel / std::max<int64_t>(1, c.head_dim), kF32, true};
  // The loop's locals, alive until rebound (the logsumexp half's copy among them).
  T buffer, next_kv, next_grad_kv, dq_, dk_, dv_, lse, k, v;
  for (int64_t i = 0; i < c.cp; ++i) {
    if (i > 0) {
      buffer = kv.next();
      key = Tensors::view(buffer, c.kv_numel);
      value = Tensors::view(buffer, c.kv_numel);
    }
    if (i != c.cp - 1) {
      next_kv = ts.cat_flat(key, value);
      kv.exchange(next_kv);
    }
    if (behaviour(c, i) != Causal::Skip) {
      const bool first = i == 0 || !c.head_tail;
      const bool early = !first && i <= c.rank;  // the first half of K/V
      const T q = first || early ? query : Tensors::half(query);
      T new_lse = first || early ? logsumexp : ts.contiguous(Tensors::half(logsumexp));
      k = early ? Tensors::half(key) : key;
      v = early ? Tensors::half(value) : value;
      lse = new_lse;
      new_lse = T{};
      T new_dq = ts.make(q.numel, c.itemsize), new_dk = ts.make(k.numel, c.itemsize);
      T new_dv = ts.make(k.numel, c.itemsize);
      dq_ = new_dq, dk_ = new_dk, dv_ = new_dv;
    } else {
      dq_ = ts.zeros_like(query, kF32);
      dk_ = ts.zeros_like(key, kF32);
      dv_ = ts.zeros_like(value, kF32);
    }
    accumulate(c, ts, dkv, i, dq_, dk_, dv_, grad_query, grad_key, grad_value, next_grad_kv);
  }
  grad_query = ts.to(grad_query, c.itemsize);
  next_grad_kv = ts.to(dkv.next(), c.itemsize);
  dq_result = grad_query;
  dkv_result = next_grad_kv;
}

template <class Body>
RingMemory replay(Body body) {
  Tensors ts;
  T a, b;
  body(ts, a, b);  // the call's locals die here, as at its return
  RingMemory m;
  m.peak = ts.level.peak;
  m.exit = ts.level.now;
  return m;
}

}  // namespace

RingMemory ring_forward_memory(const RingCall& call) {
  return replay([&](Tensors& ts, T& a, T& b) { ring_forward(call, ts, a, b); });
}

RingMemory ring_backward_memory(const RingCall& call) {
  return replay([&](Tensors& ts, T& a, T& b) { ring_backward(call, ts, a, b); });
}

}  // namespace fsdp_plan
