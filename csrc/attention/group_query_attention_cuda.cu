// CUDA kernel of GroupQueryAttention (group_query_attention.h has the semantics): two launches on the
// session's stream, no allocation, no host synchronisation, capturable in a CUDA graph.
//
// FillKernel: the cache. One block per (batch, kv head, cache row it writes): with present bound to
// past's buffer, only the call's S new rows (positions past .. past + S - 1); otherwise every row of
// present: past's rows below `past`, the new rows, zeros after them (ORT's layout). It runs first and
// alone: a query row reads the keys the other rows of its call write.
//
// AttendKernel: one block per (batch, q head, query row s), kThreads threads. The row's positions
// [first, last] (last = past + s; first = 0 or the local window's start) are taken in chunks of
// kThreads keys, chunk c starting at first + c kThreads: thread t scores key first + c kThreads + t
// (q . k over the head's features in ascending order, one float32 fma chain, times scale, softcap);
// the chunk's max and sum of exp by a fixed tree in shared memory; the running softmax (max m, sum l,
// the output accumulator, thread t owning features t, t + kThreads, ...) rescaled by exp(m_old - m_new)
// and each feature accumulated over the chunk's keys in ascending order. Every operation is an
// explicit round-to-nearest intrinsic or a libdevice function, and every order depends only on the
// row's own position range and the head size: row s of a width-S call is bit-identical to the width-1
// call at that position (the property the MTP verify needs), whatever S, the batch or the grid. The
// results differ from the CPU kernel's (double) by float32 rounding.
//
// seqlens_k lives on the device (the builder computes it from the attention mask there), so its values
// cannot be checked on the host without a synchronisation: a batch row whose positions fall outside the
// cache (past < 0, past + S > the cache length, or, not sharing past's buffer, past > past's length)
// gets NaN output rows and its cache rows are not written (zeros where present is a separate buffer).
// The CPU op reports the same inputs as an error.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "attention/group_query_attention.h"
#include "common/cuda_numeric.cuh"

namespace ort_mtp {
namespace {

constexpr int kThreads = 128;  // keys per chunk, and features per pass of a thread
constexpr int kFillThreads = 128;

struct GqaParams {
  const void* query;
  const void* key;
  const void* value;
  const void* past_key;
  const void* past_value;
  const int32_t* seqlens_k;
  void* output;
  void* present_key;
  void* present_value;
  int64_t batch, seq, past_len, present_len, local_window;
  int num_heads, kv_num_heads, head_size;
  float scale, softcap;
  bool share_buffer, smooth_softmax;
};

using cuda::FromF;
using cuda::ToF;

// The position of batch row b's first new token, or -1 when its seqlens_k puts the call outside the cache.
__device__ __forceinline__ int64_t PastOf(const GqaParams& p, int64_t b) {
  const int64_t past = static_cast<int64_t>(p.seqlens_k[b]) + 1 - p.seq;
  if (past < 0 || past + p.seq > p.present_len || (!p.share_buffer && past > p.past_len)) return -1;
  return past;
}

// Grid: (batch * kv heads, up to 65535); block y takes rows y, y + gridDim.y, ... of the rows it writes:
// the call's S new rows when sharing past's buffer, else every row of the cache.
template <typename T>
__global__ void __launch_bounds__(kFillThreads) FillKernel(const GqaParams p) {
  const int64_t bh = blockIdx.x;
  const int64_t b = bh / p.kv_num_heads, h = bh % p.kv_num_heads;
  const int H = p.head_size;
  const int64_t past = PastOf(p, b);
  if (p.share_buffer && past < 0) return;  // nothing written
  T* pk = static_cast<T*>(p.present_key) + bh * p.present_len * H;
  T* pv = static_cast<T*>(p.present_value) + bh * p.present_len * H;
  const int64_t rows = p.share_buffer ? p.seq : p.present_len;
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y) {
    const int64_t pos = p.share_buffer ? past + row : row;
    const T* src_k = nullptr;
    const T* src_v = nullptr;
    if (past >= 0 && pos >= past && pos < past + p.seq) {
      const int64_t off = (b * p.seq + (pos - past)) * p.kv_num_heads * H + h * H;
      src_k = static_cast<const T*>(p.key) + off;
      src_v = static_cast<const T*>(p.value) + off;
    } else if (past >= 0 && pos < past) {
      src_k = static_cast<const T*>(p.past_key) + (bh * p.past_len + pos) * H;
      src_v = static_cast<const T*>(p.past_value) + (bh * p.past_len + pos) * H;
    }
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
      pk[pos * H + i] = src_k ? src_k[i] : FromF<T>(0.f);
      pv[pos * H + i] = src_v ? src_v[i] : FromF<T>(0.f);
    }
  }
}

// Sum (or max) of v[0 .. kThreads) by a fixed tree: pairs (i, i + half) for half = kThreads/2 .. 1.
// Every thread takes part; every thread returns the same value.
template <bool kMax>
__device__ __forceinline__ float BlockReduce(float* scratch, float v) {
  const int t = threadIdx.x;
  scratch[t] = v;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half >>= 1) {
    if (t < half) scratch[t] = kMax ? fmaxf(scratch[t], scratch[t + half]) : __fadd_rn(scratch[t], scratch[t + half]);
    __syncthreads();
  }
  const float r = scratch[0];
  __syncthreads();
  return r;
}

// Grid: (batch * q heads, S); kThreads threads; dynamic shared memory: H floats (the query row).
template <typename T>
__global__ void __launch_bounds__(kThreads) AttendKernel(const GqaParams p) {
  extern __shared__ float q[];
  __shared__ float scratch[kThreads];
  __shared__ float weight[kThreads];
  const int64_t bh = blockIdx.x, s = blockIdx.y;
  const int64_t b = bh / p.num_heads, h = bh % p.num_heads;
  const int64_t kvh = h / (p.num_heads / p.kv_num_heads);
  const int H = p.head_size, t = threadIdx.x;
  T* out = static_cast<T*>(p.output) + ((b * p.seq + s) * p.num_heads + h) * H;
  const int64_t past = PastOf(p, b);
  if (past < 0) {
    for (int i = t; i < H; i += kThreads) out[i] = FromF<T>(__int_as_float(0x7fc00000));  // NaN: bad seqlens_k
    return;
  }
  const T* qrow = static_cast<const T*>(p.query) + ((b * p.seq + s) * p.num_heads + h) * H;
  for (int i = t; i < H; i += kThreads) q[i] = ToF(qrow[i]);
  __syncthreads();
  const T* keys = static_cast<const T*>(p.present_key) + (b * p.kv_num_heads + kvh) * p.present_len * H;
  const T* values = static_cast<const T*>(p.present_value) + (b * p.kv_num_heads + kvh) * p.present_len * H;
  const int64_t last = past + s;
  const int64_t first = p.local_window > 0 && last + 1 > p.local_window ? last + 1 - p.local_window : 0;

  constexpr int kMaxPasses = 2;  // head_size <= 2 * kThreads (checked on the host)
  float acc[kMaxPasses] = {0.f, 0.f};
  float m = -INFINITY, l = 0.f;
  for (int64_t c0 = first; c0 <= last; c0 += kThreads) {
    const int64_t j = c0 + t;
    float score = -INFINITY;
    if (j <= last) {
      const T* kj = keys + j * H;
      float dot = 0.f;
      for (int i = 0; i < H; ++i) dot = __fmaf_rn(q[i], ToF(kj[i]), dot);
      score = __fmul_rn(dot, p.scale);
      if (p.softcap > 0.f) score = __fmul_rn(p.softcap, tanhf(__fdiv_rn(score, p.softcap)));
    }
    const float m_new = fmaxf(m, BlockReduce<true>(scratch, score));
    const float e = j <= last ? expf(__fsub_rn(score, m_new)) : 0.f;
    const float rescale = m == -INFINITY ? 0.f : expf(__fsub_rn(m, m_new));
    l = __fmaf_rn(l, rescale, BlockReduce<false>(scratch, e));
    weight[t] = e;
    __syncthreads();
    const int n = static_cast<int>(last - c0 + 1 < kThreads ? last - c0 + 1 : kThreads);
    for (int pass = 0; pass < kMaxPasses; ++pass) {
      const int i = t + pass * kThreads;
      if (i >= H) break;
      float a = __fmul_rn(acc[pass], rescale);
      for (int jj = 0; jj < n; ++jj) a = __fmaf_rn(weight[jj], ToF(values[(c0 + jj) * H + i]), a);
      acc[pass] = a;
    }
    __syncthreads();  // weight[] is rewritten by the next chunk
    m = m_new;
  }
  float extra = 1.f;  // smooth softmax: the denominator also counts a logit 0
  if (p.smooth_softmax) {
    const float m_final = fmaxf(m, 0.f);
    extra = expf(__fsub_rn(m, m_final));
    l = __fmaf_rn(l, extra, expf(-m_final));
  }
  for (int pass = 0; pass < kMaxPasses; ++pass) {
    const int i = t + pass * kThreads;
    if (i < H) out[i] = FromF<T>(__fdiv_rn(__fmul_rn(acc[pass], extra), l));
  }
}

template <typename T>
const char* Launch(const GroupQueryAttentionProblem& p, const GqaParams& prm, cudaStream_t stream) {
  const int64_t rows = p.share_buffer ? p.seq : p.present_len;
  const dim3 fill(static_cast<unsigned>(p.batch * p.kv_num_heads), static_cast<unsigned>(rows < 65535 ? rows : 65535));
  FillKernel<T><<<fill, kFillThreads, 0, stream>>>(prm);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return cudaGetErrorString(err);
  const dim3 attend(static_cast<unsigned>(p.batch * p.num_heads), static_cast<unsigned>(p.seq));
  AttendKernel<T><<<attend, kThreads, static_cast<size_t>(p.head_size) * sizeof(float), stream>>>(prm);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return cudaGetErrorString(err);
  return nullptr;
}

}  // namespace

const char* GroupQueryAttentionCudaUnsupported(int64_t head_size) {
  if (head_size < 1 || head_size > 2 * kThreads) return "the CUDA kernel supports head sizes from 1 to 256";
  return nullptr;
}

const char* GroupQueryAttentionCuda(const GroupQueryAttentionProblem& p, void* stream) {
  if (const char* why = GroupQueryAttentionCudaUnsupported(p.head_size)) return why;
  if (p.batch <= 0) return nullptr;
  if (p.batch * p.num_heads > 0x7FFFFFFFLL || p.seq > 65535)
    return "batch x num_heads, or the call's tokens (at most 65535), too large for the CUDA kernel's grid";
  GqaParams prm{};
  prm.query = p.query;
  prm.key = p.key;
  prm.value = p.value;
  prm.past_key = p.past_key;
  prm.past_value = p.past_value;
  prm.seqlens_k = p.seqlens_k;
  prm.output = p.output;
  prm.present_key = p.present_key;
  prm.present_value = p.present_value;
  prm.batch = p.batch;
  prm.seq = p.seq;
  prm.past_len = p.past_len;
  prm.present_len = p.present_len;
  prm.local_window = p.local_window;
  prm.num_heads = static_cast<int>(p.num_heads);
  prm.kv_num_heads = static_cast<int>(p.kv_num_heads);
  prm.head_size = static_cast<int>(p.head_size);
  prm.scale = p.scale;
  prm.softcap = p.softcap;
  prm.share_buffer = p.share_buffer;
  prm.smooth_softmax = p.smooth_softmax;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.type) {
    case FloatType::kFloat32: return Launch<float>(p, prm, s);
    case FloatType::kFloat16: return Launch<__half>(p, prm, s);
    case FloatType::kBFloat16: return Launch<__nv_bfloat16>(p, prm, s);
  }
  return "internal error: unknown element type";
}

}  // namespace ort_mtp
