// The fast MatMulNBits kernel: int4 weights, fp16/bf16 activations, M = 1..16 tokens per pass, on the
// tensor cores with the tokens as the narrow (n = 8 or 16) side of mma.m16n8k16.
//
// Why the tensor cores even at M = 1: decode-consistency. Row i of an M-row call must be bit-identical
// to the M = 1 call on row i, so every M must run the same arithmetic; at M = 16 plain fp32 FMAs would
// need ~3.5x the HBM time on the lm_head (1.27 G weights x 16 rows = 20 G FMA at ~34 T FMA/s, against
// 715 MB at ~4.2 TB/s), the mma path does not. An mma output element depends only on its own row of A
// and column of B, so which column a token occupies (or what the other columns hold) does not change
// its result.
//
// Work decomposition (v2, chosen on the host from the weights' shape and the device only, never M):
//   * a block owns a contiguous range of `rows_per_block` weight rows (output features), balanced so
//     that all blocks of a layer-sized matrix fit in ONE wave at two blocks per multiprocessor, and one
//     K-slice of it (`splits` slices per row range = the blocks of a thread-block cluster). The block
//     has W = ceil(rows_per_block / 16) warps (blockDim.x = 32 W, W <= 8); warp w owns rows
//     16w .. 16w+15 of the range; rows past the range are zero-filled and never stored.
//   * a cp.async pipeline of `stages` stages (runtime: as many as fill the block's half of the
//     multiprocessor's shared memory, so more weight bytes are in flight); a stage is one chunk of kKC
//     k-values: the 16 W rows' packed weights (kKC/2 bytes each, 16-byte units XOR-swizzled so ldmatrix
//     is conflict-free), the tokens' activations (kTokens x kKC, 16-byte units swizzled by token
//     parity) and the rows' scales for that chunk. Weights, scales and zero points do not depend on
//     the previous kernel, so the first stages of them are requested before griddepcontrol.wait
//     (programmatic dependent launch: the loads overlap the previous kernel's tail).
//   * ldmatrix.x4 over four 16-byte units of 8 rows hands lane (g, t) word t of each unit, i.e. 8
//     consecutive k of row g: exactly one quant block per mma k-step across the quad, which lets the
//     block's scale be applied after the mma.
//   * per 32-k unit: two m16n8k16 mma per 8-token tile on (q - z) (exact small integers), fp32
//     accumulators; at the end of each quant block acc += scale * block_sum (fp32 FMA). The k-slot ->
//     k map inside a unit is a fixed permutation (see ActivationFragments) chosen so that the int4
//     conversion needs no byte shuffles on the weight side.
//   * the K-slices of one row range are the blocks of a cluster (1..8); their partial sums meet in
//     distributed shared memory and are added in rank order.
// Every (row, token) result is thus a fixed sequence of operations that depends on the weights' shape
// and the device only: the chunk size and the K-split are chosen without looking at M, and the row
// range, warp count and pipeline depth change which block or warp computes a row, or when, never how.
#pragma once
#include <cooperative_groups.h>

#include "matmul_nbits/gemv_ptx.cuh"

namespace ort_mtp {
namespace gemv {

struct MmaParams {
  const void* a;               // [M, K] of T
  const uint8_t* b;            // [N, K / 2] packed int4
  const void* scales;          // [N, k_blocks] of T
  const uint8_t* zero_points;  // [N, zp_row_bytes] packed int4, or nullptr
  const void* bias;            // [N] of T, or nullptr
  void* y;                     // [M, N] of T
  int M, N, K;
  int k_blocks;
  int zp_row_bytes;
  int kchunks;         // K / kKC
  int splits;          // K-slices per row range (= cluster size)
  int rows_per_block;  // rows of one row range (<= 16 * warps); the last range may be shorter
  int stages;          // pipeline depth, 2 .. kMaxStages
  int pdl;             // 1: launched with programmatic stream serialization (griddepcontrol runs)
  int l2_prefetch;     // 1: weight and scale copies carry the .L2::256B prefetch-size hint
};

constexpr int kMmaMaxWarps = 8;   // 256 threads: with the 128-register cap, two blocks per SM
constexpr int kMmaMaxStages = 12;

template <int kBS, int kKC, int kNT>
struct MmaConfig {
  static_assert(kBS == 32 || kBS == 64 || kBS == 128 || kBS == 256, "block size");
  static_assert(kKC % 128 == 0 && kKC >= 2 * kBS, "a chunk holds whole 64-byte groups and >= 2 blocks");
  static constexpr int kMaxThreads = 32 * kMmaMaxWarps;
  static constexpr int kTokens = 8 * kNT;       // activation rows per pass
  static constexpr int kRowBytes = kKC / 2;     // packed weight bytes per row per stage
  static constexpr int kUnits = kKC / 32;       // 16-byte (32-k) units per row per stage
  static constexpr int kSpc = kKC / kBS;        // quant blocks per row per stage
  static constexpr int kScaleBytes = 2 * kSpc;  // 4, 8 or 16: one cp.async per row
  static constexpr int kAUnits = kKC / 8;       // 16-byte units per token row of activations
  static constexpr int kABytes = kTokens * kKC * 2;

  // Stage layout for a block of `warps` warps (16 * warps weight rows):
  //   [weights 16W x kRowBytes][activations kTokens x kKC x 2][scales 16W x kScaleBytes]
  __host__ __device__ static constexpr int WBytes(int warps) { return 16 * warps * kRowBytes; }
  __host__ __device__ static constexpr int SBytes(int warps) { return 16 * warps * kScaleBytes; }
  __host__ __device__ static constexpr int StageBytes(int warps) { return WBytes(warps) + kABytes + SBytes(warps); }
  // The epilogue's [token][row] float buffer (+4 floats per token row against bank conflicts); it
  // reuses the pipeline's shared memory, so the host checks it fits in `stages` stages.
  __host__ __device__ static constexpr int RedStride(int warps) { return 16 * warps + 4; }
  __host__ __device__ static constexpr int RedBytes(int warps) { return kTokens * RedStride(warps) * 4; }
  static_assert(kABytes % 16 == 0, "stage alignment");

  // XOR swizzle of the 16-byte units of weight row r so that the 8 rows one ldmatrix matrix reads
  // fall in 8 different bank groups: rows are 64 bytes apart at kKC = 128 (two rows per 128-byte
  // bank line), 128+ bytes apart otherwise.
  __device__ __forceinline__ static int Swizzle(int r) { return kKC == 128 ? ((r >> 1) & 3) : (r & 7); }
};

// The low (half == 0) or high 16 bits of a word as a float (a scale staged in shared memory).
template <typename T>
__device__ __forceinline__ float HalfOfWord(uint32_t word, int half) {
  return BitsToFloat<T>(static_cast<uint16_t>(half ? (word >> 16) : (word & 0xFFFFu)));
}

// The activations of one token and one 32-k unit as mma B fragments. Lane (g, t) loads x0..x7 =
// a[token][unit*32 + 8t .. +8); the weight side's k-slots are (n0,n4),(n1,n5) for step 0 and
// (n2,n6),(n3,n7) for step 1 (see Int4Dequant), so the activations are paired the same way.
__device__ __forceinline__ void ActivationFragments(uint32_t addr, uint32_t (&b)[4]) {
  const uint4 v = LdShared128(addr);  // v.x = (x0,x1), v.y = (x2,x3), v.z = (x4,x5), v.w = (x6,x7)
  b[0] = Prmt(v.x, v.z, 0x5410);      // (x0, x4)
  b[1] = Prmt(v.x, v.z, 0x7632);      // (x1, x5)
  b[2] = Prmt(v.y, v.w, 0x5410);      // (x2, x6)
  b[3] = Prmt(v.y, v.w, 0x7632);      // (x3, x7)
}

// Up to 256 threads and two blocks per SM: the register cap this implies (128 per thread) holds
// without spills, and two ~110 KB pipelines fill the SM's shared memory, so one block's barrier or
// epilogue overlaps the other's streaming.
template <typename T, int kBS, int kKC, bool kZp, int kNT>
__global__ void __launch_bounds__(MmaConfig<kBS, kKC, kNT>::kMaxThreads, 2)
    GemvMmaKernel(const __grid_constant__ MmaParams p) {
  using Cfg = MmaConfig<kBS, kKC, kNT>;
  using Dq = Int4Dequant<T>;
  extern __shared__ __align__(128) uint8_t smem[];

  const int tid = threadIdx.x;
  const int threads = blockDim.x;
  const int warps = threads >> 5;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;  // mma group: weight row within an 8-row half, token within an 8-token tile
  const int t = lane & 3;   // thread in group

  const uint32_t w_bytes = Cfg::WBytes(warps);
  const uint32_t scale_base = w_bytes + Cfg::kABytes;
  const uint32_t stage_bytes = Cfg::StageBytes(warps);
  const int stages = p.stages;

  const int split = static_cast<int>(blockIdx.x) % p.splits;  // = rank in the cluster
  const int row0 = (static_cast<int>(blockIdx.x) / p.splits) * p.rows_per_block;
  const int row_end = min(p.N, row0 + p.rows_per_block);
  const int tok0 = static_cast<int>(blockIdx.y) * Cfg::kTokens;
  const int m_valid = min(Cfg::kTokens, p.M - tok0);  // tokens of this pass; the rest of the tile is zero
  // Chunks of this K-slice: an even split, each slice non-empty (host guarantees kchunks >= splits).
  const int c_begin = static_cast<int>((static_cast<int64_t>(split) * p.kchunks) / p.splits);
  const int c_end = static_cast<int>((static_cast<int64_t>(split + 1) * p.kchunks) / p.splits);
  const int nchunks = c_end - c_begin;
  const int64_t row_bytes = p.K / 2;
  const uint32_t smem_base = SmemAddr(smem);

  // ---- copy assignments, fixed for the whole K loop; the weight source advances one chunk per issue ----
  // Weights: two threads per row (32 W threads, 16 W rows), thread parity w_par copies units w_par,
  // w_par + 2, ...: each copy instruction then covers whole 32-byte sectors of 16 rows.
  constexpr int kUnitsPerThread = Cfg::kUnits / 2;
  const int w_par = tid & 1;
  const int w_row = tid >> 1;
  uint32_t w_dst[kUnitsPerThread];
#pragma unroll
  for (int j = 0; j < kUnitsPerThread; ++j)
    w_dst[j] = w_row * Cfg::kRowBytes + 16 * ((w_par + 2 * j) ^ Cfg::Swizzle(w_row));
  const bool w_valid = row0 + w_row < row_end;
  const uint8_t* w_src = p.b + static_cast<int64_t>(w_valid ? row0 + w_row : 0) * row_bytes +
                         static_cast<int64_t>(c_begin) * Cfg::kRowBytes + 16 * w_par;
  // Scales: one copy of kScaleBytes per row and chunk, by threads 0 .. 16W-1.
  const bool s_copies = tid < 16 * warps;
  const bool s_valid = s_copies && row0 + tid < row_end;
  const uint8_t* s_src = static_cast<const uint8_t*>(p.scales) +
                         2 * (static_cast<int64_t>(s_valid ? row0 + tid : 0) * p.k_blocks +
                              static_cast<int64_t>(c_begin) * Cfg::kSpc);
  const uint32_t s_dst = scale_base + tid * Cfg::kScaleBytes;

  // Next chunk's weights and scales into pipeline buffer `buf`. Rows past the range zero-fill
  // (src-size 0, from a valid address).
  const bool l2_prefetch = p.l2_prefetch != 0;  // uniform: each copy below is a predicated pair
  auto issue_weights = [&](int buf) {
    const uint32_t base = smem_base + buf * stage_bytes;
#pragma unroll
    for (int j = 0; j < kUnitsPerThread; ++j) {
      if (l2_prefetch) {
        CpAsync16L2Prefetch256(base + w_dst[j], w_src + 32 * j, w_valid);
      } else {
        CpAsync16(base + w_dst[j], w_src + 32 * j, w_valid);
      }
    }
    w_src += Cfg::kRowBytes;
    if (s_copies) {
      if (l2_prefetch) {
        CpAsyncSmall<Cfg::kScaleBytes, true>(base + s_dst, s_src, s_valid);
      } else {
        CpAsyncSmall<Cfg::kScaleBytes>(base + s_dst, s_src, s_valid);
      }
    }
    s_src += Cfg::kScaleBytes;
  };
  // Chunk `chunk`'s activations of the pass's m_valid tokens into buffer `buf`: consecutive threads
  // copy consecutive 16-byte units of one token row. Padding tokens (m_valid .. kTokens-1) are never
  // copied: their rows of every stage are zeroed once before the loop and nothing else writes them.
  const uint8_t* a_tok0 = static_cast<const uint8_t*>(p.a) + 2 * static_cast<int64_t>(tok0) * p.K;
  const uint32_t a_row_bytes = 2u * static_cast<uint32_t>(p.K);  // K <= 2^30
  const uint32_t a_copies = static_cast<uint32_t>(m_valid) * Cfg::kAUnits;
  auto issue_activations = [&](int buf, int chunk) {
    const uint32_t base = smem_base + buf * stage_bytes + w_bytes;
    const uint8_t* src_chunk = a_tok0 + 2 * static_cast<int64_t>(chunk) * kKC;
    for (uint32_t idx = tid; idx < a_copies; idx += threads) {
      const uint32_t tok = idx / Cfg::kAUnits;  // unsigned by a power of two: a shift
      const uint32_t unit = idx % Cfg::kAUnits;
      CpAsync16(base + tok * (kKC * 2) + 16 * (unit ^ ((tok & 1) << 2)),
                src_chunk + static_cast<uint64_t>(tok) * a_row_bytes + 16 * unit, true);
    }
  };

  // Packed zero points of chunk `i` for this lane's rows (g and g + 8): kSpc nibbles per row in one
  // word. Read straight from global one chunk ahead of use (rows need not be aligned).
  const int warp_row = warp * 16;
  const bool warp_active = row0 + warp_row < row_end;  // warp-uniform: a warp past the range only copies
  auto load_zero_points = [&](int i, uint32_t (&z)[2]) {
    const int64_t chunk = c_begin + i;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int n = row0 + warp_row + hf * 8 + g;
      uint32_t packed = 0;
      if (n < row_end) {
        const uint8_t* src = p.zero_points + static_cast<int64_t>(n) * p.zp_row_bytes + chunk * (Cfg::kSpc / 2);
#pragma unroll
        for (int byte = 0; byte < Cfg::kSpc / 2; ++byte) packed |= static_cast<uint32_t>(__ldg(src + byte)) << (8 * byte);
      }
      z[hf] = packed;
    }
  };

  // ---- per-lane shared-memory read offsets (relative to a stage buffer) ----
  // ldmatrix: lane gives row (lane & 7) of matrix (lane >> 3) = unit 4q + (lane >> 3); the row's
  // swizzle depends on lane & 7 only (warp_row is a multiple of 16), and 4q only meets bit 2 of it.
  const int ld_row = warp_row + (lane & 7);
  const int ld_swz = Cfg::Swizzle(ld_row);
  uint32_t ld_off[Cfg::kUnits / 4];
#pragma unroll
  for (int q = 0; q < Cfg::kUnits / 4; ++q) {
    ld_off[q] = ld_row * Cfg::kRowBytes + 16 * ((4 * q + (lane >> 3)) ^ ld_swz);
    KeepInRegister(ld_off[q]);
  }
  // Activation fragments: token g (+ 8 nt), 16-byte slot 4 * unit + t, swizzled by token parity: the
  // slot is 4 * (unit ^ (g & 1)) + t, i.e. +-64 bytes around 64 * unit.
  uint32_t b_off_even = w_bytes + g * (kKC * 2) + 16 * t + 64 * (g & 1);
  uint32_t b_off_odd = w_bytes + g * (kKC * 2) + 16 * t - 64 * (g & 1);
  uint32_t s_off = scale_base + (warp_row + g) * Cfg::kScaleBytes;
  KeepInRegister(b_off_even);
  KeepInRegister(b_off_odd);
  KeepInRegister(s_off);

  float acc[kNT][4];
  float part[kNT][4];
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[nt][i] = part[nt][i] = 0.f;

  uint32_t z_cur[2] = {};
  uint32_t z_next[2] = {};

  // Prologue: weights first (independent of the previous kernel), then wait for it, then activations.
  // Group accounting: each stage's last group is followed by exactly stages-2 newer groups when that
  // stage is waited for, so cp.async.wait_group(stages-2) is the right wait at every iteration.
  for (int s = 0; s < stages - 1; ++s) {
    if (s < nchunks) issue_weights(s);
    CpAsyncCommit();
  }
  if (kZp) load_zero_points(0, z_cur);
  if (p.pdl) {  // only in a launch that opted in (uniform branch): the plain launch runs no griddepcontrol
    GridDependencyWait();
    GridDependencyTrigger();
  }
  // Zero the padding tokens' rows of every stage once (ordinary stores, made visible by the first
  // iteration's barrier; the copies never touch these bytes).
  {
    const int pad_units = (Cfg::kTokens - m_valid) * (kKC * 2 / 16);
    const uint32_t pad_base = smem_base + w_bytes + m_valid * (kKC * 2);
    for (int s = 0; s < stages; ++s)
      for (int idx = tid; idx < pad_units; idx += threads) StShared128Zero(pad_base + s * stage_bytes + 16 * idx);
  }
  for (int s = 0; s < stages - 1; ++s) {
    if (s < nchunks) issue_activations(s, c_begin + s);
    CpAsyncCommit();
  }

  int read_buf = 0;
  int write_buf = stages - 1;
  for (int it = 0; it < nchunks; ++it) {
    if (kZp && it + 1 < nchunks) load_zero_points(it + 1, z_next);
    CpAsyncWaitPending(stages - 2);
    __syncthreads();  // stage `it` visible to all; everyone is done with the buffer refilled below
    if (it + stages - 1 < nchunks) {
      issue_weights(write_buf);
      issue_activations(write_buf, c_begin + it + stages - 1);
    }
    CpAsyncCommit();
    write_buf = write_buf == stages - 1 ? 0 : write_buf + 1;

    const uint32_t stage = smem_base + read_buf * stage_bytes;
    read_buf = read_buf == stages - 1 ? 0 : read_buf + 1;

    if (warp_active) {
      // This chunk's scales of rows g and g + 8, kSpc halves per row.
      uint32_t sc[2][Cfg::kSpc / 2];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const uint32_t addr = stage + s_off + hf * 8 * Cfg::kScaleBytes;
        if constexpr (Cfg::kSpc == 8) {
          const uint4 v = LdShared128(addr);
          sc[hf][0] = v.x; sc[hf][1] = v.y; sc[hf][2] = v.z; sc[hf][3] = v.w;
        } else if constexpr (Cfg::kSpc == 4) {
          asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(sc[hf][0]), "=r"(sc[hf][1]) : "r"(addr));
        } else {
          asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(sc[hf][0]) : "r"(addr));
        }
      }

#pragma unroll
      for (int q = 0; q < Cfg::kUnits / 4; ++q) {  // 64-byte groups of each row
        // words[hf][j]: word t of unit 4q+j of row (warp_row + 8 hf + g).
        uint32_t words[2][4];
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) LdMatrixX4(words[hf], stage + ld_off[q] + hf * 8 * Cfg::kRowBytes);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int unit = 4 * q + j;
          constexpr int kUnitsPerBlock = kBS / 32;
          const int blk = unit / kUnitsPerBlock;  // quant block within the chunk (compile-time)
          const bool block_end = (unit + 1) % kUnitsPerBlock == 0;

          uint32_t bfrag[kNT][4];
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
            ActivationFragments(stage + ((unit & 1) ? b_off_odd : b_off_even) + 64 * unit + nt * 8 * (kKC * 2),
                                bfrag[nt]);

          uint32_t lo[4], hi[4];  // rows g and g + 8
          typename Dq::Consts c_lo, c_hi;
          if constexpr (kZp) {
            c_lo = Dq::Make((z_cur[0] >> (4 * blk)) & 15u);
            c_hi = Dq::Make((z_cur[1] >> (4 * blk)) & 15u);
          } else {
            c_lo = c_hi = Dq::Make(8u);
          }
          Dq::Run(words[0][j], c_lo, lo);
          Dq::Run(words[1][j], c_hi, hi);
          const uint32_t a0[4] = {lo[0], hi[0], lo[1], hi[1]};  // k-step 0
          const uint32_t a1[4] = {lo[2], hi[2], lo[3], hi[3]};  // k-step 1
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            Mma16816<T>(part[nt], a0, bfrag[nt][0], bfrag[nt][1]);
            Mma16816<T>(part[nt], a1, bfrag[nt][2], bfrag[nt][3]);
          }
          if (block_end) {
            const float s_lo = HalfOfWord<T>(sc[0][blk >> 1], blk & 1);
            const float s_hi = HalfOfWord<T>(sc[1][blk >> 1], blk & 1);
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              acc[nt][0] = fmaf(s_lo, part[nt][0], acc[nt][0]);
              acc[nt][1] = fmaf(s_lo, part[nt][1], acc[nt][1]);
              acc[nt][2] = fmaf(s_hi, part[nt][2], acc[nt][2]);
              acc[nt][3] = fmaf(s_hi, part[nt][3], acc[nt][3]);
#pragma unroll
              for (int i = 0; i < 4; ++i) part[nt][i] = 0.f;
            }
          }
        }
      }
    }
    if constexpr (kZp) {
      z_cur[0] = z_next[0];
      z_cur[1] = z_next[1];
    }
  }

  // Epilogue: partial sums to shared memory as [token][row], then each cluster rank adds up its share
  // of the range's rows over all ranks, in rank order, plus bias.
  CpAsyncWait<0>();
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
  const int red_stride = Cfg::RedStride(warps);
#pragma unroll
  for (int nt = 0; nt < kNT; ++nt) {
    const int r = warp_row + g;
    const int tok = nt * 8 + 2 * t;
    red[tok * red_stride + r] = acc[nt][0];
    red[(tok + 1) * red_stride + r] = acc[nt][1];
    red[tok * red_stride + r + 8] = acc[nt][2];
    red[(tok + 1) * red_stride + r + 8] = acc[nt][3];
  }

  const int rows_valid = row_end - row0;  // > 0: the host launches no empty range
  const T* bias = static_cast<const T*>(p.bias);
  T* y = static_cast<T*>(p.y);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.splits > 1) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int r_begin = split * rows_valid / p.splits;
    const int r_count = (split + 1) * rows_valid / p.splits - r_begin;
    cluster.sync();  // every rank's partial sums are written
    for (int idx = tid; idx < r_count * m_valid; idx += threads) {
      const int tok = idx / r_count;
      const int r = r_begin + idx % r_count;
      const int n = row0 + r;
      const int off = tok * red_stride + r;
      float sum = *cluster.map_shared_rank(red + off, 0);
      for (int c = 1; c < p.splits; ++c) sum += *cluster.map_shared_rank(red + off, c);
      if (bias) sum += ToFloat<T>(bias[n]);
      y[static_cast<int64_t>(tok0 + tok) * p.N + n] = FromFloat<T>(sum);
    }
    cluster.sync();  // no rank leaves (freeing its shared memory) while another still reads it
    return;
  }
#endif
  __syncthreads();
  for (int idx = tid; idx < rows_valid * m_valid; idx += threads) {
    const int tok = idx / rows_valid;
    const int r = idx % rows_valid;
    const int n = row0 + r;
    float sum = red[tok * red_stride + r];
    if (bias) sum += ToFloat<T>(bias[n]);
    y[static_cast<int64_t>(tok0 + tok) * p.N + n] = FromFloat<T>(sum);
  }
}

}  // namespace gemv
}  // namespace ort_mtp
