// The fast MatMulNBits kernel: int4 weights, fp16/bf16 activations, M = 1..16 tokens per pass, on the
// tensor cores with the tokens as the narrow (n = 8 or 16) side of mma.m16n8k16.
//
// Why the tensor cores even at M = 1: decode-consistency. Row i of an M-row call must be bit-identical
// to the M = 1 call on row i, so every M must run the same arithmetic; at M = 16 plain fp32 FMAs would
// need ~3.5x the HBM time on the lm_head (1.27 G weights x 16 rows = 20 G FMA at ~34 T FMA/s, against
// 715 MB at ~4.2 TB/s), the mma path does not. An mma output element depends only on its own row of A and column of B, so which column a token
// occupies (or what the other columns hold) does not change its result.
//
// Data flow per block (kRows = 128 weight rows, i.e. output features, x one K-slice):
//   * a cp.async pipeline of kStages stages; a stage is one chunk of kKC k-values: the 128 rows'
//     packed weights (kKC/2 bytes each, 16-byte units XOR-swizzled so ldmatrix is conflict-free),
//     the tokens' activations (kTokens x kKC, 16-byte units swizzled by token parity) and the rows'
//     scales for that chunk. Weights, scales and zero points do not depend on the previous kernel,
//     so the first kStages-1 stages of them are requested before griddepcontrol.wait (programmatic
//     dependent launch: the loads overlap the previous kernel's tail when the launch opts in).
//   * each warp owns 16 * kTM rows. ldmatrix.x4 over four 16-byte units of 8 rows hands lane
//     (g, t) word t of each unit, i.e. 8 consecutive k of row g: exactly one quant block per mma
//     k-step across the quad, which lets the block's scale be applied after the mma.
//   * per 32-k unit: two m16n8k16 mma per (m-tile, 8-token tile) on (q - z) (exact small integers),
//     fp32 accumulators; at the end of each quant block acc += scale * block_sum (fp32 FMA).
//     The k-slot -> k map inside a unit is a fixed permutation (see ActivationFragments) chosen so
//     that the int4 conversion needs no byte shuffles on the weight side.
//   * the K-slices of one row tile are the blocks of a thread-block cluster (1..8 blocks); their
//     partial sums meet in distributed shared memory and are added in rank order.
// Every (row, token) result is thus a fixed sequence of operations that depends on the weights' shape
// and the device only: the chunking, the cluster split and all reduction orders are chosen without
// looking at M, which is what makes rows bit-identical across M.
#pragma once
#include <cooperative_groups.h>

#include "matmul_nbits/gemv_ptx.cuh"

namespace ort_mtp {
namespace gemv {

struct MmaParams {
  const void* a;             // [M, K] of T
  const uint8_t* b;          // [N, K / 2] packed int4
  const void* scales;        // [N, k_blocks] of T
  const uint8_t* zero_points;  // [N, zp_row_bytes] packed int4, or nullptr
  const void* bias;          // [N] of T, or nullptr
  void* y;                   // [M, N] of T
  int M, N, K;
  int k_blocks;
  int zp_row_bytes;
  int kchunks;  // K / kKC
  int splits;   // K-slices per row tile (= cluster size)
  int pdl;      // 1: launched with programmatic stream serialization (griddepcontrol runs)
};

template <int kBS, int kKC, int kNT, int kTM>
struct MmaConfig {
  static_assert(kBS == 32 || kBS == 64 || kBS == 128 || kBS == 256, "block size");
  static_assert(kKC % 128 == 0 && kKC >= 2 * kBS, "a chunk holds whole 64-byte groups and >= 2 blocks");
  static constexpr int kRows = 128;                 // weight rows (output features) per block
  static constexpr int kWarps = kRows / (16 * kTM);
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kTokens = 8 * kNT;           // activation rows per pass
  static constexpr int kRowBytes = kKC / 2;         // packed weight bytes per row per stage
  static constexpr int kUnits = kKC / 32;           // 16-byte (32-k) units per row per stage
  static constexpr int kSpc = kKC / kBS;            // quant blocks per row per stage
  static constexpr int kScaleBytes = 2 * kSpc;      // 4, 8 or 16: one cp.async per row
  // Enough stages that ~32-64 KB of weights per block are in flight (HBM latency x bandwidth share).
  static constexpr int kStages = kKC == 128 ? 6 : (kKC == 256 ? 4 : 3);
  static constexpr int kWBytes = kRows * kRowBytes;
  static constexpr int kABytes = kTokens * kKC * 2;
  static constexpr int kSBytes = kRows * kScaleBytes;
  static constexpr int kStageBytes = kWBytes + kABytes + kSBytes;
  static constexpr int kRedStride = kRows + 4;  // floats per token row of the reduction buffer (+4: banks)
  static constexpr int kSmemBytes = kStages * kStageBytes;
  static_assert(kTokens * kRedStride * 4 <= kSmemBytes, "reduction buffer fits in the pipeline's smem");
  static_assert(kStageBytes % 16 == 0, "stage alignment");

  // XOR swizzle of the 16-byte units of weight row r so that the 8 rows one ldmatrix matrix reads
  // fall in 8 different bank groups: rows are 64 bytes apart at kKC = 128 (two rows per 128-byte
  // bank line), 128+ bytes apart otherwise.
  __device__ __forceinline__ static int Swizzle(int r) { return kKC == 128 ? ((r >> 1) & 3) : (r & 7); }
};

// The activations of one token and one 32-k unit as mma B fragments. Lane (g, t) loads x0..x7 =
// a[token][unit*32 + 8t .. +8); the weight side's k-slots are (n0,n4),(n1,n5) for step 0 and
// (n2,n6),(n3,n7) for step 1 (see Int4Dequant), so the activations are paired the same way.
// The low (half == 0) or high 16 bits of a word as a float (a scale staged in shared memory).
template <typename T>
__device__ __forceinline__ float HalfOfWord(uint32_t word, int half) {
  return BitsToFloat<T>(static_cast<uint16_t>(half ? (word >> 16) : (word & 0xFFFFu)));
}

__device__ __forceinline__ void ActivationFragments(uint32_t addr, uint32_t (&b)[4]) {
  const uint4 v = LdShared128(addr);  // v.x = (x0,x1), v.y = (x2,x3), v.z = (x4,x5), v.w = (x6,x7)
  b[0] = Prmt(v.x, v.z, 0x5410);      // (x0, x4)
  b[1] = Prmt(v.x, v.z, 0x7632);      // (x1, x5)
  b[2] = Prmt(v.y, v.w, 0x5410);      // (x2, x6)
  b[3] = Prmt(v.y, v.w, 0x7632);      // (x3, x7)
}

// Two blocks per SM (the register cap this implies, 128 per thread at 256 threads, holds without
// spills; two ~106 KB pipelines fit in shared memory), so one block's barrier or epilogue overlaps the
// other's streaming.
template <typename T, int kBS, int kKC, bool kZp, int kNT, int kTM>
__global__ void __launch_bounds__(MmaConfig<kBS, kKC, kNT, kTM>::kThreads, 2)
    GemvMmaKernel(const __grid_constant__ MmaParams p) {
  using Cfg = MmaConfig<kBS, kKC, kNT, kTM>;
  using Dq = Int4Dequant<T>;
  extern __shared__ __align__(128) uint8_t smem[];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;  // mma group: weight row within an 8-row half, token within an 8-token tile
  const int t = lane & 3;   // thread in group

  const int split = static_cast<int>(blockIdx.x) % p.splits;  // = rank in the cluster
  const int row0 = (static_cast<int>(blockIdx.x) / p.splits) * Cfg::kRows;
  const int tok0 = static_cast<int>(blockIdx.y) * Cfg::kTokens;
  // Chunks of this K-slice: an even split, each slice non-empty (host guarantees kchunks >= splits).
  const int c_begin = static_cast<int>((static_cast<int64_t>(split) * p.kchunks) / p.splits);
  const int c_end = static_cast<int>((static_cast<int64_t>(split + 1) * p.kchunks) / p.splits);
  const int nchunks = c_end - c_begin;
  const int64_t row_bytes = p.K / 2;
  const uint32_t smem_base = SmemAddr(smem);

  // ---- copy assignments, fixed for the whole K loop; source pointers advance one chunk per issue ----
  // Weights: two threads per row, thread parity w_par copies units w_par, w_par + 2, ...: each copy
  // instruction then covers whole 32-byte sectors of 16 (or 32) rows.
  constexpr int kRowsPerPass = Cfg::kThreads / 2;
  constexpr int kWPasses = Cfg::kRows / kRowsPerPass;
  constexpr int kUnitsPerThread = Cfg::kUnits / 2;
  static_assert(kRowsPerPass % 8 == 0, "passes keep the row swizzle");
  const int w_par = tid & 1;
  const int w_row = tid >> 1;
  uint32_t w_dst[kUnitsPerThread];
#pragma unroll
  for (int j = 0; j < kUnitsPerThread; ++j)
    w_dst[j] = w_row * Cfg::kRowBytes + 16 * ((w_par + 2 * j) ^ Cfg::Swizzle(w_row));
  const uint8_t* w_src[kWPasses];
  uint32_t w_valid = 0;
#pragma unroll
  for (int ps = 0; ps < kWPasses; ++ps) {
    const int n = row0 + w_row + ps * kRowsPerPass;
    const bool ok = n < p.N;
    w_valid |= (ok ? 1u : 0u) << ps;
    w_src[ps] = p.b + static_cast<int64_t>(ok ? n : 0) * row_bytes + static_cast<int64_t>(c_begin) * Cfg::kRowBytes +
                16 * w_par;
  }
  // Scales: one copy of kScaleBytes per row and chunk.
  const bool s_copies = tid < Cfg::kRows;
  const bool s_valid = s_copies && row0 + tid < p.N;
  const uint8_t* s_src = static_cast<const uint8_t*>(p.scales) +
                         2 * (static_cast<int64_t>(s_valid ? row0 + tid : 0) * p.k_blocks +
                              static_cast<int64_t>(c_begin) * Cfg::kSpc);
  const uint32_t s_dst = Cfg::kWBytes + Cfg::kABytes + tid * Cfg::kScaleBytes;
  // Activations: consecutive threads copy consecutive 16-byte units of one token row.
  constexpr int kAUnits = kKC / 8;
  constexpr int kATotal = Cfg::kTokens * kAUnits;
  constexpr int kAIters = (kATotal + Cfg::kThreads - 1) / Cfg::kThreads;
  constexpr int kATokStep = Cfg::kThreads / kAUnits;
  static_assert(Cfg::kThreads % kAUnits == 0 && kATokStep % 2 == 0, "activation copy layout");
  const int a_tok = tid / kAUnits;
  const int a_unit = tid % kAUnits;
  const uint32_t a_dst = Cfg::kWBytes + a_tok * (kKC * 2) + 16 * (a_unit ^ ((a_tok & 1) << 2));
  const uint8_t* a_src[kAIters];
  uint32_t a_valid = 0;
#pragma unroll
  for (int j = 0; j < kAIters; ++j) {
    const int tok = a_tok + j * kATokStep;
    const bool ok = tok < Cfg::kTokens && tok0 + tok < p.M;
    a_valid |= (ok ? 1u : 0u) << j;
    a_src[j] = static_cast<const uint8_t*>(p.a) +
               2 * (static_cast<int64_t>(ok ? tok0 + tok : 0) * p.K + static_cast<int64_t>(c_begin) * kKC + 8 * a_unit);
  }

  // Next chunk's weights and scales into pipeline buffer `buf`. Rows past N zero-fill (src-size 0,
  // from a valid address).
  auto issue_weights = [&](int buf) {
    const uint32_t base = smem_base + buf * Cfg::kStageBytes;
#pragma unroll
    for (int ps = 0; ps < kWPasses; ++ps) {
      const bool ok = (w_valid >> ps) & 1u;
#pragma unroll
      for (int j = 0; j < kUnitsPerThread; ++j)
        CpAsync16(base + w_dst[j] + ps * kRowsPerPass * Cfg::kRowBytes, w_src[ps] + 32 * j, ok);
      w_src[ps] += Cfg::kRowBytes;
    }
    if (s_copies) CpAsyncSmall<Cfg::kScaleBytes>(base + s_dst, s_src, s_valid);
    s_src += Cfg::kScaleBytes;
  };
  // Next chunk's activations for this block's tokens into buffer `buf`; tokens past M zero-fill.
  auto issue_activations = [&](int buf) {
    const uint32_t base = smem_base + buf * Cfg::kStageBytes;
#pragma unroll
    for (int j = 0; j < kAIters; ++j) {
      if (kATotal % Cfg::kThreads == 0 || tid + j * Cfg::kThreads < kATotal)
        CpAsync16(base + a_dst + j * kATokStep * (kKC * 2), a_src[j], (a_valid >> j) & 1u);
      a_src[j] += kKC * 2;
    }
  };

  // Packed zero points of chunk `i` for this lane's rows (g and g + 8 of each m-tile): kSpc nibbles
  // per row in one word. Read straight from global one chunk ahead of use (rows need not be aligned).
  const int warp_row = warp * 16 * kTM;
  auto load_zero_points = [&](int i, uint32_t (&z)[kTM][2]) {
    const int64_t chunk = c_begin + i;
#pragma unroll
    for (int tm = 0; tm < kTM; ++tm) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int n = row0 + warp_row + tm * 16 + hf * 8 + g;
        uint32_t packed = 0;
        if (n < p.N) {
          const uint8_t* src = p.zero_points + static_cast<int64_t>(n) * p.zp_row_bytes + chunk * (Cfg::kSpc / 2);
#pragma unroll
          for (int byte = 0; byte < Cfg::kSpc / 2; ++byte)
            packed |= static_cast<uint32_t>(__ldg(src + byte)) << (8 * byte);
        }
        z[tm][hf] = packed;
      }
    }
  };

  // ---- per-lane shared-memory read offsets (relative to a stage buffer) ----
  // ldmatrix: lane gives row (lane & 7) of matrix (lane >> 3) = unit 4q + (lane >> 3); the row's
  // swizzle depends on lane & 7 only, and 4q only meets bit 2 of it.
  const int ld_row = warp_row + (lane & 7);
  const int ld_swz = Cfg::Swizzle(ld_row);
  uint32_t ld_off[Cfg::kUnits / 4];
#pragma unroll
  for (int q = 0; q < Cfg::kUnits / 4; ++q)
    ld_off[q] = ld_row * Cfg::kRowBytes + 16 * ((4 * q + (lane >> 3)) ^ ld_swz);
  // Activation fragments: token g (+ 8 nt), 16-byte slot 4 * unit + t, swizzled by token parity: the
  // slot is 4 * (unit ^ (g & 1)) + t, i.e. +-64 bytes around 64 * unit.
  const uint32_t b_off_even = Cfg::kWBytes + g * (kKC * 2) + 16 * t + 64 * (g & 1);
  const uint32_t b_off_odd = Cfg::kWBytes + g * (kKC * 2) + 16 * t - 64 * (g & 1);
  const uint32_t s_off = Cfg::kWBytes + Cfg::kABytes + (warp_row + g) * Cfg::kScaleBytes;

  float acc[kTM][kNT][4];
  float part[kTM][kNT][4];
#pragma unroll
  for (int tm = 0; tm < kTM; ++tm)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[tm][nt][i] = part[tm][nt][i] = 0.f;

  uint32_t z_cur[kTM][2] = {};
  uint32_t z_next[kTM][2] = {};

  // Prologue: weights first (independent of the previous kernel), then wait for it, then activations.
  // Group accounting: each stage's last group is followed by exactly kStages-2 newer groups when that
  // stage is waited for, so cp.async.wait_group<kStages-2> is the right wait at every iteration.
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < nchunks) issue_weights(s);
    CpAsyncCommit();
  }
  if (kZp) load_zero_points(0, z_cur);
  if (p.pdl) {  // only in a launch that opted in (uniform branch): the plain launch runs no griddepcontrol
    GridDependencyWait();
    GridDependencyTrigger();
  }
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < nchunks) issue_activations(s);
    CpAsyncCommit();
  }

  int read_buf = 0;
  int write_buf = Cfg::kStages - 1;
  for (int it = 0; it < nchunks; ++it) {
    if (kZp && it + 1 < nchunks) load_zero_points(it + 1, z_next);
    CpAsyncWait<Cfg::kStages - 2>();
    __syncthreads();  // stage `it` visible to all; everyone is done with the buffer refilled below
    if (it + Cfg::kStages - 1 < nchunks) {
      issue_weights(write_buf);
      issue_activations(write_buf);
    }
    CpAsyncCommit();
    write_buf = write_buf == Cfg::kStages - 1 ? 0 : write_buf + 1;

    const uint32_t stage = smem_base + read_buf * Cfg::kStageBytes;
    read_buf = read_buf == Cfg::kStages - 1 ? 0 : read_buf + 1;

    // This chunk's scales of rows g and g + 8 of each m-tile, kSpc halves per row.
    uint32_t sc[kTM][2][Cfg::kSpc / 2];
#pragma unroll
    for (int tm = 0; tm < kTM; ++tm) {
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const uint32_t addr = stage + s_off + (tm * 16 + hf * 8) * Cfg::kScaleBytes;
        if constexpr (Cfg::kSpc == 8) {
          const uint4 v = LdShared128(addr);
          sc[tm][hf][0] = v.x; sc[tm][hf][1] = v.y; sc[tm][hf][2] = v.z; sc[tm][hf][3] = v.w;
        } else if constexpr (Cfg::kSpc == 4) {
          asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(sc[tm][hf][0]), "=r"(sc[tm][hf][1]) : "r"(addr));
        } else {
          asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(sc[tm][hf][0]) : "r"(addr));
        }
      }
    }

#pragma unroll
    for (int q = 0; q < Cfg::kUnits / 4; ++q) {  // 64-byte groups of each row
      // words[tm][hf][j]: word t of unit 4q+j of row (warp_row + 16 tm + 8 hf + g).
      uint32_t words[kTM][2][4];
#pragma unroll
      for (int tm = 0; tm < kTM; ++tm)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf)
          LdMatrixX4(words[tm][hf], stage + ld_off[q] + (tm * 16 + hf * 8) * Cfg::kRowBytes);
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

#pragma unroll
        for (int tm = 0; tm < kTM; ++tm) {
          uint32_t lo[4], hi[4];  // rows g and g + 8
          typename Dq::Consts c_lo, c_hi;
          if constexpr (kZp) {
            c_lo = Dq::Make((z_cur[tm][0] >> (4 * blk)) & 15u);
            c_hi = Dq::Make((z_cur[tm][1] >> (4 * blk)) & 15u);
          } else {
            c_lo = c_hi = Dq::Make(8u);
          }
          Dq::Run(words[tm][0][j], c_lo, lo);
          Dq::Run(words[tm][1][j], c_hi, hi);
          const uint32_t a0[4] = {lo[0], hi[0], lo[1], hi[1]};  // k-step 0
          const uint32_t a1[4] = {lo[2], hi[2], lo[3], hi[3]};  // k-step 1
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            Mma16816<T>(part[tm][nt], a0, bfrag[nt][0], bfrag[nt][1]);
            Mma16816<T>(part[tm][nt], a1, bfrag[nt][2], bfrag[nt][3]);
          }
          if (block_end) {
            const float s_lo = HalfOfWord<T>(sc[tm][0][blk >> 1], blk & 1);
            const float s_hi = HalfOfWord<T>(sc[tm][1][blk >> 1], blk & 1);
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
              acc[tm][nt][0] = fmaf(s_lo, part[tm][nt][0], acc[tm][nt][0]);
              acc[tm][nt][1] = fmaf(s_lo, part[tm][nt][1], acc[tm][nt][1]);
              acc[tm][nt][2] = fmaf(s_hi, part[tm][nt][2], acc[tm][nt][2]);
              acc[tm][nt][3] = fmaf(s_hi, part[tm][nt][3], acc[tm][nt][3]);
#pragma unroll
              for (int i = 0; i < 4; ++i) part[tm][nt][i] = 0.f;
            }
          }
        }
      }
    }
    if constexpr (kZp) {
#pragma unroll
      for (int tm = 0; tm < kTM; ++tm) {
        z_cur[tm][0] = z_next[tm][0];
        z_cur[tm][1] = z_next[tm][1];
      }
    }
  }

  // Epilogue: partial sums to shared memory as [token][row], then each cluster rank adds up its share
  // of the rows over all ranks, in rank order, plus bias.
  CpAsyncWait<0>();
  __syncthreads();
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int tm = 0; tm < kTM; ++tm) {
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int r = warp_row + tm * 16 + g;
      const int tok = nt * 8 + 2 * t;
      red[tok * Cfg::kRedStride + r] = acc[tm][nt][0];
      red[(tok + 1) * Cfg::kRedStride + r] = acc[tm][nt][1];
      red[tok * Cfg::kRedStride + r + 8] = acc[tm][nt][2];
      red[(tok + 1) * Cfg::kRedStride + r + 8] = acc[tm][nt][3];
    }
  }

  const T* bias = static_cast<const T*>(p.bias);
  T* y = static_cast<T*>(p.y);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (p.splits > 1) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int r_begin = split * Cfg::kRows / p.splits;
    const int r_count = (split + 1) * Cfg::kRows / p.splits - r_begin;
    cluster.sync();  // every rank's partial sums are written
    for (int idx = tid; idx < r_count * Cfg::kTokens; idx += Cfg::kThreads) {
      const int tok = idx / r_count;
      const int r = r_begin + idx % r_count;
      const int n = row0 + r;
      const int m = tok0 + tok;
      if (n >= p.N || m >= p.M) continue;
      const int off = tok * Cfg::kRedStride + r;
      float sum = *cluster.map_shared_rank(red + off, 0);
      for (int c = 1; c < p.splits; ++c) sum += *cluster.map_shared_rank(red + off, c);
      if (bias) sum += ToFloat<T>(bias[n]);
      y[static_cast<int64_t>(m) * p.N + n] = FromFloat<T>(sum);
    }
    cluster.sync();  // no rank leaves (freeing its shared memory) while another still reads it
    return;
  }
#endif
  __syncthreads();
  for (int idx = tid; idx < Cfg::kRows * Cfg::kTokens; idx += Cfg::kThreads) {
    const int tok = idx / Cfg::kRows;
    const int r = idx % Cfg::kRows;
    const int n = row0 + r;
    const int m = tok0 + tok;
    if (n >= p.N || m >= p.M) continue;
    float sum = red[tok * Cfg::kRedStride + r];
    if (bias) sum += ToFloat<T>(bias[n]);
    y[static_cast<int64_t>(m) * p.N + n] = FromFloat<T>(sum);
  }
}

}  // namespace gemv
}  // namespace ort_mtp
