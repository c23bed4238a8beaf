// Lab only: one tile-chunk's arithmetic with its activations in shared memory (fp16, block 32, one
// 8-token tile), the op's (gemv_tiles.cuh) per tile-chunk: the same mma on the same values in the same
// order. Used by the lab kernels that stage activations in shared memory (lab/shared_act_probe.cu,
// lab/gemv_bulk.cuh).
#pragma once
#include "matmul_nbits/gemv_tiles.cuh"

namespace ort_mtp {
namespace gemv {
namespace lab {

// acc += the tile-chunk's 8 quant blocks' sums, each scaled: weights at w0 (shared memory, the tiles
// layout's 2048 bytes), its scales at sc, unit u's activations at a0 + (u ^ act_xor) * 64 as lane (g, t)
// holds them (k 8t..8t+7 of its token; act_xor: a swizzle of the units against bank conflicts).
__device__ __forceinline__ void TileChunkFromShared(uint32_t w0, const uint32_t* sc, uint32_t a0, int act_xor,
                                                    float (&acc)[1][4]) {
  using T = __half;
  using Dq = Int4Dequant<T>;
  const typename Dq::Consts dq = Dq::Make(8u);
  const int lane = threadIdx.x & 31, g = lane >> 2;
  float d[1][4];
  uint32_t pg = 0, ph = 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const uint4 wg = LdShared128(w0 + (2 * half) * 512 + lane * 16);
    const uint4 wh = LdShared128(w0 + (2 * half + 1) * 512 + lane * 16);
    const uint32_t wgs[4] = {wg.x, wg.y, wg.z, wg.w}, whs[4] = {wh.x, wh.y, wh.z, wh.w};
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const int u = 4 * half + w;  // = the quant block (block 32)
      const uint4 x = LdShared128(a0 + (u ^ act_xor) * 64);
      uint32_t qa[4], qb[4];
      Dq::Run(wgs[w], dq, qa);
      Dq::Run(whs[w], dq, qb);
      const uint32_t a1[4] = {qa[0], qb[0], qa[1], qb[1]};
      const uint32_t a2[4] = {qa[2], qb[2], qa[3], qb[3]};
      MmaZeroC<T>(d[0], a1, x.x, x.y);
      Mma16816<T>(d[0], a2, x.z, x.w);
      if (u % 2 == 0) {
        pg = sc[(g * 8 + u) / 2];
        ph = sc[((g + 8) * 8 + u) / 2];
      }
      AddScaledBlock<1>(acc, d, BitsToFloat<T>(static_cast<uint16_t>(pg >> (16 * (u & 1)))),
                        BitsToFloat<T>(static_cast<uint16_t>(ph >> (16 * (u & 1)))));
    }
  }
}

}  // namespace lab
}  // namespace gemv
}  // namespace ort_mtp
