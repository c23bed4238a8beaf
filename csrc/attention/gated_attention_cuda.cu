// CUDA kernel of GatedAttention (gated_attention.cc has the definition, gated_attention.h the launcher's
// contract). PrepareKernel: one block per (token, head) of q, k and v: a head's RMS norm (a fixed
// butterfly then the warps' sums in order, so a token's bits depend on that token alone), the weight,
// rounding to T, then the rotary, rounding to T, into the scratch; v heads are copied. Then
// GroupQueryAttentionCuda (its width-consistent passes for S <= 16). GateKernel: output *= sigmoid(gate)
// element by element. float32 arithmetic (the CPU op's is double): the two differ by float32 rounding.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "attention/gated_attention.h"
#include "common/cuda_numeric.cuh"

namespace ort_mtp {
namespace {

using cuda::FromF;
using cuda::RoundTo;
using cuda::ToF;

constexpr int kMaxHead = 256;

struct Params {
  const void* qkv;
  const int64_t* position_ids;
  const float* cos_cache;
  const float* sin_cache;
  const void* q_weight;
  const void* k_weight;
  void* q;
  void* k;
  void* v;
  void* output;
  int64_t tokens;  // B * S
  int64_t max_position;
  int nq, nkv, head_size, rotary_dim, layout;
  int section[3];
  float epsilon;
};

// The position stream (0 t, 1 h, 2 w) of cos/sin column `col`: ORT's MRotaryEmbedding assignment.
__device__ __forceinline__ int StreamOf(int col, const Params& p) {
  if (p.layout == 0) return col < p.section[0] ? 0 : col < p.section[0] + p.section[1] ? 1 : 2;
  if (col % 3 == 1 && col < 3 * p.section[1]) return 1;
  if (col % 3 == 2 && col < 3 * p.section[2]) return 2;
  return 0;
}

template <typename T>
__global__ void PrepareKernel(Params p) {
  const int64_t token = blockIdx.x;
  const int head = blockIdx.y, tid = threadIdx.x, H = p.head_size;
  const int64_t width = 2LL * (p.nq + p.nkv) * H;
  const T* row = static_cast<const T*>(p.qkv) + token * width;
  const T* x;
  const T* w;
  T* out;
  if (head < p.nq) {
    x = row + 2LL * head * H;
    w = static_cast<const T*>(p.q_weight);
    out = static_cast<T*>(p.q) + (token * p.nq + head) * H;
  } else if (head < p.nq + p.nkv) {
    const int kh = head - p.nq;
    x = row + 2LL * p.nq * H + static_cast<int64_t>(kh) * H;
    w = static_cast<const T*>(p.k_weight);
    out = static_cast<T*>(p.k) + (token * p.nkv + kh) * H;
  } else {
    const int vh = head - p.nq - p.nkv;
    const T* src = row + 2LL * p.nq * H + static_cast<int64_t>(p.nkv + vh) * H;
    if (tid < H) (static_cast<T*>(p.v) + (token * p.nkv + vh) * H)[tid] = src[tid];
    return;
  }
  __shared__ float normed[kMaxHead];
  __shared__ float warp_sums[kMaxHead / 32];
  const float xi = tid < H ? ToF(x[tid]) : 0.f;
  float sq = xi * xi;
  for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xFFFFFFFFu, sq, o);
  if ((tid & 31) == 0) warp_sums[tid >> 5] = sq;
  __syncthreads();
  float total = 0.f;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) total += warp_sums[i];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(H) + p.epsilon);
  if (tid < H) normed[tid] = RoundTo<T>(xi * inv * ToF(w[tid]));
  __syncthreads();
  if (tid >= H) return;
  const int half = p.rotary_dim / 2;
  float y = normed[tid];
  if (tid < p.rotary_dim) {
    const int col = tid < half ? tid : tid - half;
    const int64_t pos = p.position_ids[StreamOf(col, p) * p.tokens + token];
    if (pos < 0 || pos >= p.max_position) {
      y = NAN;
    } else {
      const float c = p.cos_cache[pos * half + col], s = p.sin_cache[pos * half + col];
      y = tid < half ? normed[tid] * c - normed[tid + half] * s : normed[tid] * c + normed[tid - half] * s;
    }
  }
  out[tid] = FromF<T>(y);
}

template <typename T>
__global__ void GateKernel(Params p) {
  const int64_t H = p.head_size, per_token = static_cast<int64_t>(p.nq) * H;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.tokens * per_token) return;
  const int64_t token = i / per_token, r = i % per_token, h = r / H, j = r % H;
  const T* gate = static_cast<const T*>(p.qkv) + token * 2 * (p.nq + p.nkv) * H + 2 * h * H + H + j;
  T* o = static_cast<T*>(p.output) + i;
  *o = FromF<T>(ToF(*o) / (1.0f + expf(-ToF(*gate))));
}

template <typename T>
const char* Launch(GatedAttentionProblem& prob, Params& p, cudaStream_t stream) {
  const GroupQueryAttentionProblem& g = prob.gqa;
  const int64_t q_elems = p.tokens * p.nq * p.head_size, kv_elems = p.tokens * p.nkv * p.head_size;
  void* scratch = nullptr;
  if (const char* why = StreamScratch(stream, kScratchGatedQkv, (q_elems + 2 * kv_elems) * sizeof(T), &scratch))
    return why;
  T* base = static_cast<T*>(scratch);
  p.q = base;
  p.k = base + q_elems;
  p.v = base + q_elems + kv_elems;
  const int threads = 32 * ((p.head_size + 31) / 32);
  PrepareKernel<T><<<dim3(static_cast<unsigned>(p.tokens), static_cast<unsigned>(p.nq + 2 * p.nkv)), threads, 0,
                     stream>>>(p);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return cudaGetErrorString(err);
  prob.gqa.query = p.q;
  prob.gqa.key = p.k;
  prob.gqa.value = p.v;
  if (const char* why = GroupQueryAttentionCuda(prob.gqa, stream)) return why;
  p.output = g.output;
  const int64_t total = q_elems;
  if (total > 0) {
    GateKernel<T><<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(p);
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return cudaGetErrorString(err);
  }
  return nullptr;
}

}  // namespace

const char* GatedAttentionCuda(GatedAttentionProblem prob, void* stream) {
  const GroupQueryAttentionProblem& g = prob.gqa;
  if (g.head_size < 1 || g.head_size > kMaxHead) return "the CUDA kernel supports head sizes from 1 to 256";
  const int64_t tokens = g.batch * g.seq;
  if (tokens <= 0) return nullptr;
  if (tokens > 0x7FFFFFFFLL || g.num_heads + 2 * g.kv_num_heads > 65535 || tokens * g.num_heads * g.head_size / 256 > 0x7FFFFFFFLL)
    return "the call has too many tokens or heads for the CUDA kernel's grid";
  Params p{};
  p.qkv = prob.qkv;
  p.position_ids = prob.position_ids;
  p.cos_cache = prob.cos_cache;
  p.sin_cache = prob.sin_cache;
  p.q_weight = prob.q_norm_weight;
  p.k_weight = prob.k_norm_weight;
  p.tokens = tokens;
  p.max_position = prob.max_position;
  p.nq = static_cast<int>(g.num_heads);
  p.nkv = static_cast<int>(g.kv_num_heads);
  p.head_size = static_cast<int>(g.head_size);
  p.rotary_dim = static_cast<int>(prob.rotary_dim);
  p.layout = prob.mrope_layout;
  for (int i = 0; i < 3; ++i) p.section[i] = static_cast<int>(prob.mrope_section[i]);
  p.epsilon = prob.epsilon;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (g.type) {
    case FloatType::kFloat32: return Launch<float>(prob, p, s);
    case FloatType::kFloat16: return Launch<__half>(prob, p, s);
    case FloatType::kBFloat16: return Launch<__nv_bfloat16>(prob, p, s);
  }
  return "internal error: unknown element type";
}

}  // namespace ort_mtp
