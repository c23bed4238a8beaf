// Lab only (device lab run 19): the op's tiles kernel (gemv_tiles.cuh, fp16, block 32) with K split
// across blocks, to measure what balancing down's cut buys before the op changes (bench/NOTES.md,
// version 3.3: down's 320 m-tiles put 2 or 3 blocks on an SM; a balanced cut of the same kernel ran at
// 94% of the copy ceiling).
//
// Blocks come in groups of ksplit consecutive indices: group r owns rows [16 tiles r, + 16 tiles) and
// block q of it the q-th of ksplit equal runs of the K chunks, cut into kparts K-parts as usual. Each
// block sums its K-parts in order (SumKParts below, as the op's epilogue), writes its (rows x tokens)
// fp32 sums to partial[q], and counts itself in counters[pass][r]; the block that counts last adds the
// ksplit partial sums in q order (fixed: the result does not depend on which block was last, nor on
// M), adds bias, stores, and resets the counter for the next launch. Counters start at zero (the lab
// clears them once).
#pragma once
#include "matmul_nbits/gemv_tiles.cuh"

namespace ort_mtp {
namespace gemv {
namespace lab {

struct SplitParams : StreamParams {
  float* partial;      // [ksplit][passes][N][tokens per pass]
  unsigned* counters;  // [passes][row groups], zero between launches
  int ksplit;
};

template <int kNT>
__device__ __forceinline__ void SplitEpilogue(const SplitParams& p, const float (&acc)[kNT][4], unsigned char* smem);

template <int kNT>
__global__ void __launch_bounds__(32 * kStreamMaxWarps) __maxnreg__(kNT == 1 ? 80 : 128)
    GemvTilesSplitKernel(const __grid_constant__ SplitParams p) {
  using T = __half;
  constexpr int kBS = 32;
  using Cfg = TilesConfig<kBS>;
  using Dq = Int4Dequant<T>;
  constexpr int kTokens = 8 * kNT, kUnits = Cfg::kKC / 32;
  extern __shared__ __align__(128) unsigned char smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int group = static_cast<int>(blockIdx.x) / p.ksplit, q = static_cast<int>(blockIdx.x) % p.ksplit;
  const int tile = warp / p.kparts, kp = warp - tile * p.kparts;
  const int block_row0 = group * p.rows_per_block;
  const int block_rows = min(p.rows_per_block, p.N - block_row0);
  const int tok0 = static_cast<int>(blockIdx.y) * kTokens;
  const int m_count = min(kTokens, p.M - tok0);
  // This block's run of chunks, then this warp's K-part of it.
  const int qb = p.kchunks / p.ksplit, qe = p.kchunks % p.ksplit;
  const int q_begin = q * qb + min(q, qe), q_count = qb + (q < qe ? 1 : 0);
  const int base = q_count / p.kparts, extra = q_count % p.kparts;
  const int c_begin = q_begin + kp * base + min(kp, extra);
  const int c_count = tile * 16 < block_rows ? base + (kp < extra ? 1 : 0) : 0;

  const uint32_t ring = SmemAddr(smem) + static_cast<uint32_t>(warp * Cfg::kWarpBytes);
  const uint32_t last_stage = ring + static_cast<uint32_t>((kStreamStages - 1) * Cfg::kStageBytes);
  const int64_t first = static_cast<int64_t>((block_row0 + tile * 16) / 16) * p.kchunks + c_begin;
  const uint8_t* wnext = p.b + first * Cfg::kWBytes + lane * 16;
  const uint8_t* snext = static_cast<const uint8_t*>(p.scales) + first * Cfg::kSBytes + lane * 8;
  uint32_t fill = ring;
  auto issue = [&](int i) {
    if (i < c_count) {
#pragma unroll
      for (int j = 0; j < 4; ++j) CpAsync16(fill + j * 512 + lane * 16, wnext + j * 512, true);
      CpAsyncSmall<8>(fill + Cfg::kWBytes + lane * 8, snext, true);
      wnext += Cfg::kWBytes;
      snext += Cfg::kSBytes;
      fill = fill == last_stage ? ring : fill + Cfg::kStageBytes;
    }
    CpAsyncCommit();
  };
#pragma unroll
  for (int i = 0; i < kStreamStages - 1; ++i) issue(i);
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
    const int64_t k0 = static_cast<int64_t>(c_begin + i) * Cfg::kKC;
    uint4 act[kNT][kUnits];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int u = 0; u < kUnits; ++u) act[nt][u] = __ldg(reinterpret_cast<const uint4*>(arow[nt] + k0 + 32 * u));
    CpAsyncWait<kStreamStages - 2>();
    __syncwarp();
    issue(i + kStreamStages - 1);
    const typename Dq::Consts dq = Dq::Make(8u);
    const uint32_t* sc = reinterpret_cast<const uint32_t*>(smem + (stage - SmemAddr(smem)) + Cfg::kWBytes);
    float d[kNT][4];
    uint32_t pg = 0, ph = 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint4 wg = LdShared128(stage + (2 * half) * 512 + lane * 16);
      const uint4 wh = LdShared128(stage + (2 * half + 1) * 512 + lane * 16);
      const uint32_t wgs[4] = {wg.x, wg.y, wg.z, wg.w}, whs[4] = {wh.x, wh.y, wh.z, wh.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int u = 4 * half + w;
        uint32_t qa[4], qbw[4];
        Dq::Run(wgs[w], dq, qa);
        Dq::Run(whs[w], dq, qbw);
        const uint32_t a1[4] = {qa[0], qbw[0], qa[1], qbw[1]};
        const uint32_t a2[4] = {qa[2], qbw[2], qa[3], qbw[3]};
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          MmaZeroC<T>(d[nt], a1, act[nt][u].x, act[nt][u].y);
          Mma16816<T>(d[nt], a2, act[nt][u].z, act[nt][u].w);
        }
        if (u % 2 == 0) {
          pg = sc[(g * Cfg::kPerRow + u) / 2];
          ph = sc[((g + 8) * Cfg::kPerRow + u) / 2];
        }
        AddScaledBlock<kNT>(acc, d, BitsToFloat<T>(static_cast<uint16_t>(pg >> (16 * (u & 1)))),
                            BitsToFloat<T>(static_cast<uint16_t>(ph >> (16 * (u & 1)))));
      }
    }
    stage = stage == last_stage ? ring : stage + Cfg::kStageBytes;
  }
  CpAsyncWait<0>();
  SplitEpilogue<kNT>(p, acc, smem);
}

// Rebuilds what it needs from p and the block index (kept live across the loop, it cost a stack frame).
template <int kNT>
__device__ __forceinline__ void SplitEpilogue(const SplitParams& p, const float (&acc)[kNT][4], unsigned char* smem) {
  using T = __half;
  constexpr int kTokens = 8 * kNT, kOut = 16 * kTokens;
  __shared__ unsigned last_flag;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int group = static_cast<int>(blockIdx.x) / p.ksplit, q = static_cast<int>(blockIdx.x) % p.ksplit;
  const int block_row0 = group * p.rows_per_block;
  const int block_rows = min(p.rows_per_block, p.N - block_row0);
  const int tok0 = static_cast<int>(blockIdx.y) * kTokens;
  const int m_count = min(kTokens, p.M - tok0);
  // The block's K-parts in order, as the op's SumKPartsAndStore, into partial[q].
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
  {
    float* mine = red + warp * kOut;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[(g + 8 * (e >> 1)) * kTokens + 8 * nt + 2 * t + (e & 1)] = acc[nt][e];
  }
  __syncthreads();
  const int tiles = static_cast<int>(blockDim.x >> 5) / p.kparts;
  const int64_t pass_stride = static_cast<int64_t>(p.N) * kTokens;
  const int64_t q_stride = static_cast<int64_t>(gridDim.y) * pass_stride;
  float* part_out = p.partial + q * q_stride + blockIdx.y * pass_stride;
  for (int o = threadIdx.x; o < tiles * kOut; o += blockDim.x) {
    const int grp = o / kOut, rem = o - grp * kOut;
    const int r = grp * 16 + rem / kTokens;
    if (r >= block_rows) continue;
    const float* part = red + grp * p.kparts * kOut + rem;
    float s = part[0];
    for (int k = 1; k < p.kparts; ++k) s += part[k * kOut];
    part_out[static_cast<int64_t>(block_row0 + r) * kTokens + rem % kTokens] = s;
  }
  __threadfence();
  __syncthreads();
  unsigned* counter = p.counters + blockIdx.y * gridDim.x / p.ksplit + group;
  if (threadIdx.x == 0) last_flag = atomicAdd(counter, 1u) == static_cast<unsigned>(p.ksplit - 1);
  __syncthreads();
  if (!last_flag) return;
  __threadfence();
  const T* bias = static_cast<const T*>(p.bias);
  T* y = static_cast<T*>(p.y);
  const float* part_in = p.partial + blockIdx.y * pass_stride;
  for (int o = threadIdx.x; o < block_rows * kTokens; o += blockDim.x) {
    const int r = o / kTokens, tok = o % kTokens;
    if (tok >= m_count) continue;
    const int64_t at = static_cast<int64_t>(block_row0 + r) * kTokens + tok;
    float s = __ldcg(part_in + at);
    for (int k = 1; k < p.ksplit; ++k) s += __ldcg(part_in + k * q_stride + at);
    if (bias) s += ToFloat<T>(bias[block_row0 + r]);
    y[static_cast<int64_t>(tok0 + tok) * p.N + block_row0 + r] = FromFloat<T>(s);
  }
  if (threadIdx.x == 0) *counter = 0u;  // ready for the next launch (stream order makes it visible)
}

}  // namespace lab
}  // namespace gemv
}  // namespace ort_mtp
