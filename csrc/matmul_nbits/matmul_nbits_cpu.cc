// CPU reference kernel of MatMulNBits. Written for clarity and exactness, not speed: each weight row
// is dequantised to float once (scale * (q - zero_point), the same float arithmetic as ONNX Runtime's
// dequantisation), then dotted with every row of A in double.
#include <algorithm>
#include <vector>

#include "common/ort.h"
#include "matmul_nbits/matmul_nbits.h"

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

}  // namespace

void MatMulNBitsCpu(const MatMulNBitsProblem& p, ParallelFor parallel_for, void* parallel_context) {
  switch (p.type) {
    case ElemType::kFloat32: Run<float>(p, parallel_for, parallel_context); break;
    case ElemType::kFloat16: Run<Ort::Float16_t>(p, parallel_for, parallel_context); break;
    case ElemType::kBFloat16: Run<Ort::BFloat16_t>(p, parallel_for, parallel_context); break;
  }
}

}  // namespace ort_mtp
