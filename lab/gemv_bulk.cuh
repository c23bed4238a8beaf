// Lab only (device lab run 40, lab/runs.md): a producer / consumer GEMV on the tiles
// layout (packing=1), Hopper's way, which nothing in the op does. Lab run 39 (lab/pipeline_probe.cu,
// BulkRuns) streamed the chain's weights and scales through a block-wide ring filled by bulk copies (the
// TMA engine) at 99-105 us against the op's per-warp cp.async pipeline's 110: is that memory floor
// reachable with the math, and does it flatten M = 2..8? (lab/NOTES.md, lab runs 38-40: not on the
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
// ring slots per group (lab/gemv_lab.cu's MaxM: with 4 groups, gate_up and the lm_head up to M = 2,
// down up to M = 3; lab run 40i, with one slot per group, ran gate_up and the lm_head at M = 8).
// Lab run 41 added: the groups as template parameters, the reducer's progress counted in shared memory
// (no mbarrier for the sums' slots), equal stage ranges per block (split), fewer stages before the
// activations (pre) and a per-block timeline (kTrace). None of them made it faster (lab/NOTES.md), and
// at its defaults this version runs the chain 4% slower than 40l's (lab run 41k; 40l is at c9d7195).
#pragma once
#include "lab/lab_common.cuh"
#include "lab/tile_chunk.cuh"

namespace ort_mtp {
namespace gemv {
namespace lab {

// Consumer warps in kBulkGroups groups of kBulkGroupWarps (template parameters kG, kW since lab run 41;
// 40l: 4 x 6): stage j goes to group j % kBulkGroups, whose warps split its q tile-chunks (warp r of the
// group: chunks r, r + kBulkGroupWarps, ...) and release it. A warp visits every kBulkGroups-th stage only
// (lab run 40h: with every warp visiting every stage, the waits and bookkeeping per stage cost as much as
// the math). The ring depth is a multiple of the groups, so that a group's stages always use the group's
// own slots: a parity wait is exact only when one party waits a slot's uses in order (lab runs 40h, 40j).
constexpr int kBulkStageChunkBytes = 2048 + 256;  // a tile-chunk's weights and scales (block 32)
constexpr int kBulkPartSlots = 2;                 // m-tiles whose sums may wait for the reducer
// An m-tile's sums: 32 lanes x 4 floats per consumer warp.
__host__ __device__ constexpr int BulkPartBytes(int consumers) { return consumers * 512; }

struct BulkParams {
  const __half* a;
  const uint8_t* b;       // tiles layout
  const uint8_t* scales;  // tiles layout
  __half* y;
  int M, N, K, kchunks;
  int q;           // tile-chunks per stage (divides kchunks)
  int stages;      // ring depth, a multiple of kBulkGroups
  int act_stride;  // bytes per token row of activations in shared memory (K * 2 + 64)
  unsigned long long* trace;  // lab run 41: kBulkTraceEvents per block (BulkTrace), or null
  // Lab run 41: split = 1 gives every block an equal range of stages (an m-tile may then be cut between
  // blocks: each block's piece of it goes to piece_sums, and the last block to arrive, counted in
  // piece_count, adds the pieces in block order); split = 0, whole m-tiles per block (40l).
  int split;
  float4* piece_sums;  // 2 x 32 lanes per block: the block's first and last piece's sums
  int* piece_count;    // per m-tile, zero between launches (the last arriver resets it)
  int pre;             // stages the producer issues before the activations have landed (>= stages: no limit)
};

// Lab run 41's per-block timeline (globaltimer ns, and the SM): where a kernel boundary's time goes.
enum BulkTrace {
  kTraceEntry,      // thread 0 at the kernel's start
  kTraceSm,         // the block's SM
  kTraceIssued,     // the producer has issued the ring's first stages (before the previous kernel ends)
  kTraceWaited,     // consumer thread 0 past griddepcontrol.wait (the previous kernel done)
  kTraceActs,       // the activations in shared memory
  kTraceFirst,      // consumer warp 0's first stage landed
  kTraceLastStage,  // consumer warp 0 done with its last stage
  kTraceDone,       // the reducer has stored the block's last m-tile
  kBulkTraceEvents
};
template <bool kTrace>
__device__ __forceinline__ void Trace(const BulkParams& p, int event, unsigned long long v) {
  if constexpr (kTrace) p.trace[blockIdx.x * kBulkTraceEvents + event] = v;
}

// Shared memory: the ring, the activations, the m-tile sums' slots, the mbarriers, the counters.
inline int BulkSmemBytes(int q, int stages, int M, int K, int consumers) {
  return stages * q * kBulkStageChunkBytes + M * (K * 2 + 64) + kBulkPartSlots * BulkPartBytes(consumers) +
         8 * (2 * stages + 1) + 4 * (kBulkPartSlots + 1) + 16;
}

// The first global stage of block b (stages: m-tile t's stage i is t * per_tile + i).
__device__ __forceinline__ int BulkBlockStart(const BulkParams& p, int b, int per_tile) {
  const int n_tiles = p.N / 16;
  if (p.split) return static_cast<int>(static_cast<int64_t>(n_tiles) * per_tile * b / gridDim.x);
  return static_cast<int>(static_cast<int64_t>(n_tiles) * b / gridDim.x) * per_tile;
}
// The block whose range holds global stage s.
__device__ __forceinline__ int BulkBlockOf(const BulkParams& p, int s, int per_tile) {
  const int total = p.N / 16 * per_tile;
  int b = static_cast<int>(static_cast<int64_t>(s) * gridDim.x / total);
  while (b > 0 && BulkBlockStart(p, b, per_tile) > s) --b;
  while (b + 1 < static_cast<int>(gridDim.x) && BulkBlockStart(p, b + 1, per_tile) <= s) ++b;
  return b;
}

__device__ __forceinline__ int LdVolatileShared(uint32_t addr) {
  int v;
  asm volatile("ld.volatile.shared.s32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

// kMath = false (lab run 40c): the consumers XOR the stage's words and the activations they would read
// instead of the arithmetic: the pipeline alone. kTrace: record the block's timeline (p.trace; a separate
// instance, so that the timed one has no trace stores).
template <int kG, int kW, bool kMath = true, bool kTrace = false>
__global__ void __launch_bounds__(32 * (kG * kW + 2)) GemvBulkKernel(const __grid_constant__ BulkParams p) {
  using T = __half;
  constexpr int kBulkGroups = kG, kBulkGroupWarps = kW, kBulkConsumers = kG * kW;
  constexpr int kBulkPartBytes = BulkPartBytes(kBulkConsumers);
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int q = p.q, stages = p.stages;
  const int stage_bytes = q * kBulkStageChunkBytes;
  const int per_tile = p.kchunks / q;  // stages per m-tile
  const int s0 = BulkBlockStart(p, blockIdx.x, per_tile), s1 = BulkBlockStart(p, blockIdx.x + 1, per_tile);
  const int n = s1 - s0;            // the block's stages
  const int tile0 = s0 / per_tile;  // the block's first m-tile (its piece k is m-tile tile0 + k)
  const uint32_t base = SmemAddr(smem);
  if (threadIdx.x == 0) {
    Trace<kTrace>(p, kTraceEntry, GlobalTimer());
    Trace<kTrace>(p, kTraceSm, SmId());
  }
  const uint32_t acts = base + stages * stage_bytes;
  const uint32_t parts = acts + p.M * p.act_stride;
  const uint32_t full = parts + kBulkPartSlots * kBulkPartBytes, empty = full + 8 * stages;
  const uint32_t acts_full = empty + 8 * stages;
  // Per part slot: warps that left their sums there (the reducer resets it); then the pieces reduced.
  const uint32_t arrived = acts_full + 8, reduced = arrived + 4 * kBulkPartSlots;
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) {
      MbarInit(full + 8 * i, 1);
      MbarInit(empty + 8 * i, kBulkGroupWarps);
    }
    MbarInit(acts_full, 1);
    for (int i = 0; i <= kBulkPartSlots; ++i) asm volatile("st.shared.s32 [%0], 0;\n" ::"r"(arrived + 4 * i) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  GridDependencyTrigger();

  if (warp == kBulkConsumers) {  // the producer: lane 0 fills the ring in stage order
    if (lane == 0) {
      // Counters instead of divisions (lab run 40e: 64-bit divisions per stage cost more than the math).
      // The tiles layout keeps an m-tile's chunks together, so global stage s is at s * q chunks.
      const uint8_t* wsrc = p.b + static_cast<int64_t>(s0) * q * 2048;
      const uint8_t* ssrc = p.scales + static_cast<int64_t>(s0) * q * 256;
      int slot = 0;
      uint32_t phase = 0;  // parity of the slot's previous use (its empty barrier), from the second lap on
      for (int j = 0; j < n; ++j) {
        if (j == p.pre) MbarWait(acts_full, 0);  // let the activations' copies go first
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
        if (j == min(stages, n) - 1) Trace<kTrace>(p, kTraceIssued, GlobalTimer());
      }
    }
    return;
  }
  if (warp == kBulkConsumers + 1) {  // the reducer: a piece's sums, added in a fixed order
    GridDependencyWait();            // y may be memory the previous kernel still reads
    const int g2 = lane >> 2, t2 = lane & 3;
    const int n_pieces = n > 0 ? (s1 - 1) / per_tile - tile0 + 1 : 0;
    for (int pc = 0; pc < n_pieces; ++pc) {
      const int tile = tile0 + pc, slot = pc % kBulkPartSlots;
      // The piece's stages (local), the groups that worked on it and the first of them.
      const int a = max(tile * per_tile, s0) - s0, e = min((tile + 1) * per_tile, s1) - s0;
      const int groups = min(e - a, kBulkGroups);
      while (LdVolatileShared(arrived + 4 * slot) < groups * kBulkGroupWarps) {
      }
      __threadfence_block();
      const int g_first = a % kBulkGroups;
      float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
      for (int k = 0; k < groups; ++k) {
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
      if (lane == 0) {
        asm volatile("st.volatile.shared.s32 [%0], 0;\n" ::"r"(arrived + 4 * slot) : "memory");
        __threadfence_block();
        asm volatile("st.volatile.shared.s32 [%0], %1;\n" ::"r"(reduced), "r"(pc + 1) : "memory");
      }
      if (e - a < per_tile) {
        // A piece of an m-tile cut between blocks: leave it, and the last block to arrive adds the pieces
        // in block order (the cut is a function of the shape and the grid, never of M).
        const int b_first = BulkBlockOf(p, tile * per_tile, per_tile);
        const int b_last = BulkBlockOf(p, (tile + 1) * per_tile - 1, per_tile);
        p.piece_sums[(2 * blockIdx.x + (pc == 0 ? 0 : 1)) * 32 + lane] = s;
        __threadfence();
        __syncwarp();
        int old = 0;
        if (lane == 0) old = atomicAdd(p.piece_count + tile, 1);
        old = __shfl_sync(0xffffffffu, old, 0);
        if (old != b_last - b_first) continue;  // another block adds them
        __threadfence();
        for (int bb = b_first; bb <= b_last; ++bb) {
          const int first_tile = BulkBlockStart(p, bb, per_tile) / per_tile;
          const float4 v = __ldcg(p.piece_sums + (2 * bb + (tile == first_tile ? 0 : 1)) * 32 + lane);
          if (bb == b_first) {
            s = v;
          } else {
            s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
          }
        }
        if (lane == 0) p.piece_count[tile] = 0;
      }
      // Lane (g, t) of the mma layout: rows g (s.x, s.y) and g + 8 (s.z, s.w), tokens 2t and 2t + 1.
      const int row = tile * 16 + g2, tok = 2 * t2;
      __half* y = p.y + static_cast<int64_t>(tok) * p.N + row;
      if (tok < p.M) { y[0] = FromFloat<T>(s.x); y[8] = FromFloat<T>(s.z); }
      if (tok + 1 < p.M) { y[p.N] = FromFloat<T>(s.y); y[p.N + 8] = FromFloat<T>(s.w); }
    }
    if (lane == 0) Trace<kTrace>(p, kTraceDone, GlobalTimer());
    return;
  }

  // The activations (the previous kernel's output), copied by the consumer threads with cp.async: a bulk
  // copy would queue behind the ring's first stages in the copy engine (lab run 40f: the consumers waited
  // ~30% of their time for it at the start).
  GridDependencyWait();
  if (threadIdx.x == 0) Trace<kTrace>(p, kTraceWaited, GlobalTimer());
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
  if (threadIdx.x == 0) {
    MbarArrive(acts_full);
    Trace<kTrace>(p, kTraceActs, GlobalTimer());
  }
  const int gr = warp / kBulkGroupWarps, r = warp - gr * kBulkGroupWarps;
  const int g = lane >> 2, t = lane & 3;
  const uint32_t my_act = acts + min(g, p.M - 1) * p.act_stride + t * 16;
  // Local stage j = gr, gr + groups, ...: its ring slot and parity, its piece pc and index within the m-tile.
  int slot = gr, in_tile = (s0 + gr) % per_tile, pc = (s0 + gr) / per_tile - tile0;
  uint32_t phase = 0;
  float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};  // this warp's sums of piece pc so far
  for (int j = gr; j < n; j += kBulkGroups) {
    MbarWait(full + 8 * slot, phase);
    if (threadIdx.x == 0 && j == gr) Trace<kTrace>(p, kTraceFirst, GlobalTimer());
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
    // Next stage of this group; when it is in another piece (or there is none), the sums of piece pc go
    // to its slot, once the reducer is done with the slot's previous piece.
    const int prev_pc = pc;
    in_tile += kBulkGroups;
    while (in_tile >= per_tile) {
      in_tile -= per_tile;
      ++pc;
    }
    if (pc != prev_pc || j + kBulkGroups >= n) {
      const int pslot = prev_pc % kBulkPartSlots;
      while (LdVolatileShared(reduced) < prev_pc - kBulkPartSlots + 1) {
      }
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(parts + pslot * kBulkPartBytes + warp * 512 + lane * 16),
                   "f"(acc[0][0]), "f"(acc[0][1]), "f"(acc[0][2]), "f"(acc[0][3])
                   : "memory");
      __syncwarp();
      if (lane == 0) {
        __threadfence_block();
        atomicAdd(reinterpret_cast<int*>(smem + (arrived - base) + 4 * pslot), 1);
      }
      acc[0][0] = acc[0][1] = acc[0][2] = acc[0][3] = 0.f;
    }
  }
  if (threadIdx.x == 0) Trace<kTrace>(p, kTraceLastStage, GlobalTimer());
}

}  // namespace lab
}  // namespace gemv
}  // namespace ort_mtp
