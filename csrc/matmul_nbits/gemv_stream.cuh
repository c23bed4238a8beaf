// The fast MatMulNBits kernel ("stream", MatMulNBits' own row-major layout): int4 weights, fp16/bf16
// activations, M = 1..16 tokens per pass, on the tensor cores with the tokens as the narrow (n = 8 or
// 16) side of mma.m16n8k16. The design decisions and their measurements: docs/kernels.md.
//
// Why the tensor cores even at M = 1: decode-consistency. Row i of an M-row call must be bit-identical
// to the M = 1 call on row i, so every M runs the same arithmetic, and at M = 16 CUDA-core FMAs would
// need ~3.5x the HBM time. An mma output element depends only on its own row of A and column of B, so
// which column a token occupies (or what the other columns hold) does not change its result
// (docs/kernels.md#decode-consistency).
//
// Why every warp is its own pipeline: one pipeline per block with a barrier per chunk held 10-12 warps
// per SM that waited on each other and ran at 38% of the copy ceiling whatever its pipeline depth
// (docs/kernels.md#warp-pipelines). Here:
//   * a warp owns one m-tile of 16 weight rows and one K-part (a contiguous run of chunks of kKC
//     k-values). Its private ring of kStreamStages stages in shared memory is filled by cp.async (16
//     rows x kKC/2 bytes of weights, and the rows' scales) and read by ldmatrix; the only
//     synchronisation in the main loop is cp.async.wait_group + __syncwarp.
//   * a block is `tiles` m-tiles x `kparts` K-parts (warp w: tile w / kparts, K-part w % kparts) over
//     rows_per_block rows (rows past it are zero-filled, never read or stored); in a two-shape cut the
//     first alt_blocks blocks have other such numbers and the same warp count (StreamCut). The
//     K-parts' sums meet in shared memory at the end and are added in K-part order. The host
//     (PlanStream) cuts the problem from N, K and the device only, never M.
//   * activations come straight from global memory (L1/L2; every warp on the same K range shares
//     them), 16 bytes per lane per 32-k unit, all of a chunk loaded at its top so their latency
//     overlaps the wait and the first unit's work. Columns past M read the last token's row: an mma
//     column does not change the others, and those results are never stored.
//   * ldmatrix.x4 over the 16-byte units of 8 rows hands lane (g, t) word t of each unit, i.e. 8
//     consecutive k of row g: exactly one quant block per mma k-step across the quad, so the block's
//     scale is applied after the mma in fp32 (acc = fma(scale, block_sum, acc)).
// Arithmetic of one (row, token) result, fixed for every M: per quant block, mma k-steps in ascending
// k on exact (q - z) values starting from zero; acc = fma(scale, block_sum, acc) in ascending block
// order within the K-part; K-parts added in order; + bias; one rounding.
//
// Measured through ORT on an H200 (bench/gemv.py): the chain of 4 x (5120->17408, 17408->5120) at
// M = 1 at 74% of the copy ceiling (twice the speed of the block-wide pipeline), M = 8 at ~1.17x the
// M = 1 time, the 248320 x 5120 lm_head at M = 1 at 92%. gemv_tiles.cuh is this kernel on regrouped
// weights.
#pragma once
#include <algorithm>

#include "matmul_nbits/gemv_ptx.cuh"

namespace ort_mtp {
namespace gemv {

struct StreamParams : GemvOperands {  // zero_points: packed int4 (read only by the kZp kernels)
  int kchunks;         // K / kKC
  int kparts;          // warps along K per m-tile (K-parts)
  int rows_per_block;  // weight rows of one block (<= tiles * 16; the rest are zero-filled)
  // The first alt_blocks blocks have the other shape of a two-shape cut (StreamCut): alt_kparts
  // K-parts over alt_rows rows, with the same number of warps.
  int alt_blocks;
  int alt_kparts;
  int alt_rows;
  int pdl;             // 1: launched with programmatic stream serialization (griddepcontrol runs)
};

constexpr int kStreamMaxWarps = 16;  // 512 threads: the compiler may use up to 128 registers
// 2 chunks in flight per warp. Slower: 4 stages (+5% on the chain at M = 1, +19% at M = 8: the rings
// take the L1 the activations are cached in); the stage refilled before the wait for the next chunk
// instead of after it, 3 chunks in flight while a warp waits (+4%). docs/kernels.md#warp-pipelines.
constexpr int kStreamStages = 3;

// kActRing: the stage also holds the chunk's activations of a single token (the M = 1 kernels,
// RingActivations below).
template <int kBS, int kKC, int kNT, bool kActRing = false>
struct StreamConfig {
  static_assert(kBS == 32 || kBS == 64 || kBS == 128 || kBS == 256, "block size");
  static_assert(kKC % 128 == 0 && kKC % kBS == 0, "a chunk holds whole quant blocks");
  static_assert(kKC / kBS == 2 || kKC / kBS == 4 || kKC / kBS == 8, "a row's scales per stage: one 4-16 byte copy");
  static constexpr int kRows = 16;                   // weight rows per warp (one m-tile)
  static constexpr int kTokens = 8 * kNT;            // tokens per pass
  static constexpr int kRowBytes = kKC / 2;          // weight bytes per row per stage
  static constexpr int kUnits = kKC / 32;            // 16-byte (32-k) units per row per stage
  static constexpr int kSpc = kKC / kBS;             // quant blocks per row per stage
  static constexpr int kScaleBytes = 2 * kSpc;       // per row per stage: 4, 8 or 16
  static constexpr int kWBytes = kRows * kRowBytes;
  static constexpr int kABytes = kActRing ? kKC * 2 : 0;  // one token's activations of the chunk
  static constexpr int kStageBytes = kWBytes + kRows * kScaleBytes + kABytes;
  static constexpr int kWarpBytes = kStreamStages * kStageBytes;  // one warp's ring
  static constexpr int kPieces = kRows * kUnits;     // 16-byte weight copies per stage
  static_assert(kPieces % 32 == 0, "whole copies per lane");
  static constexpr int kRedBytes = kRows * kTokens * 4;  // one warp's partial sums in the epilogue
  static_assert(kRedBytes <= kWarpBytes, "the epilogue reuses the ring");
};

// How a problem is cut into blocks (PlanStream and PlanTiles in matmul_nbits_cuda.cu with its
// constants; docs/kernels.md#k-split): K-parts so that the m-tiles x K-parts give ~warps_per_sm warps per
// SM (each K-part at least 2 chunks), m-tiles per block so that a block has >= min_block_warps warps;
// fewer K-parts while the grid would need a second wave, unless N alone needs several (the lm_head).
// resident(warps, blocks) sets how many blocks of that many warps fit on an SM and returns an error
// or nullptr; it must not depend on M (it is the 8-token kernel's), so neither does the K-split.
//
// Two shapes: a one-wave cut with kparts K-parts may leave warp slots idle and the SMs unevenly loaded
// (the 27B gate_up: 544 blocks of 2 m-tiles x 2 K-parts, 4 or 5 per SM). Blocks of W warps in two
// shapes, most with kparts + 1 K-parts and alt_blocks with kparts (more m-tiles each), can fill every
// slot with less per-SM imbalance (gate_up: 496 blocks of 2 x 3 and 32 of 3 x 2, 4 per SM, the most
// loaded SM 9 m-tiles instead of 10: ~15% less time per gate_up launch, ~5% on the chain). The cut
// takes them when their most loaded SM (blocks dealt to SMs in index order) holds fewer m-tiles.
struct StreamCut {
  int tiles = 0;       // m-tiles (16 rows) per block
  int kparts = 1;      // K-parts per m-tile: warps per block = tiles * kparts
  int64_t blocks = 0;  // all blocks, the alt_blocks included
  int alt_tiles = 0;   // the first alt_blocks blocks: alt_tiles m-tiles x alt_kparts K-parts, the
  int alt_kparts = 1;  // same warps per block
  int64_t alt_blocks = 0;
};

// M-tiles on the most loaded SM when blocks are dealt to the SMs in index order.
inline int64_t MostTilesPerSm(const StreamCut& cut, int sms) {
  int64_t most = 0;
  for (int s = 0; s < sms && s < cut.blocks; ++s) {
    const int64_t blocks = (cut.blocks - s + sms - 1) / sms;
    const int64_t alt = cut.alt_blocks > s ? (cut.alt_blocks - s + sms - 1) / sms : 0;
    most = std::max(most, alt * cut.alt_tiles + (blocks - alt) * cut.tiles);
  }
  return most;
}

template <typename Resident>
const char* CutStream(int64_t n_tiles, int64_t kchunks, int sms, int warps_per_sm, int min_block_warps,
                      Resident&& resident, StreamCut& cut) {
  const int64_t most = std::max<int64_t>(1, std::min<int64_t>(kStreamMaxWarps, kchunks / 2));
  int kp = static_cast<int>(std::clamp<int64_t>(static_cast<int64_t>(sms) * warps_per_sm / n_tiles, 1, most));
  bool one_wave = false;
  for (;; --kp) {
    cut = StreamCut{};
    cut.tiles = std::min(std::max(1, min_block_warps / kp), std::max(1, kStreamMaxWarps / kp));
    cut.kparts = kp;
    cut.blocks = (n_tiles + cut.tiles - 1) / cut.tiles;
    int per_sm = 0;
    if (const char* error = resident(cut.tiles * kp, per_sm)) return error;
    one_wave = cut.blocks <= static_cast<int64_t>(sms) * per_sm;
    if (one_wave || kp == 1 || n_tiles >= 4LL * sms * kStreamMaxWarps) break;
  }
  if (!one_wave || kp + 1 > most) return nullptr;
  const int ka = kp + 1, kb = kp;  // K-parts of the two shapes: W must be a multiple of both
  const int step = ka * kb;        // lcm of consecutive integers
  int64_t best = MostTilesPerSm(cut, sms);
  for (int w = step; w <= kStreamMaxWarps; w += step) {
    if (w < min_block_warps) continue;
    int per_sm = 0;
    if (const char* error = resident(w, per_sm)) return error;
    const int64_t slots = static_cast<int64_t>(sms) * per_sm;
    const int ta = w / ka, tb = w / kb;
    // Fewest alt blocks for all m-tiles in one wave, then as few main blocks as cover the rest.
    const int64_t alt = std::max<int64_t>(0, (n_tiles - ta * slots + (tb - ta) - 1) / (tb - ta));
    const int64_t main = std::max<int64_t>(0, (n_tiles - tb * alt + ta - 1) / ta);
    if (alt == 0 || main + alt > slots) continue;
    StreamCut two{ta, ka, main + alt, tb, kb, alt};
    const int64_t load = MostTilesPerSm(two, sms);
    if (load < best) {
      best = load;
      cut = two;
    }
  }
  return nullptr;
}

// XOR swizzle of the 16-byte units of a row in a stage, so that the 8 rows an ldmatrix matrix reads
// (same unit, consecutive rows) fall in 8 different 16-byte bank groups.
template <int kUnits>
__device__ __forceinline__ int SwizzleUnit(int row, int unit) {
  if constexpr (kUnits == 4) {
    return unit ^ ((row >> 1) & 3);  // 64-byte rows: two rows per 128-byte bank line
  } else {
    return unit ^ (row & 7);  // 128-byte (or longer) rows
  }
}

// Activation fragments of one 32-k unit for the k-slot map of the weights: lane quad t holds k
// 8t..8t+7 of the unit, and Int4Dequant hands out the weight pairs (0,4), (1,5), (2,6), (3,7).
__device__ __forceinline__ void ActivationFragments(uint4 x, uint32_t (&b)[4]) {
  b[0] = Prmt(x.x, x.z, 0x5410);  // (x0, x4)
  b[1] = Prmt(x.x, x.z, 0x7632);  // (x1, x5)
  b[2] = Prmt(x.y, x.w, 0x5410);  // (x2, x6)
  b[3] = Prmt(x.y, x.w, 0x7632);  // (x3, x7)
}

// A warp's share of a stream or tiles kernel launch (the block's shape from a two-shape cut, its
// m-tile and K-part, the block's rows and the pass's tokens), the same for both kernels.
struct WarpTask {
  int kparts;      // K-parts of this block's m-tiles
  int tile_row0;   // first row of the warp's m-tile, block-local
  int block_row0;  // first weight row of the block
  int block_rows;  // rows the block owns (fewer in the last block)
  int tok0;        // first token of the pass
  int m_count;     // tokens of the pass
  int c_begin;     // the warp's run of chunks: kchunks split into kparts runs of near-equal length
  int c_count;

  __device__ __forceinline__ WarpTask(const StreamParams& p, int warp, int tokens) {
    const int bx = static_cast<int>(blockIdx.x);
    const bool alt = bx < p.alt_blocks;  // the other shape of a two-shape cut
    kparts = alt ? p.alt_kparts : p.kparts;
    const int tile = warp / kparts;
    const int kp = warp - tile * kparts;
    tile_row0 = tile * 16;
    block_row0 = alt ? bx * p.alt_rows : p.alt_blocks * p.alt_rows + (bx - p.alt_blocks) * p.rows_per_block;
    block_rows = min(alt ? p.alt_rows : p.rows_per_block, p.N - block_row0);
    tok0 = static_cast<int>(blockIdx.y) * tokens;
    m_count = min(tokens, p.M - tok0);
    const int base = p.kchunks / kparts, extra = p.kchunks % kparts;
    c_begin = kp * base + min(kp, extra);
    c_count = base + (kp < extra ? 1 : 0);
  }
};

// acc += scale * the quant block's sums d, in fp32: rows g (s0) and g + 8 (s1) of the lane's mma fragments.
template <int kNT>
__device__ __forceinline__ void AddScaledBlock(float (&acc)[kNT][4], const float (&d)[kNT][4], float s0, float s1) {
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    acc[nt][0] = fmaf(s0, d[nt][0], acc[nt][0]);
    acc[nt][1] = fmaf(s0, d[nt][1], acc[nt][1]);
    acc[nt][2] = fmaf(s1, d[nt][2], acc[nt][2]);
    acc[nt][3] = fmaf(s1, d[nt][3], acc[nt][3]);
  }
}

// The stage after `stage` in a warp's ring of kStreamStages stages (kStageBytes each, from `ring` to
// `last_stage`), wrapping to the first: both kernels' copy and read positions walk the ring this way.
template <int kStageBytes>
__device__ __forceinline__ uint32_t NextStage(uint32_t stage, uint32_t ring, uint32_t last_stage) {
  return stage == last_stage ? ring : stage + kStageBytes;
}

// The prologue of both kernels once their first stages are in flight. Weights and scales (and zero
// points) are session constants, the activations are the previous kernel's output: with programmatic
// dependent launch, let the next kernel start its own prologue and wait for the previous one to
// finish. Then lane (g, t)'s activation rows: token tok0 + 8 nt + g from k 8t (the last token's row
// for columns past M: an mma column does not change the others, and those results are never stored).
template <typename T, int kNT>
__device__ __forceinline__ void WaitForActivations(const StreamParams& p, const WarpTask& w, const T* (&arow)[kNT]) {
  if (p.pdl) {
    GridDependencyTrigger();
    GridDependencyWait();
  }
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
    arow[nt] = static_cast<const T*>(p.a) + static_cast<int64_t>(w.tok0 + min(8 * nt + g, w.m_count - 1)) * p.K + 8 * t;
}

// The M = 1 kernels (kActRing) take their activations through the ring, beside the chunk's weights,
// instead of loading them from global memory at the top of each chunk. There each chunk's first mma
// waited on activations from L2 issued a few instructions earlier (Nsight Compute: ~43% of the stall
// samples at M = 1), and no register was left to load them a chunk ahead. In the ring they arrive
// with the weights, kStreamStages - 1 chunks ahead, and are read per unit from shared memory: ~12% off
// the tiles kernel's chain at M = 1, ~4% off this kernel's (docs/kernels.md#m1-ring). One token's
// kKC * 2 bytes per stage fit beside the rings of the plan's 24 warps per SM (eight tokens' would
// not). The arithmetic is the 8-token kernel's (the same mma on the same values in the same order),
// so rows stay bit-identical across M.
template <typename T, int kKC>
struct RingActivations {
  static constexpr int kBytes = kKC * 2;
  static constexpr int kCopies = kBytes / 16;  // 16-byte copies per chunk: 16, 32 or 64
  const T* next;                               // this lane's part of the next chunk's activations

  __device__ __forceinline__ RingActivations(const StreamParams& p, const WarpTask& w)
      : next(static_cast<const T*>(p.a) + static_cast<int64_t>(w.tok0) * p.K + static_cast<int64_t>(w.c_begin) * kKC +
             (threadIdx.x & 31) * 8) {}

  // The next chunk's activations into the stage's activation area at dst (no group committed).
  __device__ __forceinline__ void Copy(uint32_t dst) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int q = 0; q < (kCopies + 31) / 32; ++q)
      if (kCopies >= 32 || lane < kCopies) CpAsync16(dst + q * 512 + lane * 16, next + q * 256, true);
    next += kKC;
  }

  // After StartRun (the first stages' weights in flight, the previous kernel done): the first stages'
  // activations, one group each after the weights' groups, so that the wait of iteration i (all but
  // the newest kStreamStages - 2 groups) covers chunk i's activations too.
  __device__ __forceinline__ void First(uint32_t ring, int stage_bytes, int act_offset, int c_count) {
#pragma unroll
    for (int s = 0; s < kStreamStages - 1; ++s) {
      if (s < c_count) Copy(ring + s * stage_bytes + act_offset);
      CpAsyncCommit();
    }
  }

  // Unit u (32 k) of a stage's activations as lane (g, t) holds it: k 8t..8t+7 (every g: one token).
  __device__ __forceinline__ static uint4 Unit(uint32_t stage_act, int u) {
    return LdShared128(stage_act + u * 64 + (threadIdx.x & 3) * 16);
  }
};

// Both kernels' start: issue(i, with_act) copies chunk i of the warp's run into the ring (and its
// activations, with kActRing and with_act). The first kStreamStages - 1 chunks are issued without
// activations, then WaitForActivations (the weights load while the previous kernel finishes), then,
// with kActRing, those chunks' activations (RingActivations::First; c_count: chunks of the warp's run).
// Two chunks before the wait are the best of 0-3 (with 0, 1 or 3 the chain at M = 1 takes 18%, 6% or
// 5% longer): fewer leave the memory idle at the kernel boundary, more delay the activations queued
// behind them (docs/kernels.md#launch-and-pdl).
template <typename T, int kNT, bool kActRing, int kKC, typename Issue>
__device__ __forceinline__ void StartRun(Issue& issue, const StreamParams& p, const WarpTask& w, const T* (&arow)[kNT],
                                         RingActivations<T, kKC>& ract, uint32_t ring, int stage_bytes,
                                         int act_offset, int c_count) {
#pragma unroll
  for (int i = 0; i < kStreamStages - 1; ++i) issue(i, false);
  WaitForActivations<T, kNT>(p, w, arow);
  if constexpr (kActRing) ract.First(ring, stage_bytes, act_offset, c_count);
}

// The epilogue of both kernels: every warp's (16 rows x tokens) sums meet in shared memory (the rings
// are free once every warp is past its loop), the K-parts of an m-tile are added in K-part order,
// plus bias, one rounding, stored (StoreResult: with p.swiglu, over the gate's outputs). acc is the
// mma accumulator layout: lane (g, t) holds rows g and g + 8, tokens 8 nt + 2t and + 1.
template <typename T, int kNT>
__device__ __forceinline__ void SumKPartsAndStore(const StreamParams& p, const WarpTask& w, const float (&acc)[kNT][4],
                                                  unsigned char* smem) {
  constexpr int kTokens = 8 * kNT, kOut = 16 * kTokens;  // outputs of one m-tile
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
  {
    float* mine = red + warp * kOut;  // [row][token]
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) mine[(g + 8 * (e >> 1)) * kTokens + 8 * nt + 2 * t + (e & 1)] = acc[nt][e];
  }
  __syncthreads();
  const T* bias = static_cast<const T*>(p.bias);
  const int tiles = static_cast<int>(blockDim.x >> 5) / w.kparts;
  for (int o = threadIdx.x; o < tiles * kOut; o += blockDim.x) {
    const int grp = o / kOut, rem = o - grp * kOut;
    const int r = grp * 16 + rem / kTokens, tok = rem % kTokens;
    if (r >= w.block_rows || tok >= w.m_count) continue;
    const float* part = red + grp * w.kparts * kOut + rem;
    float s = part[0];
    for (int q = 1; q < w.kparts; ++q) s += part[q * kOut];
    const int row = w.block_row0 + r;
    if (bias) s += ToFloat<T>(bias[row]);
    StoreResult<T>(p, static_cast<int64_t>(w.tok0 + tok) * p.N + row, s);
  }
}

// The warp's task as the epilogue gets it. The 8-token kernels rebuild it after the main loop instead
// of keeping it live across it: kept live, it gave the 8-token tiles kernel a stack frame (8 bytes, one
// spill before the loop and one reload after it) and that frame alone cost ~6% on the chain. The
// 16-token kernels keep it: rebuilt there, the fp16 and bf16 block-32 tiles kernels got a spill inside
// the loop instead. bench/sass_lint.py lists every kernel that touches local memory
// (bench/device_run.sh fails on it for the fp16 block-32 kernels; docs/kernels.md#multi-token-kernels).
template <int kNT>
__device__ __forceinline__ WarpTask EpilogueTask(const StreamParams& p, const WarpTask& loop_task) {
  if constexpr (kNT == 1) {
    return WarpTask(p, static_cast<int>(threadIdx.x >> 5), 8);
  } else {
    return loop_task;
  }
}

// Register caps of the 8-token kernels, at what each needs without spilling: left alone, the compiler
// keeps the copy addresses' per-pass offsets in registers and the fp16 block-32 kernel takes 84, i.e.
// 20 warps per SM instead of 24 (80 = 25 warps' worth, 81 = 23). Caps below need (72 or 64 for that
// kernel) spilled and ran 5-30% slower. The 16-token kernels may use up to 128
// (docs/kernels.md#multi-token-kernels).
template <int kKC, int kNT, bool kZp>
constexpr int StreamMaxRegs() {
  if (kNT != 1) return 128;
  if (kKC == 128) return kZp ? 72 : 64;
  if (kKC == 256) return kZp ? 104 : 80;
  return 120;
}

// kActRing: the M = 1 kernel, its activations in the ring (RingActivations).
template <typename T, int kBS, int kKC, int kNT, bool kZp, bool kActRing = false>
__global__ void __launch_bounds__(32 * kStreamMaxWarps) __maxnreg__((StreamMaxRegs<kKC, kNT, kZp>())) GemvStreamKernel(const __grid_constant__ StreamParams p) {
  static_assert(!kActRing || kNT == 1, "activations in the ring: one token per pass");
  using Cfg = StreamConfig<kBS, kKC, kNT, kActRing>;
  using Dq = Int4Dequant<T>;
  extern __shared__ __align__(128) unsigned char smem[];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const WarpTask task(p, warp, Cfg::kTokens);
  const int block_row0 = task.block_row0, block_rows = task.block_rows, tile_row0 = task.tile_row0;
  const int c_begin = task.c_begin, c_count = task.c_count;

  const uint32_t ring = SmemAddr(smem) + static_cast<uint32_t>(warp * Cfg::kWarpBytes);
  const int64_t row_bytes = static_cast<int64_t>(p.K) / 2;

  // Copy assignment: pass j copies row r = j * kRowsPerPass + lane / kUnits of the tile, unit lane %
  // kUnits. Rows the block does not own are zero-filled (no read). The copies walk running pointers
  // and a rotating stage address, and the swizzled destinations repeat every kSwizzlePeriod passes,
  // so they are kept in registers: rebuilding every address from the chunk index cost ~30 more
  // instructions per chunk in the main loop (357 against 328) and ~3.5% of the chain's time
  // (docs/kernels.md#warp-pipelines).
  constexpr int kRowsPerPass = 32 / Cfg::kUnits;
  constexpr int kPasses = Cfg::kPieces / 32;
  constexpr int kSwizzlePeriod = Cfg::kUnits >= 8 ? 8 / kRowsPerPass : 1;  // SwizzleUnit: row & 7, or (row >> 1) & 3
  const int cu = lane % Cfg::kUnits, crow = lane / Cfg::kUnits;
  const int64_t pass_bytes = kRowsPerPass * row_bytes;
  const uint8_t* wnext = p.b + static_cast<int64_t>(block_row0 + tile_row0 + crow) * row_bytes + cu * 16 +
                         static_cast<int64_t>(c_begin) * Cfg::kRowBytes;
  uint32_t dst_in_stage[kSwizzlePeriod];
#pragma unroll
  for (int j = 0; j < kSwizzlePeriod; ++j) {
    dst_in_stage[j] = static_cast<uint32_t>(crow * Cfg::kRowBytes + SwizzleUnit<Cfg::kUnits>(j * kRowsPerPass + crow, cu) * 16);
    KeepInRegister(dst_in_stage[j]);
  }
  const int valid_passes = min(kPasses, max(0, (block_rows - tile_row0 - crow + kRowsPerPass - 1) / kRowsPerPass));
  // Scales: lane r < 16 copies row r's scales of the stage (kScaleBytes, one cp.async).
  const bool s_lane = lane < Cfg::kRows;
  const bool s_valid = s_lane && tile_row0 + lane < block_rows;
  const int s_row = block_row0 + (s_valid ? tile_row0 + lane : 0);
  const uint8_t* snext = static_cast<const uint8_t*>(p.scales) + (static_cast<int64_t>(s_row) * p.k_blocks) * 2 +
                         static_cast<int64_t>(c_begin) * Cfg::kSpc * 2;
  const uint32_t sdst = static_cast<uint32_t>(Cfg::kWBytes + (s_lane ? lane : 0) * Cfg::kScaleBytes);
  const uint32_t last_stage = ring + static_cast<uint32_t>((kStreamStages - 1) * Cfg::kStageBytes);
  uint32_t fill = ring;  // the stage the next issue fills
  constexpr int kActOffset = Cfg::kWBytes + Cfg::kRows * Cfg::kScaleBytes;  // the stage's activations (kActRing)
  RingActivations<T, kKC> ract(p, task);

  // Chunk i of this warp's run into the next stage (its activations too with kActRing, once they may
  // be read); always commits a group.
  auto issue = [&](int i, bool with_act) {
    if (i < c_count) {
      const uint8_t* src = wnext;
#pragma unroll
      for (int j = 0; j < kPasses; ++j) {
        const bool valid = j < valid_passes;
        const uint32_t dst = fill + static_cast<uint32_t>(j * kRowsPerPass * Cfg::kRowBytes) + dst_in_stage[j % kSwizzlePeriod];
        CpAsync16(dst, valid ? src : p.b, valid);
        src += pass_bytes;
      }
      if (s_lane) CpAsyncSmall<Cfg::kScaleBytes>(fill + sdst, snext, s_valid);
      if (kActRing && with_act) ract.Copy(fill + kActOffset);
      wnext += Cfg::kRowBytes;
      snext += Cfg::kSpc * 2;
      fill = NextStage<Cfg::kStageBytes>(fill, ring, last_stage);
    }
    CpAsyncCommit();
  };

  const T* arow[kNT];
  StartRun<T, kNT, kActRing>(issue, p, task, arow, ract, ring, Cfg::kStageBytes, kActOffset, c_count);

  // Lane (g, t): ldmatrix row address; mma column g = token tok0 + 8 nt + g (arow); k-slot t.
  const int g = lane >> 2;
  const int lm_row = (lane & 7) + ((lane >> 3) & 1) * 8;  // row within the m-tile this lane addresses
  const int lm_unit = lane >> 4;                          // 0: unit u, 1: unit u + 1
  // Zero points of this lane's rows g and g + 8 (rows the block does not own read its first row).
  const uint8_t* zrow[2] = {nullptr, nullptr};
  if constexpr (kZp) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = tile_row0 + g + 8 * h;
      zrow[h] = static_cast<const uint8_t*>(p.zero_points) + static_cast<int64_t>(block_row0 + (r < block_rows ? r : 0)) * p.zp_row_bytes;
    }
  }

  float acc[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[nt][e] = 0.f;

  uint32_t stage = ring;  // the stage chunk i is read from
  for (int i = 0; i < c_count; ++i) {
    const int chunk = c_begin + i;
    const int64_t k0 = static_cast<int64_t>(chunk) * kKC;
    // The whole chunk's activations at its top: their latency overlaps the wait and the first unit's
    // work. Loaded per unit pair instead they cost ~25% at M = 8 and, although that saves 46 registers
    // at 16 tokens, 10-50% at M = 16 (docs/kernels.md#multi-token-kernels). The M = 1 kernel reads
    // them from the stage per unit pair instead (RingActivations).
    uint4 act[kNT][Cfg::kUnits];
    if constexpr (!kActRing) {
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int u = 0; u < Cfg::kUnits; ++u) act[nt][u] = __ldg(reinterpret_cast<const uint4*>(arow[nt] + k0 + 32 * u));
    }
    uint32_t zbytes[2][Cfg::kSpc / 2];  // packed zero points of the chunk's blocks, rows g and g + 8
    if constexpr (kZp) {
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < Cfg::kSpc / 2; ++j) zbytes[h][j] = __ldg(zrow[h] + chunk * (Cfg::kSpc / 2) + j);
    }

    CpAsyncWait<kStreamStages - 2>();
    __syncwarp();
    issue(i + kStreamStages - 1, true);  // into the stage read in iteration i - 1 (all lanes are past it)

    // This lane's scales (rows g and g + 8), read at the end of each quant block.
    const uint16_t* sc = reinterpret_cast<const uint16_t*>(smem + (stage - SmemAddr(smem)) + Cfg::kWBytes) + g * Cfg::kSpc;

    constexpr int kUnitsPerBlock = kBS / 32;
    typename Dq::Consts dq[2] = {Dq::Make(8u), Dq::Make(8u)};  // rows g, g + 8
    float d[kNT][4];  // the current quant block's sums
#pragma unroll
    for (int u2 = 0; u2 < Cfg::kUnits; u2 += 2) {
      uint32_t w[4];  // [row g unit u2, row g+8 unit u2, row g unit u2+1, row g+8 unit u2+1]
      LdMatrixX4(w, stage + static_cast<uint32_t>(lm_row * Cfg::kRowBytes +
                                                  SwizzleUnit<Cfg::kUnits>(lm_row, u2 + lm_unit) * 16));
      if constexpr (kActRing) {  // the pair's 2 units
#pragma unroll
        for (int uu = 0; uu < 2; ++uu) act[0][u2 + uu] = RingActivations<T, kKC>::Unit(stage + kActOffset, u2 + uu);
      }
#pragma unroll
      for (int uu = 0; uu < 2; ++uu) {
        const int u = u2 + uu;
        const int blk = u / kUnitsPerBlock;
        const bool first = u % kUnitsPerBlock == 0;
        if constexpr (kZp) {
          if (first) {
#pragma unroll
            for (int h = 0; h < 2; ++h) dq[h] = Dq::Make((zbytes[h][blk / 2] >> (4 * (blk & 1))) & 0xFu);
          }
        }
        uint32_t b[kNT][4];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) ActivationFragments(act[nt][u], b[nt]);
        // k-slot map of this unit: lane quad t holds k 8t..8t+7; the weight pairs are (0,4), (1,5),
        // (2,6), (3,7): mma 1 takes pairs 0 (low k-slots) and 1 (high), mma 2 pairs 2 and 3.
        uint32_t qa[4], qb[4];
        Dq::Run(w[2 * uu], dq[0], qa);
        Dq::Run(w[2 * uu + 1], dq[1], qb);
        const uint32_t a1[4] = {qa[0], qb[0], qa[1], qb[1]};
        const uint32_t a2[4] = {qa[2], qb[2], qa[3], qb[3]};
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          if (first) {
            MmaZeroC<T>(d[nt], a1, b[nt][0], b[nt][1]);
          } else {
            Mma16816<T>(d[nt], a1, b[nt][0], b[nt][1]);
          }
          Mma16816<T>(d[nt], a2, b[nt][2], b[nt][3]);
        }
        if ((u + 1) % kUnitsPerBlock == 0) {
          AddScaledBlock<kNT>(acc, d, BitsToFloat<T>(sc[blk]), BitsToFloat<T>(sc[8 * Cfg::kSpc + blk]));
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
