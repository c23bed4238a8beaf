// The MatMul op's CPU kernel (float_matmul.h). A task computes a tile of up to 4 rows x 16 columns:
// k ascending, one float32 product and one float32 sum per step for every output, the 4 x 16
// accumulators in registers (the loop over a tile's columns is vectorised; B's row segment is loaded
// once for the tile's rows). The tile's loops are compiled for AVX-512, AVX2 and baseline x86-64
// (target_clones, picked at load), and the file with -ffp-contract=off (CMakeLists.txt), so no clone fuses
// a multiply-add: every clone, vector lane and row count computes the same bits, so a row's result
// depends neither on M nor on which tile or thread computed it.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/cpu_numeric.h"
#include "float_matmul/float_matmul.h"

namespace ort_mtp {
namespace {

constexpr int kTileRows = 4;
constexpr int kTileCols = 16;

// acc[r][j] = sum over k ascending of x[r][k] * b[k * ldb + j], for r < kRows and j < kTileCols. GCC's
// vector extension (two 8-float vectors per row) keeps the accumulators in registers, which a plain
// array of floats does not (GCC spills it to the stack every step); the arithmetic is the same.
typedef float Float8 __attribute__((vector_size(32)));

template <int kRows>
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void TileDot(const float* const* x, const float* b, int64_t ldb, int64_t k_extent, float* out) {
  static_assert(kTileCols == 16, "two Float8 per row");
  Float8 acc[kRows][2];
  for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = Float8{};
  for (int64_t k = 0; k < k_extent; ++k) {
    Float8 b0, b1;
    std::memcpy(&b0, b + k * ldb, sizeof b0);
    std::memcpy(&b1, b + k * ldb + 8, sizeof b1);
    for (int r = 0; r < kRows; ++r) {
      const Float8 xr = Float8{} + x[r][k];
      acc[r][0] = acc[r][0] + xr * b0;
      acc[r][1] = acc[r][1] + xr * b1;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    std::memcpy(out + r * kTileCols, &acc[r][0], sizeof acc[r][0]);
    std::memcpy(out + r * kTileCols + 8, &acc[r][1], sizeof acc[r][1]);
  }
}

inline float ToF(float v) { return v; }
inline float ToF(Ort::Float16_t v) { return v.ToFloat(); }
inline float ToF(Ort::BFloat16_t v) { return v.ToFloat(); }

template <typename T>
struct Tiles {
  const FloatMatMulProblem& p;
  int64_t col_tiles;
  std::vector<float> a32;  // A as float32 (T = float: unused)

  const float* Row(int64_t m) const {
    return std::is_same_v<T, float> ? static_cast<const float*>(p.a) + m * p.k : a32.data() + m * p.k;
  }

  void Run(int64_t task) {
    const int64_t r0 = (task / col_tiles) * kTileRows, c0 = (task % col_tiles) * kTileCols;
    const int rows = static_cast<int>(std::min<int64_t>(kTileRows, p.m - r0));
    const int cols = static_cast<int>(std::min<int64_t>(kTileCols, p.n - c0));
    // B's columns c0 .. c0 + 15 in place when they are float32 and all there; else a float32 copy
    // (zeros past N), whose values and order of use are the same.
    const float* b = nullptr;
    int64_t ldb = p.n;
    std::vector<float> copy;
    if (std::is_same_v<T, float> && cols == kTileCols) {
      b = static_cast<const float*>(p.b) + c0;
    } else {
      copy.assign(static_cast<size_t>(p.k) * kTileCols, 0.f);
      const T* src = static_cast<const T*>(p.b);
      for (int64_t k = 0; k < p.k; ++k)
        for (int j = 0; j < cols; ++j) copy[k * kTileCols + j] = ToF(src[k * p.n + c0 + j]);
      b = copy.data();
      ldb = kTileCols;
    }
    const float* x[kTileRows];
    for (int r = 0; r < kTileRows; ++r) x[r] = Row(r0 + std::min(r, rows - 1));
    float out[kTileRows * kTileCols];
    switch (rows) {
      case 1: TileDot<1>(x, b, ldb, p.k, out); break;
      case 2: TileDot<2>(x, b, ldb, p.k, out); break;
      case 3: TileDot<3>(x, b, ldb, p.k, out); break;
      default: TileDot<4>(x, b, ldb, p.k, out); break;
    }
    T* y = static_cast<T*>(p.y);
    for (int r = 0; r < rows; ++r)
      for (int j = 0; j < cols; ++j) y[(r0 + r) * p.n + c0 + j] = cpu::Round<T>(out[r * kTileCols + j]);
  }
};

template <typename T>
void Run(const FloatMatMulProblem& p, ParallelFor parallel_for, void* context) {
  Tiles<T> tiles{p, (p.n + kTileCols - 1) / kTileCols, {}};
  if constexpr (!std::is_same_v<T, float>) {
    const T* a = static_cast<const T*>(p.a);
    tiles.a32.resize(static_cast<size_t>(p.m * p.k));
    for (int64_t i = 0; i < p.m * p.k; ++i) tiles.a32[i] = ToF(a[i]);
  }
  const int64_t tasks = ((p.m + kTileRows - 1) / kTileRows) * tiles.col_tiles;
  cpu::ForEach<Tiles<T>, &Tiles<T>::Run>(tiles, tasks, parallel_for, context);
}

}  // namespace

void FloatMatMulCpu(const FloatMatMulProblem& p, ParallelFor parallel_for, void* parallel_context) {
  FloatMatMulProblem first = p;
  first.n2 = 0;
  cpu::WithElementType(p.type, [&](auto t) { Run<decltype(t)>(first, parallel_for, parallel_context); });
  if (p.n2 > 0) {  // the second product: the same code on (A, B2), so Y2 is what a node of its own computes
    FloatMatMulProblem second = first;
    second.n = p.n2;
    second.b = p.b2;
    second.y = p.y2;
    FloatMatMulCpu(second, parallel_for, parallel_context);
  }
}

}  // namespace ort_mtp
