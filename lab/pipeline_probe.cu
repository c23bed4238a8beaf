// Lab only (device lab runs 22-26, 30 and 39, lab/runs.md): how fast can a memory pipeline shaped
// like the GEMV's read the chain's weights, and what in the op's tiles kernel costs time beyond it? The
// chain is lab/gemv_lab.cu's (4 x (17408 x 5120, 5120 x 17408) int4 weights), 8 launches under a CUDA
// graph with programmatic dependent launch. Always run:
//   grid   the plain streaming read (ReadKernel, lab/lab_common.cuh: grid-stride, 4 x 16-byte loads per
//          thread, 4 blocks of 256 threads per SM): the floor the kernels are compared with;
//   tiles  the op's tiles kernel (gemv_tiles.cuh, fp16, block 32, M = 1) and TilesProbe, a copy of it with
//          the math, the scales' copies and the activations' loads switched off one by one, on the op's
//          plan (CutStream). Timing only: weights and scales are not in a meaningful layout.
// With PROBE_RUNS=1, also:
//   ldg    warps that own runs of C contiguous 2 KB chunks (a warp's run in the tiles layout) and load
//          them into registers, D chunks ahead of the one being consumed;
//   ring   the same runs through a per-warp cp.async ring in shared memory (the GEMV kernels' way):
//          S stages, S - 1 chunks in flight, cp.async.wait_group + __syncwarp, 16-byte shared loads;
//          at 24 warps per SM also stages of half a chunk (1 KB), and the 3- and 4-stage rings with a
//          rolling L2 prefetch (cp.async.bulk.prefetch.L2) of the chunk d past the ring's newest (lab 30).
// With PROBE_BULK=1 (lab run 39), also:
//   bulk   a producer / consumer ring (BulkRuns): one producer lane fills a block-wide ring with bulk
//          copies (TMA engine, mbarriers), consumer warps read and release the stages; stages of q
//          chunks with their scales, blocks streaming equal contiguous ranges; L producer lanes each
//          copying q / L of a stage's chunks.
// The ldg/ring variants launch exactly W warps per SM (blocks of 8 warps, persistent: a warp takes runs
// w, w + all warps, ...), trigger the next launch at their start and wait for the previous one before
// loading (as ReadKernel does), and end with a block barrier (as the GEMV epilogue does). Unused shared
// memory keeps the ldg variants at W warps per SM too.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc -I. -o build/lab/pipeline_probe lab/pipeline_probe.cu
//   run(command='PROBE_RUNS=1 ./build/lab/pipeline_probe', carry=['build/lab'])   (or PROBE_BULK=1)
// (Runs 22-26 timed 9 sets of 20 replays each; the shared TimeGraph (lab/lab_common.cuh) now takes 7.)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "lab/lab_common.cuh"
#include "matmul_nbits/gemv_tiles.cuh"

using namespace ort_mtp::gemv;

constexpr int kChunk = 2048;  // bytes of one tile-chunk (16 rows x 256 k of int4)

// The j-th chunk of warp w's runs (runs of c chunks, dealt to the warps round-robin).
__device__ __forceinline__ int64_t ChunkOf(int64_t w, int64_t warps, int c, int64_t j) {
  const int64_t run = w + (j / c) * warps;
  return run * c + j % c;
}

__device__ __forceinline__ int64_t ChunksOf(int64_t w, int64_t warps, int c, int64_t total) {
  // runs w, w + warps, ... that start before total; the last run may be cut by total
  int64_t n = 0;
  for (int64_t run = w; run * c < total; run += warps) n += min(static_cast<int64_t>(c), total - run * c);
  return n;
}

template <int kD>
__global__ void LdgRuns(const uint8_t* b, int64_t total, int c, uint32_t* sink) {
  GridDependencyTrigger();
  GridDependencyWait();
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  const int64_t w = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int64_t n = ChunksOf(w, warps, c, total);
  uint4 buf[kD + 1][4];
  auto load = [&](uint4(&dst)[4], int64_t j) {
    const uint8_t* src = b + ChunkOf(w, warps, c, j) * kChunk + lane * 16;
#pragma unroll
    for (int q = 0; q < 4; ++q) dst[q] = Ldg16(src + q * 512);
  };
#pragma unroll
  for (int s = 0; s < kD; ++s)
    if (s < n) load(buf[s], s);
  uint32_t x = 0;
  for (int64_t j0 = 0; j0 < n; j0 += kD + 1) {
#pragma unroll
    for (int s = 0; s <= kD; ++s) {
      const int64_t j = j0 + s;
      if (j + kD < n) load(buf[(s + kD) % (kD + 1)], j + kD);
      if (j < n) {
#pragma unroll
        for (int q = 0; q < 4; ++q) x ^= buf[s][q].x ^ buf[s][q].y ^ buf[s][q].z ^ buf[s][q].w;
      }
    }
  }
  __syncthreads();
  if (x == 0x12345678u) sink[0] = x;
}

// kBytes: a stage's bytes, a whole 2 KB chunk or half of one (1 KB: the tiles layout's rows g and g + 8 of
// units 0-3 or 4-7 are contiguous, so a half-chunk is a unit of work too); c and total count stages.
// kPf: lane 0 also prefetches the stage kPf past the ring's newest into L2 (cp.async.bulk.prefetch.L2),
// bytes in flight that hold no shared memory.
template <int kS, int kBytes = kChunk, int kPf = 0>
__global__ void RingRuns(const uint8_t* b, int64_t total, int c, uint32_t* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  const int64_t w = (int64_t)blockIdx.x * (blockDim.x >> 5) + warp;
  const uint32_t ring = SmemAddr(smem) + warp * kS * kBytes;
  const int64_t n = ChunksOf(w, warps, c, total);
  constexpr int kCopies = kBytes / 512;  // 16-byte copies per lane and stage
  auto issue = [&](int64_t j) {
    if (j < n) {
      const uint8_t* src = b + ChunkOf(w, warps, c, j) * kBytes + lane * 16;
      const uint32_t dst = ring + (j % kS) * kBytes + lane * 16;
#pragma unroll
      for (int q = 0; q < kCopies; ++q) CpAsync16(dst + q * 512, src + q * 512, true);
    }
    CpAsyncCommit();
  };
  auto prefetch = [&](int64_t j) {
    if (kPf > 0 && lane == 0 && j < n) {
      const uint8_t* src = b + ChunkOf(w, warps, c, j) * kBytes;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(kBytes) : "memory");
    }
  };
  // As the GEMV kernels: the first stages before the dependency wait (weights are constants).
#pragma unroll
  for (int s = 0; s < kS - 1; ++s) issue(s);
#pragma unroll
  for (int s = 0; s < kPf; ++s) prefetch(kS - 1 + s);
  GridDependencyTrigger();
  GridDependencyWait();
  uint32_t x = 0;
  for (int64_t j = 0; j < n; ++j) {
    CpAsyncWait<kS - 2>();
    __syncwarp();
    issue(j + kS - 1);
    prefetch(j + kS - 1 + kPf);
    const uint32_t st = ring + (j % kS) * kBytes + lane * 16;
#pragma unroll
    for (int q = 0; q < kCopies; ++q) {
      const uint4 v = LdShared128(st + q * 512);
      x ^= v.x ^ v.y ^ v.z ^ v.w;
    }
  }
  CpAsyncWait<0>();
  __syncthreads();
  if (x == 0x12345678u) sink[0] = x;
}

// The op's tiles kernel (gemv_tiles.cuh, fp16, block 32, 8 tokens) with parts switched off: kMath
// (conversion and mma; off: the shared-memory words are XORed), kScales (the scales' copies), kAct (the
// activations' loads). With all three on it is the op's kernel; the plan is the op's (CutStream).
template <bool kMath, bool kScales, bool kAct>
__global__ void __maxnreg__(80)
    TilesProbe(const __grid_constant__ StreamParams p) {
  using T = __half;
  using Cfg = TilesConfig<32>;
  using Dq = Int4Dequant<T>;
  constexpr int kNT = 1, kUnits = Cfg::kKC / 32, kUnitsPerBlock = 1;
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const WarpTask task(p, warp, 8);
  const int c_begin = task.c_begin;
  const int c_count = task.tile_row0 < task.block_rows ? task.c_count : 0;
  const uint32_t ring = SmemAddr(smem) + static_cast<uint32_t>(warp * Cfg::kWarpBytes);
  const uint32_t last_stage = ring + static_cast<uint32_t>((kStreamStages - 1) * Cfg::kStageBytes);
  const int64_t first = static_cast<int64_t>((task.block_row0 + task.tile_row0) / 16) * p.kchunks + c_begin;
  const uint8_t* wnext = p.b + first * Cfg::kWBytes + lane * 16;
  const bool s_lane = lane < Cfg::kSLanes;
  const uint8_t* snext = static_cast<const uint8_t*>(p.scales) + first * Cfg::kSBytes + (s_lane ? lane : 0) * 16;
  uint32_t fill = ring;
  auto issue = [&](int i, bool) {  // (no activations in the ring here)
    if (i < c_count) {
#pragma unroll
      for (int j = 0; j < 4; ++j) CpAsync16(fill + j * 512 + lane * 16, wnext + j * 512, true);
      if (kScales && s_lane) CpAsync16(fill + Cfg::kWBytes + lane * 16, snext, true);
      wnext += Cfg::kWBytes;
      snext += Cfg::kSBytes;
      fill = NextStage<Cfg::kStageBytes>(fill, ring, last_stage);
    }
    CpAsyncCommit();
  };
  const T* arow[kNT];
  RingActivations<T, Cfg::kKC> unused(p, task);
  StartRun<T, kNT, false>(issue, p, task, arow, unused, ring, Cfg::kStageBytes, 0, c_count);
  const int g = lane >> 2;
  float acc[kNT][4] = {};
  uint32_t x = 0;
  uint32_t stage = ring;
  for (int i = 0; i < c_count; ++i) {
    const int64_t k0 = static_cast<int64_t>(c_begin + i) * Cfg::kKC;
    uint4 act[kNT][kUnits];
#pragma unroll
    for (int u = 0; u < kUnits; ++u)
      act[0][u] = kAct ? __ldg(reinterpret_cast<const uint4*>(arow[0] + k0 + 32 * u)) : make_uint4(0x3c003c00u, 0, 0, 0);
    CpAsyncWait<kStreamStages - 2>();
    __syncwarp();
    issue(i + kStreamStages - 1, true);
    const typename Dq::Consts dq = Dq::Make(8u);
    const uint32_t* sc = reinterpret_cast<const uint32_t*>(smem + (stage - SmemAddr(smem)) + Cfg::kWBytes);
    float d[kNT][4];
    uint32_t pg = 0, ph = 0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint4 wg = LdShared128(stage + (2 * half) * 512 + lane * 16);
      const uint4 wh = LdShared128(stage + (2 * half + 1) * 512 + lane * 16);
      if constexpr (!kMath) {
        x ^= wg.x ^ wg.y ^ wg.z ^ wg.w ^ wh.x ^ wh.y ^ wh.z ^ wh.w;
        if (half == 1) {
#pragma unroll
          for (int u = 0; u < kUnits; ++u) x ^= act[0][u].x ^ act[0][u].y ^ act[0][u].z ^ act[0][u].w;
          if (kScales) x ^= sc[g] ^ sc[g + 32];
        }
        continue;
      }
      const uint32_t wgs[4] = {wg.x, wg.y, wg.z, wg.w}, whs[4] = {wh.x, wh.y, wh.z, wh.w};
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        const int u = 4 * half + w;
        const int blk = u / kUnitsPerBlock;
        uint32_t qa[4], qb[4];
        Dq::Run(wgs[w], dq, qa);
        Dq::Run(whs[w], dq, qb);
        const uint32_t a1[4] = {qa[0], qb[0], qa[1], qb[1]};
        const uint32_t a2[4] = {qa[2], qb[2], qa[3], qb[3]};
        MmaZeroC<T>(d[0], a1, act[0][u].x, act[0][u].y);
        Mma16816<T>(d[0], a2, act[0][u].z, act[0][u].w);
        if (kScales && blk % 2 == 0) {
          pg = sc[(g * Cfg::kPerRow + blk) / 2];
          ph = sc[((g + 8) * Cfg::kPerRow + blk) / 2];
        }
        AddScaledBlock<kNT>(acc, d, BitsToFloat<T>(static_cast<uint16_t>(pg >> (16 * (blk & 1)))),
                            BitsToFloat<T>(static_cast<uint16_t>(ph >> (16 * (blk & 1)))));
      }
    }
    stage = NextStage<Cfg::kStageBytes>(stage, ring, last_stage);
  }
  CpAsyncWait<0>();
  if (!kMath) acc[0][0] = __uint_as_float(x & 0x3fffffffu);
  SumKPartsAndStore<T, kNT>(p, EpilogueTask<kNT>(p, task), acc, smem);
}

// Lab run 39: the memory pipeline of a producer / consumer kernel (Hopper's way; nothing in the op does
// it). Lane 0 of a producer warp fills a block-wide ring of `stages` stages with bulk copies (the TMA
// engine), one "full" mbarrier per stage counting the bytes and one "empty" mbarrier counting the
// consumer warps' releases; the consumer warps read each stage (16-byte shared loads, XOR) and release it.
// A stage is q consecutive tile-chunks: their weights (q x 2 KB, one copy) and their scales (q x 256
// bytes, a second copy). Each block streams one contiguous range of the matrix's chunks, all ranges equal
// to a chunk (as a stream-K cut would deal them). The first stages are copied before
// griddepcontrol.wait, as the GEMV kernels copy their weights.
__global__ void BulkRuns(const uint8_t* b, const uint8_t* scales, int64_t total, int q, int stages, int lanes,
                         uint32_t* sink) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int consumers = (blockDim.x >> 5) - 1;
  const int stage_bytes = q * (kChunk + 256);
  const uint32_t base = SmemAddr(smem);
  const uint32_t full = base + stages * stage_bytes, empty = full + 8 * stages;  // 8 bytes per mbarrier
  const int64_t c0 = total * blockIdx.x / gridDim.x, c1 = total * (blockIdx.x + 1) / gridDim.x;
  const int64_t n = (c1 - c0 + q - 1) / q;  // stages of this block's range
  if (threadIdx.x == 0) {
    for (int i = 0; i < stages; ++i) {
      MbarInit(full + 8 * i, 1);
      MbarInit(empty + 8 * i, consumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  GridDependencyTrigger();
  if (warp == consumers) {
    if (lane < lanes) {  // each of `lanes` lanes copies q / lanes of a stage's chunks
      const int per = q / lanes;
      auto copy = [&](int64_t j) {
        const int slot = static_cast<int>(j % stages);
        if (j >= stages) MbarWait(empty + 8 * slot, static_cast<uint32_t>((j / stages - 1) & 1));
        const int64_t c = c0 + j * q;
        const int cnt = static_cast<int>(min(static_cast<int64_t>(q), c1 - c));
        if (lane == 0) MbarExpectTx(full + 8 * slot, cnt * (kChunk + 256));
        __syncwarp((1u << lanes) - 1);  // the expectation before any lane's bytes can land
        const int mine = min(per, cnt - lane * per);
        if (mine > 0) {
          BulkCopy(base + slot * stage_bytes + lane * per * kChunk, b + (c + lane * per) * kChunk, mine * kChunk,
                   full + 8 * slot);
          BulkCopy(base + slot * stage_bytes + q * kChunk + lane * per * 256, scales + (c + lane * per) * 256,
                   mine * 256, full + 8 * slot);
        }
      };
      int64_t j = 0;
      for (; j < n && j < stages; ++j) copy(j);
      GridDependencyWait();
      for (; j < n; ++j) copy(j);
    }
  } else {
    GridDependencyWait();
    uint32_t x = 0;
    for (int64_t j = 0; j < n; ++j) {
      const int slot = static_cast<int>(j % stages);
      MbarWait(full + 8 * slot, static_cast<uint32_t>((j / stages) & 1));
      const int cnt = static_cast<int>(min(static_cast<int64_t>(q), c1 - (c0 + j * q)));
      const uint32_t st = base + slot * stage_bytes;
      for (int off = (warp * 32 + lane) * 16; off < cnt * kChunk; off += consumers * 512) {
        const uint4 v = LdShared128(st + off);
        x ^= v.x ^ v.y ^ v.z ^ v.w;
      }
      for (int off = (warp * 32 + lane) * 16; off < cnt * 256; off += consumers * 512) {
        const uint4 v = LdShared128(st + q * kChunk + off);
        x ^= v.x ^ v.y ^ v.z ^ v.w;
      }
      __syncwarp();
      if (lane == 0) MbarArrive(empty + 8 * slot);
    }
    if (x == 0x12345678u) sink[0] = x;
  }
  __syncthreads();  // as the GEMV epilogue's block barrier
}

template <typename K>
void Launch(K kernel, int blocks, int threads, int smem, cudaStream_t st, const uint8_t* b, int64_t total, int c,
            uint32_t* sink) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(blocks); lc.blockDim = dim3(threads); lc.dynamicSmemBytes = smem; lc.stream = st;
  lc.attrs = attr; lc.numAttrs = 1;
  CK(cudaLaunchKernelEx(&lc, kernel, b, total, c, sink));
}

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const size_t mat = (size_t)17408 * 5120 / 2;  // bytes of one matrix's weights
  std::vector<uint8_t*> chain(8);
  for (int i = 0; i < 8; ++i) {
    CK(cudaMalloc(&chain[i], mat));
    FillBytes<<<2048, 256>>>(chain[i], mat, 17 + i);
  }
  uint32_t* sink; CK(cudaMalloc(&sink, 4));
  CK(cudaDeviceSynchronize());
  const int64_t total = mat / kChunk;
  const double bytes = 8.0 * mat;
  auto report = [&](const char* what, double us) {
    std::printf("%-40s %7.1f us  %5.0f GB/s\n", what, us, bytes / us / 1e3);
    std::fflush(stdout);
  };
  report("grid 4x256/SM", TimeGraph(st, [&] {
           for (auto* m : chain) {
             cudaLaunchAttribute attr[1];
             attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
             attr[0].val.programmaticStreamSerializationAllowed = 1;
             cudaLaunchConfig_t lc{};
             lc.gridDim = dim3(sms * 4); lc.blockDim = dim3(256); lc.stream = st; lc.attrs = attr; lc.numAttrs = 1;
             CK(cudaLaunchKernelEx(&lc, ReadKernel, (const uint4*)m, mat / 16, sink, 1));
           }
         }));

  // The tiles kernel with parts switched off, the op's plan (CutStream, 24 warps per SM, blocks of >= 4).
  {
    __half *a, *y;
    CK(cudaMalloc(&a, (size_t)16 * 17408 * 2)); CK(cudaMalloc(&y, (size_t)16 * 17408 * 2));
    CK(cudaMemset(a, 0x11, (size_t)16 * 17408 * 2));
    std::vector<uint8_t*> scales(8);
    for (int i = 0; i < 8; ++i) { CK(cudaMalloc(&scales[i], mat / 8)); CK(cudaMemset(scales[i], 0x11, mat / 8)); }
    using Cfg = TilesConfig<32>;
    auto probe = [&](auto kernel, const char* label) {
      CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
      auto kernel8 = TilesProbe<true, true, true>;
      CK(cudaFuncSetAttribute(kernel8, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
      const double us = TimeGraph(st, [&] {
        for (int i = 0; i < 8; ++i) {
          const int N = i % 2 ? 5120 : 17408, K = i % 2 ? 17408 : 5120;
          StreamCut cut;
          CutStream(N / 16, K / 256, sms, 24, 4, [&](int warps, int& per_sm) -> const char* {
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel8, 32 * warps, warps * Cfg::kWarpBytes));
            return nullptr;
          }, cut);
          StreamParams prm{};
          prm.a = a; prm.b = chain[i]; prm.scales = scales[i]; prm.y = y;
          prm.M = 1; prm.N = N; prm.K = K; prm.k_blocks = K / 32; prm.kchunks = K / 256;
          prm.kparts = cut.kparts; prm.rows_per_block = 16 * cut.tiles; prm.pdl = 1;
          prm.alt_blocks = (int)cut.alt_blocks; prm.alt_kparts = cut.alt_kparts; prm.alt_rows = 16 * cut.alt_tiles;
          cudaLaunchAttribute attr[1];
          attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          attr[0].val.programmaticStreamSerializationAllowed = 1;
          cudaLaunchConfig_t lc{};
          const int warps = cut.tiles * cut.kparts;
          lc.gridDim = dim3((unsigned)cut.blocks); lc.blockDim = dim3(32 * warps);
          lc.dynamicSmemBytes = warps * Cfg::kWarpBytes; lc.stream = st; lc.attrs = attr; lc.numAttrs = 1;
          CK(cudaLaunchKernelEx(&lc, kernel, prm));
        }
      });
      report(label, us);
    };
    probe(GemvTilesKernel<__half, 32, 1>, "the op's tiles kernel");
    probe(TilesProbe<true, true, true>, "tiles copy (math, scales, act)");
    probe(TilesProbe<true, true, false>, "tiles math, scales, no act");
    probe(TilesProbe<false, true, true>, "tiles no math, scales, act");
    probe(TilesProbe<false, true, false>, "tiles no math, scales, no act");
    probe(TilesProbe<false, false, false>, "tiles no math, no scales, no act");
    // Lab run 39 (PROBE_BULK=1): the producer / consumer ring (BulkRuns), weights and scales (401 MB).
    if (std::getenv("PROBE_BULK")) {
      CK(cudaFuncSetAttribute(BulkRuns, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
      struct BulkCfg { int q, stages, consumers, per_sm, lanes; };
      const BulkCfg cfgs[] = {{16, 5, 8, 1, 1},  {8, 5, 8, 2, 1},   {4, 20, 8, 1, 1},  {4, 20, 8, 1, 2},
                              {4, 20, 8, 1, 4},  {8, 10, 8, 1, 2},  {8, 10, 8, 1, 4},  {8, 10, 8, 1, 8},
                              {16, 5, 8, 1, 4},  {16, 5, 8, 1, 16}, {2, 40, 8, 1, 2},  {1, 80, 8, 1, 1},
                              {16, 6, 8, 1, 4},  {8, 11, 8, 1, 4},  {8, 5, 8, 2, 4},   {4, 10, 8, 2, 4},
                              {16, 5, 8, 1, 1}};
      for (const BulkCfg& bc : cfgs) {
        const int smem = bc.stages * bc.q * (kChunk + 256) + 16 * bc.stages;
        char label[80];
        std::snprintf(label, sizeof label, "bulk q=%d S=%d (%d KB) W=%d x%d/SM L=%d", bc.q, bc.stages, smem / 1024,
                      bc.consumers, bc.per_sm, bc.lanes);
        const double us = TimeGraph(st, [&] {
          for (int i = 0; i < 8; ++i) {
            cudaLaunchAttribute attr[1];
            attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            attr[0].val.programmaticStreamSerializationAllowed = 1;
            cudaLaunchConfig_t lc{};
            lc.gridDim = dim3(sms * bc.per_sm); lc.blockDim = dim3(32 * (bc.consumers + 1));
            lc.dynamicSmemBytes = smem; lc.stream = st; lc.attrs = attr; lc.numAttrs = 1;
            CK(cudaLaunchKernelEx(&lc, BulkRuns, (const uint8_t*)chain[i], (const uint8_t*)scales[i], total, bc.q,
                                  bc.stages, bc.lanes, sink));
          }
        });
        std::printf("%-40s %7.1f us  %5.0f GB/s (weights and scales)\n", label, us, bytes * 9 / 8 / us / 1e3);
        std::fflush(stdout);
      }
    }
  }
  if (std::getenv("PROBE_RUNS"))
  for (int wps : {24, 32}) {
    const int blocks = sms * wps / 8;
    // Shared memory the ldg kernels do not use, so that exactly wps / 8 blocks fit on an SM (as the
    // GEMV kernels fill it): 64 KB x 3 or 48 KB x 4 of the 228 KB.
    const int hold = wps == 24 ? 64 * 1024 : 48 * 1024;
    CK(cudaFuncSetAttribute(LdgRuns<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, hold));
    CK(cudaFuncSetAttribute(LdgRuns<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, hold));
    for (int c : {1, 2, 7, 16}) {
      char label[64];
      std::snprintf(label, sizeof label, "ldg W=%d C=%d D=1", wps, c);
      report(label, TimeGraph(st, [&] { for (auto* m : chain) Launch(LdgRuns<1>, blocks, 256, hold, st, m, total, c, sink); }));
      std::snprintf(label, sizeof label, "ldg W=%d C=%d D=2", wps, c);
      report(label, TimeGraph(st, [&] { for (auto* m : chain) Launch(LdgRuns<2>, blocks, 256, hold, st, m, total, c, sink); }));
      for (int s : {3, 4}) {
        const int smem = 8 * s * kChunk;
        if (s == 4 && wps == 32) continue;  // 256 KB: does not fit
        std::snprintf(label, sizeof label, "ring W=%d C=%d S=%d", wps, c, s);
        if (s == 3) {
          CK(cudaFuncSetAttribute(RingRuns<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
          report(label, TimeGraph(st, [&] { for (auto* m : chain) Launch(RingRuns<3>, blocks, 256, smem, st, m, total, c, sink); }));
        } else {
          CK(cudaFuncSetAttribute(RingRuns<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
          report(label, TimeGraph(st, [&] { for (auto* m : chain) Launch(RingRuns<4>, blocks, 256, smem, st, m, total, c, sink); }));
        }
      }
      if (wps != 24) continue;
      // Half-chunk stages (1 KB): S = 6 is the 3-stage ring's shared memory with 5 KB in flight per
      // warp instead of 4; S = 8 is the 4-stage ring's.
      auto half = [&](auto kernel, int s) {
        const int smem = 8 * s * 1024;
        std::snprintf(label, sizeof label, "ring W=%d C=%d S=%d of 1 KB", wps, c, s);
        CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        report(label, TimeGraph(st, [&] { for (auto* m : chain) Launch(kernel, blocks, 256, smem, st, m, 2 * total, 2 * c, sink); }));
      };
      half(RingRuns<6, 1024>, 6);
      half(RingRuns<8, 1024>, 8);
      // The 3- and 4-stage rings with a rolling L2 prefetch kPf chunks past the ring's newest.
      auto pf = [&](auto kernel, int s, int d) {
        const int smem = 8 * s * kChunk;
        std::snprintf(label, sizeof label, "ring W=%d C=%d S=%d L2 pf %d", wps, c, s, d);
        CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        report(label, TimeGraph(st, [&] { for (auto* m : chain) Launch(kernel, blocks, 256, smem, st, m, total, c, sink); }));
      };
      pf(RingRuns<3, kChunk, 1>, 3, 1);
      pf(RingRuns<3, kChunk, 2>, 3, 2);
      pf(RingRuns<3, kChunk, 4>, 3, 4);
      pf(RingRuns<4, kChunk, 1>, 4, 1);
      pf(RingRuns<4, kChunk, 2>, 4, 2);
    }
  }
  return 0;
}
