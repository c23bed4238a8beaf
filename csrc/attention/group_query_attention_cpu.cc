// CPU reference kernel of GroupQueryAttention (ORT_MTP_CPU_KERNEL=reference; by default the float32
// kernel of group_query_attention_cpu_fast.cc attends, which the tests hold to this one), and the cache
// pass both kernels run (group_query_attention.h has the arithmetic). Written for row independence
// first: every query row is one task's loop over its own positions, in double, in an order fixed by the
// row's position and the head size alone, so a call of width S computes row s exactly as the width-1
// call at that position does. Two passes: (1) per (batch, kv head): present's cache rows (past's copied
// when present is another buffer, then the call's new keys and values); (2) per (batch, q head):
// attention of the call's query rows over the cache.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "attention/group_query_attention.h"
#include "common/cpu_numeric.h"

namespace ort_mtp {
namespace {

using cpu::Round;
using cpu::ToDouble;

template <typename T>
struct Kernel {
  explicit Kernel(const GroupQueryAttentionProblem& p)
      : p(p),
        q(static_cast<const T*>(p.query)),
        k(static_cast<const T*>(p.key)),
        v(static_cast<const T*>(p.value)),
        past_k(static_cast<const T*>(p.past_key)),
        past_v(static_cast<const T*>(p.past_value)),
        out(static_cast<T*>(p.output)),
        present_k(static_cast<T*>(p.present_key)),
        present_v(static_cast<T*>(p.present_value)) {}

  // Position of the call's first token in batch row b (checked by the op: 0 <= past, past + S <= present).
  int64_t Past(int64_t b) const { return static_cast<int64_t>(p.seqlens_k[b]) + 1 - p.seq; }

  // Pass 1, task (b, kv head): present's rows. When present is not past's buffer it starts as zeros with
  // past's first `past` positions copied (ORT's ConcatStateChunkGQA); in the shared buffer those rows are
  // already in place. Then the call's S new rows at positions past .. past + S - 1.
  void WriteCache(int64_t task) {
    const int64_t b = task / p.kv_num_heads, h = task % p.kv_num_heads, H = p.head_size, past = Past(b);
    const size_t head_rows = static_cast<size_t>(p.present_len * H);
    T* dk = present_k + task * p.present_len * H;
    T* dv = present_v + task * p.present_len * H;
    if (!p.share_buffer) {
      std::fill(dk, dk + head_rows, Round<T>(0.0));
      std::fill(dv, dv + head_rows, Round<T>(0.0));
      const T* sk = past_k + task * p.past_len * H;
      const T* sv = past_v + task * p.past_len * H;
      std::memcpy(dk, sk, static_cast<size_t>(past * H) * sizeof(T));
      std::memcpy(dv, sv, static_cast<size_t>(past * H) * sizeof(T));
    }
    const int64_t kv_dim = p.kv_num_heads * H;
    for (int64_t s = 0; s < p.seq; ++s) {
      const int64_t src = (b * p.seq + s) * kv_dim + h * H;
      std::memcpy(dk + (past + s) * H, k + src, static_cast<size_t>(H) * sizeof(T));
      std::memcpy(dv + (past + s) * H, v + src, static_cast<size_t>(H) * sizeof(T));
    }
  }

  // Pass 2, task (b, q head): the call's S query rows of that head, each on its own.
  void Attend(int64_t task) {
    const int64_t b = task / p.num_heads, h = task % p.num_heads, H = p.head_size, past = Past(b);
    const int64_t kvh = h / (p.num_heads / p.kv_num_heads);
    const T* keys = present_k + (b * p.kv_num_heads + kvh) * p.present_len * H;
    const T* values = present_v + (b * p.kv_num_heads + kvh) * p.present_len * H;
    static thread_local std::vector<double> score, qrow, acc;
    qrow.resize(static_cast<size_t>(H));
    acc.resize(static_cast<size_t>(H));
    for (int64_t s = 0; s < p.seq; ++s) {
      const int64_t last = past + s;  // the row's own position: it sees [first, last]
      int64_t first = 0;
      if (p.local_window > 0 && last + 1 > p.local_window) first = last + 1 - p.local_window;
      const T* qs = q + ((b * p.seq + s) * p.num_heads + h) * H;
      for (int64_t i = 0; i < H; ++i) qrow[i] = ToDouble(qs[i]);
      score.resize(static_cast<size_t>(last - first + 1));
      double max = -INFINITY;
      for (int64_t j = first; j <= last; ++j) {
        const T* kj = keys + j * H;
        double dot = 0.0;
        for (int64_t i = 0; i < H; ++i) dot += qrow[i] * ToDouble(kj[i]);
        double x = static_cast<float>(dot * p.scale);  // ORT's scores are float32
        if (p.softcap > 0.f) x = p.softcap * std::tanh(x / p.softcap);
        score[j - first] = x;
        max = std::max(max, x);
      }
      if (p.smooth_softmax) max = std::max(max, 0.0);
      double sum = p.smooth_softmax ? std::exp(-max) : 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = first; j <= last; ++j) {
        const double e = std::exp(score[j - first] - max);
        sum += e;
        const T* vj = values + j * H;
        for (int64_t i = 0; i < H; ++i) acc[i] += e * ToDouble(vj[i]);
      }
      T* o = out + ((b * p.seq + s) * p.num_heads + h) * H;
      for (int64_t i = 0; i < H; ++i) o[i] = Round<T>(acc[i] / sum);
    }
  }

  const GroupQueryAttentionProblem& p;
  const T *q, *k, *v, *past_k, *past_v;
  T *out, *present_k, *present_v;
};

template <typename T>
void Cache(const GroupQueryAttentionProblem& p, ParallelFor parallel_for, void* context) {
  Kernel<T> kernel(p);
  cpu::ForEach<Kernel<T>, &Kernel<T>::WriteCache>(kernel, p.batch * p.kv_num_heads, parallel_for, context);
}

template <typename T>
void Attention(const GroupQueryAttentionProblem& p, ParallelFor parallel_for, void* context) {
  Kernel<T> kernel(p);
  cpu::ForEach<Kernel<T>, &Kernel<T>::Attend>(kernel, p.batch * p.num_heads, parallel_for, context);
}

}  // namespace

void GroupQueryAttentionCpuCache(const GroupQueryAttentionProblem& p, ParallelFor parallel_for,
                                 void* parallel_context) {
  cpu::WithElementType(p.type, [&](auto t) { Cache<decltype(t)>(p, parallel_for, parallel_context); });
}

void GroupQueryAttentionCpuReference(const GroupQueryAttentionProblem& p, ParallelFor parallel_for,
                                     void* parallel_context) {
  GroupQueryAttentionCpuCache(p, parallel_for, parallel_context);
  cpu::WithElementType(p.type, [&](auto t) { Attention<decltype(t)>(p, parallel_for, parallel_context); });
}

}  // namespace ort_mtp
