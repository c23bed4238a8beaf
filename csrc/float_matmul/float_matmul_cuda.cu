// The MatMul op's CUDA kernel (float_matmul.h). One block per group of 8 output columns and pass of up to
// R rows; the block's 512 threads split K by residue (thread t takes k = t, t + 512, ...), so adjacent
// threads read adjacent rows of A and B, and a thread's 8 columns of B are one 16-byte load (fp16/bf16,
// when N % 8 == 0). A thread's k loop is unrolled (kUnroll) so that the loads of several of its k are in
// flight together: at the a/b projections' K = 5120 a thread has 10 k, and the kernel's time is their
// memory round trips, not arithmetic. The partial sums meet in a fixed order: pairs of lanes 16, 8, 4, 2, 1 apart within
// each warp (HalvingSum), then the 16 warps' sums in ascending order through shared memory. R (1 or 8)
// is picked from M only for speed: every row follows the same sequence of float32 operations in every R
// and unrolling, so row m's bits never depend on M. Up to kOneRowPassesMaxM rows (decode and verify
// widths) each row is its own pass of the one-row kernel, all passes at once: the a/b projections have
// only 2 x 6 column groups, so one 8-row pass per group left most SMs idle while each block's threads
// waited on their k's in two-deep rounds (kUnroll<8>), and the extra passes read B from L2 (prefetched by
// the first). Beyond it (prefill chunks) 8-row passes read B once per 8 rows. (R = 2 and 4 took longer
// at M = 2..4 than R = 8 at M = 5..8 on an H200: bench/results/2026-12-03-float-matmul.)
// With a second weight B2 the grid's first blocks take B's column groups and the rest B2's; a block runs
// the same code on whichever (B, Y, N) its index selects, so each output is what a one-weight launch
// computes.
//
// On sm_90 the kernel is launched with programmatic stream serialization: its blocks may start while the
// previous kernel (in the graphs, the in-projection GEMVs, which let dependents start once running) is
// still at work. A block then asks L2 for its share of B, which is a session constant, lets the next
// kernel start likewise, and waits for the previous kernel to finish before it reads A or writes Y. So
// its launch and B's first trip from DRAM overlap the previous kernel; what it computes is unchanged.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_numeric.cuh"
#include "common/cuda_pdl.cuh"
#include "float_matmul/float_matmul.h"

namespace ort_mtp {
namespace {

using cuda::FromF;
using cuda::ToF;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kCols = 8;  // output columns per block
constexpr int kMaxGridY = 65535;
constexpr int64_t kOneRowPassesMaxM = 8;  // M up to this: one one-row pass per row (see above)

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

// One weight of a launch: B [K, N] and its output Y [M, N].
template <typename T>
struct Weight {
  const T* b;
  T* y;
  int n;
};

template <typename T, int R, bool kVector>
__global__ void __launch_bounds__(kThreads) FloatMatMulKernel(const T* __restrict__ a, Weight<T> w0, Weight<T> w1,
                                                             int blocks0, int64_t m, int k) {
  constexpr int kValues = R * kCols;  // a thread's partial sums, a power of two
  static_assert((kValues & (kValues - 1)) == 0, "HalvingSum halves evenly");
  // Lanes whose bits below 32 / kValues are zero hold a sum no other lane's copy differs from.
  constexpr int kCopies = kValues >= 32 ? 1 : 32 / kValues;
  __shared__ float warp_sums[kWarps][kValues];
  const bool second = static_cast<int>(blockIdx.x) >= blocks0;
  const T* __restrict__ b = second ? w1.b : w0.b;
  T* __restrict__ y = second ? w1.y : w0.y;
  const int n = second ? w1.n : w0.n;
  const int c0 = (second ? static_cast<int>(blockIdx.x) - blocks0 : static_cast<int>(blockIdx.x)) * kCols;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // B's rows of this thread's k into L2 (each 8-column segment is 16 or 32 bytes: one prefetch of its
  // first byte), then programmatic dependent launch's handshake (no-ops when the launch did not opt in):
  // from here on A and Y are safe to touch.
  if (c0 < n) {
    for (int kk = threadIdx.x; kk < k; kk += kThreads)
      asm volatile("prefetch.global.L2 [%0];" ::"l"(b + static_cast<int64_t>(kk) * n + c0));
  }
  cuda::GridDependencyTrigger();
  cuda::GridDependencyWait();
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
cudaError_t LaunchR(const FloatMatMulProblem& p, bool vector, cudaStream_t stream) {
  const int64_t passes = (p.m + R - 1) / R;
  const int blocks0 = static_cast<int>((p.n + kCols - 1) / kCols);
  const int blocks1 = static_cast<int>((p.n2 + kCols - 1) / kCols);
  const dim3 grid(static_cast<unsigned>(blocks0 + blocks1),
                  static_cast<unsigned>(passes < kMaxGridY ? passes : kMaxGridY));
  const T* a = static_cast<const T*>(p.a);
  const Weight<T> w0{static_cast<const T*>(p.b), static_cast<T*>(p.y), static_cast<int>(p.n)};
  const Weight<T> w1{static_cast<const T*>(p.b2), static_cast<T*>(p.y2), static_cast<int>(p.n2)};
  const int k = static_cast<int>(p.k);
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = cuda::DeviceMajor() >= 9 ? 1 : 0;
  auto kernel = vector ? FloatMatMulKernel<T, R, true> : FloatMatMulKernel<T, R, false>;
  return cudaLaunchKernelEx(&cfg, kernel, a, w0, w1, blocks0, p.m, k);
}

template <typename T>
cudaError_t Launch(const FloatMatMulProblem& p, cudaStream_t stream) {
  // 16-byte loads of B's rows need N % 8 == 0 and an aligned B, in both weights. (The vector and scalar
  // loads give the same values, so the choice never changes a result.)
  const auto aligned = [](int64_t n, const void* b) { return n % kCols == 0 && reinterpret_cast<uintptr_t>(b) % 16 == 0; };
  const bool vector = aligned(p.n, p.b) && (p.n2 == 0 || aligned(p.n2, p.b2));
  if (p.m <= kOneRowPassesMaxM) return LaunchR<T, 1>(p, vector, stream);
  return LaunchR<T, 8>(p, vector, stream);
}

}  // namespace

const char* FloatMatMulCuda(const FloatMatMulProblem& p, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaSuccess;
  switch (p.type) {
    case FloatType::kFloat32: err = Launch<float>(p, s); break;
    case FloatType::kFloat16: err = Launch<__half>(p, s); break;
    case FloatType::kBFloat16: err = Launch<__nv_bfloat16>(p, s); break;
  }
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

}  // namespace ort_mtp
