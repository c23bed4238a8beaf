// Lab only (device lab run 17): lab run 15's first tiles kernel (from lab15_first_tiles_kernel.patch,
// bench/results/2026-11-29-lab), unchanged but for its namespace, to time it beside the op's tiles kernel
// on the same data in one binary.
#pragma once
#include "matmul_nbits/gemv_stream.cuh"

namespace ort_mtp {
namespace gemv {
namespace lab15 {

constexpr int kRpKC = 256, kRpBS = 32;
constexpr int kRpWBytes = 2048;                       // weights of one tile-chunk
constexpr int kRpSBytes = 256;                        // its scales
constexpr int kRpStageBytes = kRpWBytes + kRpSBytes;  // one ring stage
constexpr int kRpStages = 3;
constexpr int kRpWarpBytes = kRpStages * kRpStageBytes;

// p.b / p.scales: the repacked tensors. Plan fields as the stream kernel's (CutStream), rows whole tiles.
template <int kNT>
__global__ void __launch_bounds__(32 * kStreamMaxWarps) __maxnreg__(kNT == 1 ? 80 : 128)
    GemvRepackedKernel(const __grid_constant__ StreamParams p) {
  using T = __half;
  using Dq = Int4Dequant<T>;
  constexpr int kTokens = 8 * kNT, kUnits = kRpKC / 32;
  extern __shared__ __align__(128) unsigned char smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int bx = static_cast<int>(blockIdx.x);
  const bool alt = bx < p.alt_blocks;
  const int kparts = alt ? p.alt_kparts : p.kparts;
  const int tile = warp / kparts;
  const int kp = warp - tile * kparts;
  const int block_row0 = alt ? bx * p.alt_rows : p.alt_blocks * p.alt_rows + (bx - p.alt_blocks) * p.rows_per_block;
  const int block_rows = min(alt ? p.alt_rows : p.rows_per_block, p.N - block_row0);
  const int tile_row0 = tile * 16;
  const int tok0 = static_cast<int>(blockIdx.y) * kTokens;
  const int m_count = min(kTokens, p.M - tok0);
  const int base = p.kchunks / kparts, extra = p.kchunks % kparts;
  const int c_begin = kp * base + min(kp, extra);
  const int c_count = tile_row0 < block_rows ? base + (kp < extra ? 1 : 0) : 0;  // whole tiles only

  const uint32_t ring = SmemAddr(smem) + static_cast<uint32_t>(warp * kRpWarpBytes);
  const uint32_t last_stage = ring + static_cast<uint32_t>((kRpStages - 1) * kRpStageBytes);
  const int64_t tc0 = static_cast<int64_t>((block_row0 + tile_row0) / 16) * p.kchunks + c_begin;
  const uint8_t* wnext = p.b + tc0 * kRpWBytes + lane * 16;
  const uint8_t* snext = static_cast<const uint8_t*>(p.scales) + tc0 * kRpSBytes + lane * 8;
  uint32_t fill = ring;
  auto issue = [&](int i) {
    if (i < c_count) {
#pragma unroll
      for (int j = 0; j < 4; ++j) CpAsync16(fill + j * 512 + lane * 16, wnext + j * 512, true);
      CpAsyncSmall<8>(fill + kRpWBytes + lane * 8, snext, true);
      wnext += kRpWBytes;
      snext += kRpSBytes;
      fill = fill == last_stage ? ring : fill + kRpStageBytes;
    }
    CpAsyncCommit();
  };
#pragma unroll
  for (int i = 0; i < kRpStages - 1; ++i) issue(i);
  if (p.pdl) {
    GridDependencyTrigger();
    GridDependencyWait();
  }

  const int g = lane >> 2, t = lane & 3;
  const T* arow[kNT];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
    arow[nt] = static_cast<const T*>(p.a) + static_cast<int64_t>(tok0 + min(8 * nt + g, m_count - 1)) * p.K + 8 * t;

  float acc[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;

  uint32_t stage = ring;
  for (int i = 0; i < c_count; ++i) {
    const int64_t k0 = static_cast<int64_t>(c_begin + i) * kRpKC;
    uint4 act[kNT][kUnits];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int u = 0; u < kUnits; ++u) act[nt][u] = __ldg(reinterpret_cast<const uint4*>(arow[nt] + k0 + 32 * u));
    CpAsyncWait<kRpStages - 2>();
    __syncwarp();
    issue(i + kRpStages - 1);

    const typename Dq::Consts dq = Dq::Make(8u);
    // Row g's and row g + 8's scales of the chunk's 8 blocks, two blocks per 32-bit read.
    const uint32_t* sc = reinterpret_cast<const uint32_t*>(smem + (stage - SmemAddr(smem)) + kRpWBytes);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint4 wg = LdShared128(stage + (2 * half) * 512 + lane * 16);      // row g, units 4 half ..
      const uint4 wh = LdShared128(stage + (2 * half + 1) * 512 + lane * 16);  // row g + 8
      const uint32_t wgs[4] = {wg.x, wg.y, wg.z, wg.w}, whs[4] = {wh.x, wh.y, wh.z, wh.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int u = 4 * half + w;  // unit = quant block (block 32)
        uint32_t qa[4], qb[4];
        Dq::Run(wgs[w], dq, qa);
        Dq::Run(whs[w], dq, qb);
        const uint32_t a1[4] = {qa[0], qb[0], qa[1], qb[1]};
        const uint32_t a2[4] = {qa[2], qb[2], qa[3], qb[3]};
        float d[kNT][4];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          MmaZeroC<T>(d[nt], a1, act[nt][u].x, act[nt][u].y);
          Mma16816<T>(d[nt], a2, act[nt][u].z, act[nt][u].w);
        }
        const uint32_t pg = sc[g * 4 + u / 2], ph = sc[(g + 8) * 4 + u / 2];
        const float s0 = BitsToFloat<T>(static_cast<uint16_t>(pg >> (16 * (u & 1))));
        const float s1 = BitsToFloat<T>(static_cast<uint16_t>(ph >> (16 * (u & 1))));
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          acc[nt][0] = fmaf(s0, d[nt][0], acc[nt][0]);
          acc[nt][1] = fmaf(s0, d[nt][1], acc[nt][1]);
          acc[nt][2] = fmaf(s1, d[nt][2], acc[nt][2]);
          acc[nt][3] = fmaf(s1, d[nt][3], acc[nt][3]);
        }
      }
    }
    stage = stage == last_stage ? ring : stage + kRpStageBytes;
  }
  CpAsyncWait<0>();

  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
  constexpr int kOut = 16 * kTokens;
  {
    float* mine = red + warp * kOut;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[(g + 8 * (e >> 1)) * kTokens + 8 * nt + 2 * t + (e & 1)] = acc[nt][e];
  }
  __syncthreads();
  T* y = static_cast<T*>(p.y);
  const int tiles = static_cast<int>(blockDim.x >> 5) / kparts;
  for (int o = threadIdx.x; o < tiles * kOut; o += blockDim.x) {
    const int grp = o / kOut, rem = o - grp * kOut;
    const int r = grp * 16 + rem / kTokens, tok = rem % kTokens;
    if (r >= block_rows || tok >= m_count) continue;
    const float* part = red + grp * kparts * kOut + rem;
    float s = part[0];
    for (int q = 1; q < kparts; ++q) s += part[q * kOut];
    y[static_cast<int64_t>(tok0 + tok) * p.N + block_row0 + r] = FromFloat<T>(s);
  }
}

}  // namespace lab15
}  // namespace gemv
}  // namespace ort_mtp
