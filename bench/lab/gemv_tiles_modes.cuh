// Lab only (device lab run 17): the op's tiles kernel (csrc/matmul_nbits/gemv_tiles.cuh, fp16, block 32)
// copied with a mode, to learn where its time goes and to try a cheaper int4 conversion before the op
// changes. Modes:
//   0: the op's kernel as it is (a check that the copy times like the op's);
//   1: the same pipeline, shared-memory reads kept, no conversion and no mma (words XORed): the floor
//      the tiles layout's memory pipeline sets;
//   2: "offset" conversion: one lop3 per pair and no f16x2 subtract/fma. A nibble ORed into the mantissa
//      of 1024 (bits 0-3) or of 64 (bits 4-7, whose ulp-16 step makes the value 64 + n exactly) gives
//      off + n, off = 1024 for k = 0, 1 mod 4 and 64 for k = 2, 3 mod 4 (the tiles layout's nibble
//      order). The mma then sums (off + n) x; a second mma per k-step on the constant fragment
//      -(off + 8) subtracts sum (off + 8) x, leaving sum (n - 8) x. Products are exact in fp32, the
//      accumulator cancels ~1000x per k-step (the error this adds is measured by the lab's check).
//      Per 2 KB chunk and warp: conversion 80 instructions instead of 144, mma 32 instead of 16.
//   3: mode 0 with the ring filled by the bulk-copy engine (cp.async.bulk, completion on one mbarrier per
//      stage): lane 0 issues a chunk's 2 KB of weights and its scales as two copies (the tiles layout
//      makes both contiguous) instead of every lane issuing four 16-byte cp.async and one 8-byte;
//   4: mode 3's pipeline with mode 1's no-math loop.
#pragma once
#include "matmul_nbits/gemv_tiles.cuh"

namespace ort_mtp {
namespace gemv {
namespace lab {

__device__ __forceinline__ void OffsetDequant(uint32_t w, uint32_t (&out)[4]) {
  const uint32_t w8 = w >> 8;
  out[0] = AndOr(w, 0x000F000Fu, 0x64006400u);   // (k0, k1): 1024 + n
  out[1] = AndOr(w, 0x00F000F0u, 0x54005400u);   // (k2, k3): 64 + n
  out[2] = AndOr(w8, 0x000F000Fu, 0x64006400u);  // (k4, k5)
  out[3] = AndOr(w8, 0x00F000F0u, 0x54005400u);  // (k6, k7)
}

__device__ __forceinline__ void BarInit(uint32_t bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void BarExpect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void BulkCopy(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void BarWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n LAB_WAIT_%=:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra LAB_WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// kVar (mode 0 only), differences from lab run 15's first tiles kernel, one bit each: 1 the epilogue
// rebuilt the warp's task instead of keeping it live across the loop (lab run 17c; the op's kernels now
// do that through EpilogueTask, so bit 1 changes nothing since); 2 every lane copies scales (no
// predicate); 4 scales read per block, not per pair; 8 the block sums declared per unit.
template <int kNT, int kMode, int kVar = 0>
__global__ void __launch_bounds__(32 * kStreamMaxWarps) __maxnreg__(kNT == 1 ? 80 : 128)
    GemvTilesModeKernel(const __grid_constant__ StreamParams p) {
  using T = __half;
  constexpr int kBS = 32;
  using Cfg = TilesConfig<kBS>;
  using Dq = Int4Dequant<T>;
  constexpr int kTokens = 8 * kNT, kUnits = Cfg::kKC / 32, kUnitsPerBlock = kBS / 32;
  extern __shared__ __align__(128) unsigned char smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const WarpTask task(p, warp, kTokens);
  const int c_begin = task.c_begin;
  const int c_count = task.tile_row0 < task.block_rows ? task.c_count : 0;

  constexpr bool kBulk = kMode >= 3, kMemOnly = kMode == 1 || kMode == 4;
  // Bulk modes: each stage is followed by 16 bytes holding its mbarrier.
  constexpr int kStage = Cfg::kStageBytes + (kBulk ? 16 : 0);
  const uint32_t ring = SmemAddr(smem) + static_cast<uint32_t>(warp * kStreamStages * kStage);
  const uint32_t last_stage = ring + static_cast<uint32_t>((kStreamStages - 1) * kStage);
  const int64_t first = static_cast<int64_t>((task.block_row0 + task.tile_row0) / 16) * p.kchunks + c_begin;
  const uint8_t* wnext = p.b + first * Cfg::kWBytes + lane * 16;
  const bool s_lane = lane < Cfg::kSLanes;
  const uint8_t* snext = static_cast<const uint8_t*>(p.scales) + first * Cfg::kSBytes + (s_lane ? lane : 0) * 8;
  if constexpr (kBulk) {
    if (lane == 0)
      for (int s2 = 0; s2 < kStreamStages; ++s2) BarInit(ring + s2 * kStage + Cfg::kStageBytes);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    __syncwarp();
  }
  uint32_t fill = ring;
  auto issue = [&](int i) {
    if constexpr (kBulk) {
      if (i < c_count) {
        if (lane == 0) {
          const uint32_t bar = fill + Cfg::kStageBytes;
          BarExpect(bar, Cfg::kStageBytes);
          BulkCopy(fill, wnext - lane * 16, Cfg::kWBytes, bar);
          BulkCopy(fill + Cfg::kWBytes, snext - (s_lane ? lane : 0) * 8, Cfg::kSBytes, bar);
        }
        wnext += Cfg::kWBytes;
        snext += Cfg::kSBytes;
        fill = fill == last_stage ? ring : fill + kStage;
      }
      return;
    }
    if (i < c_count) {
#pragma unroll
      for (int j = 0; j < 4; ++j) CpAsync16(fill + j * 512 + lane * 16, wnext + j * 512, true);
      if ((kVar & 2) || s_lane) CpAsyncSmall<8>(fill + Cfg::kWBytes + lane * 8, snext, true);
      wnext += Cfg::kWBytes;
      snext += Cfg::kSBytes;
      fill = fill == last_stage ? ring : fill + kStage;
    }
    CpAsyncCommit();
  };
#pragma unroll
  for (int i = 0; i < kStreamStages - 1; ++i) issue(i);
  const T* arow[kNT];
  WaitForActivations<T, kNT>(p, task, arow);
  const int g = lane >> 2;

  float acc[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;
  uint32_t sink = 0;

  uint32_t stage = ring;
  uint32_t parity = 0;
  for (int i = 0; i < c_count; ++i) {
    const int64_t k0 = static_cast<int64_t>(c_begin + i) * Cfg::kKC;
    uint4 act[kNT][kUnits];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int u = 0; u < kUnits; ++u) act[nt][u] = __ldg(reinterpret_cast<const uint4*>(arow[nt] + k0 + 32 * u));
    if constexpr (kBulk) {
      BarWait(stage + Cfg::kStageBytes, parity);
    } else {
      CpAsyncWait<kStreamStages - 2>();
    }
    __syncwarp();
    issue(i + kStreamStages - 1);

    const typename Dq::Consts dq = Dq::Make(8u);
    const uint32_t* sc = reinterpret_cast<const uint32_t*>(smem + (stage - SmemAddr(smem)) + Cfg::kWBytes);
    float dchunk[kNT][4];
    uint32_t pg = 0, ph = 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint4 wg = LdShared128(stage + (2 * half) * 512 + lane * 16);
      const uint4 wh = LdShared128(stage + (2 * half + 1) * 512 + lane * 16);
      if constexpr (kMemOnly) {
        sink ^= wg.x ^ wg.y ^ wg.z ^ wg.w ^ wh.x ^ wh.y ^ wh.z ^ wh.w;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) sink += act[nt][2 * half].x ^ act[nt][2 * half + 1].w;
        continue;
      }
      const uint32_t wgs[4] = {wg.x, wg.y, wg.z, wg.w}, whs[4] = {wh.x, wh.y, wh.z, wh.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int u = 4 * half + w;
        const int blk = u / kUnitsPerBlock;
        uint32_t qa[4], qb[4];
        if constexpr (kMode == 2) {
          OffsetDequant(wgs[w], qa);
          OffsetDequant(whs[w], qb);
        } else {
          Dq::Run(wgs[w], dq, qa);
          Dq::Run(whs[w], dq, qb);
        }
        const uint32_t a1[4] = {qa[0], qb[0], qa[1], qb[1]};
        const uint32_t a2[4] = {qa[2], qb[2], qa[3], qb[3]};
        // -(off + 8) for the fragment's slots: a0/a1 pair with b0 (k 0, 1 mod 4), a2/a3 with b1.
        const uint32_t aneg[4] = {0xE408E408u, 0xE408E408u, 0xD480D480u, 0xD480D480u};
        float dunit[kNT][4];
        float (&d)[kNT][4] = (kVar & 8) ? dunit : dchunk;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          if (u % kUnitsPerBlock == 0) {
            MmaZeroC<T>(d[nt], a1, act[nt][u].x, act[nt][u].y);
          } else {
            Mma16816<T>(d[nt], a1, act[nt][u].x, act[nt][u].y);
          }
          if constexpr (kMode == 2) Mma16816<T>(d[nt], aneg, act[nt][u].x, act[nt][u].y);
          Mma16816<T>(d[nt], a2, act[nt][u].z, act[nt][u].w);
          if constexpr (kMode == 2) Mma16816<T>(d[nt], aneg, act[nt][u].z, act[nt][u].w);
        }
        if ((u + 1) % kUnitsPerBlock == 0) {
          if ((kVar & 4) || blk % 2 == 0) {
            pg = sc[(g * Cfg::kPerRow + blk) / 2];
            ph = sc[((g + 8) * Cfg::kPerRow + blk) / 2];
          }
          AddScaledBlock<kNT>(acc, d, BitsToFloat<T>(static_cast<uint16_t>(pg >> (16 * (blk & 1)))),
                              BitsToFloat<T>(static_cast<uint16_t>(ph >> (16 * (blk & 1)))));
        }
      }
    }
    if (stage == last_stage) {
      stage = ring;
      parity ^= 1u;
    } else {
      stage += kStage;
    }
  }
  if constexpr (kBulk) {
    __syncwarp();  // the epilogue reuses the ring: retire its barriers first
    if (lane == 0)
      for (int s2 = 0; s2 < kStreamStages; ++s2)
        asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(ring + s2 * kStage + Cfg::kStageBytes) : "memory");
  } else {
    CpAsyncWait<0>();
  }
  if constexpr (kMemOnly) acc[0][0] = __uint_as_float(sink & 0x3C00u);  // keeps the reads; output not checked
  SumKPartsAndStore<T, kNT>(p, EpilogueTask<kNT>(p, task), acc, smem);
}

}  // namespace lab
}  // namespace gemv
}  // namespace ort_mtp
