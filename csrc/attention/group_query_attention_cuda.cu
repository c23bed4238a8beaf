// CUDA kernel of GroupQueryAttention (group_query_attention.h has the semantics): 1 + 2 x ceil(S / 16)
// launches on the session's stream, no host synchronisation, capturable in a CUDA graph; the partials'
// scratch is allocated once per stream (StreamScratch), never per call.
//
// FillKernel: the cache. One block per (batch, kv head, cache row it writes): with present bound to
// past's buffer, only the call's S new rows (positions past .. past + S - 1); otherwise every row of
// present: past's rows below `past`, the new rows, zeros after them (ORT's layout). It runs first and
// alone: a query row reads the keys the other rows of its call write.
//
// AttendKernel + CombineKernel: the attention, split over fixed chunks of the cache (flash-decoding), in
// passes of up to 16 query rows. Every reduction order depends only on a row's own position range and the
// head size, so row s of a width-S call is bit-identical to the width-1 call at that position (the
// property the MTP verify needs), whatever S, the batch or the grid; the comment above AttendKernel says
// how. The results differ from the CPU kernel's (double) by float32 rounding.
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
#include <map>
#include <mutex>
#include <type_traits>

#include "attention/group_query_attention.h"
#include "common/cuda_numeric.cuh"

namespace ort_mtp {
namespace {

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

// ---- the attention: a split over fixed chunks of kChunk cache positions (flash-decoding) ----
//
// Scores of one (query row, key) pair: one lane takes the key's features in ascending order, feature f
// into float32 fma chain f % 4, the chains added as (c0 + c1) + (c2 + c3) (features past the head size are
// zero on both sides). A chunk's
// partial for the row: m = the max of its scores, l = the sum of exp(score - m) (each lane's two slots,
// then the butterfly), acc[f] = sum over its keys in ascending position of exp(score - m) v[f]. The
// combine: M = max over the row's chunks of m, L = sum over chunks in ascending order of l exp(m - M),
// out = (sum over chunks in ascending order of acc exp(m - M)) / L. Every step depends only on the row's
// own position range, the head size and the cache: not on S, the row's index in the call, the batch or
// the grid, so a width-S call is bit-identical to S width-1 calls. A call's rows go through in passes of
// kRowsPerPass rows (one AttendKernel and one CombineKernel each), which bounds the scratch of partials;
// a prefill takes S / kRowsPerPass passes.
constexpr int kChunk = 64;        // cache positions per chunk (a constant: the split must not depend on S)
constexpr int kRowsPerPass = 16;  // query rows (positions) per pass; decode and verify calls take one
constexpr int kAttendWarps = 8;
constexpr int kMaxFrag = 8;       // head sizes up to 32 * 8 = 256

static_assert(kChunk % 32 == 0, "chunk slots are spread over a warp's lanes");
constexpr int kSlots = kChunk / 32;

struct PassParams {
  int64_t s0;       // the pass's first query row
  int rows;         // rows in the pass
  int64_t chunks;   // chunks of the cache (grid x)
  float* ml;        // [B * Nq * kRowsPerPass, chunks, 2]: each chunk's m and l
  float* acc;       // [B * Nq * kRowsPerPass, chunks, 32 F]: each chunk's unnormalised output
};

// The positions [first, last] row s of batch row b attends to (past: PastOf's value, >= 0).
__device__ __forceinline__ void RowRange(const GqaParams& p, int64_t past, int64_t s, int64_t& first, int64_t& last) {
  last = past + s;
  first = p.local_window > 0 && last + 1 > p.local_window ? last + 1 - p.local_window : 0;
}

// F consecutive elements from shared memory as float: one 16- or 8-byte load where they fit.
template <typename T, int F>
__device__ __forceinline__ void LoadFrag(const T* src, float (&x)[F]) {
  if constexpr (sizeof(T) * F == 16) {
    const uint4 raw = *reinterpret_cast<const uint4*>(src);
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < F; ++i) x[i] = ToF(v[i]);
  } else if constexpr (sizeof(T) * F == 8) {
    const uint2 raw = *reinterpret_cast<const uint2*>(src);
    const T* v = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < F; ++i) x[i] = ToF(v[i]);
  } else {
#pragma unroll
    for (int i = 0; i < F; ++i) x[i] = ToF(src[i]);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Grid: (chunks, batch * kv heads, pair blocks); kAttendWarps warps; dynamic shared memory: the chunk's keys
// (rows padded by 16 bytes) and values, kChunk rows of 32 F elements each (features past the head size
// zero). Block (c, b, g, z) loads the chunk's positions that some row of the pass attends to, then each
// warp takes (row, q head) pairs of kv head g's group, pairs z kAttendWarps + warp, stepping by all the pair
// blocks' warps, and writes their partials. Pair blocks: a pass of several rows has rows x group pairs, and
// a short cache only a few chunks, so one block per (chunk, kv head) would leave most SMs idle while its 8
// warps took three or more pairs each; the blocks of a (chunk, kv head) each load the tile (from L2) and
// take their share. A pair's partial is one warp's work in either case, so the split changes no bit.
template <typename T, int F>
__global__ void __launch_bounds__(kAttendWarps * 32) AttendKernel(const GqaParams p, const PassParams pass) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int HP = 32 * F;
  constexpr int kVec = 16 / sizeof(T);  // elements per 16-byte load
  constexpr int KS = HP + kVec;         // a key row's stride: padded so that lanes reading rows j, j+1 .. hit
                                        // different banks
  T* ks = reinterpret_cast<T*>(smem_raw);
  T* vs = ks + kChunk * KS;
  float* qs = reinterpret_cast<float*>(vs + kChunk * HP);  // [warps][HP]: each warp's query row
  float* ws = qs + kAttendWarps * HP;                       // [warps][kChunk]: each warp's weights
  const int64_t c = blockIdx.x, bg = blockIdx.y;
  const int64_t b = bg / p.kv_num_heads, g = bg % p.kv_num_heads;
  const int H = p.head_size, group = p.num_heads / p.kv_num_heads;
  const int64_t past = PastOf(p, b);
  if (past < 0) return;  // CombineKernel writes the NaN rows
  int64_t lo, hi, unused;
  RowRange(p, past, pass.s0, lo, unused);
  RowRange(p, past, pass.s0 + pass.rows - 1, unused, hi);
  const int64_t c_lo = c * kChunk;
  if (c_lo > hi || c_lo + kChunk - 1 < lo) return;  // no row of the pass sees this chunk
  const int64_t key_lo = lo > c_lo ? lo : c_lo;
  const int64_t key_hi = hi < c_lo + kChunk - 1 ? hi : c_lo + kChunk - 1;

  // The tile: positions key_lo .. key_hi, zeros elsewhere (so every score below is of finite numbers).
  const T* keys = static_cast<const T*>(p.present_key) + bg * p.present_len * H;
  const T* values = static_cast<const T*>(p.present_value) + bg * p.present_len * H;
  const int t = threadIdx.x;
  if (H == HP && HP % kVec == 0) {      // rows are whole 16-byte vectors (the cache's rows are 16-byte aligned)
    for (int e = t * kVec; e < kChunk * HP; e += blockDim.x * kVec) {
      const int64_t pos = c_lo + e / HP;
      const bool in = pos >= key_lo && pos <= key_hi;
      const uint4 zero = make_uint4(0, 0, 0, 0);
      *reinterpret_cast<uint4*>(ks + (e / HP) * KS + e % HP) = in ? *reinterpret_cast<const uint4*>(keys + pos * H + e % HP) : zero;
      *reinterpret_cast<uint4*>(vs + e) = in ? *reinterpret_cast<const uint4*>(values + pos * H + e % HP) : zero;
    }
  } else {
    for (int e = t; e < kChunk * HP; e += blockDim.x) {
      const int j = e / HP, f = e % HP;
      const int64_t pos = c_lo + j;
      const bool in = pos >= key_lo && pos <= key_hi && f < H;
      ks[j * KS + f] = in ? keys[pos * H + f] : FromF<T>(0.f);
      vs[e] = in ? values[pos * H + f] : FromF<T>(0.f);
    }
  }
  __syncthreads();

  const int lane = t & 31, warp = t >> 5;
  for (int pair = static_cast<int>(blockIdx.z) * kAttendWarps + warp; pair < pass.rows * group;
       pair += kAttendWarps * static_cast<int>(gridDim.z)) {
    const int64_t s = pass.s0 + pair / group;
    const int64_t h = g * group + pair % group;
    int64_t first, last;
    RowRange(p, past, s, first, last);
    if (c_lo > last || c_lo + kChunk - 1 < first) continue;  // this row does not see the chunk
    const int jlo = static_cast<int>((first > c_lo ? first : c_lo) - c_lo);
    const int jhi = static_cast<int>((last < c_lo + kChunk - 1 ? last : c_lo + kChunk - 1) - c_lo);

    const T* qrow = static_cast<const T*>(p.query) + ((b * p.seq + s) * p.num_heads + h) * H;
    float* q = qs + warp * HP;
#pragma unroll
    for (int i = 0; i < F; ++i) q[lane * F + i] = lane * F + i < H ? ToF(qrow[lane * F + i]) : 0.f;
    __syncwarp();

    // Lane l scores keys l and l + 32 (slot 0 and 1): feature f goes to chain f % 4, the chains added as
    // (c0 + c1) + (c2 + c3).
    float score[kSlots];
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      const int j = lane + 32 * slot;
      const T* krow = ks + j * KS;
      float chain[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
      for (int f0 = 0; f0 < HP; f0 += kVec) {
        float k[kVec];
        LoadFrag<T, kVec>(krow + f0, k);
#pragma unroll
        for (int i = 0; i < kVec; ++i) chain[i % 4] = __fmaf_rn(q[f0 + i], k[i], chain[i % 4]);
      }
      const float dot = __fadd_rn(__fadd_rn(chain[0], chain[1]), __fadd_rn(chain[2], chain[3]));
      float sc = __fmul_rn(dot, p.scale);
      if (p.softcap > 0.f) sc = __fmul_rn(p.softcap, tanhf(__fdiv_rn(sc, p.softcap)));
      score[slot] = j < jlo || j > jhi ? -INFINITY : sc;
    }
    float m = score[0];
#pragma unroll
    for (int slot = 1; slot < kSlots; ++slot) m = fmaxf(m, score[slot]);
    m = WarpMax(m);  // finite: the row sees at least one key of the chunk
    float* w = ws + warp * kChunk;
    float l = 0.f;
#pragma unroll
    for (int slot = 0; slot < kSlots; ++slot) {
      const float e = score[slot] == -INFINITY ? 0.f : expf(__fsub_rn(score[slot], m));
      w[lane + 32 * slot] = e;
      l = __fadd_rn(l, e);
    }
    l = WarpSum(l);
    __syncwarp();

    float acc[F];
#pragma unroll
    for (int i = 0; i < F; ++i) acc[i] = 0.f;
    for (int j = jlo; j <= jhi; ++j) {  // the positions the row sees, ascending
      const float wj = w[j];
      float v[F];
      LoadFrag<T, F>(vs + j * HP + lane * F, v);
#pragma unroll
      for (int i = 0; i < F; ++i) acc[i] = __fmaf_rn(wj, v[i], acc[i]);
    }
    const int64_t slot_row = ((b * p.num_heads + h) * kRowsPerPass + (s - pass.s0)) * pass.chunks + c;
    float* dst = pass.acc + slot_row * HP + lane * F;
#pragma unroll
    for (int i = 0; i < F; ++i) dst[i] = acc[i];
    if (lane == 0) {
      pass.ml[slot_row * 2] = m;
      pass.ml[slot_row * 2 + 1] = l;
    }
    __syncwarp();  // the next pair rewrites this warp's q and w
  }
}

// Grid: (batch * q heads, rows of the pass); 32 F threads, thread f the output feature f.
template <typename T, int F>
__global__ void __launch_bounds__(32 * kMaxFrag) CombineKernel(const GqaParams p, const PassParams pass) {
  constexpr int HP = 32 * F;
  const int64_t bh = blockIdx.x, s = pass.s0 + blockIdx.y;
  const int64_t b = bh / p.num_heads, h = bh % p.num_heads;
  const int f = threadIdx.x, H = p.head_size;
  T* out = static_cast<T*>(p.output) + ((b * p.seq + s) * p.num_heads + h) * H;
  const int64_t past = PastOf(p, b);
  if (past < 0) {
    if (f < H) out[f] = FromF<T>(__int_as_float(0x7fc00000));  // NaN: bad seqlens_k
    return;
  }
  int64_t first, last;
  RowRange(p, past, s, first, last);
  const int64_t c_first = first / kChunk, c_last = last / kChunk;
  const int64_t base = (bh * kRowsPerPass + blockIdx.y) * pass.chunks;
  float M = -INFINITY;
  for (int64_t c = c_first; c <= c_last; ++c) M = fmaxf(M, pass.ml[(base + c) * 2]);
  float L = 0.f, acc = 0.f;
  for (int64_t c = c_first; c <= c_last; ++c) {
    const float r = expf(__fsub_rn(pass.ml[(base + c) * 2], M));
    L = __fmaf_rn(pass.ml[(base + c) * 2 + 1], r, L);
    acc = __fmaf_rn(pass.acc[(base + c) * HP + f], r, acc);
  }
  float extra = 1.f;  // smooth softmax: the denominator also counts a logit 0
  if (p.smooth_softmax) {
    const float m_final = fmaxf(M, 0.f);
    extra = expf(__fsub_rn(M, m_final));
    L = __fmaf_rn(L, extra, expf(-m_final));
  }
  if (f < H) out[f] = FromF<T>(__fdiv_rn(__fmul_rn(acc, extra), L));
}

// ---- the prefill: S > kRowsPerPass, float16 / bfloat16, head sizes 32, 64, 128, 256 (tensor cores) ----
//
// A flash-attention kernel: block (query tile, batch, q head) takes 64 query rows (4 warps of 16) and walks
// the keys they see in tiles of 64 positions, ascending; per tile, S = Q K^T and O += P V on mma.sync
// m16n8k16 (T inputs, float32 accumulation), the softmax online (running max and sum per row, O rescaled
// when the max grows), the weights P rounded to T for the second product. Its rows depend on where they
// fall in the query tile, so a width-S prefill is not bit-identical to S width-1 calls: that is allowed
// for widths above kRowsPerPass only, which greedy decoding and MTP both take the same way (the prompt's
// prefill); decode, verify and re-advance widths (1..16) always go through the passes above.
constexpr int kPrefillRows = 64;   // query rows per block: kPrefillWarps warps of 16
constexpr int kPrefillKeys = 64;   // cache positions per key tile
constexpr int kPrefillWarps = 4;
static_assert(kPrefillRows == 16 * kPrefillWarps, "a warp's mma tile is 16 rows");

template <typename T>
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats as one 32-bit pair of T, `lo` in the low half (the lower column).
template <typename T>
__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

__device__ __forceinline__ uint32_t Load32(const void* smem) { return *reinterpret_cast<const uint32_t*>(smem); }

// Grid: (query tiles, batch * q heads); kPrefillWarps warps; dynamic shared memory: the Q tile and one K and
// one V tile, rows of HP + 8 elements (the pad puts the 8 rows a fragment load touches in different banks).
// Lane (g = lane / 4, t = lane % 4) of warp w holds rows 16 w + g and 16 w + g + 8 of the tile (mma's
// accumulator layout: columns 2 t, 2 t + 1 of each 8-column block).
template <typename T, int HP>
__global__ void __launch_bounds__(kPrefillWarps * 32) PrefillKernel(const GqaParams p) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  constexpr int LD = HP + 8;
  constexpr int kVec = 8;  // elements per 16-byte load
  T* qs = reinterpret_cast<T*>(smem_raw);
  T* ks = qs + kPrefillRows * LD;
  T* vs = ks + kPrefillKeys * LD;
  const int64_t qt = static_cast<int64_t>(gridDim.x) - 1 - blockIdx.x;  // the tiles that see the most keys first
  const int64_t bh = blockIdx.y;
  const int64_t b = bh / p.num_heads, h = bh % p.num_heads;
  const int64_t kvh = h / (p.num_heads / p.kv_num_heads);
  const int64_t s0 = qt * kPrefillRows;
  const int rows = static_cast<int>(p.seq - s0 < kPrefillRows ? p.seq - s0 : kPrefillRows);
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int64_t row_stride = static_cast<int64_t>(p.num_heads) * HP;  // query and output rows
  T* out = static_cast<T*>(p.output) + (b * p.seq + s0) * row_stride + h * HP;
  const int64_t past = PastOf(p, b);
  if (past < 0) {  // bad seqlens_k: NaN rows, as the passes write
    for (int e = t; e < rows * HP; e += blockDim.x) out[(e / HP) * row_stride + e % HP] = FromF<T>(__int_as_float(0x7fc00000));
    return;
  }
  const T* q = static_cast<const T*>(p.query) + (b * p.seq + s0) * row_stride + h * HP;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int e = t * kVec; e < kPrefillRows * HP; e += blockDim.x * kVec) {
    const int r = e / HP, f = e % HP;
    *reinterpret_cast<uint4*>(qs + r * LD + f) = r < rows ? *reinterpret_cast<const uint4*>(q + r * row_stride + f) : zero;
  }

  // The block's keys [lo, hi]; each lane's two rows' [first, last] (last = -1: a row past the call's end).
  int64_t lo, hi, unused;
  RowRange(p, past, s0, lo, unused);
  hi = past + s0 + rows - 1;
  const int g = lane >> 2, tq = lane & 3;
  const int ra = warp * 16 + g, rb = ra + 8;
  int64_t first_a = 0, last_a = -1, first_b = 0, last_b = -1;
  if (ra < rows) RowRange(p, past, s0 + ra, first_a, last_a);
  if (rb < rows) RowRange(p, past, s0 + rb, first_b, last_b);
  const bool active = warp * 16 < rows;
  int64_t w_first = 0, w_last = -1;
  if (active) {
    RowRange(p, past, s0 + warp * 16, w_first, unused);
    w_last = past + s0 + (warp * 16 + 15 < rows ? warp * 16 + 15 : rows - 1);
  }

  const T* keys = static_cast<const T*>(p.present_key) + (b * p.kv_num_heads + kvh) * p.present_len * HP;
  const T* values = static_cast<const T*>(p.present_value) + (b * p.kv_num_heads + kvh) * p.present_len * HP;
  float o[HP / 8][4];
#pragma unroll
  for (int n = 0; n < HP / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.f, l_b = 0.f;

  for (int64_t k0 = lo / kPrefillKeys * kPrefillKeys; k0 <= hi; k0 += kPrefillKeys) {
    __syncthreads();  // every warp is done with the previous tile (and, the first time, the Q tile is in)
    for (int e = t * kVec; e < kPrefillKeys * HP; e += blockDim.x * kVec) {
      const int j = e / HP, f = e % HP;
      const int64_t pos = k0 + j;
      const bool in = pos >= lo && pos <= hi;  // zeros elsewhere: a masked weight times a finite value
      *reinterpret_cast<uint4*>(ks + j * LD + f) = in ? *reinterpret_cast<const uint4*>(keys + pos * HP + f) : zero;
      *reinterpret_cast<uint4*>(vs + j * LD + f) = in ? *reinterpret_cast<const uint4*>(values + pos * HP + f) : zero;
    }
    __syncthreads();
    if (!active || k0 > w_last || k0 + kPrefillKeys - 1 < w_first) continue;

    float sc[kPrefillKeys / 8][4];
#pragma unroll
    for (int j = 0; j < kPrefillKeys / 8; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HP / 16; ++kk) {
      const T* qa = qs + ra * LD + kk * 16 + 2 * tq;
      const uint32_t a[4] = {Load32(qa), Load32(qa + 8 * LD), Load32(qa + 8), Load32(qa + 8 * LD + 8)};
#pragma unroll
      for (int j = 0; j < kPrefillKeys / 8; ++j) {
        const T* kb = ks + (j * 8 + g) * LD + kk * 16 + 2 * tq;
        Mma16816<T>(sc[j], a, Load32(kb), Load32(kb + 8));
      }
    }

    float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
    for (int j = 0; j < kPrefillKeys / 8; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t key = k0 + j * 8 + 2 * tq + (i & 1);
        float s = __fmul_rn(sc[j][i], p.scale);
        if (p.softcap > 0.f) s = __fmul_rn(p.softcap, tanhf(__fdiv_rn(s, p.softcap)));
        const bool seen = i < 2 ? key >= first_a && key <= last_a : key >= first_b && key <= last_b;
        s = seen ? s : -INFINITY;
        sc[j][i] = s;
        if (i < 2) mx_a = fmaxf(mx_a, s); else mx_b = fmaxf(mx_b, s);
      }
    }
#pragma unroll
    for (int o2 = 1; o2 <= 2; o2 <<= 1) {  // the quad of lanes sharing the rows
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, o2));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, o2));
    }
    const float new_a = fmaxf(m_a, mx_a), new_b = fmaxf(m_b, mx_b);
    // -inf - -inf is NaN: a row that has seen no key yet keeps m = -inf, its weights 0 and O untouched.
    const float corr_a = new_a == -INFINITY ? 1.f : expf(m_a - new_a);
    const float corr_b = new_b == -INFINITY ? 1.f : expf(m_b - new_b);
    m_a = new_a;
    m_b = new_b;
    float sum_a = 0.f, sum_b = 0.f;
#pragma unroll
    for (int j = 0; j < kPrefillKeys / 8; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float m = i < 2 ? m_a : m_b;
        const float e = sc[j][i] == -INFINITY ? 0.f : expf(sc[j][i] - m);
        sc[j][i] = e;
        if (i < 2) sum_a += e; else sum_b += e;
      }
    }
    l_a = l_a * corr_a + sum_a;
    l_b = l_b * corr_b + sum_b;
#pragma unroll
    for (int n = 0; n < HP / 8; ++n) {
      o[n][0] *= corr_a;
      o[n][1] *= corr_a;
      o[n][2] *= corr_b;
      o[n][3] *= corr_b;
    }

    // O += P V: P's A fragment for keys 16 kk .. 16 kk + 15 is the accumulators of S's column blocks 2 kk
    // and 2 kk + 1; V's B fragments come transposed from the row-major tile through ldmatrix.
#pragma unroll
    for (int kk = 0; kk < kPrefillKeys / 16; ++kk) {
      const uint32_t a[4] = {PackPair<T>(sc[2 * kk][0], sc[2 * kk][1]), PackPair<T>(sc[2 * kk][2], sc[2 * kk][3]),
                             PackPair<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                             PackPair<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int n = 0; n < HP / 16; ++n) {
        const T* vb = vs + (kk * 16 + (lane & 15)) * LD + n * 16 + (lane >> 4) * 8;
        const uint32_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(vb));
        uint32_t b0, b1, b2, b3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3) : "r"(addr));
        Mma16816<T>(o[2 * n], a, b0, b1);
        Mma16816<T>(o[2 * n + 1], a, b2, b3);
      }
    }
  }
  if (!active) return;

#pragma unroll
  for (int o2 = 1; o2 <= 2; o2 <<= 1) {
    l_a += __shfl_xor_sync(0xffffffffu, l_a, o2);
    l_b += __shfl_xor_sync(0xffffffffu, l_b, o2);
  }
  float inv_a = 1.f / l_a, inv_b = 1.f / l_b;
  if (p.smooth_softmax) {  // the denominator also counts a logit 0
    const float fa = fmaxf(m_a, 0.f), fb = fmaxf(m_b, 0.f);
    const float ea = expf(m_a - fa), eb = expf(m_b - fb);
    inv_a = ea / (l_a * ea + expf(-fa));
    inv_b = eb / (l_b * eb + expf(-fb));
  }
#pragma unroll
  for (int n = 0; n < HP / 8; ++n) {
    const int f = n * 8 + 2 * tq;
    if (ra < rows) *reinterpret_cast<uint32_t*>(out + ra * row_stride + f) = PackPair<T>(o[n][0] * inv_a, o[n][1] * inv_a);
    if (rb < rows) *reinterpret_cast<uint32_t*>(out + rb * row_stride + f) = PackPair<T>(o[n][2] * inv_b, o[n][3] * inv_b);
  }
}

template <typename T, int HP>
const char* LaunchPrefill(const GroupQueryAttentionProblem& p, const GqaParams& prm, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(kPrefillRows + 2 * kPrefillKeys) * (HP + 8) * sizeof(T);
  if (const cudaError_t err = cudaFuncSetAttribute(PrefillKernel<T, HP>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
      err != cudaSuccess)
    return cudaGetErrorString(err);
  const dim3 grid(static_cast<unsigned>((p.seq + kPrefillRows - 1) / kPrefillRows), static_cast<unsigned>(p.batch * p.num_heads));
  PrefillKernel<T, HP><<<grid, kPrefillWarps * 32, smem, stream>>>(prm);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return cudaGetErrorString(err);
  return nullptr;
}

bool Aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// The prefill kernel takes a call when it is wider than a decode / verify pass, 16-bit, of a head size it
// has, with 16-byte aligned rows, and a grid that fits; otherwise the passes do (slower, same results).
template <typename T>
const char* TryPrefill(const GroupQueryAttentionProblem& p, const GqaParams& prm, cudaStream_t stream, bool& done) {
  done = false;
  if constexpr (sizeof(T) != 2) {
    return nullptr;
  } else {
    if (p.seq <= kRowsPerPass || p.batch * p.num_heads > 65535 || (p.seq + kPrefillRows - 1) / kPrefillRows > 0x7FFFFFFFLL)
      return nullptr;
    if (!Aligned16(p.query) || !Aligned16(p.output) || !Aligned16(p.present_key) || !Aligned16(p.present_value))
      return nullptr;
    done = true;
    switch (p.head_size) {
      case 32: return LaunchPrefill<T, 32>(p, prm, stream);
      case 64: return LaunchPrefill<T, 64>(p, prm, stream);
      case 128: return LaunchPrefill<T, 128>(p, prm, stream);
      case 256: return LaunchPrefill<T, 256>(p, prm, stream);
      default: done = false; return nullptr;
    }
  }
}

int FragFor(int64_t head_size) {
  const int64_t per_lane = (head_size + 31) / 32;
  return per_lane <= 1 ? 1 : per_lane <= 2 ? 2 : per_lane <= 4 ? 4 : 8;
}

int64_t ChunksFor(int64_t present_len) { return (present_len + kChunk - 1) / kChunk; }

template <typename T, int F>
const char* LaunchPasses(const GroupQueryAttentionProblem& p, const GqaParams& prm, float* scratch,
                         cudaStream_t stream) {
  constexpr int HP = 32 * F;
  constexpr int kVec = 16 / sizeof(T);
  const size_t smem = static_cast<size_t>(kChunk) * (2 * HP + kVec) * sizeof(T) +
                      static_cast<size_t>(kAttendWarps) * (HP + kChunk) * sizeof(float);
  if (const cudaError_t err = cudaFuncSetAttribute(AttendKernel<T, F>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem));
      err != cudaSuccess)
    return cudaGetErrorString(err);
  PassParams pass{};
  pass.chunks = ChunksFor(p.present_len);
  const int64_t slots = p.batch * p.num_heads * kRowsPerPass * pass.chunks;
  pass.ml = scratch;
  pass.acc = scratch + slots * 2;
  const int64_t group = p.num_heads / p.kv_num_heads;
  for (int64_t s0 = 0; s0 < p.seq; s0 += kRowsPerPass) {
    pass.s0 = s0;
    pass.rows = static_cast<int>(p.seq - s0 < kRowsPerPass ? p.seq - s0 : kRowsPerPass);
    const int64_t pair_blocks = (pass.rows * group + kAttendWarps - 1) / kAttendWarps;
    const dim3 attend(static_cast<unsigned>(pass.chunks), static_cast<unsigned>(p.batch * p.kv_num_heads),
                      static_cast<unsigned>(pair_blocks < 65535 ? pair_blocks : 65535));
    AttendKernel<T, F><<<attend, kAttendWarps * 32, smem, stream>>>(prm, pass);
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return cudaGetErrorString(err);
    const dim3 combine(static_cast<unsigned>(p.batch * p.num_heads), static_cast<unsigned>(pass.rows));
    CombineKernel<T, F><<<combine, HP, 0, stream>>>(prm, pass);
    if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return cudaGetErrorString(err);
  }
  return nullptr;
}

template <typename T>
const char* Launch(const GroupQueryAttentionProblem& p, const GqaParams& prm, float* scratch, cudaStream_t stream) {
  const int64_t rows = p.share_buffer ? p.seq : p.present_len;
  const dim3 fill(static_cast<unsigned>(p.batch * p.kv_num_heads), static_cast<unsigned>(rows < 65535 ? rows : 65535));
  FillKernel<T><<<fill, kFillThreads, 0, stream>>>(prm);
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return cudaGetErrorString(err);
  bool done = false;
  if (const char* why = TryPrefill<T>(p, prm, stream, done)) return why;
  if (done) return nullptr;
  switch (FragFor(p.head_size)) {
    case 1: return LaunchPasses<T, 1>(p, prm, scratch, stream);
    case 2: return LaunchPasses<T, 2>(p, prm, scratch, stream);
    case 4: return LaunchPasses<T, 4>(p, prm, scratch, stream);
    default: return LaunchPasses<T, 8>(p, prm, scratch, stream);
  }
}

}  // namespace

// Scratch buffers, one per (stream, slot) (the ops' calls on one stream run one after another, so every
// layer of a session shares each slot). A buffer that is outgrown is kept, not freed: a CUDA graph
// captured earlier may still hold its address. It only grows outside a capture (the CUDA EP runs a
// graph's shapes once before capturing them); a capture that would need a larger one is refused with an
// error.
namespace {
struct Scratch {
  void* ptr = nullptr;
  size_t bytes = 0;
};
std::mutex scratch_mutex;
std::map<std::pair<cudaStream_t, int>, Scratch>& ScratchByStream() {
  static auto* by_stream = new std::map<std::pair<cudaStream_t, int>, Scratch>();  // never destroyed: see above
  return *by_stream;
}
}  // namespace

const char* StreamScratch(void* stream, int slot, size_t bytes, void** out) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  std::lock_guard<std::mutex> lock(scratch_mutex);
  Scratch& buf = ScratchByStream()[{s, slot}];
  if (buf.bytes < bytes) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone)
      return "the attention's scratch must grow during a CUDA graph capture: run the same shapes once "
             "before capturing";
    const size_t grown = bytes > 2 * buf.bytes ? bytes : 2 * buf.bytes;
    void* ptr = nullptr;
    if (const cudaError_t err = cudaMalloc(&ptr, grown); err != cudaSuccess) return cudaGetErrorString(err);
    buf.ptr = ptr;  // the old buffer is kept (see above)
    buf.bytes = grown;
  }
  *out = buf.ptr;
  return nullptr;
}

namespace {
}  // namespace

const char* GroupQueryAttentionCudaUnsupported(int64_t head_size) {
  if (head_size < 1 || head_size > 32 * kMaxFrag) return "the CUDA kernel supports head sizes from 1 to 256";
  return nullptr;
}

const char* GroupQueryAttentionCuda(const GroupQueryAttentionProblem& p, void* stream) {
  if (const char* why = GroupQueryAttentionCudaUnsupported(p.head_size)) return why;
  if (p.batch <= 0) return nullptr;
  if (p.batch * p.num_heads > 0x7FFFFFFFLL || p.batch * p.kv_num_heads > 65535 || ChunksFor(p.present_len) > 0x7FFFFFFFLL)
    return "batch x heads, or the cache's length, too large for the CUDA kernel's grid";
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
  const size_t slots = static_cast<size_t>(p.batch * p.num_heads * kRowsPerPass * ChunksFor(p.present_len));
  void* scratch_ptr = nullptr;
  if (const char* why = StreamScratch(s, kScratchGqaPartials, slots * (2 + 32 * FragFor(p.head_size)) * sizeof(float),
                                      &scratch_ptr))
    return why;
  float* scratch = static_cast<float*>(scratch_ptr);
  switch (p.type) {
    case FloatType::kFloat32: return Launch<float>(p, prm, scratch, s);
    case FloatType::kFloat16: return Launch<__half>(p, prm, scratch, s);
    case FloatType::kBFloat16: return Launch<__nv_bfloat16>(p, prm, scratch, s);
  }
  return "internal error: unknown element type";
}

}  // namespace ort_mtp
