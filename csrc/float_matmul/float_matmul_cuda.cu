// The MatMul op's CUDA kernel (float_matmul.h). One block per group of 8 output columns and pass of up to
// R rows; the block's 512 threads split K by residue (thread t takes k = t, t + 512, ...), so adjacent
// threads read adjacent rows of A and B, and a thread's 8 columns of B are one 16-byte load (fp16/bf16,
// when N % 8 == 0). A thread's k loop is unrolled (kUnroll) so that the loads of several of its k are in
// flight together: at the a/b projections' K = 5120 a thread has 10 k, and the kernel's time is their
// memory round trips, not arithmetic. The partial sums meet in a fixed order: pairs of lanes 16, 8, 4, 2, 1 apart within
// each warp (HalvingSum), then the 16 warps' sums in ascending order through shared memory. R (1 or 8)
// is picked from M only to skip work on rows that do not exist: every row follows the same sequence of
// float32 operations in every R and unrolling, so row m's bits never depend on M. (R = 2 and 4 took
// longer at M = 2..4 than R = 8 at M = 5..8 on an H200: bench/results/2026-12-03-float-matmul.)
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_numeric.cuh"
#include "float_matmul/float_matmul.h"

namespace ort_mtp {
namespace {

using cuda::FromF;
using cuda::ToF;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kCols = 8;  // output columns per block
constexpr int kMaxGridY = 65535;

// The 8 columns c0 .. c0 + 7 of B's row k as float32 (0 beyond N).
template <typename T, bool kVector>
__device__ __forceinline__ void LoadB(const T* __restrict__ b, int64_t k, int n, int c0, float (&out)[kCols]) {
  const T* row = b + k * n + c0;
  if constexpr (kVector) {
    // 8 elements of a 16-byte aligned row segment (N % 8 == 0 and B 16-byte aligned, checked on launch).
    if constexpr (sizeof(T) == 2) {
      const uint4 v = __ldg(reinterpret_cast<const uint4*>(row));
      const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
      for (int c = 0; c < kCols; ++c) out[c] = ToF(e[c]);
    } else {
      const float4 lo = __ldg(reinterpret_cast<const float4*>(row));
      const float4 hi = __ldg(reinterpret_cast<const float4*>(row) + 1);
      out[0] = lo.x, out[1] = lo.y, out[2] = lo.z, out[3] = lo.w;
      out[4] = hi.x, out[5] = hi.y, out[6] = hi.z, out[7] = hi.w;
    }
  } else {
#pragma unroll
    for (int c = 0; c < kCols; ++c) out[c] = c0 + c < n ? ToF(row[c]) : 0.f;
  }
}

// The sum over the warp's 32 lanes of each of a lane's kCount values, by recursive halving: at offset o
// a lane keeps half of its values (the upper half where lane & o, else the lower), adds the partner's
// copy of them, and passes on the other half. Each sum is the one a butterfly (v += shfl_xor(v, o) for
// o = 16, 8, 4, 2, 1) computes, pairs of lanes in the same order, with about kCount shuffles per lane
// instead of 5 kCount; once one value is left the rounds go on as a butterfly. On return, vals[i] is
// the sum of value base + i, i < max(kCount / 32, 1).
template <int kCount, int kOffset>
__device__ __forceinline__ void HalvingSum(float* vals, int lane, int& base) {
  if constexpr (kOffset > 0) {
    if constexpr (kCount > 1) {
      constexpr int kHalf = kCount / 2;
      const bool upper = (lane & kOffset) != 0;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? vals[i] : vals[i + kHalf];
        const float keep = upper ? vals[i + kHalf] : vals[i];
        vals[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, kOffset));
      }
      if (upper) base += kHalf;
      HalvingSum<kHalf, kOffset / 2>(vals, lane, base);
    } else {
      vals[0] = __fadd_rn(vals[0], __shfl_xor_sync(0xffffffffu, vals[0], kOffset));
      HalvingSum<1, kOffset / 2>(vals, lane, base);
    }
  }
}

template <int R>
constexpr int kUnroll = R == 1 ? 8 : 2;  // R = 8 at 4: past the 128 registers 512 threads may each have

template <typename T, int R, bool kVector>
__global__ void __launch_bounds__(kThreads) FloatMatMulKernel(const T* __restrict__ a, const T* __restrict__ b,
                                                             T* __restrict__ y, int64_t m, int k, int n) {
  constexpr int kValues = R * kCols;  // a thread's partial sums, a power of two
  static_assert((kValues & (kValues - 1)) == 0, "HalvingSum halves evenly");
  // Lanes whose bits below 32 / kValues are zero hold a sum no other lane's copy differs from.
  constexpr int kCopies = kValues >= 32 ? 1 : 32 / kValues;
  __shared__ float warp_sums[kWarps][kValues];
  const int c0 = blockIdx.x * kCols;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t passes = (m + R - 1) / R;
  for (int64_t pass = blockIdx.y; pass < passes; pass += gridDim.y) {
    const int64_t r0 = pass * R;
    const int rows = static_cast<int>(m - r0 < R ? m - r0 : R);
    float acc[kValues];
#pragma unroll
    for (int v = 0; v < kValues; ++v) acc[v] = 0.f;
#pragma unroll(kUnroll<R>)
    for (int kk = threadIdx.x; kk < k; kk += kThreads) {
      float bv[kCols];
      LoadB<T, kVector>(b, kk, n, c0, bv);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (r < rows) {
          const float x = ToF(a[(r0 + r) * k + kk]);
#pragma unroll
          for (int c = 0; c < kCols; ++c) acc[r * kCols + c] = __fmaf_rn(x, bv[c], acc[r * kCols + c]);
        }
      }
    }
    int base = 0;
    HalvingSum<kValues, 16>(acc, lane, base);
    if (lane % kCopies == 0) {
#pragma unroll
      for (int i = 0; i < (kValues >= 32 ? kValues / 32 : 1); ++i) warp_sums[warp][base + i] = acc[i];
    }
    __syncthreads();
    if (threadIdx.x < kValues) {
      const int r = threadIdx.x / kCols, c = threadIdx.x % kCols;
      float s = warp_sums[0][threadIdx.x];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) s = __fadd_rn(s, warp_sums[w][threadIdx.x]);
      if (r < rows && c0 + c < n) y[(r0 + r) * n + c0 + c] = FromF<T>(s);
    }
    __syncthreads();  // warp_sums is rewritten by the next pass
  }
}

template <typename T, int R>
void LaunchR(const FloatMatMulProblem& p, bool vector, cudaStream_t stream) {
  const int64_t passes = (p.m + R - 1) / R;
  const dim3 grid(static_cast<unsigned>((p.n + kCols - 1) / kCols),
                  static_cast<unsigned>(passes < kMaxGridY ? passes : kMaxGridY));
  const T* a = static_cast<const T*>(p.a);
  const T* b = static_cast<const T*>(p.b);
  T* y = static_cast<T*>(p.y);
  const int k = static_cast<int>(p.k), n = static_cast<int>(p.n);
  if (vector)
    FloatMatMulKernel<T, R, true><<<grid, kThreads, 0, stream>>>(a, b, y, p.m, k, n);
  else
    FloatMatMulKernel<T, R, false><<<grid, kThreads, 0, stream>>>(a, b, y, p.m, k, n);
}

template <typename T>
void Launch(const FloatMatMulProblem& p, cudaStream_t stream) {
  const bool vector = p.n % kCols == 0 && reinterpret_cast<uintptr_t>(p.b) % 16 == 0;
  if (p.m == 1) return LaunchR<T, 1>(p, vector, stream);
  return LaunchR<T, 8>(p, vector, stream);
}

}  // namespace

const char* FloatMatMulCuda(const FloatMatMulProblem& p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.type) {
    case FloatType::kFloat32: Launch<float>(p, s); break;
    case FloatType::kFloat16: Launch<__half>(p, s); break;
    case FloatType::kBFloat16: Launch<__nv_bfloat16>(p, s); break;
  }
  if (const cudaError_t err = cudaGetLastError(); err != cudaSuccess) return cudaGetErrorString(err);
  return nullptr;
}

}  // namespace ort_mtp
