// CUDA kernel of GatedDeltaNet: the whole linear-attention mixer of one layer (no allocation, no host
// synchronisation, capturable in a CUDA graph): GdnKernel (conv features, l2 norms, gates, the
// recurrence, y's GatedRMSNorm), then FinishKernel (present_conv; y's norm only where no block or
// cluster holds a whole row of o).
//
// WHAT BOUNDS IT. One block per (batch, v head, group of `cols` state columns): 96 blocks of 320 threads
// for the 27B-class layer (Hv = 48, dv = 128, 64 columns) on 132 SMs, one block per SM, so each SM runs
// ~10 warps through a chain of dependent steps (loads -> conv -> norm -> recurrence -> norm -> stores).
// It moves ~1.5 MB of state per slot and does almost no arithmetic, so neither bandwidth nor FLOPs
// bound it: the time is the length of one warp's instruction stream times its stall per instruction.
// Nsight Compute on the first kernel (bench/results/2026-12-02-gdn-speed) counted ~2270 instructions
// per warp at S = 1, most of them index arithmetic (integer divisions for the block -> head mapping and
// in every per-element loop, 64-bit offsets, bounds checks) and serial global-load round trips. The
// design below therefore (1) issues every global load of a phase before using any (one memory round trip
// for the conv inputs, gates and norm inputs; the past state by cp.async into shared memory while the
// features are computed), (2) takes the block's head from a 3D grid and, for the 27B-class shape,
// instantiates the same code with dk, dv, K and cols as constants (GdnKernel<..., 128, 128, 4, 64>), so
// that index arithmetic folds away, and (3) moves whole 16-byte pieces of state rows (zero slots,
// stored slots) through a shared-memory stage instead of 2-element accesses strided by a row.
//
// THE PHASES of GdnKernel, per chunk of up to kChunk tokens (S = 1..8: one chunk):
//   features: thread tid holds one channel: q channel tid (tid < kpad = dk rounded up to 32), k channel
//     tid - kpad, or the block's v column tid - 2 kpad. It loads its conv weights, bias and the chunk's
//     window of inputs (past conv state, then qkv) at once, computes conv + SiLU for each token, rounded
//     to T. q and k: each warp sums its lanes' squares by a butterfly (xor 16..1), lane 0 stores the
//     warp's sum; after a barrier each lane adds its vector's warp sums in ascending order, takes the l2
//     norm and rounds (q then scaled and rounded again). One thread per token computes the gates.
//   recurrence: thread (cp, rg) of state warp w (w < cols / 8) owns columns jl = 2 (4 w + cp) and jl + 1
//     of the block, rows i = 8 ii + rg (ii < kRows), in float32 registers for the whole call (read from
//     the staged past state). Per token: S *= exp(g); r = S^T k; S += k (beta (v - r))^T; o = S^T q, each
//     column sum over the thread's rows in ascending ii into four interleaved accumulators ((a0 + a1) +
//     (a2 + a3)), then the 8 row groups by a butterfly (xor 1, 2, 4). o is rounded to T into shared
//     memory; the state is rounded to S and, for a token whose slot is stored, written to the stage and
//     copied to that present slot in 16-byte pieces.
//   y: GatedRMSNorm of each token's o row by one warp (NormRow: ss over j = lane + 32 m ascending, a
//     butterfly, y = o / sqrt(ss / dv + eps) * w * silu(z)). Where the block holds all dv columns
//     (cols >= dv) it reads its own o; where 2..8 blocks share the row (64 columns: 2) they are launched
//     as a thread-block cluster (sm_90) and the warp reads the other blocks' o through distributed shared
//     memory between two cluster barriers; otherwise (16 blocks, or before sm_90) GdnKernel writes o into
//     y and FinishKernel norms the rows. All three run NormRow on the same values.
// Every sum has one order, fixed by dk and dv alone (not by the width, nor by `cols`, nor by which of the
// two instantiations runs), and every operation on the data path is an explicit round-to-nearest
// intrinsic (__fmaf_rn, __fmul_rn, ...), so no path can contract or reassociate it differently.
//
// Rounding points are those of the CPU kernel (gated_delta_net_cpu.cc) and the com.microsoft subgraph:
// conv output, normed k, normed q and scaled q, g, beta, o and y are rounded to T; the state is rounded
// to its stored type after every token, and the rounded value is what the next token computes with, as
// a width-1 call that stores it and the next call that loads it. Token t's y row and the state after
// token t therefore do not depend on the call's width: a width-S call is bit-identical to S width-1
// calls (tests/gpu/cases_gated_delta_net.py checks it). The CUDA results differ from the CPU kernel's
// (which computes in double) by float32 rounding, which can flip a rounding to T by one unit.
//
// In place (present bound to past). Recurrent state: a block reads only its own region of the past slot
// (the stage copy completes before the barrier that ends the features), and writes that region of a
// present slot only after later barriers; the zero slots below W - S are never the slot read. So no
// block reads what another writes. Conv state: a q/k head's channels are read by every block of its v
// heads, so FinishKernel writes present_conv, one thread per (batch, channel), each loading every value
// its slots hold before it stores any. It is launched with programmatic dependent launch where the
// device has it (sm_90): GdnKernel triggers it once each block has consumed its reads of past_conv (after
// the first chunk's features), so its blocks run while the recurrence runs; each of its threads then
// waits for GdnKernel to complete before it exits (or, for y's norm, before it reads o), so that what
// follows on the stream sees both kernels' writes. (A profile that sums kernel durations counts that
// overlap twice.) Without it, FinishKernel runs after GdnKernel in stream order.
//
// ORT_MTP_GDN_COLS (8, 16, 32, 64 or 128; read once per process) sets the columns per block, a speed
// knob only: a column's arithmetic is the same in any block, and y's norm is the same function in every
// mode.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <type_traits>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "common/cuda_numeric.cuh"
#include "common/cuda_pdl.cuh"
#include "gated_delta_net/gated_delta_net.h"

namespace ort_mtp {
namespace {

constexpr int kMaxHeadDim = kGdnCudaMaxHeadDim;  // dk and dv
constexpr int kChunk = 8;                         // tokens whose features are staged in shared memory at once
constexpr int kMaxThreads = 4 * kMaxHeadDim;      // 8 columns per warp (128 columns: 16 warps)
constexpr int kFastKernel = 8;                    // conv kernels up to this: every input loaded at once
constexpr int kWindow = kFastKernel - 1 + kChunk;  // conv inputs of a chunk's tokens, per channel
constexpr int kMaxClusterBlocks = 8;              // the portable cluster size
constexpr unsigned kFull = 0xffffffffu;

// How y's GatedRMSNorm is done: by FinishKernel (the row is split over blocks that share no memory), by
// the block (it owns all dv columns), or by the blocks of a thread-block cluster (sm_90: they read each
// other's o through distributed shared memory). The same arithmetic in the same order in all three.
enum NormMode : int { kNormFinish = 0, kNormBlock = 1, kNormCluster = 2 };

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
  int norm_mode;                     // NormMode
  uint64_t group_magic;              // h -> h / (Hv / Hk) as (h * group_magic) >> 32 (exact for h < 2^16)
  bool vec_state;  // the recurrent state's block rows can be moved in 16-byte pieces (sizes and addresses)
  // FinishKernel lets the next launch on the stream start at its top rather than at its exit
  // (ORT_MTP_GDN_FINISH_TRIGGER=1, read once; off by default: correct, no gain measured end to end,
  // bench/results/2026-12-05-gdn-finish-trigger-cuda).
  bool finish_trigger_first;
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

// Causal conv + SiLU of channel c at token t of batch b, rounded to T, one tap after the other (the
// general path, K > kFastKernel; the fast path does the same operations in the same order). Inputs
// before the call's first token come from the past conv state, whose last position holds token -1.
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

// Two adjacent state elements of one row (8-byte aligned for float, 4 for 16 bits); pack rounds each to
// S (round to nearest even, as FromF), in one instruction for 16-bit types.
template <typename S>
struct Pair;
template <>
struct Pair<float> {
  using type = float2;
  static __device__ float2 pack(float lo, float hi) { return make_float2(lo, hi); }
  static __device__ float lo(float2 v) { return v.x; }
  static __device__ float hi(float2 v) { return v.y; }
};
template <>
struct Pair<__half> {
  using type = __half2;
  static __device__ __half2 pack(float lo, float hi) { return __floats2half2_rn(lo, hi); }
  static __device__ float lo(__half2 v) { return __low2float(v); }
  static __device__ float hi(__half2 v) { return __high2float(v); }
};
template <>
struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __nv_bfloat162 pack(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
  static __device__ float lo(__nv_bfloat162 v) { return __low2float(v); }
  static __device__ float hi(__nv_bfloat162 v) { return __high2float(v); }
};

// 16 bytes global -> shared without a register round trip (cp.async, sm_80+), completed by
// CopyAsyncWait before the next barrier.
__device__ __forceinline__ void CopyAsync16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem) : "memory");
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}
__device__ __forceinline__ void CopyAsyncWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

using cuda::GridDependencyTrigger;  // programmatic dependent launch: common/cuda_pdl.cuh
using cuda::GridDependencyWait;

// Thread-block cluster (sm_90; only launched as a cluster there): a barrier over all threads of the
// cluster's blocks (release / acquire: shared-memory writes before it are visible to every block
// after it), and a load from the shared memory of block `rank` of the cluster at the address that
// `local` has in this block's.
__device__ __forceinline__ void ClusterSync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
#else
  __syncthreads();
#endif
}
__device__ __forceinline__ float LoadClusterShared(const float* local, unsigned rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(local));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(addr), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(remote) : "memory");
  return v;
#else
  return *local;
#endif
}

// A block's region of one state slot (rows < dk, its `ncols` columns; row stride dv in global memory,
// `sstride` elements in shared memory), moved by all threads: 16-byte pieces where `vec` (the sizes and
// addresses allow it), else element by element. In: global -> shared (asynchronous in 16-byte pieces).
// Out: shared -> global, or zeros when `stage` is nullptr.
// Row i, piece k of this thread's u-th piece (u = tid, tid + nthreads, ...) of a region of `units`
// pieces per row, stepped without a division per piece.
struct PieceWalk {
  int i, k, di, dk, units;
  __device__ __forceinline__ PieceWalk(int units_, int nthreads) : units(units_) {
    const int tid = threadIdx.x;
    i = tid / units;
    k = tid - i * units;
    di = nthreads / units;
    dk = nthreads - di * units;
  }
  __device__ __forceinline__ void next() {
    i += di;
    k += dk;
    if (k >= units) k -= units, ++i;
  }
};
template <typename S>
__device__ __forceinline__ void RegionIn(S* stage, int sstride, const S* g, int dv, int rows, int ncols, bool vec,
                                         int nthreads) {
  constexpr int kPer = 16 / sizeof(S);
  const int per = vec ? kPer : 1;
  for (PieceWalk w(ncols / per, nthreads); w.i < rows; w.next()) {
    if (vec) {
      CopyAsync16(stage + w.i * sstride + w.k * kPer, g + static_cast<int64_t>(w.i) * dv + w.k * kPer);
    } else {
      stage[w.i * sstride + w.k] = g[static_cast<int64_t>(w.i) * dv + w.k];
    }
  }
}
template <typename S>
__device__ __forceinline__ void RegionOut(const S* stage, int sstride, S* g, int dv, int rows, int ncols, bool vec,
                                          int nthreads) {
  constexpr int kPer = 16 / sizeof(S);
  const int per = vec ? kPer : 1;
  for (PieceWalk w(ncols / per, nthreads); w.i < rows; w.next()) {
    if (vec) {
      const uint4 v =
          stage ? *reinterpret_cast<const uint4*>(stage + w.i * sstride + w.k * kPer) : make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(g + static_cast<int64_t>(w.i) * dv + w.k * kPer) = v;
    } else {
      g[static_cast<int64_t>(w.i) * dv + w.k] = stage ? stage[w.i * sstride + w.k] : FromF<S>(0.f);
    }
  }
}

// Sum over the 8 row groups of a column (lanes that differ in their low 3 bits), as a butterfly: every
// lane of the group ends with the same bits (each step adds the same two values, x + y == y + x).
__device__ __forceinline__ float SumRowGroups(float v) {
  v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 1));
  v = __fadd_rn(v, __shfl_xor_sync(kFull, v, 2));
  return __fadd_rn(v, __shfl_xor_sync(kFull, v, 4));
}
__device__ __forceinline__ float SumWarp(float v) {
#pragma unroll
  for (int m = 16; m >= 1; m >>= 1) v = __fadd_rn(v, __shfl_xor_sync(kFull, v, m));
  return v;
}

// GatedRMSNorm of one (batch, token, v head) row by one warp: lane holds o, z and the norm weight of
// columns j = lane + 32 m (m < 4, j < dv; o already rounded to T). ss = sum of o^2, each lane over its
// columns in ascending order, then a butterfly xor 16..1; y = o / sqrt(ss / dv + eps) * w * silu(z),
// each step rounded as in the CPU kernel, y rounded to T. The only code that norms a row, whichever
// kernel or block runs it.
template <typename T>
__device__ __forceinline__ void NormRow(const float (&o)[4], const float (&z)[4], const float (&w)[4], int lane,
                                        int dv, float epsilon, T* yrow) {
  float ss = 0.f;
#pragma unroll
  for (int m = 0; m < 4; ++m)
    if (lane + 32 * m < dv) ss = __fmaf_rn(o[m], o[m], ss);
  ss = SumWarp(ss);
  const float inv_rms = __fdiv_rn(1.f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, static_cast<float>(dv)), epsilon)));
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int j = lane + 32 * m;
    if (j < dv) yrow[j] = FromF<T>(__fmul_rn(__fmul_rn(__fmul_rn(o[m], inv_rms), w[m]), Silu(z[m])));
  }
}
template <typename T>
__device__ __forceinline__ void LoadNormInputs(const T* zrow, const T* norm_weight, int lane, int dv, float (&z)[4],
                                               float (&w)[4]) {
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int j = lane + 32 * m;
    z[m] = j < dv ? ToF(zrow[j]) : 0.f;
    w[m] = j < dv ? ToF(norm_weight[j]) : 0.f;
  }
}

// T: activations, weights, y; S: the recurrent state's type (T or float); kRows: state rows per
// thread, 8 kRows >= dk. See the file's comment for the layout and the phases.
// Threads of a block: 4 per state column (8 columns per warp), and at least one per feature channel
// (q and k each padded to whole warps, then the block's v columns).
__host__ __device__ constexpr int BlockThreads(int dk, int cols) {
  return ((2 * ((dk + 31) / 32 * 32) + cols > 4 * cols ? 2 * ((dk + 31) / 32 * 32) + cols : 4 * cols) + 31) / 32 * 32;
}

// kDk, kDv, kK, kCols: the shape at compile time (the 27B-class layer's), or 0: from p at run time.
// Both instantiations run this same code, so they compute the same values in the same order; constants
// only remove index arithmetic (integer divisions, bounds checks), which is what bounds this
// latency-bound kernel.
template <typename T, typename S, int kRows, int kDk = 0, int kDv = 0, int kK = 0, int kCols = 0>
__global__ void __launch_bounds__(kMaxThreads) GdnKernel(const GdnParams p) {
  extern __shared__ __align__(16) unsigned char sh_dyn[];
  S* const stage = reinterpret_cast<S*>(sh_dyn);  // [dk][sstride]: the block's columns of one state slot
  __shared__ float sh_q[kChunk][kMaxHeadDim];
  __shared__ float sh_k[kChunk][kMaxHeadDim];
  __shared__ float sh_v[kChunk][kMaxHeadDim];  // the block's columns, from 0
  __shared__ float sh_o[kChunk][kMaxHeadDim];  // o rounded to T, the block's columns, from 0
  __shared__ float sh_part[2 * kMaxHeadDim / 32][kChunk];  // per warp: its lanes' sum of squares
  __shared__ float sh_g[kChunk];
  __shared__ float sh_beta[kChunk];

  constexpr bool kStatic = kDk && kDv && kK && kCols;
  const int dk = kDk ? kDk : p.dk, dv = kDv ? kDv : p.dv, pcols = kCols ? kCols : p.cols;
  const int nthreads = kStatic ? BlockThreads(kDk, kCols) : static_cast<int>(blockDim.x);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, nwarps = nthreads >> 5;
  // Grid: x = the block's group of columns (the cluster rank), y = v head, z = batch row.
  const int rank = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int64_t task = static_cast<int64_t>(b) * p.hv + h;
  const int c0 = rank * pcols;
  // This block's columns (all blocks have pcols when it divides dv).
  const int cols = kStatic && kDv % (kCols ? kCols : 1) == 0 ? kCols : dv - c0 < pcols ? dv - c0 : pcols;
  const int hk = static_cast<int>((static_cast<uint64_t>(h) * p.group_magic) >> 32);  // h / (Hv / Hk), as HF and ORT
  const int kpad = (dk + 31) & ~31;
  const int rg = lane & 7, jl = 2 * (warp * 4 + (lane >> 3));
  const bool state_warp = warp < (pcols >> 3);
  const bool col0 = jl < cols, col1 = jl + 1 < cols;
  const int64_t head = static_cast<int64_t>(dk) * dv;
  const int64_t slot_stride = p.batch * p.hv * head;
  const int64_t key_dim = static_cast<int64_t>(p.hk) * dk, value_dim = static_cast<int64_t>(p.hv) * dv;
  const int64_t C = 2 * key_dim + value_dim;
  const int sstride = pcols + static_cast<int>(16 / sizeof(S));
  const int64_t seq = p.seq;

  // The block's region of the past state -> shared memory (in flight during the features), and the
  // zero slots below W - S (never the slot read; written by 16-byte stores from every thread).
  const S* past = static_cast<const S*>(p.past_recurrent) + task * head + c0;
  S* const present = static_cast<S*>(p.present_recurrent) + task * head + c0;
  RegionIn(stage, sstride, past, dv, dk, cols, p.vec_state, nthreads);

  // This thread's feature channel: q channel tid (tid < kpad), k channel tid - kpad (tid < 2 kpad), or
  // the block's v column tid - 2 kpad; lanes past dk (or past the block's columns) have none.
  int role = 3, ch = 0;  // 0 q, 1 k, 2 v, 3 none
  int64_t c = 0;
  if (tid < kpad) {
    ch = tid;
    if (ch < dk) role = 0, c = static_cast<int64_t>(hk) * dk + ch;
  } else if (tid < 2 * kpad) {
    ch = tid - kpad;
    if (ch < dk) role = 1, c = key_dim + static_cast<int64_t>(hk) * dk + ch;
  } else {
    ch = tid - 2 * kpad;
    if (ch < cols) role = 2, c = 2 * key_dim + static_cast<int64_t>(h) * dv + c0 + ch;
  }
  const bool qk_warp = tid < 2 * kpad;  // whole warps (kpad is a multiple of 32)
  const int K = kK ? kK : p.kernel, L = K - 1;
  const T* qkv_c = static_cast<const T*>(p.qkv) + static_cast<int64_t>(b) * seq * C + c;
  const T* past_c = static_cast<const T*>(p.past_conv) + (static_cast<int64_t>(b) * C + c) * L;
  const T* w_c = static_cast<const T*>(p.conv_weight) + c * K;
  const T* a = static_cast<const T*>(p.a);
  const T* bg = static_cast<const T*>(p.b);
  const T* z = static_cast<const T*>(p.z);
  const T* norm_weight = static_cast<const T*>(p.norm_weight);
  T* const y = static_cast<T*>(p.y);
  // Rows of y normed here: token tt by block tt % nb, warp (tt / nb) % nwarps.
  const bool norm_here = p.norm_mode != kNormFinish;
  const int nb = p.norm_mode == kNormCluster ? (kStatic ? kDv / kCols : p.col_blocks) : 1;
  float dt_bias = 0.f, neg_exp_a = 0.f;
  if (tid < kChunk) {
    dt_bias = LoadAny(p.dt_bias, p.dt_bias_type, h);
    neg_exp_a = LoadAny(p.neg_exp_a, p.neg_exp_a_type, h);
  }

  float st0[kRows], st1[kRows];  // this thread's state elements, float32, for the whole call
#pragma unroll
  for (int ii = 0; ii < kRows; ++ii) st0[ii] = st1[ii] = 0.f;

  for (int64_t t0 = 0; t0 < seq; t0 += kChunk) {
    const int n = static_cast<int>(seq - t0 < kChunk ? seq - t0 : kChunk);
    if (t0 > 0) __syncthreads();  // the previous chunk has read its features and o

    // Every global load of the chunk's features is issued before any is used: one memory round trip.
    float a_in = 0.f, b_in = 0.f;
    if (tid < n) {
      const int64_t gi = (static_cast<int64_t>(b) * seq + t0 + tid) * p.hv + h;
      a_in = ToF(a[gi]);
      b_in = ToF(bg[gi]);
    }
    const int tt_norm = rank + nb * warp;  // the first token this warp norms
    float zr[4], wr[4];
    if (norm_here && tt_norm < n)
      LoadNormInputs(z + (static_cast<int64_t>(b) * seq + t0 + tt_norm) * value_dim + static_cast<int64_t>(h) * dv,
                     norm_weight, lane, dv, zr, wr);
    // Inputs of the chunk's conv windows: x[m] is token t0 - L + m (the past conv state before token 0).
    const bool fast = role != 3 && K <= kFastKernel;
    float x[kWindow], wt[kFastKernel], bias = 0.f;
#pragma unroll
    for (int m = 0; m < kWindow; ++m) x[m] = 0.f;
    if (fast) {
#pragma unroll
      for (int m = 0; m < kWindow; ++m) {
        if (m >= L + n) break;
        const int64_t pos = t0 - L + m;
        x[m] = ToF(pos >= 0 ? qkv_c[pos * C] : past_c[L + pos]);
      }
    }
#pragma unroll
    for (int j = 0; j < kFastKernel; ++j) wt[j] = fast && j < K ? ToF(w_c[j]) : 0.f;
    if (fast && p.conv_bias) bias = ToF(static_cast<const T*>(p.conv_bias)[c]);
    if (t0 == 0) {  // issued while the loads above are in flight
      for (int64_t slot = 0; slot < p.slots - seq; ++slot)
        RegionOut<S>(nullptr, sstride, present + slot * slot_stride, dv, dk, cols, p.vec_state, nthreads);
    }
    float feat[kChunk];
#pragma unroll
    for (int tt = 0; tt < kChunk; ++tt) feat[tt] = 0.f;
#pragma unroll
    for (int tt = 0; tt < kChunk; ++tt) {
      if (tt >= n) break;
      if (fast) {
        float acc = bias;
#pragma unroll
        for (int j = 0; j < kFastKernel; ++j)
          if (j < K) acc = __fmaf_rn(wt[j], x[tt + j], acc);
        feat[tt] = RoundTo<T>(Silu(acc));
      } else if (role != 3) {  // K > kFastKernel: tap after tap, the same operations
        feat[tt] = ConvSilu<T>(p, b, t0 + tt, c);
      }
    }
    // LinearAttentionGate: g = neg_exp_A softplus(a + dt_bias), beta = sigmoid(b), each rounded to T.
    if (tid < n) {
      sh_g[tid] = RoundTo<T>(__fmul_rn(neg_exp_a, Softplus(__fadd_rn(a_in, dt_bias))));
      sh_beta[tid] = RoundTo<T>(Sigmoid(b_in));
    }
    if (role == 2) {
#pragma unroll
      for (int tt = 0; tt < kChunk; ++tt) {
        if (tt >= n) break;
        sh_v[tt][ch] = feat[tt];
      }
    }
    // Sums of squares for the l2 norms: each warp of q (k) channels over its lanes by a butterfly.
    if (qk_warp) {
#pragma unroll
      for (int tt = 0; tt < kChunk; ++tt) {
        if (tt >= n) break;
        const float sq = SumWarp(role != 3 ? __fmul_rn(feat[tt], feat[tt]) : 0.f);
        if (lane == 0) sh_part[warp][tt] = sq;
      }
    }
    if (t0 == 0) CopyAsyncWait();  // this thread's pieces of the past state
    __syncthreads();
    // Every block has now read all it reads of past_conv (only the first chunk's windows do): the
    // finishing kernel may start (and overwrite it).
    if (t0 == 0) GridDependencyTrigger();

    // LpNormalization of q and k per token: ss over the vector's warps in ascending order, rounded to
    // T; q then scaled and rounded again (the subgraph's Mul).
    if (role == 0 || role == 1) {
      const int w0 = role == 0 ? 0 : kpad / 32, nw = kpad / 32;
#pragma unroll
      for (int tt = 0; tt < kChunk; ++tt) {
        if (tt >= n) break;
        float ss = sh_part[w0][tt];
        for (int w = 1; w < nw; ++w) ss = __fadd_rn(ss, sh_part[w0 + w][tt]);
        const float norm = __fsqrt_rn(__fadd_rn(ss, p.l2norm_epsilon));
        const float e = norm > 0.f ? RoundTo<T>(__fdiv_rn(feat[tt], norm)) : 0.f;
        if (role == 0) {
          sh_q[tt][ch] = RoundTo<T>(__fmul_rn(e, p.scale));
        } else {
          sh_k[tt][ch] = e;
        }
      }
    }
    __syncthreads();
    if (t0 == 0 && state_warp) {  // this thread's elements of the past state, from the staged copy
#pragma unroll
      for (int ii = 0; ii < kRows; ++ii) {
        const int i = ii * 8 + rg;
        if (i < dk && col1) {
          const auto v = *reinterpret_cast<const typename Pair<S>::type*>(stage + i * sstride + jl);
          st0[ii] = Pair<S>::lo(v);
          st1[ii] = Pair<S>::hi(v);
        } else if (i < dk && col0) {
          st0[ii] = ToF(stage[i * sstride + jl]);
        }
      }
    }

    // The gated delta rule, token by token.
    for (int tt = 0; tt < n; ++tt) {
      const int64_t t = t0 + tt;
      if (state_warp) {
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
        if (rg == 0) {  // LinearAttention's output, rounded to T
          if (col0) sh_o[tt][jl] = RoundTo<T>(o0);
          if (col1) sh_o[tt][jl + 1] = RoundTo<T>(o1);
        }
        // The state as stored between calls: the next token starts from exactly that.
#pragma unroll
        for (int ii = 0; ii < kRows; ++ii) {
          const auto v = Pair<S>::pack(st0[ii], st1[ii]);
          st0[ii] = Pair<S>::lo(v);
          st1[ii] = Pair<S>::hi(v);
        }
      }
      const int64_t slot = t - (seq - p.slots);
      if (slot >= 0) {  // the same for the whole block
        __syncthreads();  // the previous slot's copy (or the past state's read) has left `stage`
        if (state_warp) {
#pragma unroll
          for (int ii = 0; ii < kRows; ++ii) {
            const int i = ii * 8 + rg;
            if (i < dk && col1) {
              *reinterpret_cast<typename Pair<S>::type*>(stage + i * sstride + jl) = Pair<S>::pack(st0[ii], st1[ii]);
            } else if (i < dk && col0) {
              stage[i * sstride + jl] = FromF<S>(st0[ii]);
            }
          }
        }
        __syncthreads();
        RegionOut(stage, sstride, present + slot * slot_stride, dv, dk, cols, p.vec_state, nthreads);
      }
    }

    // y's rows of the chunk: normed here (the block, or the cluster, holds all dv columns of o), else
    // o rounded to T for FinishKernel to norm.
    if (p.norm_mode == kNormFinish) {
      __syncthreads();
      for (int idx = tid; idx < n * cols; idx += nthreads) {
        const int tt = idx / cols, jj = idx - tt * cols;
        y[(static_cast<int64_t>(b) * seq + t0 + tt) * value_dim + static_cast<int64_t>(h) * dv + c0 + jj] =
            FromF<T>(sh_o[tt][jj]);
      }
    } else {
      const bool cluster = p.norm_mode == kNormCluster;
      if (cluster) {
        ClusterSync();  // every block's o of the chunk is in its shared memory
      } else {
        __syncthreads();
      }
      for (int tt = tt_norm; tt < n; tt += nb * nwarps) {
        const int64_t row = static_cast<int64_t>(b) * seq + t0 + tt;
        if (tt != tt_norm) LoadNormInputs(z + row * value_dim + static_cast<int64_t>(h) * dv, norm_weight, lane, dv, zr, wr);
        float o[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const int j = lane + 32 * m;
          o[m] = 0.f;
          if (j < dv) {
            const int owner = j / pcols;
            o[m] = cluster && owner != rank ? LoadClusterShared(&sh_o[tt][j - owner * pcols], owner)
                                            : sh_o[tt][j - owner * pcols];
          }
        }
        NormRow<T>(o, zr, wr, lane, dv, p.epsilon, y + row * value_dim + static_cast<int64_t>(h) * dv);
      }
      if (cluster) ClusterSync();  // no block overwrites (or leaves) its o while another may read it
    }
  }
}

constexpr int kFinishThreads = 256;
constexpr int kNormRowsPerBlock = kFinishThreads / 32;  // one warp per (batch, token, v head) row
constexpr int kConvWindow = 16;                         // slots + K - 2 up to this: loaded at once

// The first conv_blocks blocks: present_conv. Slot s holds the last K - 1 inputs of each channel up to
// token S - slots + s, oldest first; zeros where that token is before the call's first. One thread per
// (batch, channel), which loads every input its slots hold before it writes any: slot slots - 1 may
// alias the past slot read, and no other thread reads this channel. Launched after GdnKernel: where
// programmatic dependent launch runs (sm_90), it starts once every GdnKernel block has read past_conv
// (GdnKernel triggers after its first chunk's features), so it overlaps the recurrence; it then waits
// for GdnKernel to complete, so that what follows on the stream sees both kernels' writes.
// The other blocks (norm mode kNormFinish only): GatedRMSNorm of y's rows in place (NormRow), after
// GdnKernel has written o into them.
// With p.finish_trigger_first every block triggers first: the next kernel on the stream (the out
// projection's matmul, launched with programmatic dependent launch) may then start issuing its weight
// copies while this kernel runs; it still reads y only after its own wait, which waits for this kernel's
// completion (and this kernel for GdnKernel's), so the trigger moves no result.
template <typename T>
__global__ void __launch_bounds__(kFinishThreads) FinishKernel(const GdnParams p, unsigned conv_blocks) {
  if (p.finish_trigger_first) GridDependencyTrigger();  // uniform branch: no divergence
  if (blockIdx.x < conv_blocks) {  // grid y: batch row
    const int64_t C = 2LL * p.hk * p.dk + static_cast<int64_t>(p.hv) * p.dv;
    const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, b = blockIdx.y;
    if (c < C) {
      const int L = p.kernel - 1;
      const T* past = static_cast<const T*>(p.past_conv) + (b * C + c) * L;
      const T* qkv = static_cast<const T*>(p.qkv) + b * p.seq * C + c;
      T* const out = static_cast<T*>(p.present_conv) + (b * C + c) * L;
      const int64_t slot_stride = p.batch * C * L;
      const T zero = FromF<T>(0.f);
      const int nwin = p.slots + L - 1;  // tokens first .. S - 1 are what the slots hold
      const int64_t first = p.seq - p.slots - L + 1;
      if (nwin <= kConvWindow) {
        T x[kConvWindow];
#pragma unroll
        for (int m = 0; m < kConvWindow; ++m) {
          const int64_t pos = first + m;
          x[m] = m < nwin && pos >= -L ? (pos >= 0 ? qkv[pos * C] : past[L + pos]) : zero;
        }
        // Value m is position q = m - s of slot s (s + q = m).
#pragma unroll
        for (int m = 0; m < kConvWindow; ++m) {
          if (m < nwin) {
            const int s_lo = m - L + 1 > 0 ? m - L + 1 : 0, s_hi = m < p.slots - 1 ? m : p.slots - 1;
            for (int s = s_lo; s <= s_hi; ++s)
              out[s * slot_stride + (m - s)] = p.seq - p.slots + s < 0 ? zero : x[m];
          }
        }
      } else {
        for (int s = 0; s < p.slots; ++s) {
          const int64_t t = p.seq - p.slots + s;  // the last token this slot has seen
          for (int q = 0; q < L; ++q) {
            const int64_t pos = t - (L - 1) + q;  // token held at position q
            out[s * slot_stride + q] = t < 0 ? zero : pos >= 0 ? qkv[pos * C] : past[L + pos];
          }
        }
      }
    }
    GridDependencyWait();
    return;
  }
  const int64_t row = static_cast<int64_t>(blockIdx.x - conv_blocks) * kNormRowsPerBlock + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31, dv = p.dv;
  const bool valid = blockIdx.y == 0 && row < p.batch * p.seq * p.hv;  // a whole warp together
  const int64_t offset = row * dv;  // rows of [B, S, Hv] in order; each dv long
  float z[4], w[4], o[4];
  if (valid) LoadNormInputs(static_cast<const T*>(p.z) + offset, static_cast<const T*>(p.norm_weight), lane, dv, z, w);
  GridDependencyWait();  // o is GdnKernel's
  if (!valid) return;
  T* y = static_cast<T*>(p.y) + offset;
#pragma unroll
  for (int m = 0; m < 4; ++m) o[m] = lane + 32 * m < dv ? ToF(y[lane + 32 * m]) : 0.f;
  NormRow<T>(o, z, w, lane, dv, p.epsilon, y);
}

// The staging buffer: dk rows of (cols + 16 bytes) state elements; at most 128 x (128 x 4 + 16) bytes.
constexpr int kMaxStageBytes = kMaxHeadDim * (kMaxHeadDim * 4 + 16);

template <typename T, typename S, int kRows, int kDk = 0, int kDv = 0, int kK = 0, int kCols = 0>
const char* LaunchMainKernel(const GdnParams& prm, dim3 grid, unsigned threads, size_t smem, cudaStream_t stream) {
  auto kernel = GdnKernel<T, S, kRows, kDk, kDv, kK, kCols>;
  static std::atomic<uint64_t> configured{0};  // one bit per device: the shared-memory limit raised
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return cudaGetErrorString(err);
  const uint64_t bit = device < 64 ? (1ull << device) : 0;
  if (bit == 0 || !(configured.load(std::memory_order_acquire) & bit)) {
    if (const cudaError_t err =
            cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxStageBytes);
        err != cudaSuccess)
      return cudaGetErrorString(err);
    configured.fetch_or(bit, std::memory_order_acq_rel);
  }
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = static_cast<unsigned>(prm.col_blocks);
  attr.val.clusterDim.y = 1;
  attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = prm.norm_mode == kNormCluster ? 1 : 0;
  if (const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, prm); err != cudaSuccess)
    return cudaGetErrorString(err);
  return nullptr;
}

// The 27B-class layer (dk = dv = 128, K = 4, 64 or 128 columns per block, state in T) runs an
// instantiation with its shape as constants; every other shape the general one (the same code).
template <typename T, typename S>
const char* LaunchMain(const GdnParams& prm, dim3 grid, unsigned threads, size_t smem, cudaStream_t stream) {
  if constexpr (!std::is_same_v<T, float> && std::is_same_v<S, T>) {
    if (prm.dk == 128 && prm.dv == 128 && prm.kernel == 4) {
      if (prm.cols == 64) return LaunchMainKernel<T, S, 16, 128, 128, 4, 64>(prm, grid, threads, smem, stream);
      if (prm.cols == 128) return LaunchMainKernel<T, S, 16, 128, 128, 4, 128>(prm, grid, threads, smem, stream);
    }
  }
  if (prm.dk <= 16) return LaunchMainKernel<T, S, 2>(prm, grid, threads, smem, stream);
  if (prm.dk <= 32) return LaunchMainKernel<T, S, 4>(prm, grid, threads, smem, stream);
  if (prm.dk <= 64) return LaunchMainKernel<T, S, 8>(prm, grid, threads, smem, stream);
  return LaunchMainKernel<T, S, 16>(prm, grid, threads, smem, stream);
}

template <typename T>
const char* Launch(const GatedDeltaNetProblem& p, const GdnParams& prm, bool pdl, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(prm.col_blocks), static_cast<unsigned>(p.num_v_heads),
                  static_cast<unsigned>(p.batch));
  const unsigned threads = static_cast<unsigned>(BlockThreads(prm.dk, prm.cols));
  const size_t state_size = p.state_type == FloatType::kFloat32 ? 4 : 2;
  const size_t smem = static_cast<size_t>(prm.dk) * (prm.cols * state_size + 16);
  const char* error = p.state_type == FloatType::kFloat32 ? LaunchMain<T, float>(prm, grid, threads, smem, stream)
                                                         : LaunchMain<T, T>(prm, grid, threads, smem, stream);
  if (error) return error;
  const unsigned conv_blocks =
      p.conv_kernel > 1 ? static_cast<unsigned>((p.conv_dim() + kFinishThreads - 1) / kFinishThreads) : 0;
  const unsigned norm_blocks =
      prm.norm_mode == kNormFinish
          ? static_cast<unsigned>((p.batch * p.seq * p.num_v_heads + kNormRowsPerBlock - 1) / kNormRowsPerBlock)
          : 0;
  if (conv_blocks + norm_blocks == 0) return nullptr;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(conv_blocks + norm_blocks, conv_blocks ? static_cast<unsigned>(p.batch) : 1, 1);
  cfg.blockDim = dim3(kFinishThreads, 1, 1);
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  if (const cudaError_t err = cudaLaunchKernelEx(&cfg, FinishKernel<T>, prm, conv_blocks); err != cudaSuccess)
    return cudaGetErrorString(err);
  return nullptr;
}

// Columns per block: ORT_MTP_GDN_COLS if set (8, 16, 32, 64 or 128), else 64. nullptr error when valid.
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
  if (p.batch > 65535 || p.num_v_heads > 65535 ||
      (p.conv_dim() + kFinishThreads - 1) / kFinishThreads +
              (p.batch * p.seq * p.num_v_heads + kNormRowsPerBlock - 1) / kNormRowsPerBlock >
          0x7FFFFFFFLL)
    return "batch or num_v_heads over 65535 (or batch x S x num_v_heads too large) for the CUDA kernel's grid";
  if (p.slots < 1 || p.slots > 0x7FFFFFFFLL || p.conv_kernel < 1 || p.conv_kernel > 0x7FFFFFFFLL)
    return "internal error: bad slot count or conv kernel size";
  const int major = cuda::DeviceMajor();
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
  const uint64_t group = static_cast<uint64_t>(p.num_v_heads / p.num_k_heads);
  prm.group_magic = (uint64_t{1} << 32) / group + 1;  // floor(h / group) for h, group < 2^16
  prm.norm_mode = col_blocks == 1                                     ? kNormBlock
                  : major >= 9 && col_blocks <= kMaxClusterBlocks ? kNormCluster
                                                                      : kNormFinish;
  const size_t state_size = p.state_type == FloatType::kFloat32 ? 4 : 2;
  const uintptr_t state_addresses =
      reinterpret_cast<uintptr_t>(p.past_recurrent) | reinterpret_cast<uintptr_t>(p.present_recurrent);
  prm.vec_state = state_addresses % 16 == 0 && (p.v_head_dim * state_size) % 16 == 0 && (cols * state_size) % 16 == 0;
  static const bool finish_trigger_first = [] {
    const char* v = std::getenv("ORT_MTP_GDN_FINISH_TRIGGER");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  prm.finish_trigger_first = finish_trigger_first;
  const bool pdl = major >= 9;
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.type) {
    case FloatType::kFloat32: return Launch<float>(p, prm, pdl, s);
    case FloatType::kFloat16: return Launch<__half>(p, prm, pdl, s);
    case FloatType::kBFloat16: return Launch<__nv_bfloat16>(p, prm, pdl, s);
  }
  return "internal error: unknown element type";
}

}  // namespace ort_mtp
