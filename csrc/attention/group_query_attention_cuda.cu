// CUDA kernel of GroupQueryAttention (group_query_attention.h has the semantics): 1 + 2 x ceil(S / 16)
// launches on the session's stream, no host synchronisation, capturable in a CUDA graph; the partials'
// scratch is allocated once per stream (ScratchFor), never per call.
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

// Grid: (chunks, batch * kv heads); kAttendWarps warps; dynamic shared memory: the chunk's keys (rows padded by 16 bytes) and
// values, kChunk rows of 32 F elements each (features past the head size zero). Block (c, b, g) loads the
// chunk's positions that some row of the pass attends to, then each warp takes (row, q head) pairs of
// kv head g's group and writes their partials.
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
  for (int pair = warp; pair < pass.rows * group; pair += kAttendWarps) {
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
  const dim3 attend(static_cast<unsigned>(pass.chunks), static_cast<unsigned>(p.batch * p.kv_num_heads));
  for (int64_t s0 = 0; s0 < p.seq; s0 += kRowsPerPass) {
    pass.s0 = s0;
    pass.rows = static_cast<int>(p.seq - s0 < kRowsPerPass ? p.seq - s0 : kRowsPerPass);
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
  switch (FragFor(p.head_size)) {
    case 1: return LaunchPasses<T, 1>(p, prm, scratch, stream);
    case 2: return LaunchPasses<T, 2>(p, prm, scratch, stream);
    case 4: return LaunchPasses<T, 4>(p, prm, scratch, stream);
    default: return LaunchPasses<T, 8>(p, prm, scratch, stream);
  }
}

// The partials' scratch, one per stream (the op's calls on one stream run one after another, so every
// layer of a session shares it). A buffer that is outgrown is kept, not freed: a CUDA graph captured
// earlier may still hold its address. It only grows outside a capture (the CUDA EP runs a graph's shapes
// once before capturing them); a capture that would need a larger one is refused with an error.
struct Scratch {
  void* ptr = nullptr;
  size_t bytes = 0;
};
std::mutex scratch_mutex;
std::map<cudaStream_t, Scratch>& ScratchByStream() {
  static auto* by_stream = new std::map<cudaStream_t, Scratch>();  // never destroyed: see above
  return *by_stream;
}

const char* ScratchFor(cudaStream_t stream, size_t bytes, float** out) {
  std::lock_guard<std::mutex> lock(scratch_mutex);
  Scratch& s = ScratchByStream()[stream];
  if (s.bytes < bytes) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess || capture != cudaStreamCaptureStatusNone)
      return "the attention's scratch must grow during a CUDA graph capture: run the same shapes once "
             "before capturing";
    const size_t grown = bytes > 2 * s.bytes ? bytes : 2 * s.bytes;
    void* ptr = nullptr;
    if (const cudaError_t err = cudaMalloc(&ptr, grown); err != cudaSuccess) return cudaGetErrorString(err);
    s.ptr = ptr;  // the old buffer is kept (see above)
    s.bytes = grown;
  }
  *out = static_cast<float*>(s.ptr);
  return nullptr;
}

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
  float* scratch = nullptr;
  if (const char* why = ScratchFor(s, slots * (2 + 32 * FragFor(p.head_size)) * sizeof(float), &scratch)) return why;
  switch (p.type) {
    case FloatType::kFloat32: return Launch<float>(p, prm, scratch, s);
    case FloatType::kFloat16: return Launch<__half>(p, prm, scratch, s);
    case FloatType::kBFloat16: return Launch<__nv_bfloat16>(p, prm, scratch, s);
  }
  return "internal error: unknown element type";
}

}  // namespace ort_mtp
