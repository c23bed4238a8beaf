// CPU kernels of MatMulNBits.
// - The reference (MatMulNBitsCpuReference): written for clarity and exactness, not speed: each weight
//   row is dequantised to float once (scale * (q - zero_point), the same float arithmetic as ONNX
//   Runtime's dequantisation), then dotted with every row of A in double. The tests' oracle.
// - The fast kernel (cpu_gemv_body.h): a batched GEMV in float32 with a fixed per-output order of
//   operations (AVX-512 or AVX2+FMA, picked at run time with __builtin_cpu_supports), used by
//   default wherever it applies (row-major layout; everything else takes the reference).
// ORT_MTP_CPU_KERNEL (read once per process) picks one: "reference", "avx2", "avx512"; unset or
// "auto" means the best this CPU runs. An instruction set the CPU lacks falls back to the reference.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/ort.h"
#include "matmul_nbits/matmul_nbits.h"

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
#undef ORT_MTP_TARGET
}  // namespace avx2

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
#undef ORT_MTP_TARGET
}  // namespace avx512

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
  if (want == "avx2") return CpuHasAvx2() ? &kAvx2 : nullptr;
  if (want == "avx512") return CpuHasAvx512() ? &kAvx512 : nullptr;
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
  if (j.tasks == 1) {
    isa.range(j, 0, j.groups);
    return;
  }
  struct Ctx {
    const FastJob* j;
    const FastIsa* isa;
  } ctx{&j, &isa};
  parallel_for(
      parallel_context,
      [](void* user, size_t i) {
        const Ctx& c = *static_cast<const Ctx*>(user);
        const int64_t g = c.j->groups, t = c.j->tasks;
        c.isa->range(*c.j, g * static_cast<int64_t>(i) / t, g * static_cast<int64_t>(i + 1) / t);
      },
      static_cast<size_t>(j.tasks), &ctx);
}
#endif  // ORT_MTP_CPU_X86

}  // namespace

void MatMulNBitsCpuReference(const MatMulNBitsProblem& p, ParallelFor parallel_for, void* parallel_context) {
  switch (p.type) {
    case ElemType::kFloat32: Run<float>(p, parallel_for, parallel_context); break;
    case ElemType::kFloat16: Run<Ort::Float16_t>(p, parallel_for, parallel_context); break;
    case ElemType::kBFloat16: Run<Ort::BFloat16_t>(p, parallel_for, parallel_context); break;
  }
}

const char* MatMulNBitsCpuKernel(const MatMulNBitsProblem& p) {
#if ORT_MTP_CPU_X86
  if (const FastIsa* isa = Isa(); isa && FastApplies(p)) return isa->name;
#else
  (void)p;
#endif
  return "reference";
}

void MatMulNBitsCpu(const MatMulNBitsProblem& p, ParallelFor parallel_for, void* parallel_context) {
#if ORT_MTP_CPU_X86
  if (const FastIsa* isa = Isa(); isa && FastApplies(p)) {
    RunFast(*isa, p, parallel_for, parallel_context);
    return;
  }
#endif
  MatMulNBitsCpuReference(p, parallel_for, parallel_context);
}

}  // namespace ort_mtp
