// CUDA kernel of GatedDeltaNet: the whole linear-attention mixer of one layer in two launches (no
// allocation, no host synchronisation, capturable in a CUDA graph): the recurrence, then a finishing
// kernel that applies the gated RMSNorm to its output and writes the conv state.
//
// GdnKernel: one block per (batch, v head, group of `cols` state columns), looping over the call's
// tokens in order. A column j of the dk x dv state evolves on its own (r_j = S[:, j] . k, delta_j,
// S[:, j] += k delta_j, o_j = S[:, j] . q), so the columns are split over blocks: the 27B-class layer
// (Hv = 48, dv = 128) runs 48 x 2 blocks of 64 columns. Thread (cp, rg)
// of warp w owns columns j0 = c0 + 2 (4 w + cp) and j0 + 1 (c0: the block's first column), rows
// i = 8 ii + rg (ii < kRows), in float32 registers for the whole call (lane = 8 cp + rg: a column's 8 row
// groups are 8 lanes of one warp; 32 cols / 8 threads). Per chunk of up to kChunk tokens the block first
// computes, in shared memory, what the recurrence reads (the causal conv + SiLU of its q/k head's
// channels and of its v columns, the l2 norms and q scale, the gates; every block of a head computes the
// same q and k by the same code), then runs the gated delta rule token by token:
//   S *= exp(g);  r = S^T k;  S += k (beta (v - r))^T;  o = S^T q
// and writes o, rounded to T (the subgraph's LinearAttention output), into y. FinishKernel then does
// y = GatedRMSNorm(o) * silu(z) per (batch, token, v head) row, one warp per row, and writes present_conv.
// Every sum has one order, fixed by dk and dv alone (not by the width, nor by `cols`): a thread's rows in
// ascending ii over four interleaved accumulators ((a0 + a1) + (a2 + a3)), then the 8 row groups by a
// shuffle butterfly (xor 1, 2, 4); the l2 norms by a warp (lanes' strided partial sums, butterfly xor
// 16..1); the RMS over dv likewise. Every operation on the data path is an explicit round-to-nearest
// intrinsic (__fmaf_rn, __fmul_rn, ...), so the compiler cannot contract or reassociate it differently
// in different code paths.
//
// Rounding points are those of the CPU kernel (gated_delta_net_cpu.cc) and the com.microsoft subgraph:
// conv output, normed k, normed q and scaled q, g, beta, o and y are rounded to T; the state is rounded
// to its stored type after every token, and the rounded value is what the next token computes with, as
// a width-1 call that stores it and the next call that loads it. Token t's y row and the state after
// token t therefore do not depend on the call's width: a width-S call is bit-identical to S width-1
// calls (tests/gpu/cases_gated_delta_net.py checks it). The CUDA results differ from the CPU kernel's
// (which computes in double) by float32 rounding, which can flip a rounding to T by one unit.
//
// In place (present bound to past): each thread reads its own elements of the past recurrent slot into
// registers before it writes anything, and writes exactly those elements of every slot it stores (the
// zero slots below W - S included; they are never the slot read). So no thread, and no block, reads
// what another writes. The conv state is different: a q/k head's channels are read by every block of
// its v heads, so no block may overwrite them while another may still read them: FinishKernel writes
// present_conv after GdnKernel has finished (stream order), one thread per (batch, channel), each
// reading its channel's past slot before writing it over.
//
// ORT_MTP_GDN_COLS (8, 16, 32, 64 or 128; read once per process) sets the columns per block, a speed
// knob only: a column's arithmetic is the same in any block.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/cuda_numeric.cuh"
#include "gated_delta_net/gated_delta_net.h"

namespace ort_mtp {
namespace {

constexpr int kMaxHeadDim = kGdnCudaMaxHeadDim;  // dk and dv
constexpr int kChunk = 8;                         // tokens whose features are staged in shared memory at once
constexpr int kMaxWarps = kMaxHeadDim / 8;        // 8 columns per warp
constexpr int kMaxThreads = kMaxWarps * 32;
constexpr unsigned kFull = 0xffffffffu;

struct GdnParams {
  const void* qkv;
  const void* z;
  const void* a;
  const void* b;
  const void* conv_weight;
  const void* conv_bias;  // nullptr: none
  const void* dt_bias;
  const void* neg_exp_a;
  const void* norm_weight;
  const void* past_conv;       // the slot read: [B, C, L]
  const void* past_recurrent;  // the slot read: [B, Hv, dk, dv]
  void* y;
  void* present_conv;       // [slots, B, C, L]
  void* present_recurrent;  // [slots, B, Hv, dk, dv]
  int64_t batch, seq;
  int hk, hv, dk, dv, kernel, slots;
  int cols, col_blocks;  // state columns per block (a multiple of 8), blocks per (batch, v head)
  float scale, epsilon, l2norm_epsilon;
  int dt_bias_type, neg_exp_a_type;  // FloatType
  bool pair_access;  // dv even and the recurrent state buffers aligned for 2-element accesses
};

using cuda::FromF;
using cuda::ToF;
using cuda::RoundTo;

__device__ __forceinline__ float LoadAny(const void* p, int type, int i) {
  switch (type) {
    case static_cast<int>(FloatType::kFloat16): return ToF(static_cast<const __half*>(p)[i]);
    case static_cast<int>(FloatType::kBFloat16): return ToF(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

__device__ __forceinline__ float Sigmoid(float x) { return __fdiv_rn(1.f, __fadd_rn(1.f, expf(-x))); }
__device__ __forceinline__ float Silu(float x) { return __fmul_rn(x, Sigmoid(x)); }
// log(1 + e^x) without overflow for large x.
__device__ __forceinline__ float Softplus(float x) {
  return x > 0.f ? __fadd_rn(x, log1pf(expf(-x))) : log1pf(expf(x));
}

// Causal conv + SiLU of channel c at token t of batch b, rounded to T. Inputs before the call's first
// token come from the past conv state, whose last position holds token -1.
template <typename T>
__device__ float ConvSilu(const GdnParams& p, int64_t b, int64_t t, int64_t c) {
  const int K = p.kernel, L = K - 1;
  const int64_t C = 2LL * p.hk * p.dk + static_cast<int64_t>(p.hv) * p.dv;
  const T* qkv = static_cast<const T*>(p.qkv);
  const T* past = static_cast<const T*>(p.past_conv) + (b * C + c) * L;
  const T* w = static_cast<const T*>(p.conv_weight) + c * K;
  float acc = p.conv_bias ? ToF(static_cast<const T*>(p.conv_bias)[c]) : 0.f;
  for (int j = 0; j < K; ++j) {
    const int64_t pos = t - (K - 1) + j;
    const float x = pos >= 0 ? ToF(qkv[(b * p.seq + pos) * C + c]) : ToF(past[L + pos]);
    acc = __fmaf_rn(ToF(w[j]), x, acc);
  }
  return RoundTo<T>(Silu(acc));
}

// Two adjacent state elements (columns j and j + 1 of one row), by one 4- or 8-byte access where `pair`
// says both exist and the address is aligned for it, else element by element.
__device__ __forceinline__ void LoadPair(const float* p, bool pair, bool second, float& lo, float& hi) {
  if (pair) {
    const float2 v = *reinterpret_cast<const float2*>(p);
    lo = v.x;
    hi = v.y;
  } else {
    lo = p[0];
    hi = second ? p[1] : 0.f;
  }
}
__device__ __forceinline__ void LoadPair(const __half* p, bool pair, bool second, float& lo, float& hi) {
  if (pair) {
    const __half2 v = *reinterpret_cast<const __half2*>(p);
    lo = __low2float(v);
    hi = __high2float(v);
  } else {
    lo = __half2float(p[0]);
    hi = second ? __half2float(p[1]) : 0.f;
  }
}
__device__ __forceinline__ void LoadPair(const __nv_bfloat16* p, bool pair, bool second, float& lo, float& hi) {
  if (pair) {
    const __nv_bfloat162 v = *reinterpret_cast<const __nv_bfloat162*>(p);
    lo = __low2float(v);
    hi = __high2float(v);
  } else {
    lo = __bfloat162float(p[0]);
    hi = second ? __bfloat162float(p[1]) : 0.f;
  }
}
__device__ __forceinline__ void StorePair(float* p, bool pair, bool second, float lo, float hi) {
  if (pair) {
    *reinterpret_cast<float2*>(p) = make_float2(lo, hi);
  } else {
    p[0] = lo;
    if (second) p[1] = hi;
  }
}
__device__ __forceinline__ void StorePair(__half* p, bool pair, bool second, __half lo, __half hi) {
  if (pair) {
    *reinterpret_cast<__half2*>(p) = __halves2half2(lo, hi);
  } else {
    p[0] = lo;
    if (second) p[1] = hi;
  }
}
__device__ __forceinline__ void StorePair(__nv_bfloat16* p, bool pair, bool second, __nv_bfloat16 lo,
                                          __nv_bfloat16 hi) {
  if (pair) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __halves2bfloat162(lo, hi);
  } else {
    p[0] = lo;
    if (second) p[1] = hi;
  }
}

// Sum over the 8 row groups of a column (lanes that differ in their low 3 bits), as a butterfly: every
// lane of the group ends with the same bits (each step adds the same two values, x + y == y + x).
__device__ __forceinline__ float SumRowGroups(float v) {
  v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 1));
  v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 2));
  return __fadd_rn(v, __shfl_xor_sync(kFull, v, 4));
}

// T: activations, weights, y; S: the recurrent state's type (T or float); kRows: state rows per
// thread, 8 kRows >= dk. Thread layout: lane = 8 cp + rg, warp w; the thread owns columns j0 = c0 + 2 (4 w
// + cp) and j0 + 1, rows i = 8 ii + rg (ii < kRows). p.pair_access: dv is even and the state buffers are
// aligned for 2-element accesses.
template <typename T, typename S, int kRows>
__global__ void __launch_bounds__(kMaxThreads) GdnKernel(const GdnParams p) {
  __shared__ float sh_q[kChunk][kMaxHeadDim];
  __shared__ float sh_k[kChunk][kMaxHeadDim];
  __shared__ float sh_v[kChunk][kMaxHeadDim];  // the block's columns, from 0
  __shared__ float sh_g[kChunk];
  __shared__ float sh_beta[kChunk];

  const int tid = threadIdx.x, nthreads = blockDim.x, warp = tid >> 5, lane = tid & 31, nwarps = nthreads >> 5;
  const int64_t task = blockIdx.x / p.col_blocks;  // b * Hv + h
  const int c0 = static_cast<int>(blockIdx.x % p.col_blocks) * p.cols;
  const int dk = p.dk, dv = p.dv;
  const int cols = dv - c0 < p.cols ? dv - c0 : p.cols;  // this block's columns
  const int rg = lane & 7, jl = 2 * (warp * 4 + (lane >> 3)), j0 = c0 + jl;
  const bool col0 = jl < cols, col1 = jl + 1 < cols;
  const bool pair = p.pair_access && col1;
  const int64_t b = task / p.hv;
  const int h = static_cast<int>(task % p.hv);
  const int hk = h / (p.hv / p.hk);  // repeat_interleave, as HF and ORT
  const int64_t head = static_cast<int64_t>(dk) * dv;
  const int64_t slot_stride = p.batch * p.hv * head;
  const int64_t key_dim = static_cast<int64_t>(p.hk) * dk, value_dim = static_cast<int64_t>(p.hv) * dv;

  // This thread's elements of the past state, before anything is written (present may alias past).
  float st0[kRows], st1[kRows];
  {
    const S* past = static_cast<const S*>(p.past_recurrent) + task * head;
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
      const int i = ii * 8 + rg;
      st0[ii] = 0.f;
      st1[ii] = 0.f;
      if (col0 && i < dk) LoadPair(past + i * dv + j0, pair, col1, st0[ii], st1[ii]);
    }
  }
  S* present = static_cast<S*>(p.present_recurrent) + task * head;
  // Slots before the call's first token hold zeros (never the slot read: that is slot slots - 1).
  for (int64_t slot = 0; slot < p.slots - p.seq; ++slot) {
    const S zero = FromF<S>(0.f);
#pragma unroll
    for (int ii = 0; ii < kRows; ++ii) {
      const int i = ii * 8 + rg;
      if (col0 && i < dk) StorePair(present + slot * slot_stride + i * dv + j0, pair, col1, zero, zero);
    }
  }

  const float dt_bias = LoadAny(p.dt_bias, p.dt_bias_type, h);
  const float neg_exp_a = LoadAny(p.neg_exp_a, p.neg_exp_a_type, h);
  const T* a = static_cast<const T*>(p.a);
  const T* bg = static_cast<const T*>(p.b);
  T* y = static_cast<T*>(p.y);
  const int channels = 2 * dk + cols;

  for (int64_t t0 = 0; t0 < p.seq; t0 += kChunk) {
    const int n = static_cast<int>(p.seq - t0 < kChunk ? p.seq - t0 : kChunk);
    __syncthreads();  // the previous chunk's recurrence has read its features

    // Features of the chunk's tokens: conv + SiLU of the q head's and k head's channels and of the
    // block's v columns.
    for (int idx = tid; idx < n * channels; idx += nthreads) {
      const int tt = idx / channels, cl = idx % channels;
      int64_t c;
      float* dst;
      if (cl < dk) {
        c = hk * dk + cl;
        dst = &sh_q[tt][cl];
      } else if (cl < 2 * dk) {
        c = key_dim + hk * dk + (cl - dk);
        dst = &sh_k[tt][cl - dk];
      } else {
        c = 2 * key_dim + static_cast<int64_t>(h) * dv + c0 + (cl - 2 * dk);
        dst = &sh_v[tt][cl - 2 * dk];
      }
      *dst = ConvSilu<T>(p, b, t0 + tt, c);
    }
    // LinearAttentionGate: g = neg_exp_A softplus(a + dt_bias), beta = sigmoid(b), each rounded to T.
    if (tid < n) {
      const int64_t gi = (b * p.seq + t0 + tid) * p.hv + h;
      sh_g[tid] = RoundTo<T>(__fmul_rn(neg_exp_a, Softplus(__fadd_rn(ToF(a[gi]), dt_bias))));
      sh_beta[tid] = RoundTo<T>(Sigmoid(ToF(bg[gi])));
    }
    __syncthreads();

    // LpNormalization of q and k per token (one warp per vector), rounded to T; q then scaled and
    // rounded again (the subgraph's Mul).
    for (int v = warp; v < 2 * n; v += nwarps) {
      const bool is_q = v < n;
      float* x = is_q ? sh_q[v] : sh_k[v - n];
      float ss = 0.f;
      for (int i = lane; i < dk; i += 32) ss = __fmaf_rn(x[i], x[i], ss);
#pragma unroll
      for (int m = 16; m >= 1; m >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(kFull, ss, m));
      const float norm = __fsqrt_rn(__fadd_rn(ss, p.l2norm_epsilon));
      for (int i = lane; i < dk; i += 32) {
        float e = norm > 0.f ? RoundTo<T>(__fdiv_rn(x[i], norm)) : 0.f;
        if (is_q) e = RoundTo<T>(__fmul_rn(e, p.scale));
        x[i] = e;
      }
    }
    __syncthreads();

    // The gated delta rule, token by token.
    for (int tt = 0; tt < n; ++tt) {
      const int64_t t = t0 + tt;
      const int64_t row = b * p.seq + t;
      const float decay = expf(sh_g[tt]);
      const float beta = sh_beta[tt];
      const float v0 = col0 ? sh_v[tt][jl] : 0.f;
      const float v1 = col1 ? sh_v[tt][jl + 1] : 0.f;
      const float* kt = sh_k[tt];
      const float* qt = sh_q[tt];

      // S *= exp(g); r = S^T k  (per column: four accumulators over ascending ii, then the row groups)
      float r0a[4] = {0.f, 0.f, 0.f, 0.f}, r1a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii) {
        const int i = ii * 8 + rg;
        if (i < dk) {
          const float k = kt[i];
          st0[ii] = __fmul_rn(st0[ii], decay);
          st1[ii] = __fmul_rn(st1[ii], decay);
          r0a[ii & 3] = __fmaf_rn(st0[ii], k, r0a[ii & 3]);
          r1a[ii & 3] = __fmaf_rn(st1[ii], k, r1a[ii & 3]);
        }
      }
      const float r0 = SumRowGroups(__fadd_rn(__fadd_rn(r0a[0], r0a[1]), __fadd_rn(r0a[2], r0a[3])));
      const float r1 = SumRowGroups(__fadd_rn(__fadd_rn(r1a[0], r1a[1]), __fadd_rn(r1a[2], r1a[3])));
      const float delta0 = __fmul_rn(beta, __fsub_rn(v0, r0));
      const float delta1 = __fmul_rn(beta, __fsub_rn(v1, r1));

      // S += k delta^T; o = S^T q
      float o0a[4] = {0.f, 0.f, 0.f, 0.f}, o1a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii) {
        const int i = ii * 8 + rg;
        if (i < dk) {
          const float k = kt[i], q = qt[i];
          st0[ii] = __fmaf_rn(k, delta0, st0[ii]);
          st1[ii] = __fmaf_rn(k, delta1, st1[ii]);
          o0a[ii & 3] = __fmaf_rn(q, st0[ii], o0a[ii & 3]);
          o1a[ii & 3] = __fmaf_rn(q, st1[ii], o1a[ii & 3]);
        }
      }
      const float o0 = SumRowGroups(__fadd_rn(__fadd_rn(o0a[0], o0a[1]), __fadd_rn(o0a[2], o0a[3])));
      const float o1 = SumRowGroups(__fadd_rn(__fadd_rn(o1a[0], o1a[1]), __fadd_rn(o1a[2], o1a[3])));
      // LinearAttention's output tensor, normed by FinishKernel.
      if (rg == 0) {
        T* yrow = y + row * value_dim + static_cast<int64_t>(h) * dv;
        if (col0) yrow[j0] = FromF<T>(o0);
        if (col1) yrow[j0 + 1] = FromF<T>(o1);
      }

      // The state as stored between calls: the next token starts from exactly that.
      const int64_t slot = t - (p.seq - p.slots);
      S* out = slot >= 0 ? present + slot * slot_stride : nullptr;
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii) {
        const int i = ii * 8 + rg;
        const S s0 = FromF<S>(st0[ii]), s1 = FromF<S>(st1[ii]);
        st0[ii] = ToF(s0);
        st1[ii] = ToF(s1);
        if (out != nullptr && col0 && i < dk) StorePair(out + i * dv + j0, pair, col1, s0, s1);
      }
    }
  }
}

constexpr int kFinishThreads = 256;
constexpr int kNormRowsPerBlock = kFinishThreads / 32;  // one warp per (batch, token, v head) row

// The first conv_blocks blocks: present_conv. Slot s holds the last K - 1 inputs of each channel up to
// token S - slots + s, oldest first; zeros where that token is before the call's first. One thread per
// (batch, channel). Slot slots - 1 is the one that may alias the past slot read; it is written last,
// position by position in ascending order, and position q reads past position S + q > q (or qkv), never
// one already written.
// The other blocks: GatedRMSNorm(o, norm_weight, z) of y's rows in place: ss = sum of o^2 (each lane
// over j = lane, lane + 32, ... ascending, then a butterfly xor 16..1), y = o / sqrt(ss / dv + eps) * w *
// silu(z), each step rounded as in the CPU kernel, y rounded to T.
template <typename T>
__global__ void __launch_bounds__(kFinishThreads) FinishKernel(const GdnParams p, unsigned conv_blocks) {
  if (blockIdx.x < conv_blocks) {
    const int64_t C = 2LL * p.hk * p.dk + static_cast<int64_t>(p.hv) * p.dv;
    const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (idx >= p.batch * C) return;
    const int64_t b = idx / C, c = idx % C;
    const int L = p.kernel - 1;
    const T* past = static_cast<const T*>(p.past_conv) + (b * C + c) * L;
    const T* qkv = static_cast<const T*>(p.qkv) + b * p.seq * C + c;
    for (int s = 0; s < p.slots; ++s) {
      const int64_t t = p.seq - p.slots + s;  // the last token this slot has seen
      T* out = static_cast<T*>(p.present_conv) + ((s * p.batch + b) * C + c) * L;
      for (int q = 0; q < L; ++q) {
        const int64_t pos = t - (L - 1) + q;  // token held at position q
        out[q] = t < 0 ? FromF<T>(0.f) : pos >= 0 ? qkv[pos * C] : past[L + pos];
      }
    }
    return;
  }
  const int64_t row = static_cast<int64_t>(blockIdx.x - conv_blocks) * kNormRowsPerBlock + (threadIdx.x >> 5);
  if (row >= p.batch * p.seq * p.hv) return;  // a whole warp leaves together
  const int lane = threadIdx.x & 31, dv = p.dv;
  const int64_t offset = row * dv;  // rows of [B, S, Hv] in order; each dv long
  T* y = static_cast<T*>(p.y) + offset;
  const T* z = static_cast<const T*>(p.z) + offset;
  const T* norm_weight = static_cast<const T*>(p.norm_weight);
  float ss = 0.f;
  for (int j = lane; j < dv; j += 32) {
    const float o = ToF(y[j]);
    ss = __fmaf_rn(o, o, ss);
  }
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) ss = __fadd_rn(ss, __shfl_xor_sync(kFull, ss, m));
  const float inv_rms = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(dv)), p.epsilon)));
  for (int j = lane; j < dv; j += 32)
    y[j] = FromF<T>(__fmul_rn(__fmul_rn(__fmul_rn(ToF(y[j]), inv_rms), ToF(norm_weight[j])), Silu(ToF(z[j]))));
}

template <typename T, typename S>
void LaunchMain(const GdnParams& prm, unsigned blocks, unsigned threads, cudaStream_t stream) {
  if (prm.dk <= 16) {
    GdnKernel<T, S, 2><<<blocks, threads, 0, stream>>>(prm);
  } else if (prm.dk <= 32) {
    GdnKernel<T, S, 4><<<blocks, threads, 0, stream>>>(prm);
  } else if (prm.dk <= 64) {
    GdnKernel<T, S, 8><<<blocks, threads, 0, stream>>>(prm);
  } else {
    GdnKernel<T, S, 16><<<blocks, threads, 0, stream>>>(prm);
  }
}

template <typename T>
const char* Launch(const GatedDeltaNetProblem& p, const GdnParams& prm, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(p.batch * p.num_v_heads * prm.col_blocks);
  const unsigned threads = static_cast<unsigned>(32 * (prm.cols / 8));
  if (p.state_type == FloatType::kFloat32) {
    LaunchMain<T, float>(prm, blocks, threads, stream);
  } else {
    LaunchMain<T, T>(prm, blocks, threads, stream);
  }
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return cudaGetErrorString(err);
  const unsigned conv_blocks =
      p.conv_kernel > 1 ? static_cast<unsigned>((p.batch * p.conv_dim() + kFinishThreads - 1) / kFinishThreads) : 0;
  const unsigned norm_blocks =
      static_cast<unsigned>((p.batch * p.seq * p.num_v_heads + kNormRowsPerBlock - 1) / kNormRowsPerBlock);
  FinishKernel<T><<<conv_blocks + norm_blocks, kFinishThreads, 0, stream>>>(prm, conv_blocks);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return cudaGetErrorString(err);
  return nullptr;
}

// Columns per block: ORT_MTP_GDN_COLS if set (8, 16, 32, 64 or 128), else 64: the fastest on an H200
// for the 27B-class layer at every width 1..8 (bench/results/2026-12-02-gdn-cuda-default: 14.8 us at
// S = 1 against 15.9 with 32 and 18.4 with 128; 8 and 16 are slower, each block recomputing the head's
// q and k features with fewer threads). nullptr error when valid.
struct ColsChoice {
  int cols = 64;
  const char* error = nullptr;
};
ColsChoice ColumnsPerBlock() {
  static const ColsChoice choice = [] {
    ColsChoice c;
    if (const char* v = std::getenv("ORT_MTP_GDN_COLS"); v && *v) {
      const int n = std::atoi(v);
      if ((n == 8 || n == 16 || n == 32 || n == 64 || n == 128) && std::strlen(v) <= 3) {
        c.cols = n;
      } else {
        c.error = "environment variable ORT_MTP_GDN_COLS must be 8, 16, 32, 64 or 128";
      }
    }
    return c;
  }();
  return choice;
}

}  // namespace

const char* GatedDeltaNetCudaUnsupported(int64_t k_head_dim, int64_t v_head_dim) {
  if (k_head_dim < 1 || k_head_dim > kMaxHeadDim || v_head_dim < 1 || v_head_dim > kMaxHeadDim)
    return "the CUDA kernel supports k_head_dim and v_head_dim from 1 to 128";
  return nullptr;
}

const char* GatedDeltaNetCuda(const GatedDeltaNetProblem& p, void* stream) {
  if (const char* error = GatedDeltaNetCudaUnsupported(p.k_head_dim, p.v_head_dim)) return error;
  if (p.batch <= 0 || p.seq <= 0) return nullptr;
  const ColsChoice choice = ColumnsPerBlock();
  if (choice.error) return choice.error;
  const int64_t dv8 = (p.v_head_dim + 7) / 8 * 8;
  const int cols = static_cast<int>(dv8 < choice.cols ? dv8 : choice.cols);
  const int64_t col_blocks = (p.v_head_dim + cols - 1) / cols;
  if (p.batch * p.num_v_heads * col_blocks > 0x7FFFFFFFLL ||
      (p.batch * p.conv_dim() + kFinishThreads - 1) / kFinishThreads +
              (p.batch * p.seq * p.num_v_heads + kNormRowsPerBlock - 1) / kNormRowsPerBlock >
          0x7FFFFFFFLL)
    return "batch x num_v_heads (or batch x conv_dim, or batch x S x num_v_heads) too large for the CUDA kernel's grid";
  if (p.slots < 1 || p.slots > 0x7FFFFFFFLL || p.conv_kernel < 1 || p.conv_kernel > 0x7FFFFFFFLL)
    return "internal error: bad slot count or conv kernel size";
  GdnParams prm{};
  prm.qkv = p.qkv;
  prm.z = p.z;
  prm.a = p.a;
  prm.b = p.b;
  prm.conv_weight = p.conv_weight;
  prm.conv_bias = p.conv_bias;
  prm.dt_bias = p.dt_bias;
  prm.neg_exp_a = p.neg_exp_a;
  prm.norm_weight = p.norm_weight;
  prm.past_conv = p.past_conv;
  prm.past_recurrent = p.past_recurrent;
  prm.y = p.y;
  prm.present_conv = p.present_conv;
  prm.present_recurrent = p.present_recurrent;
  prm.batch = p.batch;
  prm.seq = p.seq;
  prm.hk = static_cast<int>(p.num_k_heads);
  prm.hv = static_cast<int>(p.num_v_heads);
  prm.dk = static_cast<int>(p.k_head_dim);
  prm.dv = static_cast<int>(p.v_head_dim);
  prm.kernel = static_cast<int>(p.conv_kernel);
  prm.slots = static_cast<int>(p.slots);
  prm.cols = cols;
  prm.col_blocks = static_cast<int>(col_blocks);
  prm.scale = p.scale;
  prm.epsilon = p.epsilon;
  prm.l2norm_epsilon = p.l2norm_epsilon;
  prm.dt_bias_type = static_cast<int>(p.dt_bias_type);
  prm.neg_exp_a_type = static_cast<int>(p.neg_exp_a_type);
  const size_t state_size = p.state_type == FloatType::kFloat32 ? 4 : 2;
  const uintptr_t state_addresses =
      reinterpret_cast<uintptr_t>(p.past_recurrent) | reinterpret_cast<uintptr_t>(p.present_recurrent);
  prm.pair_access = p.v_head_dim % 2 == 0 && state_addresses % (2 * state_size) == 0;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.type) {
    case FloatType::kFloat32: return Launch<float>(p, prm, s);
    case FloatType::kFloat16: return Launch<__half>(p, prm, s);
    case FloatType::kBFloat16: return Launch<__nv_bfloat16>(p, prm, s);
  }
  return "internal error: unknown element type";
}

}  // namespace ort_mtp
