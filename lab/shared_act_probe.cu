// Lab only (device lab run 37, lab/runs.md): is a block-shared activation ring worth a new
// kernel for M = 2..8 (lab/NOTES.md, "What is left is a different kernel")? On down (5120 x 17408, the
// chain's shape with one m-tile per block in the op's cut), 4 launches in a CUDA graph with programmatic
// dependent launch:
//   op      the op's tiles kernel (gemv_tiles.cuh; the M = 1 ring kernel at M = 1), the op's cut;
//   shared  SharedActKernel: blocks of kTiles m-tiles x ONE K-part (the op's K-split of down: 8 parts), each
//           warp its own weight ring as in the op, the chunk's activations of the pass's M tokens staged
//           once per block in a 3-stage ring that every thread helps fill, two chunks ahead; one block
//           barrier per chunk. The K-parts' fp32 sums go to scratch ([K-part][token][row]);
//   +sum    the same followed by a kernel adding them in K-part order (what the op's epilogue does in
//           shared memory): bit-identical to the op's output, checked before timing;
//   mbar    shared with 4 activation stages and full / empty mbarriers instead of the block barrier, so
//           that a block's warps may drift up to two chunks apart;
//   +fused  shared, the last of a group's K-part blocks to finish (an atomic counter per group) adding
//           the group's sums in K-part order and storing the output: no second kernel;
//   +cluster shared, a group's 8 K-part blocks one cluster: block r adds m-tile r's sums over the
//           cluster's shared memory (DSMEM) in K-part order.
// Weights and scales are fresh random bytes and halves in the tiles layout (no meaning needed: both kernels
// read the same ones).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc -I. -o build/lab/shared_act_probe lab/shared_act_probe.cu
//   run(command='./build/lab/shared_act_probe', carry=['build/lab'])
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "lab/lab_common.cuh"
#include "lab/tile_chunk.cuh"
#include "matmul_nbits/gemv_tiles.cuh"

using namespace ort_mtp::gemv;

constexpr int kN = 5120, kK = 17408, kKParts = 8, kTiles = 8, kLaunches = 4;
constexpr int kActStage = 8 * 512;  // 8 tokens x 256 k x 2 bytes

struct SharedParams {
  const __half* a;
  const uint8_t* b;
  const uint8_t* scales;
  float* partial;  // [kparts][M][N]
  int M, N, K, kchunks, kparts;
  __half* y;       // kFused: the output [M][N]
  int* arrived;    // kFused: per group of m-tiles, how many of its K-part blocks are done (0 between launches)
};

// kTiles warps, one m-tile each, all on K-part blockIdx.x % kparts. kMbar = false: one block barrier per
// chunk (3 activation stages); true: 4 activation stages with full / empty mbarriers, so that the warps
// of a block may drift up to two chunks apart.
// kFused: the last of a group's K-part blocks to finish adds the group's sums in K-part order and
// stores the output (the others only leave their sums in `partial`). kCluster: a group's K-part blocks
// are one thread-block cluster; each leaves its sums in its shared memory, and block r adds m-tile r's
// over the cluster (distributed shared memory) in K-part order and stores it.
template <bool kMbar, bool kFused = false, bool kCluster = false>
__global__ void __maxnreg__(80) SharedActKernel(const __grid_constant__ SharedParams p) {
  constexpr int kActStages = kMbar ? 4 : kStreamStages;
  using Cfg = TilesConfig<32>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2;
  const int kp = blockIdx.x % p.kparts;
  const int tile = (blockIdx.x / p.kparts) * kTiles + warp;
  const int base = p.kchunks / p.kparts, extra = p.kchunks % p.kparts;
  const int c_begin = kp * base + min(kp, extra), c_count = base + (kp < extra ? 1 : 0);

  const uint32_t ring = SmemAddr(smem) + warp * Cfg::kWarpBytes;
  const uint32_t act_ring = SmemAddr(smem) + kTiles * Cfg::kWarpBytes;
  const int64_t first = static_cast<int64_t>(tile) * p.kchunks + c_begin;
  const uint8_t* wnext = p.b + first * Cfg::kWBytes + lane * 16;
  const bool s_lane = lane < Cfg::kSLanes;
  const uint8_t* snext = p.scales + first * Cfg::kSBytes + (s_lane ? lane : 0) * 16;
  // This thread's activation piece: token tid / 32, 16 bytes tid % 32 (threads past the pass's M tokens
  // copy nothing; lanes whose column is past M read the last token's slot).
  const int tid = threadIdx.x, tok = tid >> 5, piece = tid & 31;
  const bool a_thread = tok < p.M;
  const __half* anext = p.a + static_cast<int64_t>(min(tok, p.M - 1)) * p.K + static_cast<int64_t>(c_begin) * 256 + piece * 8;
  const uint32_t a_dst = static_cast<uint32_t>(tok * 512 + (((piece >> 2) ^ (tok & 1)) * 64) + (piece & 3) * 16);

  auto issue_w = [&](int i) {
    if (i < c_count) {
      const uint32_t st = ring + (i % kStreamStages) * Cfg::kStageBytes;
#pragma unroll
      for (int j = 0; j < 4; ++j) CpAsync16(st + j * 512 + lane * 16, wnext + j * 512, true);
      if (s_lane) CpAsync16(st + Cfg::kWBytes + lane * 16, snext, true);
      wnext += Cfg::kWBytes;
      snext += Cfg::kSBytes;
    }
  };
  __shared__ uint64_t bars[2 * 4];  // kMbar: full[4], empty[4]
  const uint32_t full = SmemAddr(bars), empty = full + 4 * 8;
  if (kMbar) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kActStages; ++s) {
        MbarInit(full + 8 * s, blockDim.x);
        MbarInit(empty + 8 * s, kTiles);
      }
    }
    __syncthreads();
  }
  auto issue_a = [&](int i) {
    if (i < c_count) {
      if (kMbar && i >= kActStages) MbarWait(empty + 8 * (i % kActStages), ((i / kActStages) - 1) & 1);
      if (a_thread) CpAsync16(act_ring + (i % kActStages) * kActStage + a_dst, anext, true);
      if (kMbar) CpAsyncMbarArrive(full + 8 * (i % kActStages));
    }
    anext += 256;
  };
  for (int i = 0; i < kStreamStages - 1; ++i) { issue_w(i); CpAsyncCommit(); }
  GridDependencyTrigger();
  GridDependencyWait();
  for (int i = 0; i < kStreamStages - 1; ++i) { issue_a(i); CpAsyncCommit(); }

  float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
  const int m = min(g, p.M - 1);
  for (int i = 0; i < c_count; ++i) {
    CpAsyncWait<kStreamStages - 2>();
    if (kMbar) {
      __syncwarp();
    } else {
      __syncthreads();  // every thread's piece of chunk i is in; every warp is past chunk i - 1
    }
    issue_w(i + kStreamStages - 1);
    issue_a(i + kStreamStages - 1);
    CpAsyncCommit();
    if (kMbar) MbarWait(full + 8 * (i % kActStages), (i / kActStages) & 1);  // every piece of chunk i is in
    const uint32_t stage = ring + (i % kStreamStages) * Cfg::kStageBytes;
    const uint32_t astage = act_ring + (i % kActStages) * kActStage + m * 512 + (lane & 3) * 16;
    const uint32_t* sc = reinterpret_cast<const uint32_t*>(smem + (stage - SmemAddr(smem)) + Cfg::kWBytes);
    lab::TileChunkFromShared(stage, sc, astage, m & 1, acc);
    if (kMbar) {
      __syncwarp();
      if (lane == 0) MbarArrive(empty + 8 * (i % kActStages));  // this warp is done with chunk i's stage
    }
  }
  CpAsyncWait<0>();
  // acc: rows g, g + 8 of the tile; tokens 2t, 2t + 1. (The block's place is read again here rather than
  // kept across the loop: kept, it took the register that the fused variant's end spilled.)
  if constexpr (kCluster) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int tid_e = ThreadIdx(), l = tid_e & 31, w = tid_e >> 5;
    float* red = reinterpret_cast<float*>(smem);  // [warp][16 rows][8 tokens]; the rings are done
    __syncthreads();
#pragma unroll
    for (int e = 0; e < 4; ++e) red[(w * 16 + (l >> 2) + 8 * (e >> 1)) * 8 + 2 * (l & 3) + (e & 1)] = acc[0][e];
    cluster.sync();
    const int rank = static_cast<int>(cluster.block_rank());  // = this block's K-part
    const int tile_r = (BlockIdx() / p.kparts) * kTiles + rank;
    for (int o = tid_e; o < 16 * p.M; o += blockDim.x) {
      const int r = o / p.M, token = o % p.M;
      float sum = 0.f;
      for (int q = 0; q < p.kparts; ++q) {
        const float* other = cluster.map_shared_rank(red, q);
        const float v = other[(rank * 16 + r) * 8 + token];
        sum = q == 0 ? v : sum + v;
      }
      p.y[static_cast<int64_t>(token) * p.N + tile_r * 16 + r] = __float2half_rn(sum);
    }
    cluster.sync();  // no block leaves while the others read its shared memory
    return;
  }
  {
    const int tid_e = ThreadIdx(), bid = BlockIdx();
    const int l = tid_e & 31, kpe = bid % p.kparts;
    const int tile_e = (bid / p.kparts) * kTiles + (tid_e >> 5);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = tile_e * 16 + (l >> 2) + 8 * (e >> 1), token = 2 * (l & 3) + (e & 1);
      if (token < p.M) p.partial[(static_cast<int64_t>(kpe) * p.M + token) * p.N + row] = acc[0][e];
    }
  }
  if constexpr (kFused) {
    __shared__ int last;
    const int group = BlockIdx() / p.kparts;
    __threadfence();  // this block's sums are visible before it counts itself in
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(p.arrived + group, 1) == p.kparts - 1;
    __syncthreads();
    if (last) {
      __threadfence();
      const int rows = kTiles * 16;
      for (int o = threadIdx.x; o < rows * p.M; o += blockDim.x) {
        const int token = o / rows, row = group * rows + o % rows;
        const int64_t at = static_cast<int64_t>(token) * p.N + row;
        float sum = __ldcg(p.partial + at);
        for (int q = 1; q < p.kparts; ++q) sum += __ldcg(p.partial + static_cast<int64_t>(q) * p.M * p.N + at);
        p.y[at] = __float2half_rn(sum);
      }
      if (threadIdx.x == 0) p.arrived[group] = 0;  // ready for the next launch
    }
  }
}

// The K-parts' sums added in K-part order, one rounding (the op's epilogue, without bias).
__global__ void SumParts(const float* partial, __half* y, int M, int N, int kparts, int pdl) {
  if (pdl) {
    GridDependencyTrigger();
    GridDependencyWait();
  }
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= M * N) return;
  float s = partial[i];
  for (int q = 1; q < kparts; ++q) s += partial[static_cast<int64_t>(q) * M * N + i];
  y[i] = __float2half_rn(s);
}

template <typename Kernel, typename... Args>
void LaunchPdl(Kernel k, dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t lc{};
  lc.gridDim = grid; lc.blockDim = block; lc.dynamicSmemBytes = smem; lc.stream = st; lc.attrs = attr; lc.numAttrs = 1;
  CK(cudaLaunchKernelEx(&lc, k, args...));
}

// The same with clusters of `cluster` blocks along x.
template <typename Kernel, typename... Args>
void LaunchPdlCluster(Kernel k, int cluster, dim3 grid, dim3 block, size_t smem, cudaStream_t st, Args... args) {
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = cluster; attr[1].val.clusterDim.y = 1; attr[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t lc{};
  lc.gridDim = grid; lc.blockDim = block; lc.dynamicSmemBytes = smem; lc.stream = st; lc.attrs = attr; lc.numAttrs = 2;
  CK(cudaLaunchKernelEx(&lc, k, args...));
}

int main() {
  int sms = 0, smem_block = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  using Cfg = TilesConfig<32>;
  const size_t wbytes = (size_t)kN * kK / 2, sbytes = (size_t)kN * (kK / 32) * 2;
  std::vector<uint8_t*> b(kLaunches), s(kLaunches);
  for (int l = 0; l < kLaunches; ++l) {
    CK(cudaMalloc(&b[l], wbytes)); CK(cudaMalloc(&s[l], sbytes));
    FillBytes<<<2048, 256>>>(b[l], wbytes, 11u + l);
    const float sc = 1.0f / (4.6f * std::sqrt((float)kK));
    FillHalf<<<2048, 256>>>(reinterpret_cast<__half*>(s[l]), sbytes / 2, 77u + l, 0.5f * sc, 1.5f * sc);
  }
  __half *a, *y_op, *y_sh;
  float* partial;
  CK(cudaMalloc(&a, (size_t)8 * kK * 2)); CK(cudaMalloc(&y_op, (size_t)8 * kN * 2)); CK(cudaMalloc(&y_sh, (size_t)8 * kN * 2));
  CK(cudaMalloc(&partial, (size_t)kKParts * 8 * kN * 4));
  FillHalf<<<256, 256>>>(a, (size_t)8 * kK, 5u, -1.f, 1.f);

  // The op's cut for down (CutStream, residency of the 8-token tiles kernel), as gemv_lab does.
  auto k8 = GemvTilesKernel<__half, 32, 1>;
  auto k1 = GemvTilesKernel<__half, 32, 1, true>;
  CK(cudaFuncSetAttribute(k8, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_block));
  CK(cudaFuncSetAttribute(k1, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_block));
  const int shared_smem = kTiles * Cfg::kWarpBytes + kStreamStages * kActStage;
  const int mbar_smem = kTiles * Cfg::kWarpBytes + 4 * kActStage;
  CK(cudaFuncSetAttribute(SharedActKernel<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_smem));
  CK(cudaFuncSetAttribute(SharedActKernel<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, mbar_smem));
  CK(cudaFuncSetAttribute(SharedActKernel<false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_smem));
  CK(cudaFuncSetAttribute(SharedActKernel<false, false, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_smem));
  CK(cudaFuncSetAttribute(SharedActKernel<false, false, true>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  int* arrived;
  CK(cudaMalloc(&arrived, kN / 16 / kTiles * sizeof(int)));
  CK(cudaMemset(arrived, 0, kN / 16 / kTiles * sizeof(int)));
  StreamCut cut;
  CutStream(kN / 16, kK / 256, sms, 24, 4, [&](int warps, int& per_sm) -> const char* {
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k8, 32 * warps, warps * Cfg::kWarpBytes));
    return nullptr;
  }, cut);
  int shared_per_sm = 0, mbar_per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&shared_per_sm, SharedActKernel<false>, 32 * kTiles, shared_smem));
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&mbar_per_sm, SharedActKernel<true>, 32 * kTiles, mbar_smem));
  const int shared_blocks = kN / 16 / kTiles * kKParts;
  std::printf("op cut %dx%d, %lld blocks; shared: %d blocks of %d warps x 1 K-part (%d K-parts), %d B smem, %d per SM"
              " (mbar: %d B, %d per SM)\n", cut.tiles, cut.kparts, (long long)cut.blocks, shared_blocks, kTiles, kKParts,
              shared_smem, shared_per_sm, mbar_smem, mbar_per_sm);
  if (cut.kparts != kKParts || cut.alt_blocks) { std::printf("the op's cut for down changed; update kKParts\n"); return 1; }

  auto op = [&](int l, int M, __half* y) {
    StreamParams prm{};
    prm.a = a; prm.b = b[l]; prm.scales = s[l]; prm.y = y; prm.bias = nullptr; prm.zero_points = nullptr;
    prm.M = M; prm.N = kN; prm.K = kK; prm.k_blocks = kK / 32; prm.kchunks = kK / 256;
    prm.kparts = cut.kparts; prm.rows_per_block = 16 * cut.tiles; prm.pdl = 1;
    prm.alt_blocks = 0; prm.alt_kparts = 1; prm.alt_rows = 0;
    const int warps = cut.tiles * cut.kparts;
    const int wb = M == 1 ? TilesConfig<32, true>::kWarpBytes : Cfg::kWarpBytes;
    LaunchPdl(M == 1 ? k1 : k8, dim3((unsigned)cut.blocks), dim3(32 * warps), (size_t)warps * wb, st, prm);
  };
  auto shared = [&](int l, int M, __half* y, bool sum, bool mbar = false, bool fused = false, bool clustered = false) {
    SharedParams sp{a, b[l], s[l], partial, M, kN, kK, kK / 256, kKParts, y, arrived};
    if (clustered) {
      LaunchPdlCluster(SharedActKernel<false, false, true>, kKParts, dim3(shared_blocks), dim3(32 * kTiles),
                       (size_t)shared_smem, st, sp);
      return;
    }
    if (fused) {
      LaunchPdl(SharedActKernel<false, true>, dim3(shared_blocks), dim3(32 * kTiles), (size_t)shared_smem, st, sp);
      return;
    }
    if (mbar) LaunchPdl(SharedActKernel<true>, dim3(shared_blocks), dim3(32 * kTiles), (size_t)mbar_smem, st, sp);
    else LaunchPdl(SharedActKernel<false>, dim3(shared_blocks), dim3(32 * kTiles), (size_t)shared_smem, st, sp);
    if (sum) LaunchPdl(SumParts, dim3((M * kN + 255) / 256), dim3(256), 0, st, (const float*)partial, y, M, kN, kKParts, 1);
  };

  for (int M : {1, 2, 4, 8}) {  // bit-identity with the op first
    for (int v : {0, 1, 2, 3}) {
      const bool mbar = v == 1, fused = v == 2, clustered = v == 3;
      op(0, M, y_op);
      CK(cudaMemsetAsync(y_sh, 0xFF, (size_t)8 * kN * 2, st));
      shared(0, M, y_sh, true, mbar, fused, clustered);
      CK(cudaStreamSynchronize(st)); CK(cudaGetLastError());
      std::vector<__half> h1((size_t)M * kN), h2((size_t)M * kN);
      CK(cudaMemcpy(h1.data(), y_op, h1.size() * 2, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(h2.data(), y_sh, h2.size() * 2, cudaMemcpyDeviceToHost));
      std::printf("M=%d %s bit-identical to the op: %d\n", M,
                  clustered ? "shared+cluster" : fused ? "shared+fused" : mbar ? "mbar+sum" : "shared+sum",
                  std::memcmp(h1.data(), h2.data(), h1.size() * 2) == 0);
    }
  }
  const double read_us = TimeGraph(st, [&] {
    for (int l = 0; l < kLaunches; ++l)
      LaunchPdl(ReadKernel, dim3(sms * 4), dim3(256), 0, st, (const uint4*)b[l], (wbytes + sbytes) / 16, (uint32_t*)partial, 1);
  });
  std::printf("plain read of 4 x %.1f MB: %.1f us\n", (wbytes + sbytes) / 1e6, read_us);
  std::printf("%-14s %8s %8s %8s %8s   (us for 4 launches of down)\n", "", "M=1", "M=2", "M=4", "M=8");
  const char* names[7] = {"op", "shared", "shared+sum", "mbar", "mbar+sum", "shared+fused", "shared+cluster"};
  for (int v = 0; v < 7; ++v) {
    std::printf("%-14s", names[v]);
    for (int M : {1, 2, 4, 8}) {
      const double us = TimeGraph(st, [&] {
        for (int l = 0; l < kLaunches; ++l) {
          if (v == 0) op(l, M, y_op);
          else shared(l, M, y_sh, v == 2 || v == 4, v == 3 || v == 4, v == 5, v == 6);
        }
      });
      std::printf(" %8.1f", us);
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  return 0;
}
