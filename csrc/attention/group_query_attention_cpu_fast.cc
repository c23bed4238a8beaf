// The CPU attention of GroupQueryAttention that runs by default (and inside GatedAttention): the
// reference's steps (group_query_attention_cpu.cc) in float32 instead of double, vectorised, with
// silu::Exp for the softmax's exponentials. The cache pass is the reference's (a copy).
//
// Why row s of a width-S call is bit-identical to the width-1 call at that position, at any thread
// count, on any x86-64 CPU: a row is computed by one task, from its own position's keys and values, in
// an order fixed by the number of positions it sees and the head size alone (a score's 16 lanes take
// features i % 16 in ascending order, then a fixed tree; the exponentials' sum takes positions j % 16
// likewise; each output feature sums its positions in ascending order); and the file is compiled with
// -ffp-contract=off (CMakeLists.txt), so the AVX-512, AVX2+FMA and baseline clones (target_clones, picked
// at load) fuse no multiply-add but silu::Exp's explicit ones, which every clone computes exactly.
#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/group_query_attention.h"
#include "common/cpu_numeric.h"
#include "matmul_nbits/silu_mul.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define ORT_MTP_GQA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define ORT_MTP_GQA_CLONES
#endif

namespace ort_mtp {
namespace {

using cpu::FromFloat;
using cpu::ToFloat;

constexpr int kLanes = 16;

// ((l0 + l8) + (l4 + l12)) + ((l2 + l10) + (l6 + l14)) + ... : lanes folded in halves, a fixed tree.
inline float Fold16(float* lane) {
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
  return lane[0];
}

// The query rows of one head that share a pass over the cache: a prefill chunk's rows read each key and
// value once per kRows rows rather than once per row. A row's arithmetic is the same whichever group it
// is in (R = 1 or kRows below): the blocking only changes which loads are shared.
constexpr int kRows = 4;

// Where R query rows sit in a pass over positions lo .. hi: row r sees [first[r], last[r]] and keeps its
// values at row(r) + (j - first[r]) of a buffer with `stride` floats per row.
struct RowSpans {
  int64_t lo, hi, stride;
  int64_t first[kRows], last[kRows];
  bool sees(int r, int64_t j) const { return first[r] <= j && j <= last[r]; }
  int64_t at(int r, int64_t j) const { return r * stride + (j - first[r]); }
};

// scores at(r, j) = softcap'd (scale * q_r . k_j) for every position j row r sees, the dot product in 16
// lanes (feature i in lane i % 16, ascending), folded in a fixed tree; q: R rows of H floats.
template <typename T, int R>
ORT_MTP_GQA_CLONES void Scores(const float* q, const T* keys, int64_t H, const RowSpans& rows, float scale,
                               float softcap, float* scores) {
  for (int64_t j = rows.lo; j <= rows.hi; ++j) {
    const T* k = keys + j * H;
    float lane[R][kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= H; i += kLanes)
      for (int r = 0; r < R; ++r)
        for (int l = 0; l < kLanes; ++l) lane[r][l] += q[r * H + i + l] * ToFloat(k[i + l]);
    for (int l = 0; i < H; ++i, ++l)
      for (int r = 0; r < R; ++r) lane[r][l] += q[r * H + i] * ToFloat(k[i]);
    for (int r = 0; r < R; ++r) {
      if (!rows.sees(r, j)) continue;
      float x = Fold16(lane[r]) * scale;
      if (softcap > 0.f) x = softcap * std::tanh(x / softcap);
      scores[rows.at(r, j)] = x;
    }
  }
}

// scores[j] <- exp(scores[j] - max); returns their sum in 16 lanes (position j in lane j % 16, ascending),
// folded in a fixed tree, plus `start` (smooth softmax's exp(-max), else 0) first.
ORT_MTP_GQA_CLONES float Exponentials(float* scores, int64_t count, float max, float start) {
  for (int64_t j = 0; j < count; ++j) scores[j] = silu::Exp(scores[j] - max);
  float lane[kLanes] = {start};
  int64_t j = 0;
  for (; j + kLanes <= count; j += kLanes)
    for (int l = 0; l < kLanes; ++l) lane[l] += scores[j + l];
  for (int l = 0; j < count; ++j, ++l) lane[l] += scores[j];
  return Fold16(lane);
}

// acc[r H + i] = sum_j weights at(r, j) values_j[i] over the positions row r sees, in ascending order,
// every feature i its own sum.
template <typename T, int R>
ORT_MTP_GQA_CLONES void WeightedSum(const float* weights, const T* values, int64_t H, const RowSpans& rows,
                                    float* acc) {
  for (int64_t i = 0; i < R * H; ++i) acc[i] = 0.f;
  for (int64_t j = rows.lo; j <= rows.hi; ++j) {
    const T* v = values + j * H;
    for (int r = 0; r < R; ++r) {
      if (!rows.sees(r, j)) continue;
      const float w = weights[rows.at(r, j)];
      float* a = acc + r * H;
      for (int64_t i = 0; i < H; ++i) a[i] += w * ToFloat(v[i]);
    }
  }
}

template <typename T>
struct Kernel {
  const GroupQueryAttentionProblem& p;

  // Task (b, q head): the call's S query rows of that head, in groups of kRows (then one at a time).
  void Attend(int64_t task) {
    int64_t s = 0;
    for (; s + kRows <= p.seq; s += kRows) Rows<kRows>(task, s);
    for (; s < p.seq; ++s) Rows<1>(task, s);
  }

  // Rows s0 .. s0 + R - 1 of task (b, q head), each computed on its own from its position.
  template <int R>
  void Rows(int64_t task, int64_t s0) {
    const int64_t b = task / p.num_heads, h = task % p.num_heads, H = p.head_size;
    const int64_t past = static_cast<int64_t>(p.seqlens_k[b]) + 1 - p.seq;
    const int64_t kvh = h / (p.num_heads / p.kv_num_heads);
    const T* keys = static_cast<const T*>(p.present_key) + (b * p.kv_num_heads + kvh) * p.present_len * H;
    const T* values = static_cast<const T*>(p.present_value) + (b * p.kv_num_heads + kvh) * p.present_len * H;
    RowSpans rows{};
    for (int r = 0; r < R; ++r) {
      const int64_t last = past + s0 + r;  // the row's own position: it sees [first, last]
      int64_t first = 0;
      if (p.local_window > 0 && last + 1 > p.local_window) first = last + 1 - p.local_window;
      rows.first[r] = first;
      rows.last[r] = last;
    }
    rows.lo = rows.first[0];  // first and last grow with the row
    rows.hi = rows.last[R - 1];
    rows.stride = rows.hi - rows.lo + 1;
    thread_local std::vector<float> scores, q, acc;  // a task's only allocations, once per thread
    q.resize(static_cast<size_t>(R * H));
    acc.resize(static_cast<size_t>(R * H));
    scores.resize(static_cast<size_t>(R * rows.stride));
    for (int r = 0; r < R; ++r) {
      const T* qs = static_cast<const T*>(p.query) + ((b * p.seq + s0 + r) * p.num_heads + h) * H;
      for (int64_t i = 0; i < H; ++i) q[r * H + i] = ToFloat(qs[i]);
    }
    Scores<T, R>(q.data(), keys, H, rows, p.scale, p.softcap, scores.data());
    float sum[R];
    for (int r = 0; r < R; ++r) {
      float* row_scores = scores.data() + rows.at(r, rows.first[r]);
      const int64_t count = rows.last[r] - rows.first[r] + 1;
      float max = p.smooth_softmax ? 0.f : -INFINITY;
      for (int64_t j = 0; j < count; ++j) max = std::max(max, row_scores[j]);
      sum[r] = Exponentials(row_scores, count, max, p.smooth_softmax ? silu::Exp(-max) : 0.f);
    }
    WeightedSum<T, R>(scores.data(), values, H, rows, acc.data());
    for (int r = 0; r < R; ++r) {
      T* o = static_cast<T*>(p.output) + ((b * p.seq + s0 + r) * p.num_heads + h) * H;
      for (int64_t i = 0; i < H; ++i) o[i] = FromFloat<T>(acc[r * H + i] / sum[r]);
    }
  }
};

template <typename T>
void Attention(const GroupQueryAttentionProblem& p, ParallelFor parallel_for, void* context) {
  Kernel<T> kernel{p};
  cpu::ForEach<Kernel<T>, &Kernel<T>::Attend>(kernel, p.batch * p.num_heads, parallel_for, context);
}

}  // namespace

void GroupQueryAttentionCpu(const GroupQueryAttentionProblem& p, ParallelFor parallel_for,
                            void* parallel_context) {
  if (cpu::ReferenceKernelsRequested()) {
    GroupQueryAttentionCpuReference(p, parallel_for, parallel_context);
    return;
  }
  GroupQueryAttentionCpuCache(p, parallel_for, parallel_context);
  cpu::WithElementType(p.type, [&](auto t) { Attention<decltype(t)>(p, parallel_for, parallel_context); });
}

}  // namespace ort_mtp
