// Lab only (device lab run 40, bench/results/2026-11-29-lab): a producer / consumer GEMV on the tiles
// layout (packing=1), Hopper's way, which nothing in the op does. Lab run 39 (bench/lab/pipeline_probe.cu,
// BulkRuns) streamed the chain's weights and scales through a block-wide ring filled by bulk copies (the
// TMA engine) at 99-105 us against the op's per-warp cp.async pipeline's 110: is that memory floor
// reachable with the math, and does it flatten M = 2..8? (bench/NOTES.md, lab runs 38-40: not on the
// chain; this file is the last version, 40l, and lab40.log describes the ones before it.)
//
// One block per SM: kBulkConsumers consumer warps, a producer warp and a reducer warp. The block owns a
// contiguous range of m-tiles, full K (no sum across blocks). Lane 0 of the producer copies
//   - stages of q consecutive tile-chunks of one m-tile (q x 2 KB of weights and q x 256 bytes of scales,
//     two bulk copies, q divides the m-tile's chunks), into a ring of `stages` stages; the first stages
//     before griddepcontrol.wait (the weights are constants);
// After griddepcontrol.wait the consumer threads copy the M tokens' activations of all of K, once per
// block, into shared memory (rows padded by 64 bytes so that a quarter-warp's 16-byte reads of two
// tokens fall in different banks).
// The consumer warps (in groups, see kBulkGroups) take the stages' tile-chunks with the op's arithmetic
// per tile-chunk (gemv_tiles.cuh) and release each stage on an mbarrier; a warp leaves its sums of an
// m-tile in the m-tile's slot, and a reducer warp adds an m-tile's sums in a fixed order and stores it:
// the arithmetic depends on the shape and the grid, never on M, so rows are bit-identical across M
// (gemv_lab's check). M <= 8, block 32, fp16; the activations must fit beside two
// ring slots per group (bench/gemv_lab.cu's MaxM: with 4 groups, gate_up and the lm_head up to M = 2,
// down up to M = 3; lab run 40i, with one slot per group, ran gate_up and the lm_head at M = 8).
#pragma once
#include "lab/lab_common.cuh"
#include "lab/tile_chunk.cuh"

namespace ort_mtp {
namespace gemv {
namespace lab {

// Consumer warps in kBulkGroups groups of kBulkGroupWarps: stage j goes to group j % kBulkGroups, whose
// warps split its q tile-chunks (warp r of the group: chunks r, r + kBulkGroupWarps, ...) and release it.
// A warp visits every kBulkGroups-th stage only (lab run 40h: with every warp visiting every stage, the
// waits and bookkeeping per stage cost as much as the math). The ring depth is a multiple of the groups,
// so that a group's stages always use the group's own slots: a parity wait is exact only when one party
// waits a slot's uses in order (lab runs 40h, 40j).
constexpr int kBulkGroups = 4, kBulkGroupWarps = 6;
constexpr int kBulkConsumers = kBulkGroups * kBulkGroupWarps;  // + the producer and the reducer warp
constexpr int kBulkStageChunkBytes = 2048 + 256;  // a tile-chunk's weights and scales (block 32)
constexpr int kBulkPartSlots = 2;                 // m-tiles whose sums may wait for the reducer
constexpr int kBulkPartBytes = kBulkConsumers * 512;  // an m-tile's sums: 32 lanes x 4 floats per warp

struct BulkParams {
  const __half* a;
  const uint8_t* b;       // tiles layout
  const uint8_t* scales;  // tiles layout
  __half* y;
  int M, N, K, kchunks;
  int q;           // tile-chunks per stage (divides kchunks)
  int stages;      // ring depth, a multiple of kBulkGroups
  int act_stride;  // bytes per token row of activations in shared memory (K * 2 + 64)
};

// Shared memory: the ring, the activations, the m-tile sums' slots, the mbarriers, the reducer's count.
inline int BulkSmemBytes(int q, int stages, int M, int K) {
  return stages * q * kBulkStageChunkBytes + M * (K * 2 + 64) + kBulkPartSlots * kBulkPartBytes +
         8 * (2 * stages + kBulkPartSlots) + 16;
}

__device__ __forceinline__ int LdVolatileShared(uint32_t addr) {
  int v;
  asm volatile("ld.volatile.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// kMath = false (lab run 40c): the consumers XOR the stage's words and the activations they would read
// instead of the arithmetic: the pipeline alone.
template <bool kMath = true>
__global__ void __launch_bounds__(32 * (kBulkConsumers + 2)) GemvBulkKernel(const __grid_constant__ BulkParams p) {
  using T = __half;
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n_tiles = p.N / 16;
  const int t0 = static_cast<int>(static_cast<int64_t>(n_tiles) * blockIdx.x / gridDim.x);
  const int t1 = static_cast<int>(static_cast<int64_t>(n_tiles) * (blockIdx.x + 1) / gridDim.x);
  const int q = p.q, stages = p.stages;
  const int stage_bytes = q * kBulkStageChunkBytes;
  const int per_tile = p.kchunks / q;  // stages per m-tile
  const int groups_per_tile = min(per_tile, kBulkGroups);  // groups whose warps leave sums for an m-tile
  const uint32_t base = SmemAddr(smem);
  const uint32_t acts = base + stages * stage_bytes;
  const uint32_t parts = acts + p.M * p.act_stride;
  const uint32_t full = parts + kBulkPartSlots * kBulkPartBytes, empty = full + 8 * stages;
  const uint32_t parts_full = empty + 8 * stages, reduced = parts_full + 8 * kBulkPartSlots;
  const int n = (t1 - t0) * per_tile;  // the block's stages
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) {
      MbarInit(full + 8 * i, 1);
      MbarInit(empty + 8 * i, kBulkGroupWarps);
    }
    for (int i = 0; i < kBulkPartSlots; ++i) MbarInit(parts_full + 8 * i, groups_per_tile * kBulkGroupWarps);
    asm volatile("st.shared.s32 [%0], 0;\n" ::"r"(reduced) : "memory");  // m-tiles the reducer is done with
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  GridDependencyTrigger();

  if (warp == kBulkConsumers) {  // the producer: lane 0 fills the ring in stage order
    if (lane == 0) {
      // Counters instead of divisions (lab run 40e: 64-bit divisions per stage cost more than the math).
      const uint8_t* wsrc = p.b + static_cast<int64_t>(t0) * p.kchunks * 2048;
      const uint8_t* ssrc = p.scales + static_cast<int64_t>(t0) * p.kchunks * 256;
      int slot = 0;
      uint32_t phase = 0;  // parity of the slot's previous use (its empty barrier), from the second lap on
      for (int j = 0; j < n; ++j) {
        if (j >= stages) MbarWait(empty + 8 * slot, phase);
        MbarExpectTx(full + 8 * slot, stage_bytes);
        BulkCopy(base + slot * stage_bytes, wsrc, q * 2048, full + 8 * slot);
        BulkCopy(base + slot * stage_bytes + q * 2048, ssrc, q * 256, full + 8 * slot);
        wsrc += q * 2048;
        ssrc += q * 256;
        if (++slot == stages) {
          slot = 0;
          if (j >= stages) phase ^= 1;
        }
      }
    }
    return;
  }
  if (warp == kBulkConsumers + 1) {  // the reducer: an m-tile's sums, added in a fixed order
    GridDependencyWait();            // y may be memory the previous kernel still reads
    const int g2 = lane >> 2, t2 = lane & 3;
    for (int tl = 0; tl < t1 - t0; ++tl) {
      const int slot = tl % kBulkPartSlots;
      MbarWait(parts_full + 8 * slot, static_cast<uint32_t>((tl / kBulkPartSlots) & 1));
      // Groups in the order of their first stage in the m-tile, each group's warps in order.
      const int g_first = (tl * per_tile) % kBulkGroups;
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int k = 0; k < groups_per_tile; ++k) {
        const int grp = (g_first + k) % kBulkGroups;
        const uint32_t buf = parts + slot * kBulkPartBytes + grp * kBulkGroupWarps * 512 + lane * 16;
        for (int w = 0; w < kBulkGroupWarps; ++w) {
          const uint4 v = LdShared128(buf + w * 512);
          if (k == 0 && w == 0) {
            s = make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
          } else {
            s.x += __uint_as_float(v.x); s.y += __uint_as_float(v.y);
            s.z += __uint_as_float(v.z); s.w += __uint_as_float(v.w);
          }
        }
      }
      __syncwarp();
      if (lane == 0) asm volatile("st.volatile.shared.s32 [%0], %1;\n" ::"r"(reduced), "r"(tl + 1) : "memory");
      // Lane (g, t) of the mma layout: rows g (s.x, s.y) and g + 8 (s.z, s.w), tokens 2t and 2t + 1.
      const int row = (t0 + tl) * 16 + g2, tok = 2 * t2;
      __half* y = p.y + static_cast<int64_t>(tok) * p.N + row;
      if (tok < p.M) { y[0] = FromFloat<T>(s.x); y[8] = FromFloat<T>(s.z); }
      if (tok + 1 < p.M) { y[p.N] = FromFloat<T>(s.y); y[p.N + 8] = FromFloat<T>(s.w); }
    }
    return;
  }

  // The activations (the previous kernel's output), copied by the consumer threads with cp.async: a bulk
  // copy would queue behind the ring's first stages in the copy engine (lab run 40f: the consumers waited
  // ~30% of their time for it at the start).
  GridDependencyWait();
  {
    const int per_row = p.K / 8;  // 16-byte pieces per token row
    for (int x = threadIdx.x; x < p.M * per_row; x += 32 * kBulkConsumers) {
      const int tok = x / per_row, k8 = x - tok * per_row;
      CpAsync16(acts + tok * p.act_stride + k8 * 16, p.a + static_cast<int64_t>(tok) * p.K + k8 * 8, true);
    }
    CpAsyncCommit();
    CpAsyncWait<0>();
    asm volatile("bar.sync 1, %0;\n" ::"n"(32 * kBulkConsumers) : "memory");
  }
  const int gr = warp / kBulkGroupWarps, r = warp - gr * kBulkGroupWarps;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t my_act = acts + min(g, p.M - 1) * p.act_stride + t * 16;
  // Stage j = gr, gr + groups, ...: its ring slot and parity, its m-tile tl and index within it.
  int slot = gr, in_tile = gr % per_tile, tl = gr / per_tile;
  uint32_t phase = 0;
  float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};  // this warp's sums of m-tile tl so far
  for (int j = gr; j < n; j += kBulkGroups) {
    MbarWait(full + 8 * slot, phase);
    const uint32_t st = base + slot * stage_bytes;
    const uint32_t* sc0 = reinterpret_cast<const uint32_t*>(smem + (st - base) + q * 2048);
    const uint32_t a_stage = my_act + in_tile * q * 512;  // k0 * 2 bytes of the stage's first chunk
    // The warp's tile-chunks of the stage, two at a time with their own sums (two independent chains of
    // loads, mma and fma for the scheduler), in a fixed order: each pair's second sum added to the first.
    int i = r;
    for (; i + kBulkGroupWarps < q; i += 2 * kBulkGroupWarps) {
      const int i2 = i + kBulkGroupWarps;
      if constexpr (kMath) {
        float acc2[1][4] = {{0.f, 0.f, 0.f, 0.f}};
        TileChunkFromShared(st + i * 2048, sc0 + i * 64, a_stage + i * 512, 0, acc);
        TileChunkFromShared(st + i2 * 2048, sc0 + i2 * 64, a_stage + i2 * 512, 0, acc2);
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[0][e] += acc2[0][e];
      } else {
        const uint4 v = LdShared128(st + i * 2048 + lane * 16), v2 = LdShared128(st + i2 * 2048 + lane * 16);
        const uint4 x = LdShared128(a_stage + i * 512), x2 = LdShared128(a_stage + i2 * 512);
        acc[0][0] = __uint_as_float(__float_as_uint(acc[0][0]) ^ v.x ^ v.w ^ v2.y ^ x.x ^ x2.y ^ sc0[i * 64 + g]);
      }
    }
    if (i < q) {
      if constexpr (kMath) {
        TileChunkFromShared(st + i * 2048, sc0 + i * 64, a_stage + i * 512, 0, acc);
      } else {
        const uint4 v = LdShared128(st + i * 2048 + lane * 16);
        const uint4 x = LdShared128(a_stage + i * 512);
        acc[0][1] = __uint_as_float(__float_as_uint(acc[0][1]) ^ v.x ^ v.w ^ x.x ^ sc0[i * 64 + g]);
      }
    }
    __syncwarp();
    if (lane == 0) MbarArrive(empty + 8 * slot);
    slot += kBulkGroups;
    if (slot >= stages) {
      slot -= stages;
      phase ^= 1;
    }
    // Next stage of this group; when it is in another m-tile (or there is none), the sums of m-tile tl go
    // to its slot, once the reducer is done with the slot's previous m-tile.
    const int prev_tl = tl;
    in_tile += kBulkGroups;
    while (in_tile >= per_tile) {
      in_tile -= per_tile;
      ++tl;
    }
    if (tl != prev_tl || j + kBulkGroups >= n) {
      const int pslot = prev_tl % kBulkPartSlots;
      while (LdVolatileShared(reduced) < prev_tl - kBulkPartSlots + 1) {
      }
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(parts + pslot * kBulkPartBytes + warp * 512 + lane * 16),
                   "f"(acc[0][0]), "f"(acc[0][1]), "f"(acc[0][2]), "f"(acc[0][3])
                   : "memory");
      __syncwarp();
      if (lane == 0) MbarArrive(parts_full + 8 * pslot);
      acc[0][0] = acc[0][1] = acc[0][2] = acc[0][3] = 0.f;
    }
  }
}

}  // namespace lab
}  // namespace gemv
}  // namespace ort_mtp
