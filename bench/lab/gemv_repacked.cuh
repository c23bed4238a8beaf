// Lab only: the tiles layout of the op (packing=1; WeightLayout::kTiles in csrc/matmul_nbits/matmul_nbits.h,
// written by ops.packing in numpy) produced on the device, so that bench/gemv_lab.cu can time the op's
// tiles kernel (gemv_tiles.cuh) on its 1.1 GB of weights without a round trip through the host.
// fp16, block 32, N % 16 == 0, K % 256 == 0. Device lab run 15 ran an earlier copy of the tiles kernel
// that lived in this file (the same layout and arithmetic).
#pragma once
#include "matmul_nbits/gemv_tiles.cuh"

namespace ort_mtp {
namespace gemv {
namespace lab {

constexpr int kRpKC = 256, kRpBS = 32;
constexpr int kRpWBytes = 2048;  // weights of one tile-chunk

// Repack from MatMulNBits' row-major [N, K/32, 16] bytes and [N, K/32] scales (N % 16 == 0, K % 256 == 0).
__global__ void RepackWeights(const uint8_t* b, uint8_t* out, int N, int K) {
  const int kchunks = K / kRpKC;
  const int64_t words = static_cast<int64_t>(N / 16) * kchunks * (kRpWBytes / 4);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t tc = i / (kRpWBytes / 4);
    const int in_tc = static_cast<int>(i % (kRpWBytes / 4));  // word index inside the tile-chunk
    const int j = in_tc / 128, l = (in_tc / 4) % 32, w = in_tc % 4;
    const int g = l / 4, t = l % 4;
    const int64_t tile = tc / kchunks;
    const int c = static_cast<int>(tc % kchunks);
    const int64_t row = tile * 16 + g + 8 * (j & 1);
    const int unit = 4 * (j >> 1) + w;
    const uint32_t src = *reinterpret_cast<const uint32_t*>(b + row * (K / 2) + c * 128 + unit * 16 + t * 4);
    uint32_t dst = 0;
    constexpr int kFrom[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // output nibble i holds input nibble kFrom[i]
#pragma unroll
    for (int n = 0; n < 8; ++n) dst |= ((src >> (4 * kFrom[n])) & 0xFu) << (4 * n);
    reinterpret_cast<uint32_t*>(out)[i] = dst;
  }
}

__global__ void RepackScales(const __half* s, __half* out, int N, int K) {
  const int kchunks = K / kRpKC, kb = K / kRpBS;
  const int64_t total = static_cast<int64_t>(N) * kb;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t tc = i / 128;
    const int r = static_cast<int>((i / 8) % 16), blk = static_cast<int>(i % 8);
    const int64_t tile = tc / kchunks;
    const int c = static_cast<int>(tc % kchunks);
    out[i] = s[(tile * 16 + r) * kb + c * 8 + blk];
  }
}

}  // namespace lab
}  // namespace gemv
}  // namespace ort_mtp
