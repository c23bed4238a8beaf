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

// scores[j] = softcap'd (scale * q . k_j) for the `count` positions from `keys` (H values each): the dot
// product in 16 lanes (feature i in lane i % 16, ascending), folded in a fixed tree.
template <typename T>
ORT_MTP_GQA_CLONES void Scores(const float* q, const T* keys, int64_t H, int64_t count, float scale, float softcap,
                               float* scores) {
  for (int64_t j = 0; j < count; ++j) {
    const T* k = keys + j * H;
    float lane[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= H; i += kLanes)
      for (int l = 0; l < kLanes; ++l) lane[l] += q[i + l] * ToFloat(k[i + l]);
    for (int l = 0; i < H; ++i, ++l) lane[l] += q[i] * ToFloat(k[i]);
    float x = Fold16(lane) * scale;
    if (softcap > 0.f) x = softcap * std::tanh(x / softcap);
    scores[j] = x;
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

// acc[i] = sum_j weights[j] values_j[i], positions in ascending order, every feature i its own sum.
template <typename T>
ORT_MTP_GQA_CLONES void WeightedSum(const float* weights, const T* values, int64_t H, int64_t count, float* acc) {
  for (int64_t i = 0; i < H; ++i) acc[i] = 0.f;
  for (int64_t j = 0; j < count; ++j) {
    const float w = weights[j];
    const T* v = values + j * H;
    for (int64_t i = 0; i < H; ++i) acc[i] += w * ToFloat(v[i]);
  }
}

template <typename T>
struct Kernel {
  const GroupQueryAttentionProblem& p;

  // Task (b, q head): the call's S query rows of that head, each on its own.
  void Attend(int64_t task) {
    const int64_t b = task / p.num_heads, h = task % p.num_heads, H = p.head_size;
    const int64_t past = static_cast<int64_t>(p.seqlens_k[b]) + 1 - p.seq;
    const int64_t kvh = h / (p.num_heads / p.kv_num_heads);
    const T* keys = static_cast<const T*>(p.present_key) + (b * p.kv_num_heads + kvh) * p.present_len * H;
    const T* values = static_cast<const T*>(p.present_value) + (b * p.kv_num_heads + kvh) * p.present_len * H;
    thread_local std::vector<float> scores, q, acc;  // a task's only allocations, once per thread
    q.resize(static_cast<size_t>(H));
    acc.resize(static_cast<size_t>(H));
    for (int64_t s = 0; s < p.seq; ++s) {
      const int64_t last = past + s;  // the row's own position: it sees [first, last]
      int64_t first = 0;
      if (p.local_window > 0 && last + 1 > p.local_window) first = last + 1 - p.local_window;
      const int64_t count = last - first + 1;
      const T* qs = static_cast<const T*>(p.query) + ((b * p.seq + s) * p.num_heads + h) * H;
      for (int64_t i = 0; i < H; ++i) q[i] = ToFloat(qs[i]);
      scores.resize(static_cast<size_t>(count));
      Scores<T>(q.data(), keys + first * H, H, count, p.scale, p.softcap, scores.data());
      float max = p.smooth_softmax ? 0.f : -INFINITY;
      for (int64_t j = 0; j < count; ++j) max = std::max(max, scores[j]);
      const float sum = Exponentials(scores.data(), count, max, p.smooth_softmax ? silu::Exp(-max) : 0.f);
      WeightedSum<T>(scores.data(), values + first * H, H, count, acc.data());
      T* o = static_cast<T*>(p.output) + ((b * p.seq + s) * p.num_heads + h) * H;
      for (int64_t i = 0; i < H; ++i) o[i] = FromFloat<T>(acc[i] / sum);
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
