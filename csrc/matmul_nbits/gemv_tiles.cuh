// The tensor-core kernel for weights in the tiles layout (packing=1; WeightLayout::kTiles in
// matmul_nbits.h, written once by ops.packing): the stream kernel's design (gemv_stream.cuh: a warp per
// m-tile and K-part, its own cp.async ring, K-parts summed in order at the end, the same cut) with
// what the layout saves per 2 KB chunk of a warp:
//   * a warp's run of chunks is contiguous (one pointer, copies at fixed offsets, no swizzle), and a
//     lane reads its mma fragments with two 16-byte shared loads per 16 units instead of ldmatrix;
//   * the nibbles come interleaved (k 0, 2, 4, 6, 1, 3, 5, 7), so the int4 -> fp16/bf16 conversion
//     hands out pairs of adjacent k, the activations' own pairs: no byte permutes (PRMT);
//   * a chunk's scales are one 64..256-byte block, copied 16 bytes a lane with cp.async.cg, which
//     bypasses L1 (8-byte copies can only go through it, where they took room from the activations
//     of M >= 2: without ORT M = 2 and 4 ran 2-3% slower with them; through ORT the difference was
//     within run-to-run spread).
// Measured through ORT on an H200 (bench/gemv.py), against the stream kernel on the same weights: the
// chain 4 x (5120->17408, 17408->5120) ~13% faster at M = 1 (84% of the copy ceiling, with the
// activations through the ring, RingActivations) and ~7% at M = 8; the lm_head ~7% faster at M = 1
// and ~18% at M = 16 (docs/kernels.md#layout). An 8-byte stack frame (one spill before the loop, one
// reload after) once cost it ~6%; EpilogueTask (gemv_stream.cuh) keeps it out.
//
// Arithmetic of one (row, token) result, fixed for every M: per quant block, mma k-steps over its
// 32-k units in ascending order on exact (q - 8) values starting from zero (within a step the k order
// is the tiles layout's, which is the same for every M); acc = fma(scale, block_sum, acc) in ascending
// block order within the K-part; K-parts added in order; + bias; one rounding.
#pragma once
#include "matmul_nbits/gemv_stream.cuh"

namespace ort_mtp {
namespace gemv {

// kActRing: the stage also holds the chunk's 512 bytes of activations of a single token (the M = 1
// kernel; RingActivations in gemv_stream.cuh).
template <int kBS, bool kActRing = false>
struct TilesConfig {
  static_assert(kBS == 32 || kBS == 64 || kBS == 128, "block size");
  static constexpr int kKC = 256;                  // k per chunk: one tile-chunk
  static constexpr int kWBytes = 2048;             // weights of a tile-chunk
  static constexpr int kPerRow = kKC / kBS;        // scales per row and chunk
  static constexpr int kSBytes = 16 * kPerRow * 2;  // a tile-chunk's scales: 256, 128 or 64 bytes
  static constexpr int kSLanes = kSBytes / 16;     // lanes that copy them, 16 bytes each
  static constexpr int kABytes = kActRing ? kKC * 2 : 0;  // one token's activations of the chunk
  static constexpr int kStageBytes = kWBytes + kSBytes + kABytes;
  static constexpr int kWarpBytes = kStreamStages * kStageBytes;
};

// kActRing: the M = 1 kernel, its activations in the ring (RingActivations, gemv_stream.cuh).
template <typename T, int kBS, int kNT, bool kActRing = false>
__global__ void __launch_bounds__(32 * kStreamMaxWarps) __maxnreg__(kNT == 1 ? 80 : 128)
    GemvTilesKernel(const __grid_constant__ StreamParams p) {
  static_assert(!kActRing || kNT == 1, "activations in the ring: one token per pass");
  using Cfg = TilesConfig<kBS, kActRing>;
  using Dq = Int4Dequant<T>;
  constexpr int kTokens = 8 * kNT, kUnits = Cfg::kKC / 32, kUnitsPerBlock = kBS / 32;
  extern __shared__ __align__(128) unsigned char smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const WarpTask task(p, warp, kTokens);
  const int c_begin = task.c_begin;
  // N is a multiple of 16: a tile is either the block's or past N (the last block's spare warps).
  const int c_count = task.tile_row0 < task.block_rows ? task.c_count : 0;

  const uint32_t ring = SmemAddr(smem) + static_cast<uint32_t>(warp * Cfg::kWarpBytes);
  const uint32_t last_stage = ring + static_cast<uint32_t>((kStreamStages - 1) * Cfg::kStageBytes);
  const int64_t first = static_cast<int64_t>((task.block_row0 + task.tile_row0) / 16) * p.kchunks + c_begin;
  const uint8_t* wnext = p.b + first * Cfg::kWBytes + lane * 16;
  const bool s_lane = lane < Cfg::kSLanes;
  const uint8_t* snext = static_cast<const uint8_t*>(p.scales) + first * Cfg::kSBytes + (s_lane ? lane : 0) * 16;
  uint32_t fill = ring;
  constexpr int kActOffset = Cfg::kWBytes + Cfg::kSBytes;  // the stage's activations (kActRing)
  RingActivations<T, Cfg::kKC> ract(p, task);
  // Chunk i of this warp's run into the next stage (its activations too with kActRing, once they
  // may be read); always commits a group.
  auto issue = [&](int i, bool with_act) {
    if (i < c_count) {
#pragma unroll
      for (int j = 0; j < 4; ++j) CpAsync16(fill + j * 512 + lane * 16, wnext + j * 512, true);
      if (s_lane) CpAsync16(fill + Cfg::kWBytes + lane * 16, snext, true);
      if (kActRing && with_act) ract.Copy(fill + kActOffset);
      wnext += Cfg::kWBytes;
      snext += Cfg::kSBytes;
      fill = NextStage<Cfg::kStageBytes>(fill, ring, last_stage);
    }
    CpAsyncCommit();
  };
  const T* arow[kNT];
  StartRun<T, kNT, kActRing>(issue, p, task, arow, ract, ring, Cfg::kStageBytes, kActOffset, c_count);
  const int g = lane >> 2;

  float acc[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;

  uint32_t stage = ring;
  for (int i = 0; i < c_count; ++i) {
    const int64_t k0 = static_cast<int64_t>(c_begin + i) * Cfg::kKC;
    // The chunk's activations at its top (as in the stream kernel; the M = 1 kernel reads them from
    // the stage per half instead): lane (g, t) holds k 8t..8t+7 of each unit for token g, in the
    // natural pairs the conversion hands out. These loads are all that M = 2..8 pay over M = 1: without
    // them (a measurement with wrong results) the chain runs flat in M = 2..8, a little under the M = 1
    // kernel's time; with them M = 8 takes ~1.24x the M = 1 time (docs/kernels.md#multi-token-kernels).
    // Every way tried of getting them here earlier was slower: L1 prefetches, per-warp or shared stages
    // a chunk ahead, larger blocks that share them (docs/kernels.md#what-was-tried-and-lost).
    uint4 act[kNT][kUnits];
    if constexpr (!kActRing) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int u = 0; u < kUnits; ++u) act[nt][u] = __ldg(reinterpret_cast<const uint4*>(arow[nt] + k0 + 32 * u));
    }
    CpAsyncWait<kStreamStages - 2>();
    __syncwarp();
    issue(i + kStreamStages - 1, true);  // into the stage read in iteration i - 1 (all lanes are past it)

    const typename Dq::Consts dq = Dq::Make(8u);  // compile-time constants: immediates, not registers
    // Rows g and g + 8's scales of the chunk's blocks, two per 32-bit read (kPerRow is even).
    const uint32_t* sc = reinterpret_cast<const uint32_t*>(smem + (stage - SmemAddr(smem)) + Cfg::kWBytes);
    float d[kNT][4];  // the current quant block's sums
    uint32_t pg = 0, ph = 0;  // rows g and g + 8's scales of the current pair of blocks
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint4 wg = LdShared128(stage + (2 * half) * 512 + lane * 16);      // row g, units 4 half ..
      const uint4 wh = LdShared128(stage + (2 * half + 1) * 512 + lane * 16);  // row g + 8
      const uint32_t wgs[4] = {wg.x, wg.y, wg.z, wg.w}, whs[4] = {wh.x, wh.y, wh.z, wh.w};
      if constexpr (kActRing) {  // the half's 4 units
#pragma unroll
        for (int w = 0; w < 4; ++w) act[0][4 * half + w] = RingActivations<T, Cfg::kKC>::Unit(stage + kActOffset, 4 * half + w);
      }
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int u = 4 * half + w;
        const int blk = u / kUnitsPerBlock;
        uint32_t qa[4], qb[4];
        Dq::Run(wgs[w], dq, qa);
        Dq::Run(whs[w], dq, qb);
        // k-slots of the unit: lane quad t holds k 8t..8t+7; mma 1 takes pairs (0,1) (low slots)
        // and (2,3) (high), mma 2 pairs (4,5) and (6,7): the activations' .x/.y and .z/.w.
        const uint32_t a1[4] = {qa[0], qb[0], qa[1], qb[1]};
        const uint32_t a2[4] = {qa[2], qb[2], qa[3], qb[3]};
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          if (u % kUnitsPerBlock == 0) {
            MmaZeroC<T>(d[nt], a1, act[nt][u].x, act[nt][u].y);
          } else {
            Mma16816<T>(d[nt], a1, act[nt][u].x, act[nt][u].y);
          }
          Mma16816<T>(d[nt], a2, act[nt][u].z, act[nt][u].w);
        }
        if ((u + 1) % kUnitsPerBlock == 0) {
          if (blk % 2 == 0) {
            pg = sc[(g * Cfg::kPerRow + blk) / 2];
            ph = sc[((g + 8) * Cfg::kPerRow + blk) / 2];
          }
          AddScaledBlock<kNT>(acc, d, BitsToFloat<T>(static_cast<uint16_t>(pg >> (16 * (blk & 1)))),
                              BitsToFloat<T>(static_cast<uint16_t>(ph >> (16 * (blk & 1)))));
        }
      }
    }
    stage = NextStage<Cfg::kStageBytes>(stage, ring, last_stage);
  }
  CpAsyncWait<0>();
  SumKPartsAndStore<T, kNT>(p, EpilogueTask<kNT>(p, task), acc, smem);
}

}  // namespace gemv
}  // namespace ort_mtp
