// The general MatMulNBits kernel: every problem the op accepts (fp32/fp16/bf16, 4 or 8 bits, any
// block size, K not a multiple of the block size, zero points absent / packed / typed, any
// alignment). It is the correctness path for what the tensor-core kernel does not take, not a fast
// one: one warp per output feature n, 8 tokens per pass, fp32 accumulation.
//
// Arithmetic, fixed per (n, token) and independent of M: the weight is dequantised exactly as the CPU
// reference does ((float(q) - zero_point) * scale in fp32); lane l takes the 8-element groups
// l, l + 32, ... of the row in ascending order with fmaf; the 32 lane sums meet in a fixed xor
// butterfly; bias is added last (then StoreResult: with p.swiglu, over the gate's outputs).
#pragma once
#include "matmul_nbits/gemv_ptx.cuh"
#include "matmul_nbits/matmul_nbits.h"

namespace ort_mtp {
namespace gemv {

struct GenericParams : GemvOperands {
  int block_size;
  int block_bytes;
};

constexpr int kGenericWarps = 8;   // output features per block
constexpr int kGenericTokens = 8;  // tokens per pass (blockIdx.y)

template <typename T, int kBits, ZeroPointKind kZk>
__device__ __forceinline__ float GenericZeroPoint(const GenericParams& p, int n, int blk) {
  if constexpr (kZk == ZeroPointKind::kNone) {
    return static_cast<float>(1 << (kBits - 1));
  } else if constexpr (kZk == ZeroPointKind::kPacked) {
    const uint8_t* row = static_cast<const uint8_t*>(p.zero_points) + static_cast<int64_t>(n) * p.zp_row_bytes;
    if constexpr (kBits == 8) {
      return static_cast<float>(row[blk]);
    } else {
      return static_cast<float>((row[blk >> 1] >> ((blk & 1) * 4)) & 15);
    }
  } else {
    return ToFloat<T>(static_cast<const T*>(p.zero_points)[static_cast<int64_t>(n) * p.k_blocks + blk]);
  }
}

template <typename T, int kBits, ZeroPointKind kZk>
__global__ void __launch_bounds__(32 * kGenericWarps) GemvGenericKernel(const __grid_constant__ GenericParams p) {
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int n = static_cast<int>(blockIdx.x) * kGenericWarps + warp;
  if (n >= p.N) return;
  const int m0 = static_cast<int>(blockIdx.y) * kGenericTokens;
  const int m_count = min(kGenericTokens, p.M - m0);

  const uint8_t* row = p.b + static_cast<int64_t>(n) * p.k_blocks * p.block_bytes;
  const T* scales = static_cast<const T*>(p.scales);
  const T* a = static_cast<const T*>(p.a);

  float acc[kGenericTokens];
#pragma unroll
  for (int m = 0; m < kGenericTokens; ++m) acc[m] = 0.f;

  const int groups = (p.K + 7) / 8;
  for (int gi = lane; gi < groups; gi += 32) {
    const int k0 = gi * 8;
    const int blk = k0 / p.block_size;  // a group of 8 never straddles a block (block_size >= 16)
    const float scale = ToFloat<T>(scales[static_cast<int64_t>(n) * p.k_blocks + blk]);
    const float zp = GenericZeroPoint<T, kBits, kZk>(p, n, blk);
    float w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int k = k0 + i;  // < k_blocks * block_size: inside the packed row even past K
      int q;
      if constexpr (kBits == 4) {
        q = (row[k >> 1] >> ((k & 1) * 4)) & 15;
      } else {
        q = row[k];
      }
      w[i] = (static_cast<float>(q) - zp) * scale;
    }
    const int valid = min(8, p.K - k0);
#pragma unroll
    for (int m = 0; m < kGenericTokens; ++m) {
      if (m < m_count) {
        const T* ar = a + static_cast<int64_t>(m0 + m) * p.K + k0;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (i < valid) acc[m] = fmaf(ToFloat<T>(ar[i]), w[i], acc[m]);
        }
      }
    }
  }

#pragma unroll
  for (int m = 0; m < kGenericTokens; ++m) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) acc[m] += __shfl_xor_sync(0xFFFFFFFFu, acc[m], offset);
  }
  if (lane == 0) {
    const T* bias = static_cast<const T*>(p.bias);
    const float b = bias ? ToFloat<T>(bias[n]) : 0.f;
#pragma unroll
    for (int m = 0; m < kGenericTokens; ++m) {
      if (m < m_count) StoreResult<T>(p, static_cast<int64_t>(m0 + m) * p.N + n, acc[m] + b);
    }
  }
}

}  // namespace gemv
}  // namespace ort_mtp
