// Lab only: the tiles layout of the op (packing=1; WeightLayout::kTiles in csrc/matmul_nbits/matmul_nbits.h,
// written by ops.packing in numpy) produced on the device, so that lab/gemv_lab.cu can time the op's
// tiles kernel (gemv_tiles.cuh) on its 1.1 GB of weights without a round trip through the host.
// fp16, block 32, N % 16 == 0, K % 256 == 0. Device lab run 15 ran an earlier copy of the tiles kernel
// that lived in this file (the same layout and arithmetic).
#pragma once
#include "matmul_nbits/gemv_tiles.cuh"
#include "matmul_nbits/matmul_nbits.h"

namespace ort_mtp {
namespace gemv {
namespace lab {

// Repack from MatMulNBits' row-major [N, K/32, 16] bytes and [N, K/32] scales (N % 16 == 0, K % 256 == 0)
// by the op's own map (TilesByte, TilesScale): each row-major word of 8 nibbles lands in one word.
__global__ void RepackWeights(const uint8_t* b, uint8_t* out, int N, int K) {
  const int64_t words = static_cast<int64_t>(N) * (K / 8);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t n = i / (K / 8), k0 = (i % (K / 8)) * 8;
    const uint32_t src = reinterpret_cast<const uint32_t*>(b)[i];
    uint32_t dst = 0;
    int64_t word = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      int shift = 0;
      const int64_t byte = TilesByte(K, n, k0 + e, shift);
      word = byte / 4;
      dst |= ((src >> (4 * e)) & 0xFu) << (8 * (byte % 4) + shift);
    }
    reinterpret_cast<uint32_t*>(out)[word] = dst;
  }
}

__global__ void RepackScales(const __half* s, __half* out, int N, int K, int block_size) {
  const int kb = K / block_size;
  const int64_t total = static_cast<int64_t>(N) * kb;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[TilesScale(K, block_size, i / kb, i % kb)] = s[i];
}

}  // namespace lab
}  // namespace gemv
}  // namespace ort_mtp
