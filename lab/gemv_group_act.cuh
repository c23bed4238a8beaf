// Lab run 46: the tiles kernel at M = 2..8 with its activations shared through shared memory by the warps
// of a block that work on the same K-part ("group": the block's m-tiles of one K-part), instead of every
// warp loading them from L1/L2 at the top of each chunk. Not part of the product.
//
// Why (lab run 44): the 8-token tiles kernel runs the chain at 107-108 us at M = 2..8 when it loads no
// activations, 112-116 when every load hits L1, and 122-141 as it is: the gap to M = 1 is the activations'
// misses. A group's activations of a chunk (M x 512 bytes) are copied once per block, each member warp
// copying its share with cp.async, into a 2-stage ring per group (one chunk ahead); a named barrier per
// group and chunk says every share has landed and every member is past the previous chunk.
//
// Blocks are larger than the op's so that more warps share (gate_up: two of the op's 2 x 3 blocks in one,
// 4 x 3; down: one block per SM of 3 or 2 m-tiles x 8 K-parts, 24 warps), but every m-tile keeps the op's
// K-split, and a chunk's arithmetic is lab/tile_chunk.cuh's (the op's per tile-chunk; fp16, block 32), so a
// row's arithmetic is the op's: rows bit-identical to the op's M = 1 kernel.
#pragma once
#include <type_traits>

#include "lab/tile_chunk.cuh"

namespace ort_mtp {
namespace gemv {
namespace lab {

constexpr int kGaMaxWarps = 24;

__device__ __forceinline__ void NamedBarrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// A group's activation stage: token-major, 512 bytes (256 k) per token; the 16-byte granule s of a token's
// row sits at s ^ ((token & 1) << 2), so that the two tokens an 8-lane phase of a 16-byte load reads fall
// in different banks.
__device__ __forceinline__ uint32_t GaActAddr(uint32_t slot, int tok, int s) {
  return slot + static_cast<uint32_t>(tok * 512 + ((s ^ ((tok & 1) << 2)) << 4));
}

// Shared memory of a launch: the warps' weight rings, then per K-part group 2 stages of M tokens.
template <int kBS>
inline int GaSmemBytes(int warps, int groups, int m) {
  return warps * TilesConfig<kBS>::kWarpBytes + groups * 2 * m * 512;
}

// kViaL1 (lab run 47): cp.async.ca, which allocates the lines in L1, so that the groups of other blocks on
// the SM on the same K-part find them there; otherwise cp.async.cg (L2 only), as the op's ring copies.
template <bool kViaL1>
__device__ __forceinline__ void CopyAct(uint32_t dst, const void* src) {
  if constexpr (kViaL1) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
  } else {
    CpAsync16(dst, src, true);
  }
}

template <typename T, int kBS, bool kViaL1 = false>
__global__ void __launch_bounds__(32 * kGaMaxWarps, 1) GemvTilesGroupActKernel(const __grid_constant__ StreamParams p) {
  static_assert(std::is_same<T, __half>::value && kBS == 32, "TileChunkFromShared: fp16, block 32");
  using Cfg = TilesConfig<kBS>;
  extern __shared__ __align__(128) unsigned char smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const WarpTask task(p, warp, 8);
  const int c_begin = task.c_begin;
  const int c_count = task.tile_row0 < task.block_rows ? task.c_count : 0;
  const int warps = static_cast<int>(blockDim.x >> 5);
  const int kp = warp % task.kparts, member = warp / task.kparts;
  const int members = min((task.block_rows + 15) / 16, warps / task.kparts);  // the group's active warps
  const int ma = task.m_count;

  const uint32_t ring = SmemAddr(smem) + static_cast<uint32_t>(warp * Cfg::kWarpBytes);
  const uint32_t last_stage = ring + static_cast<uint32_t>((kStreamStages - 1) * Cfg::kStageBytes);
  const uint32_t act_ring = SmemAddr(smem) + static_cast<uint32_t>(warps * Cfg::kWarpBytes + kp * 2 * ma * 512);
  const int64_t first = static_cast<int64_t>((task.block_row0 + task.tile_row0) / 16) * p.kchunks + c_begin;
  const uint8_t* wnext = p.b + first * Cfg::kWBytes + lane * 16;
  const bool s_lane = lane < Cfg::kSLanes;
  const uint8_t* snext = static_cast<const uint8_t*>(p.scales) + first * Cfg::kSBytes + (s_lane ? lane : 0) * 16;
  uint32_t fill = ring;
  auto issue = [&](int i, bool) {
    if (i < c_count) {
#pragma unroll
      for (int j = 0; j < 4; ++j) CpAsync16(fill + j * 512 + lane * 16, wnext + j * 512, true);
      if (s_lane) CpAsync16(fill + Cfg::kWBytes + lane * 16, snext, true);
      wnext += Cfg::kWBytes;
      snext += Cfg::kSBytes;
      fill = NextStage<Cfg::kStageBytes>(fill, ring, last_stage);
    }
    CpAsyncCommit();
  };
  // Chunk j's activations of the pass's tokens into the group's stage j % 2, this warp's share.
  const T* act_src = static_cast<const T*>(p.a) + static_cast<int64_t>(task.tok0) * p.K + static_cast<int64_t>(c_begin) * Cfg::kKC;
  auto issue_act = [&](int j) {
    if (j < c_count) {
      const uint32_t slot = act_ring + static_cast<uint32_t>((j & 1) * ma * 512);
      const T* src = act_src + static_cast<int64_t>(j) * Cfg::kKC;
      for (int tok = member; tok < ma; tok += members)  // this lane: granule `lane` of the share's tokens
        CopyAct<kViaL1>(GaActAddr(slot, tok, lane), src + static_cast<int64_t>(tok) * p.K + lane * 8);
    }
    CpAsyncCommit();
  };
  const T* arow[1];
  RingActivations<T, Cfg::kKC> ract(p, task);  // not used (kActRing false)
  StartRun<T, 1, false>(issue, p, task, arow, ract, ring, Cfg::kStageBytes, 0, c_count);
  issue_act(0);
  const int atok = min(static_cast<int>(lane >> 2), ma - 1);  // lane (g, t) feeds token g (the last one past M)
  const uint32_t a_lane = static_cast<uint32_t>(atok * 512 + (lane & 3) * 16);

  float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  uint32_t stage = ring;
  CpAsyncWait<0>();  // chunk 0's weights and activations (and chunk 1's weights)
  for (int i = 0; i < c_count; ++i) {
    // Groups, oldest first: ..., weights i, activations i, weights i + 1, [activations i + 1 and weights
    // i + 2 are issued below]: all but the newest is weights and activations of chunk i.
    CpAsyncWait<1>();
    __syncwarp();
    NamedBarrier(1 + kp, members * 32);  // every member's share of chunk i landed; all are past chunk i - 1
    issue_act(i + 1);                    // into the stage chunk i - 1 used
    issue(i + kStreamStages - 1, true);  // into the stage read in iteration i - 1
    // GaActAddr's granule 4u + t of token atok is at unit (u ^ (atok & 1)) of its row.
    TileChunkFromShared(stage, reinterpret_cast<const uint32_t*>(smem + (stage - SmemAddr(smem)) + Cfg::kWBytes),
                        act_ring + static_cast<uint32_t>((i & 1) * ma * 512) + a_lane, atok & 1, acc);
    stage = NextStage<Cfg::kStageBytes>(stage, ring, last_stage);
  }
  CpAsyncWait<0>();
  SumKPartsAndStore<T, 1>(p, EpilogueTask<1>(p, task), acc, smem);
}

}  // namespace lab
}  // namespace gemv
}  // namespace ort_mtp
