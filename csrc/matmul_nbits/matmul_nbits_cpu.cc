// CPU kernels of MatMulNBits.
// - The reference (MatMulNBitsCpuReference): written for clarity and exactness, not speed: each weight
//   row is dequantised to float once (scale * (q - zero_point), the same float arithmetic as ONNX
//   Runtime's dequantisation), then dotted with every row of A in double. The tests' oracle.
// - The fast kernel (cpu_gemv_body.h): a batched GEMV in float32 with a fixed per-output order of
//   operations (AVX-512 or AVX2+FMA, picked at run time with __builtin_cpu_supports), used by
//   default wherever it applies (row-major layout; everything else takes the reference).
// - The int8-activation kernel (accuracy_level 4, bits 4, row-major; see "Int8" below and
//   cpu_int8_body.h): what com.microsoft::MatMulNBits computes at accuracy_level 4, with a fixed
//   order of operations per output. AVX-512 VNNI, AVX-512BW, AVX-VNNI, AVX2, or portable scalar.
// ORT_MTP_CPU_KERNEL (read once per process) picks one: "reference", "avx2", "avxvnni", "avx512",
// "avx512-novnni"; unset or "auto" means the best this CPU runs. An instruction set the CPU lacks
// falls back to the reference (fp32 path) or the scalar int8 kernel (accuracy_level 4).
// "reference" runs the scalar int8 kernel where accuracy_level 4 applies (it is that path's
// definition); "avxvnni" and "avx512-novnni" only change the int8 kernel (the fp32 path reads them as
// "avx2" and "avx512").
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "common/ort.h"
#include "matmul_nbits/matmul_nbits.h"
#include "matmul_nbits/silu_mul.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define ORT_MTP_CPU_X86 1
#include <immintrin.h>
#endif

namespace ort_mtp {
namespace {

template <typename T>
float ToFloat(T v);
template <>
float ToFloat<float>(float v) { return v; }
template <>
float ToFloat<Ort::Float16_t>(Ort::Float16_t v) { return v.ToFloat(); }
template <>
float ToFloat<Ort::BFloat16_t>(Ort::BFloat16_t v) { return v.ToFloat(); }

template <typename T>
T FromFloat(float v);
template <>
float FromFloat<float>(float v) { return v; }
template <>
Ort::Float16_t FromFloat<Ort::Float16_t>(float v) { return Ort::Float16_t(v); }
template <>
Ort::BFloat16_t FromFloat<Ort::BFloat16_t>(float v) { return Ort::BFloat16_t(v); }

// Quantised value of element k of row n (0 <= k < k_blocks * block_size).
inline int Quant(const MatMulNBitsProblem& p, const uint8_t* row, int64_t k) {
  if (p.bits == 8) return row[k];
  const uint8_t byte = row[k >> 1];
  return (k & 1) ? (byte >> 4) : (byte & 0x0F);
}

// The same for the kTiles layout (4 bits).
inline int TilesQuant(const MatMulNBitsProblem& p, int64_t n, int64_t k) {
  int shift = 0;
  const int64_t byte = TilesByte(p.K, n, k, shift);
  return (p.b[byte] >> shift) & 0x0F;
}

template <typename T>
float ZeroPoint(const MatMulNBitsProblem& p, int64_t n, int64_t block) {
  switch (p.zp_kind) {
    case ZeroPointKind::kNone:
      return static_cast<float>(1 << (p.bits - 1));
    case ZeroPointKind::kPacked: {
      const uint8_t* row = static_cast<const uint8_t*>(p.zero_points) + n * p.zp_row_bytes;
      if (p.bits == 8) return row[block];
      const uint8_t byte = row[block >> 1];
      return static_cast<float>((block & 1) ? (byte >> 4) : (byte & 0x0F));
    }
    case ZeroPointKind::kTyped:
      return ToFloat(static_cast<const T*>(p.zero_points)[n * p.k_blocks + block]);
  }
  return 0.f;
}

template <typename T>
void ComputeRows(const MatMulNBitsProblem& p, int64_t n_begin, int64_t n_end) {
  const T* a = static_cast<const T*>(p.a);
  const T* scales = static_cast<const T*>(p.scales);
  const T* bias = static_cast<const T*>(p.bias);
  T* y = static_cast<T*>(p.y);
  std::vector<float> w(static_cast<size_t>(p.K));
  const bool tiles = p.layout == WeightLayout::kTiles;
  for (int64_t n = n_begin; n < n_end; ++n) {
    const uint8_t* row = p.b + n * p.k_blocks * p.block_bytes;
    for (int64_t blk = 0; blk < p.k_blocks; ++blk) {
      const float scale = ToFloat(scales[tiles ? TilesScale(p.K, p.block_size, n, blk) : n * p.k_blocks + blk]);
      const float zp = ZeroPoint<T>(p, n, blk);
      const int64_t k_end = std::min<int64_t>(p.K, (blk + 1) * p.block_size);
      for (int64_t k = blk * p.block_size; k < k_end; ++k) {
        w[k] = (static_cast<float>(tiles ? TilesQuant(p, n, k) : Quant(p, row, k)) - zp) * scale;
      }
    }
    const double b = bias ? static_cast<double>(ToFloat(bias[n])) : 0.0;
    for (int64_t m = 0; m < p.M; ++m) {
      const T* a_row = a + m * p.K;
      double acc = 0.0;
      for (int64_t k = 0; k < p.K; ++k) acc += static_cast<double>(ToFloat(a_row[k])) * w[k];
      y[m * p.N + n] = FromFloat<T>(static_cast<float>(acc + b));
    }
  }
}

template <typename T>
void Run(const MatMulNBitsProblem& p, ParallelFor parallel_for, void* parallel_context) {
  // Split N into tasks of at least 16 rows (fewer tasks than rows keeps per-task overhead small).
  constexpr int64_t kMinRows = 16;
  const int64_t tasks = parallel_for ? std::max<int64_t>(1, std::min<int64_t>(256, p.N / kMinRows)) : 1;
  if (tasks == 1) {
    ComputeRows<T>(p, 0, p.N);
    return;
  }
  struct Ctx {
    const MatMulNBitsProblem* p;
    int64_t tasks;
  } ctx{&p, tasks};
  parallel_for(
      parallel_context,
      [](void* user, size_t i) {
        const Ctx& c = *static_cast<const Ctx*>(user);
        const int64_t begin = c.p->N * static_cast<int64_t>(i) / c.tasks;
        const int64_t end = c.p->N * static_cast<int64_t>(i + 1) / c.tasks;
        ComputeRows<T>(*c.p, begin, end);
      },
      static_cast<size_t>(tasks), &ctx);
}


// ---- Int8: the accuracy_level 4 path -------------------------------------------------------------
// Definition (every implementation below computes exactly this: the scalar kernel, and the SIMD ones
// of cpu_int8_body.h on either weight layout):
// 1. A is widened to float32 (fp16/bf16 exactly) and zero-padded to kp = k_blocks * block_size.
//    Per row m and block b (the weights' block_size):
//      amax = max |a[m, k]| over the block, s_a[m, b] = amax / 127.f (float32 division)
//      qa[m, k] = s_a == 0 ? 0 : clamp(round_half_even(a[m, k] / s_a), -127, 127)   (int8)
//    (the quotient a / s_a is a float32 division; A must be finite). A row's quantisation depends on
//    that row's values only.
// 2. k is cut into segments of G = kSegK(block_size) (32, or 16 for block_size 16: a segment lies in
//    one block b) and chunks of 4 segments (CK = 4 G); qsum = a segment's sum of qa (zero past kp).
//    Per output (m, n) and segment position s = 0..3, for chunks c ascending (the segment k = c CK +
//    s G .. + G - 1):
//      p = sum over the segment of qa[m, k] * q[n, k]  (int32, exact: any order gives the same p)
//      d = p - zp[n, b] * qsum  (int32, exact; zp = 8 without zero points, the uint8 value if packed)
//          typed zero points: d = fma(zp, -float(qsum), float(p)) in float32
//      acc[s] = fma(float(d), float32(s_w[n, b] * s_a[m, b]), acc[s])
//    segments past the last block add fma(0, 0, acc).
// 3. y = (acc[0] + acc[1]) + (acc[2] + acc[3]) + bias (float32), rounded once to Y's type.
// So a row's float work is 3 operations per 32 k and column; the rest is exact integer arithmetic.
// Against exact arithmetic on the same int4 weights the error is dominated by the int8 rounding of A:
// |qa s_a - a| <= s_a / 2 per element (ops/nbits.py's int8_reference emulates step 1 exactly).
struct Int8Job {
  const MatMulNBitsProblem* p;
  const int8_t* qa;          // [M][chunks][CK], arranged per chunk as cpu_int8_body.h says (ArrangeChunk)
  const int32_t* lane_sum;   // [M][chunks][4]: -zp0 * qsum per segment (zp0 = 8 without zero points, else 1)
  const float* lane_scale;   // [M][chunks][4]: s_a of the segment's block (0 past the last block)
  int64_t chunks;            // ceil(kp / CK)
  int64_t groups;            // work units (column groups of 4, or columns for the scalar kernel)
  int64_t tasks;
};

// Unit (group g, chunk c) of p's row-major weights in the kCpuGroups layout (zeros past N and past the
// last block): the statement of that layout's map (GatherGroup below computes the same bytes for a whole
// group in the common case, faster; the tests compare both against the scalar kernel, which reads the
// row-major weights). Scales and typed zero points keep their type.
void GatherUnit(const MatMulNBitsProblem& p, int64_t g, int64_t c, uint8_t* b, uint8_t* scales, uint8_t* zp) {
  const int seg = kSegK(p.block_size), ck = kSegments * seg;
  const int64_t kp = p.k_blocks * p.block_size, row_bytes = p.k_blocks * p.block_bytes;
  const size_t elem = ScaleBytes(p), zp_elem = GroupedZeroPointBytes(p);
  const int block_shift = __builtin_ctz(static_cast<unsigned>(p.block_size));  // a power of two: no division
  for (int col = 0; col < kGroupCols; ++col) {
    const int64_t n = g * kGroupCols + col;
    for (int s = 0; s < kSegments; ++s) {
      const int lane = kSegments * col + s;
      const int64_t k0 = c * ck + s * seg, blk = k0 >> block_shift;
      const bool inside = n < p.N && k0 < kp;
      for (int v = 0; v < seg / 8; ++v) {
        uint8_t* dst = b + 64 * v + 4 * lane;
        if (inside) {
          std::memcpy(dst, p.b + n * row_bytes + (k0 + 8 * v) / 2, 4);
        } else {
          std::memset(dst, 0, 4);
        }
      }
      uint8_t* sd = scales + lane * elem;
      if (inside) {
        std::memcpy(sd, static_cast<const uint8_t*>(p.scales) + (n * p.k_blocks + blk) * elem, elem);
      } else {
        std::memset(sd, 0, elem);
      }
      if (p.zp_kind == ZeroPointKind::kPacked) {
        const uint8_t* zrow = static_cast<const uint8_t*>(p.zero_points) + (inside ? n : 0) * p.zp_row_bytes;
        zp[lane] = inside ? static_cast<uint8_t>((blk & 1) ? (zrow[blk >> 1] >> 4) : (zrow[blk >> 1] & 0x0F)) : 0;
      } else if (p.zp_kind == ZeroPointKind::kTyped) {
        uint8_t* zd = zp + lane * zp_elem;
        if (inside) {
          std::memcpy(zd, static_cast<const uint8_t*>(p.zero_points) + (n * p.k_blocks + blk) * zp_elem, zp_elem);
        } else {
          std::memset(zd, 0, zp_elem);
        }
      }
    }
  }
}

// All units of group g (chunks 0 .. chunks - 1, unit c at b + c * kUnitBytes, scales likewise) for
// the common case GatherUnit would otherwise do unit by unit: 4 whole columns, 32-k segments, whole
// chunks, no zero points. Each column's row is read once, front to back (one stream the prefetchers
// follow), and every 64 bytes of it, 4 rows (segments s) of 4 dwords (v), are transposed into the
// column's 4 lanes of the unit's 4 vectors (SSE2, which every x86-64 has). False where it does not apply.
bool GatherGroup(const MatMulNBitsProblem& p, int64_t g, int64_t chunks, uint8_t* b, uint8_t* scales) {
#if ORT_MTP_CPU_X86
  const int seg = kSegK(p.block_size), ck = kSegments * seg;
  const int64_t kp = p.k_blocks * p.block_size, row_bytes = p.k_blocks * p.block_bytes;
  if (seg != 32 || (g + 1) * kGroupCols > p.N || kp % ck != 0 || p.zp_kind != ZeroPointKind::kNone) return false;
  const size_t elem = ScaleBytes(p);
  const int block_shift = __builtin_ctz(static_cast<unsigned>(p.block_size));  // a power of two: no division
  const int unit_bytes = kUnitBytes(p.block_size);
  const uint8_t* src_s = static_cast<const uint8_t*>(p.scales);
  for (int col = 0; col < kGroupCols; ++col) {
    const int64_t n = g * kGroupCols + col;
    const uint8_t* row = p.b + n * row_bytes;
    for (int64_t c = 0; c < chunks; ++c) {
      const __m128i* src = reinterpret_cast<const __m128i*>(row + c * ck / 2);
      const __m128i r0 = _mm_loadu_si128(src), r1 = _mm_loadu_si128(src + 1);
      const __m128i r2 = _mm_loadu_si128(src + 2), r3 = _mm_loadu_si128(src + 3);
      const __m128i t01l = _mm_unpacklo_epi32(r0, r1), t01h = _mm_unpackhi_epi32(r0, r1);
      const __m128i t23l = _mm_unpacklo_epi32(r2, r3), t23h = _mm_unpackhi_epi32(r2, r3);
      uint8_t* u = b + c * unit_bytes + 16 * col;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(u), _mm_unpacklo_epi64(t01l, t23l));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(u + 64), _mm_unpackhi_epi64(t01l, t23l));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(u + 128), _mm_unpacklo_epi64(t01h, t23h));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(u + 192), _mm_unpackhi_epi64(t01h, t23h));
      uint8_t* sd = scales + (c * kUnitLanes + kSegments * col) * elem;
      for (int s = 0; s < kSegments; ++s) {
        const int64_t blk = (c * ck + s * seg) >> block_shift;
        if (elem == 4) {
          std::memcpy(sd + s * 4, src_s + (n * p.k_blocks + blk) * 4, 4);
        } else {
          std::memcpy(sd + s * 2, src_s + (n * p.k_blocks + blk) * 2, 2);
        }
      }
    }
  }
  return true;
#else
  (void)p, (void)g, (void)chunks, (void)b, (void)scales;
  return false;
#endif
}

// Where element k (within its chunk, k order) of a row's quantised values goes in the kernel's
// arrangement: for v = 0 .. G / 8 - 1, 16 bytes of even k then 16 of odd k, 4 bytes per segment s:
// t[s G + 8 v + parity + 0, 2, 4, 6].
inline int ArrangedIndex(int k, int seg) {
  const int s = k / seg, v = (k % seg) / 8, parity = k % 2, e = (k % 8) / 2;
  return 32 * v + 16 * parity + 4 * s + e;
}

// One chunk of quantised values t (k order) -> the kernel's arrangement d.
void ArrangeChunk(const int8_t* t, int seg, int8_t* d) {
  for (int k = 0; k < kSegments * seg; ++k) d[ArrangedIndex(k, seg)] = t[k];
}

template <typename T>
void WidenPortable(const T* a, int64_t M, int64_t K, int64_t kp, float* out) {
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) out[m * kp + k] = ToFloat(a[m * K + k]);
    for (int64_t k = K; k < kp; ++k) out[m * kp + k] = 0.f;
  }
}

// Step 1 for one row (a: kp floats; tmp: chunks * CK bytes of scratch).
void QuantizeRowPortable(const float* a, int64_t kp, int bs, int64_t chunks, int zp0, int8_t* q, int32_t* lane_sum,
                         float* lane_scale, int8_t* tmp) {
  const int seg = kSegK(bs), ck = kSegments * seg;
  const int64_t kq = chunks * ck;
  for (int64_t k0 = 0; k0 < kp; k0 += bs) {
    float amax = 0.f;
    for (int64_t k = k0; k < k0 + bs; ++k) amax = std::max(amax, std::fabs(a[k]));
    const float s = amax / 127.f;
    for (int64_t k = k0; k < k0 + bs; ++k) {
      float v = s == 0.f ? 0.f : std::nearbyint(a[k] / s);
      v = std::min(std::max(v, -127.f), 127.f);
      tmp[k] = static_cast<int8_t>(v);
    }
    for (int64_t k = k0; k < k0 + bs; k += seg) lane_scale[k / seg] = s;
  }
  for (int64_t k = kp; k < kq; ++k) tmp[k] = 0;
  for (int64_t i = kp / seg; i < kq / seg; ++i) lane_scale[i] = 0.f;
  for (int64_t c = 0; c < chunks; ++c) ArrangeChunk(tmp + c * ck, seg, q + c * ck);
  for (int64_t i = 0; i < kq / seg; ++i) {
    int sum = 0;
    for (int e = 0; e < seg; ++e) sum += tmp[seg * i + e];
    lane_sum[i] = -zp0 * sum;
  }
}

// The definition, one output at a time, from row-major weights.
template <typename T>
void Int8ScalarColumns(const Int8Job& j, int64_t n_begin, int64_t n_end) {
  const MatMulNBitsProblem& p = *j.p;
  const int seg = kSegK(p.block_size), ck = kSegments * seg;
  const T* scales = static_cast<const T*>(p.scales);
  const int64_t row_bytes = p.k_blocks * p.block_bytes, kp = p.k_blocks * p.block_size;
  for (int64_t n = n_begin; n < n_end; ++n) {
    const uint8_t* row = p.b + n * row_bytes;
    for (int64_t m = 0; m < p.M; ++m) {
      float acc[kSegments] = {};
      for (int64_t c = 0; c < j.chunks; ++c) {
        const int64_t at = m * j.chunks + c;
        const int8_t* qa = j.qa + at * ck;
        for (int s = 0; s < kSegments; ++s) {
          const int64_t k0 = c * ck + s * seg, blk = k0 / p.block_size;
          int32_t dot = 0;
          for (int e = 0; e < seg && k0 + e < kp; ++e) dot += qa[ArrangedIndex(s * seg + e, seg)] * Quant(p, row, k0 + e);
          const int32_t ls = j.lane_sum[at * kSegments + s];
          float sw = 0.f, f;
          if (blk < p.k_blocks) sw = ToFloat(scales[n * p.k_blocks + blk]);
          if (p.zp_kind == ZeroPointKind::kTyped) {
            const float zp = blk < p.k_blocks ? ToFloat(static_cast<const T*>(p.zero_points)[n * p.k_blocks + blk]) : 0.f;
            f = std::fma(zp, static_cast<float>(ls), static_cast<float>(dot));
          } else if (p.zp_kind == ZeroPointKind::kPacked) {
            const int32_t zp = blk < p.k_blocks ? static_cast<int32_t>(ZeroPoint<T>(p, n, blk)) : 0;
            f = static_cast<float>(dot + zp * ls);
          } else {
            f = static_cast<float>(dot + ls);  // ls = -8 qsum
          }
          acc[s] = std::fma(f, sw * j.lane_scale[at * kSegments + s], acc[s]);
        }
      }
      float v = (acc[0] + acc[1]) + (acc[2] + acc[3]);
      if (p.bias) v += ToFloat(static_cast<const T*>(p.bias)[n]);
      static_cast<T*>(p.y)[m * p.N + n] = FromFloat<T>(v);
    }
  }
}

void Int8ScalarRange(const Int8Job& j, int64_t b, int64_t e) {
  switch (j.p->type) {
    case FloatType::kFloat32: Int8ScalarColumns<float>(j, b, e); break;
    case FloatType::kFloat16: Int8ScalarColumns<Ort::Float16_t>(j, b, e); break;
    case FloatType::kBFloat16: Int8ScalarColumns<Ort::BFloat16_t>(j, b, e); break;
  }
}

void Int8ScalarWiden(const MatMulNBitsProblem& p, int64_t kp, float* out) {
  switch (p.type) {
    case FloatType::kFloat32: WidenPortable(static_cast<const float*>(p.a), p.M, p.K, kp, out); break;
    case FloatType::kFloat16: WidenPortable(static_cast<const Ort::Float16_t*>(p.a), p.M, p.K, kp, out); break;
    case FloatType::kBFloat16: WidenPortable(static_cast<const Ort::BFloat16_t*>(p.a), p.M, p.K, kp, out); break;
  }
}

void Int8ScalarQuantize(const float* a, int64_t M, int64_t kp, int bs, int64_t chunks, int zp0, int8_t* qa,
                        int32_t* lane_sum, float* lane_scale, int8_t* tmp) {
  const int64_t ck = kChunkK(bs);
  for (int64_t m = 0; m < M; ++m)
    QuantizeRowPortable(a + m * kp, kp, bs, chunks, zp0, qa + m * chunks * ck, lane_sum + m * chunks * kSegments,
                        lane_scale + m * chunks * kSegments, tmp);
}

// isa.range(job, begin, end) over the job's column groups, split into job.tasks contiguous ranges on
// ORT's thread pool (or in one call). A group's arithmetic does not depend on the range it is in.
template <typename Isa, typename Job>
void RangesOverTasks(const Isa& isa, const Job& job, ParallelFor parallel_for, void* parallel_context) {
  if (job.tasks == 1) {
    isa.range(job, 0, job.groups);
    return;
  }
  struct Ctx {
    const Job* job;
    const Isa* isa;
  } ctx{&job, &isa};
  parallel_for(
      parallel_context,
      [](void* user, size_t i) {
        const Ctx& c = *static_cast<const Ctx*>(user);
        const int64_t g = c.job->groups, t = c.job->tasks;
        c.isa->range(*c.job, g * static_cast<int64_t>(i) / t, g * static_cast<int64_t>(i + 1) / t);
      },
      static_cast<size_t>(job.tasks), &ctx);
}

#if ORT_MTP_CPU_X86
struct FastJob {
  const MatMulNBitsProblem* p;
  const float* a;  // A widened to float32, [M, kp], zeros past K
  int64_t kp;      // k_blocks * block_size
  int64_t groups;  // ceil(N / 4) column groups
  int64_t tasks;
};

namespace avx2 {
#define ORT_MTP_TARGET __attribute__((target("avx2,fma,f16c")))
struct V {
  using F = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kRows = 2;  // rows per tile: 2 x 4 columns of sums fit AVX2's 16 registers
  static ORT_MTP_TARGET inline F Load(const float* p) { return _mm256_load_ps(p); }
  static ORT_MTP_TARGET inline F Loadu(const float* p) { return _mm256_loadu_ps(p); }
  static ORT_MTP_TARGET inline void Storeu(float* p, F v) { _mm256_storeu_ps(p, v); }
  static ORT_MTP_TARGET inline F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static ORT_MTP_TARGET inline F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static ORT_MTP_TARGET inline F Set1(float v) { return _mm256_set1_ps(v); }
  static ORT_MTP_TARGET inline F Bcast4(const float* p) { return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(p)); }
  // 8 float16 (kType 1) or bfloat16 (2) values -> float32 (exact).
  template <int kType>
  static ORT_MTP_TARGET inline F LoadHalfFloats(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    if constexpr (kType == 1) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static ORT_MTP_TARGET inline float Hsum(F v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  // 16 quantised values at src -> q[0..16) = float(q - zp).
  template <int kBits, bool kTyped>
  static ORT_MTP_TARGET inline void Dequant16(const uint8_t* src, int zpi, float zpf, float* q) {
    __m256i i0, i1;
    if constexpr (kBits == 4) {
      const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src));
      const __m128i m = _mm_set1_epi8(0x0F);
      const __m128i b = _mm_unpacklo_epi8(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 4), m));
      i0 = _mm256_cvtepu8_epi32(b);
      i1 = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
    } else {
      i0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
      i1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + 8)));
    }
    if constexpr (kTyped) {
      const __m256 z = _mm256_set1_ps(zpf);
      _mm256_store_ps(q, _mm256_sub_ps(_mm256_cvtepi32_ps(i0), z));
      _mm256_store_ps(q + 8, _mm256_sub_ps(_mm256_cvtepi32_ps(i1), z));
    } else {
      const __m256i z = _mm256_set1_epi32(zpi);
      _mm256_store_ps(q, _mm256_cvtepi32_ps(_mm256_sub_epi32(i0, z)));
      _mm256_store_ps(q + 8, _mm256_cvtepi32_ps(_mm256_sub_epi32(i1, z)));
    }
  }
};
#include "matmul_nbits/cpu_gemv_body.h"
// The int8 kernel's integer side: u8 weights (nibbles) x s8 activations, 4 bytes per int32 lane.
struct Q {
  using I = __m256i;
  static constexpr int kRows = 2;
  static ORT_MTP_TARGET inline I LoadBytes(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
  static ORT_MTP_TARGET inline I Lo(I x) { return _mm256_and_si256(x, _mm256_set1_epi8(0x0F)); }
  static ORT_MTP_TARGET inline I Hi(I x) { return _mm256_and_si256(_mm256_srli_epi16(x, 4), _mm256_set1_epi8(0x0F)); }
  static ORT_MTP_TARGET inline I Zero() { return _mm256_setzero_si256(); }
  static ORT_MTP_TARGET inline I MulLo(I a, I b) { return _mm256_mullo_epi32(a, b); }
  static ORT_MTP_TARGET inline __m256 Cvt(I x) { return _mm256_cvtepi32_ps(x); }
  // acc + per lane (l . qe + h . qo) over its 4 bytes. maddubs pairs: |2 * 15 * 127| and their sum
  // over l and h (<= 7620) fit int16 without saturation, so this is exact, as VNNI's dpbusd.
  static ORT_MTP_TARGET inline I Dot(I acc, I l, I qe, I h, I qo) {
    const I s16 = _mm256_add_epi16(_mm256_maddubs_epi16(l, qe), _mm256_maddubs_epi16(h, qo));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(s16, _mm256_set1_epi16(1)));
  }
  // 16 bytes to both 128-bit lanes; 8 uint8 lanes widened to int32.
  static ORT_MTP_TARGET inline I Bcast128(const void* p) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  }
  static ORT_MTP_TARGET inline I LoadU8Lanes(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
};
#include "matmul_nbits/cpu_int8_body.h"
#undef ORT_MTP_TARGET
}  // namespace avx2

// AVX2 with AVX-VNNI's 256-bit vpdpbusd: the same integers as avx2::Q::Dot, so the same results.
namespace avxvnni {
#define ORT_MTP_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
using avx2::kPrefetchBytes;
using avx2::LoadScalar;
using avx2::StoreY;
using V = avx2::V;
struct Q : avx2::Q {
  static ORT_MTP_TARGET inline I Dot(I acc, I l, I qe, I h, I qo) {
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(acc, l, qe), h, qo);
  }
};
#include "matmul_nbits/cpu_int8_body.h"
#undef ORT_MTP_TARGET
}  // namespace avxvnni

namespace avx512 {
#define ORT_MTP_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
struct V {
  using F = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kRows = 4;  // 4 rows x 4 columns of sums: 16 of the 32 registers
  static ORT_MTP_TARGET inline F Load(const float* p) { return _mm512_load_ps(p); }
  static ORT_MTP_TARGET inline F Loadu(const float* p) { return _mm512_loadu_ps(p); }
  static ORT_MTP_TARGET inline void Storeu(float* p, F v) { _mm512_storeu_ps(p, v); }
  static ORT_MTP_TARGET inline F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static ORT_MTP_TARGET inline F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static ORT_MTP_TARGET inline F Set1(float v) { return _mm512_set1_ps(v); }
  static ORT_MTP_TARGET inline F Bcast4(const float* p) { return _mm512_broadcast_f32x4(_mm_loadu_ps(p)); }
  template <int kType>
  static ORT_MTP_TARGET inline F LoadHalfFloats(const uint16_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    if constexpr (kType == 1) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static ORT_MTP_TARGET inline float Hsum(F v) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  template <int kBits, bool kTyped>
  static ORT_MTP_TARGET inline void Dequant16(const uint8_t* src, int zpi, float zpf, float* q) {
    __m512i i0;
    if constexpr (kBits == 4) {
      const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src));
      const __m128i m = _mm_set1_epi8(0x0F);
      i0 = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 4), m)));
    } else {
      i0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    }
    if constexpr (kTyped) {
      _mm512_store_ps(q, _mm512_sub_ps(_mm512_cvtepi32_ps(i0), _mm512_set1_ps(zpf)));
    } else {
      _mm512_store_ps(q, _mm512_cvtepi32_ps(_mm512_sub_epi32(i0, _mm512_set1_epi32(zpi))));
    }
  }
};
#include "matmul_nbits/cpu_gemv_body.h"
struct Q {
  using I = __m512i;
  static constexpr int kRows = 8;  // 8 rows x 16 lanes of sums beside a unit's 8 weight vectors: 32 registers hold them
  static ORT_MTP_TARGET inline I LoadBytes(const void* p) { return _mm512_loadu_si512(p); }
  static ORT_MTP_TARGET inline I Lo(I x) { return _mm512_and_si512(x, _mm512_set1_epi8(0x0F)); }
  static ORT_MTP_TARGET inline I Hi(I x) { return _mm512_and_si512(_mm512_srli_epi16(x, 4), _mm512_set1_epi8(0x0F)); }
  static ORT_MTP_TARGET inline I Zero() { return _mm512_setzero_si512(); }
  static ORT_MTP_TARGET inline I MulLo(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static ORT_MTP_TARGET inline __m512 Cvt(I x) { return _mm512_cvtepi32_ps(x); }
  static ORT_MTP_TARGET inline I Dot(I acc, I l, I qe, I h, I qo) {  // exact: see avx2::Q::Dot
    const I s16 = _mm512_add_epi16(_mm512_maddubs_epi16(l, qe), _mm512_maddubs_epi16(h, qo));
    return _mm512_add_epi32(acc, _mm512_madd_epi16(s16, _mm512_set1_epi16(1)));
  }
  static ORT_MTP_TARGET inline I Bcast128(const void* p) {
    return _mm512_broadcast_i32x4(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  }
  static ORT_MTP_TARGET inline I LoadU8Lanes(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
#include "matmul_nbits/cpu_int8_body.h"
#undef ORT_MTP_TARGET
}  // namespace avx512

// AVX-512 VNNI's vpdpbusd: the same integers as avx512::Q::Dot, so the same results.
namespace avx512vnni {
#define ORT_MTP_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
using avx512::kPrefetchBytes;
using avx512::LoadScalar;
using avx512::StoreY;
using V = avx512::V;
struct Q : avx512::Q {
  static ORT_MTP_TARGET inline I Dot(I acc, I l, I qe, I h, I qo) {
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(acc, l, qe), h, qo);
  }
};
#include "matmul_nbits/cpu_int8_body.h"
#undef ORT_MTP_TARGET
}  // namespace avx512vnni

struct FastIsa {
  const char* name;
  void (*widen)(const FastJob&, float*);
  void (*range)(const FastJob&, int64_t, int64_t);
};
constexpr FastIsa kAvx2{"avx2", avx2::WidenEntry, avx2::RangeEntry};
constexpr FastIsa kAvx512{"avx512", avx512::WidenEntry, avx512::RangeEntry};

bool CpuHasAvx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
bool CpuHasAvx512() {
  return CpuHasAvx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
}

// The kernel this process uses, chosen once.
const FastIsa* ChooseIsa() {
  const char* env = std::getenv("ORT_MTP_CPU_KERNEL");
  const std::string want = env ? env : "auto";
  if (want == "reference") return nullptr;
  if (want == "avx2" || want == "avxvnni") return CpuHasAvx2() ? &kAvx2 : nullptr;
  if (want == "avx512" || want == "avx512-novnni") return CpuHasAvx512() ? &kAvx512 : nullptr;
  if (CpuHasAvx512()) return &kAvx512;
  if (CpuHasAvx2()) return &kAvx2;
  return nullptr;
}

const FastIsa* Isa() {
  static const FastIsa* isa = ChooseIsa();
  return isa;
}

bool FastApplies(const MatMulNBitsProblem& p) { return p.layout == WeightLayout::kRowMajor; }

void RunFast(const FastIsa& isa, const MatMulNBitsProblem& p, ParallelFor parallel_for, void* parallel_context) {
  FastJob j;
  j.p = &p;
  j.kp = p.k_blocks * p.block_size;
  j.groups = (p.N + 3) / 4;
  // Tasks of at least 4 groups (16 columns). Each output's arithmetic is the same whichever task or
  // thread computes it, so the split only moves work, never changes a result.
  j.tasks = parallel_for ? std::max<int64_t>(1, std::min<int64_t>(64, j.groups / 4)) : 1;
  static thread_local std::vector<float> a_buf;
  const size_t need = static_cast<size_t>(p.M * j.kp);
  if (a_buf.size() < need) a_buf.resize(need);
  isa.widen(j, a_buf.data());
  j.a = a_buf.data();
  RangesOverTasks(isa, j, parallel_for, parallel_context);
}
#endif  // ORT_MTP_CPU_X86

// The int8 kernels: (name, columns per work unit, widen A to float32 [M, kp], quantise, compute a
// range of work units).
struct Int8Isa {
  const char* name;
  int group;  // columns per work unit
  void (*widen)(const MatMulNBitsProblem&, int64_t kp, float* out);
  void (*quantize)(const float*, int64_t, int64_t, int, int64_t, int, int8_t*, int32_t*, float*, int8_t*);
  void (*range)(const Int8Job&, int64_t, int64_t);
};
constexpr Int8Isa kInt8Scalar{"scalar-int8", 1, Int8ScalarWiden, Int8ScalarQuantize, Int8ScalarRange};

#if ORT_MTP_CPU_X86
template <void (*kWiden)(const FastJob&, float*)>
void WidenVia(const MatMulNBitsProblem& p, int64_t kp, float* out) {
  FastJob j{};
  j.p = &p;
  j.kp = kp;
  kWiden(j, out);
}
constexpr Int8Isa kInt8Avx2{"avx2-int8", 4, WidenVia<avx2::WidenEntry>, avx2::Int8QuantizeEntry, avx2::Int8RangeEntry};
constexpr Int8Isa kInt8AvxVnni{"avxvnni-int8", 4, WidenVia<avx2::WidenEntry>, avxvnni::Int8QuantizeEntry,
                               avxvnni::Int8RangeEntry};
constexpr Int8Isa kInt8Avx512{"avx512-int8", 4, WidenVia<avx512::WidenEntry>, avx512::Int8QuantizeEntry,
                              avx512::Int8RangeEntry};
constexpr Int8Isa kInt8Avx512Vnni{"avx512vnni-int8", 4, WidenVia<avx512::WidenEntry>,
                                  avx512vnni::Int8QuantizeEntry, avx512vnni::Int8RangeEntry};

bool CpuHasAvxVnni() { return CpuHasAvx2() && __builtin_cpu_supports("avxvnni"); }
bool CpuHasAvx512Vnni() { return CpuHasAvx512() && __builtin_cpu_supports("avx512vnni"); }
#endif

const Int8Isa* ChooseInt8Isa() {
#if ORT_MTP_CPU_X86
  const char* env = std::getenv("ORT_MTP_CPU_KERNEL");
  const std::string want = env ? env : "auto";
  if (want == "reference") return &kInt8Scalar;
  if (want == "avx2") return CpuHasAvx2() ? &kInt8Avx2 : &kInt8Scalar;
  if (want == "avxvnni") return CpuHasAvxVnni() ? &kInt8AvxVnni : CpuHasAvx2() ? &kInt8Avx2 : &kInt8Scalar;
  if (want == "avx512-novnni") return CpuHasAvx512() ? &kInt8Avx512 : &kInt8Scalar;
  if (want == "avx512") return CpuHasAvx512Vnni() ? &kInt8Avx512Vnni : CpuHasAvx512() ? &kInt8Avx512 : &kInt8Scalar;
  if (CpuHasAvx512Vnni()) return &kInt8Avx512Vnni;
  if (CpuHasAvx512()) return &kInt8Avx512;
  if (CpuHasAvxVnni()) return &kInt8AvxVnni;
  if (CpuHasAvx2()) return &kInt8Avx2;
#endif
  return &kInt8Scalar;
}

const Int8Isa& Int8IsaChosen() {
  static const Int8Isa* isa = ChooseInt8Isa();
  return *isa;
}

bool Int8Applies(const MatMulNBitsProblem& p) {
  return p.accuracy_level == 4 && p.bits == 4 &&
         (p.layout == WeightLayout::kRowMajor || p.layout == WeightLayout::kCpuGroups);
}

// Step 1 (widen, quantise) of p's A into this thread's buffers: the job's fields but `tasks`. The
// quantisation depends on A, the block size and whether the node has zero points (zp0) only, so two
// weight sets of one node that agree in those share it (MatMulNBitsCpuPair).
Int8Job QuantizeInt8(const Int8Isa& isa, const MatMulNBitsProblem& p) {
  const int ck = kChunkK(p.block_size);
  const int64_t kp = p.k_blocks * p.block_size;
  Int8Job j{};
  j.p = &p;
  j.chunks = (kp + ck - 1) / ck;
  j.groups = (p.N + isa.group - 1) / isa.group;
  static thread_local std::vector<float> a_buf, lane_scale;
  static thread_local std::vector<int8_t> qa, tmp;
  static thread_local std::vector<int32_t> lane_sum;
  auto grow = [](auto& v, size_t n) { if (v.size() < n) v.resize(n); };
  grow(a_buf, static_cast<size_t>(p.M * kp));
  grow(qa, static_cast<size_t>(p.M * j.chunks * ck) + 64);
  grow(tmp, static_cast<size_t>(j.chunks * ck) + 64);
  grow(lane_sum, static_cast<size_t>(p.M * j.chunks * kSegments));
  grow(lane_scale, static_cast<size_t>(p.M * j.chunks * kSegments));
  isa.widen(p, kp, a_buf.data());
  const int zp0 = p.zp_kind == ZeroPointKind::kNone ? (1 << (p.bits - 1)) : 1;
  isa.quantize(a_buf.data(), p.M, kp, p.block_size, j.chunks, zp0, qa.data(), lane_sum.data(), lane_scale.data(),
               tmp.data());
  j.qa = qa.data();
  j.lane_sum = lane_sum.data();
  j.lane_scale = lane_scale.data();
  return j;
}

// Tasks of at least 16 columns and 32K weights (a smaller node costs less than handing work to another
// thread); each output's arithmetic is the same whichever task computes it.
int64_t Int8Tasks(bool parallel, int64_t columns, int64_t weights) {
  return parallel ? std::max<int64_t>(1, std::min<int64_t>({64, columns / 16, weights / (32 << 10)})) : 1;
}

void RunInt8(const Int8Isa& isa, const MatMulNBitsProblem& p, ParallelFor parallel_for, void* parallel_context) {
  Int8Job j = QuantizeInt8(isa, p);
  j.tasks = Int8Tasks(parallel_for != nullptr, j.groups * isa.group, p.N * p.k_blocks * p.block_size);
  RangesOverTasks(isa, j, parallel_for, parallel_context);
}

// SwiGLU's definition, applied where a pair's up projection was written: y = T(silu(g) * u), g and u
// the two products as the type holds them, silu.h's SiluMul (one fixed sequence of float32 operations,
// shared with the CUDA kernels), so the AVX2 loop below and the scalar one give the same bits.
using silu::kExpHi, silu::kExpLo, silu::kLn2Hi, silu::kLn2Lo, silu::kLog2e, silu::kRound, silu::SiluMul;
constexpr float kExpC[6] = {silu::kExpC0, silu::kExpC1, silu::kExpC2, silu::kExpC3, silu::kExpC4, silu::kExpC5};

#if ORT_MTP_CPU_X86
// SiluMul on 8 lanes at a time; the remainder through the scalar SiluMul (the same bits).
__attribute__((target("avx2,fma"))) void SiluMulAvx2(const float* g, float* yu, int64_t n) {
  const __m256 lo = _mm256_set1_ps(kExpLo), hi = _mm256_set1_ps(kExpHi), log2e = _mm256_set1_ps(kLog2e);
  const __m256 round = _mm256_set1_ps(kRound), one = _mm256_set1_ps(1.0f);
  const __m256 ln2_hi = _mm256_set1_ps(-kLn2Hi), ln2_lo = _mm256_set1_ps(-kLn2Lo);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    __m256 x = _mm256_sub_ps(_mm256_setzero_ps(), gv);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    const __m256 nf = _mm256_sub_ps(_mm256_fmadd_ps(x, log2e, round), round);
    const __m256 r = _mm256_fmadd_ps(nf, ln2_lo, _mm256_fmadd_ps(nf, ln2_hi, x));
    __m256 q = _mm256_set1_ps(kExpC[0]);
    for (int c = 1; c < 6; ++c) q = _mm256_fmadd_ps(q, r, _mm256_set1_ps(kExpC[c]));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(nf), _mm256_set1_epi32(127)), 23);
    const __m256 e = _mm256_mul_ps(_mm256_add_ps(_mm256_fmadd_ps(q, _mm256_mul_ps(r, r), r), one),
                                   _mm256_castsi256_ps(bits));
    const __m256 y = _mm256_mul_ps(_mm256_div_ps(gv, _mm256_add_ps(one, e)), _mm256_loadu_ps(yu + i));
    _mm256_storeu_ps(yu + i, y);
  }
  for (; i < n; ++i) yu[i] = SiluMul(g[i], yu[i]);
}
#endif

// yu[i] = SiluMul(g[i], yu[i]) for i < n; the AVX2 loop wherever the float32 kernel has a SIMD choice
// (ORT_MTP_CPU_KERNEL=reference runs the scalar loop, which the tests compare it with).
void SiluMulRow(const float* g, float* yu, int64_t n) {
#if ORT_MTP_CPU_X86
  if (Isa() != nullptr) {
    SiluMulAvx2(g, yu, n);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) yu[i] = SiluMul(g[i], yu[i]);
}

template <typename T>
void SwiGluColumnsT(const MatMulNBitsProblem& up, const void* gate, int64_t n_begin, int64_t n_end) {
  const T* g = static_cast<const T*>(gate);
  T* y = static_cast<T*>(up.y);
  for (int64_t m = 0; m < up.M; ++m) {
    const int64_t row = m * up.N;
    if constexpr (std::is_same_v<T, float>) {
      SiluMulRow(g + row + n_begin, y + row + n_begin, n_end - n_begin);
    } else {  // widen 64 at a time, then round once to the type
      float gf[64], yf[64];
      for (int64_t n0 = n_begin; n0 < n_end; n0 += 64) {
        const int64_t c = std::min<int64_t>(64, n_end - n0);
        for (int64_t i = 0; i < c; ++i) gf[i] = ToFloat(g[row + n0 + i]), yf[i] = ToFloat(y[row + n0 + i]);
        SiluMulRow(gf, yf, c);
        for (int64_t i = 0; i < c; ++i) y[row + n0 + i] = FromFloat<T>(yf[i]);
      }
    }
  }
}

void SwiGluColumns(const MatMulNBitsProblem& up, const void* gate, int64_t n_begin, int64_t n_end) {
  switch (up.type) {
    case FloatType::kFloat32: SwiGluColumnsT<float>(up, gate, n_begin, n_end); break;
    case FloatType::kFloat16: SwiGluColumnsT<Ort::Float16_t>(up, gate, n_begin, n_end); break;
    case FloatType::kBFloat16: SwiGluColumnsT<Ort::BFloat16_t>(up, gate, n_begin, n_end); break;
  }
}

// Two weight sets on one quantised A as one piece of work for the thread pool (RangesOverTasks): the
// work units are the first set's column groups, then the second's, so the tasks walk each weight set
// front to back as two one-weight nodes would. (Giving each task the same columns of both sets instead
// makes a thread read the weights in short runs from two places, which the hardware prefetchers follow
// worse where the weights stream from memory rather than cache: a model's forward, not a node alone.)
struct Int8Pair {
  Int8Job first, second;  // sharing qa, lane_sum and lane_scale
  int64_t groups, tasks;
};

struct Int8PairIsa {
  const Int8Isa* isa;
  void range(const Int8Pair& j, int64_t b, int64_t e) const {
    const int64_t g1 = j.first.groups;
    if (b < g1) isa->range(j.first, b, std::min(e, g1));
    if (e > g1) isa->range(j.second, std::max(b, g1) - g1, e - g1);
  }
};

// The SwiGLU epilogue over all of `up`'s columns, split in column ranges over the pool.
void SwiGluAll(const MatMulNBitsProblem& up, const void* gate, ParallelFor parallel_for, void* parallel_context) {
  const int64_t tasks = parallel_for ? std::max<int64_t>(1, std::min<int64_t>(16, up.M * up.N / 8192)) : 1;
  if (tasks == 1) {
    SwiGluColumns(up, gate, 0, up.N);
    return;
  }
  struct Ctx {
    const MatMulNBitsProblem* up;
    const void* gate;
    int64_t tasks;
  } ctx{&up, gate, tasks};
  parallel_for(
      parallel_context,
      [](void* user, size_t i) {
        const Ctx& c = *static_cast<const Ctx*>(user);
        const int64_t n = c.up->N;
        SwiGluColumns(*c.up, c.gate, n * static_cast<int64_t>(i) / c.tasks, n * static_cast<int64_t>(i + 1) / c.tasks);
      },
      static_cast<size_t>(tasks), &ctx);
}

}  // namespace

void MatMulNBitsCpuPair(const MatMulNBitsProblem& p1, const MatMulNBitsProblem& p2, PairEpilogue epilogue,
                        ParallelFor parallel_for, void* parallel_context) {
  const bool swiglu = epilogue == PairEpilogue::kSwiGlu;
  if (swiglu && p1.N != p2.N) throw std::logic_error("SwiGLU needs two weight sets of one N");
  MatMulNBitsProblem first = p1, second = p2;
  static thread_local std::vector<uint8_t> gate;
  if (swiglu) {  // the gate projection goes to scratch, the up projection to Y, then Y = silu(gate) * Y
    gate.resize(static_cast<size_t>(p1.M * p1.N) * ScaleBytes(p1));
    first.y = gate.data();
    second.y = p1.y;
  }
  const bool share = Int8Applies(first) && Int8Applies(second) && first.block_size == second.block_size &&
                     first.K == second.K && first.M == second.M &&
                     (first.zp_kind == ZeroPointKind::kNone) == (second.zp_kind == ZeroPointKind::kNone);
  if (!share) {  // the float32 and reference kernels: one product after the other
    MatMulNBitsCpu(first, parallel_for, parallel_context);
    MatMulNBitsCpu(second, parallel_for, parallel_context);
    if (swiglu) SwiGluAll(second, gate.data(), parallel_for, parallel_context);
    return;
  }
  for (const MatMulNBitsProblem* p : {&first, &second})
    if (p->layout == WeightLayout::kCpuGroups && Int8IsaChosen().group != kGroupCols)
      throw std::logic_error("kCpuGroups weights reached a kernel that cannot read them");
  const Int8Isa& isa = Int8IsaChosen();
  Int8Pair j{};
  j.first = QuantizeInt8(isa, first);
  j.second = j.first;
  j.second.p = &second;
  j.second.groups = (second.N + isa.group - 1) / isa.group;
  j.groups = j.first.groups + j.second.groups;
  const int64_t kp = first.k_blocks * first.block_size;
  j.tasks = Int8Tasks(parallel_for != nullptr, j.groups * isa.group, (first.N + second.N) * kp);
  j.first.tasks = j.second.tasks = j.tasks;
  RangesOverTasks(Int8PairIsa{&isa}, j, parallel_for, parallel_context);
  if (swiglu) SwiGluAll(second, gate.data(), parallel_for, parallel_context);
}

void MatMulNBitsCpuReference(const MatMulNBitsProblem& p, ParallelFor parallel_for, void* parallel_context) {
  switch (p.type) {
    case FloatType::kFloat32: Run<float>(p, parallel_for, parallel_context); break;
    case FloatType::kFloat16: Run<Ort::Float16_t>(p, parallel_for, parallel_context); break;
    case FloatType::kBFloat16: Run<Ort::BFloat16_t>(p, parallel_for, parallel_context); break;
  }
}

const char* MatMulNBitsCpuKernel(const MatMulNBitsProblem& p) {
  if (Int8Applies(p)) return Int8IsaChosen().name;
#if ORT_MTP_CPU_X86
  if (const FastIsa* isa = Isa(); isa && FastApplies(p)) return isa->name;
#else
  (void)p;
#endif
  return "reference";
}

bool MatMulNBitsCpuPackable(const MatMulNBitsProblem& p) {
  const char* env = std::getenv("ORT_MTP_CPU_PACK");
  if (env && std::string(env) == "0") return false;
  return p.layout == WeightLayout::kRowMajor && Int8Applies(p) && Int8IsaChosen().group == kGroupCols;
}

namespace {
// The sizes of p's kCpuGroups copy.
struct GroupedSizes {
  int64_t groups, chunks;
  size_t unit_bytes, elem, zp_elem, b, scales, zero_points;
};

GroupedSizes GroupedSizesOf(const MatMulNBitsProblem& p) {
  GroupedSizes z{};
  const int64_t kp = p.k_blocks * p.block_size, ck = kChunkK(p.block_size);
  z.groups = (p.N + kGroupCols - 1) / kGroupCols;
  z.chunks = (kp + ck - 1) / ck;
  const size_t units = static_cast<size_t>(z.groups * z.chunks);
  z.elem = ScaleBytes(p);
  z.zp_elem = GroupedZeroPointBytes(p);
  z.unit_bytes = static_cast<size_t>(kUnitBytes(p.block_size));
  z.b = units * z.unit_bytes;
  z.scales = units * kUnitLanes * z.elem;
  z.zero_points = p.zp_kind == ZeroPointKind::kNone ? 0 : units * kUnitLanes * z.zp_elem;
  return z;
}
}  // namespace

size_t MatMulNBitsCpuPackBytes(const MatMulNBitsProblem& p) {
  const GroupedSizes z = GroupedSizesOf(p);
  return z.b + z.scales + z.zero_points;
}

namespace {
// Group g of p's weights in the kCpuGroups layout, into b, scales and zp (null without zero points):
// the bytes MatMulNBitsCpuPack writes at the group's place.
void PackGroup(const MatMulNBitsProblem& p, const GroupedSizes& z, int64_t g, uint8_t* b, uint8_t* scales,
               uint8_t* zp) {
  if (GatherGroup(p, g, z.chunks, b, scales)) return;
  for (int64_t c = 0; c < z.chunks; ++c)
    GatherUnit(p, g, c, b + c * z.unit_bytes, scales + c * kUnitLanes * z.elem, zp ? zp + c * kUnitLanes * z.zp_elem : nullptr);
}

// The bytes of one group in each of the copy's three arrays.
struct GroupBytes {
  size_t b, scales, zero_points;
};
GroupBytes GroupBytesOf(const GroupedSizes& z) {
  const size_t chunks = static_cast<size_t>(z.chunks);
  return {chunks * z.unit_bytes, chunks * kUnitLanes * z.elem, z.zero_points ? chunks * kUnitLanes * z.zp_elem : 0};
}
}  // namespace

void MatMulNBitsCpuPack(const MatMulNBitsProblem& p, CpuGroupedWeights& out) {
  const GroupedSizes z = GroupedSizesOf(p);
  const GroupBytes per = GroupBytesOf(z);
  out.b = HugePageBytes(z.b);
  out.scales = HugePageBytes(z.scales);
  out.zero_points = HugePageBytes(z.zero_points);
  for (int64_t g = 0; g < z.groups; ++g)
    PackGroup(p, z, g, out.b.data() + g * per.b, out.scales.data() + g * per.scales,
              out.zero_points.empty() ? nullptr : out.zero_points.data() + g * per.zero_points);
}

namespace {
// A cheap key for p's weights, read from its row-major inputs: the problem's shape and 64 bytes at each
// of 64 evenly spaced places of B (plus the first and last of scales and zero points). Copies with equal
// keys are then compared in full (PackedEquals).
uint64_t SourceKey(const MatMulNBitsProblem& p) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  auto sample = [&mix](const void* data, size_t size, int places) {
    mix(size);
    if (data == nullptr || size == 0) return;
    const uint8_t* bytes = static_cast<const uint8_t*>(data);
    const size_t window = std::min<size_t>(64, size);
    for (int i = 0; i < places; ++i) {
      const size_t at = (size - window) / (places > 1 ? places - 1 : 1) * i;
      for (size_t j = 0; j < window; j += 8) {
        uint64_t v = 0;
        std::memcpy(&v, bytes + at + j, std::min<size_t>(8, window - j));
        mix(v);
      }
    }
  };
  const GroupedSizes z = GroupedSizesOf(p);
  mix(static_cast<uint64_t>(p.N)), mix(static_cast<uint64_t>(p.k_blocks)), mix(static_cast<uint64_t>(p.block_size));
  mix(static_cast<uint64_t>(p.zp_kind)), mix(z.b), mix(z.scales), mix(z.zero_points);
  const size_t blocks = static_cast<size_t>(p.N * p.k_blocks);
  sample(p.b, blocks * static_cast<size_t>(p.block_bytes), 64);
  sample(p.scales, blocks * ScaleBytes(p), 2);
  if (p.zp_kind == ZeroPointKind::kPacked) sample(p.zero_points, static_cast<size_t>(p.N * p.zp_row_bytes), 2);
  if (p.zp_kind == ZeroPointKind::kTyped) sample(p.zero_points, blocks * ScaleBytes(p), 2);
  return h;
}

// Whether `w` holds the bytes MatMulNBitsCpuPack(p) would write, found group by group without
// allocating a copy of the whole.
bool PackedEquals(const MatMulNBitsProblem& p, const CpuGroupedWeights& w) {
  const GroupedSizes z = GroupedSizesOf(p);
  if (w.b.size() != z.b || w.scales.size() != z.scales || w.zero_points.size() != z.zero_points) return false;
  const GroupBytes per = GroupBytesOf(z);
  std::vector<uint8_t> b(per.b), scales(per.scales), zp(per.zero_points);
  for (int64_t g = 0; g < z.groups; ++g) {
    PackGroup(p, z, g, b.data(), scales.data(), zp.empty() ? nullptr : zp.data());
    if (std::memcmp(b.data(), w.b.data() + g * per.b, per.b) != 0 ||
        std::memcmp(scales.data(), w.scales.data() + g * per.scales, per.scales) != 0 ||
        (!zp.empty() && std::memcmp(zp.data(), w.zero_points.data() + g * per.zero_points, per.zero_points) != 0))
      return false;
  }
  return true;
}

bool SameBytes(const CpuGroupedWeights& x, const CpuGroupedWeights& y) {
  auto same = [](const HugePageBytes& u, const HugePageBytes& v) {
    return u.size() == v.size() && (u.size() == 0 || std::memcmp(u.data(), v.data(), u.size()) == 0);
  };
  return same(x.b, y.b) && same(x.scales, y.scales) && same(x.zero_points, y.zero_points);
}
}  // namespace

std::shared_ptr<const CpuGroupedWeights> MatMulNBitsCpuPackShared(const MatMulNBitsProblem& p) {
  const uint64_t key = SourceKey(p);
  // Copies held by live kernels, by key. Entries whose kernels are all gone are dropped on every call
  // (a few hundred per model), so a process that creates and frees many sessions keeps none of them.
  // A copy equal to one held is found before anything is allocated: the MTP head's lm_head (the main
  // model's) is then packed once, and no spare copy is left as dead space in a huge-page chunk.
  // The lock covers the table only: comparing and packing read all of p's weights, and sessions
  // created on several threads at once do that at the same time.
  static std::mutex mutex;
  static std::unordered_multimap<uint64_t, std::weak_ptr<const CpuGroupedWeights>> held;
  auto same_key = [&key](std::vector<std::shared_ptr<const CpuGroupedWeights>>& out) {
    std::lock_guard<std::mutex> lock(mutex);
    for (auto it = held.begin(); it != held.end();) it = it->second.expired() ? held.erase(it) : std::next(it);
    for (auto [it, end] = held.equal_range(key); it != end; ++it)
      if (auto other = it->second.lock()) out.push_back(std::move(other));
  };
  std::vector<std::shared_ptr<const CpuGroupedWeights>> compared;
  same_key(compared);
  for (const auto& other : compared)
    if (PackedEquals(p, *other)) return other;
  auto packed = std::make_shared<CpuGroupedWeights>();
  MatMulNBitsCpuPack(p, *packed);
  // Another thread may have added an equal copy while this one packed: keep one (the packed bytes are
  // compared directly, under the lock, so that two threads cannot both add theirs).
  std::lock_guard<std::mutex> lock(mutex);
  for (auto [it, end] = held.equal_range(key); it != end; ++it) {
    std::shared_ptr<const CpuGroupedWeights> other = it->second.lock();
    const bool seen = std::find(compared.begin(), compared.end(), other) != compared.end();
    if (other && !seen && SameBytes(*packed, *other)) return other;
  }
  held.emplace(key, packed);
  return packed;
}

void MatMulNBitsCpu(const MatMulNBitsProblem& p, ParallelFor parallel_for, void* parallel_context) {
  if (p.layout == WeightLayout::kCpuGroups && Int8IsaChosen().group != kGroupCols)
    throw std::logic_error("kCpuGroups weights reached a kernel that cannot read them");  // packed only for it
  if (Int8Applies(p)) {
    RunInt8(Int8IsaChosen(), p, parallel_for, parallel_context);
    return;
  }
#if ORT_MTP_CPU_X86
  if (const FastIsa* isa = Isa(); isa && FastApplies(p)) {
    RunFast(*isa, p, parallel_for, parallel_context);
    return;
  }
#endif
  MatMulNBitsCpuReference(p, parallel_for, parallel_context);
}

}  // namespace ort_mtp
