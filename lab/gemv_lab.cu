// GEMV lab: the stream kernel (csrc/matmul_nbits/gemv_stream.cuh) alone, without ONNX Runtime, on the
// 27B-class shapes, for choosing its decomposition in one device call. Not part of the product; the
// product's benchmark is bench/gemv.py (ORT sessions, ORT's kernels in the same run).
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Icsrc -I. -o /tmp/gemv_lab lab/gemv_lab.cu && /tmp/gemv_lab [--quick]
//
// The kernels are the product's (fp16, block 32, chunk 256, no zero points): the stream kernel on
// MatMulNBits' layout and, without --quick, the tiles kernel (gemv_tiles.cuh) on the same weights in
// the tiles layout (packing=1, made on the device by lab/gemv_repacked.cuh), with the same plan. Device lab runs 1-5 (lab/runs.md)
// ran earlier versions of this file with kernel variants as template parameters (lab/NOTES.md,
// version 3). What it does, per configuration:
//   1. correctness on gate_up (17408 x 5120), down (5120 x 17408) and lm_head (248320 x 5120) at M = 8
//      against a plain fp32 reference kernel (relative L2 error), and bit-identity of rows 0 and 5 of
//      the M = 8 call with M = 1 calls on those rows alone, of its first rows with M = 2, 3, 4 calls, and
//      of rows 3 and 11 of an M = 16 call;
//   2. time of the chain 4 x (gate_up, down) under a CUDA graph with programmatic dependent launch, for
//      M = 1, 2, 4, 8, 16, and of the lm_head, median of 7 x 20 replays; weights 401 MB (> L2).
//   3. the same chain read by a plain streaming kernel (16-byte loads, no math): what 8 launches of
//      50 MB each can reach here (bench/gemv.py measures the copy ceiling the targets refer to);
//   4. one shape at a time: 4 launches of gate_up (or down) at M = 1 and 8, us per launch.
// Environment: LAB_NO_ACT_RING=1 (the kernels at M = 1 without their activations in the ring),
// LAB_KERNELS=0,1,2,3,1:20 (which kernels, in order: 0 stream, 1 tiles, 2 the lab's producer / consumer
// kernel, lab/gemv_bulk.cuh, lab run 40: M <= 8 where its activations fit, the rest printed as "-"; 3 below;
// :W plans for W warps per SM instead of 24), LAB_BULK_NOMATH=1 (kernel 2 without its arithmetic: the
// pipeline alone; its checks fail by design), LAB_NO_BALANCE=1 (skip
// the balance probe at the end), LAB_LAUNCH_PROBE=1 (the same bytes as 4 launches and as one launch of
// a 4x taller matrix, lab run 18), LAB_CARVEOUT=N, LAB_PLAN_RING=1 (the plan's residency from the M = 1
// ring kernel, whose stages are the largest; lab run 32 built this file with deeper rings). Kernel 2's lab
// run 41 knobs: LAB_TRACE=1 (a timeline per block of 4 launches, printed after the table), LAB_BULK_GW=GxW,GxW
// (consumer groups x warps for the K = 5120 shapes, then down), LAB_BULK_Q=q,q, LAB_BULK_SPLIT=1 (equal stage
// ranges per block), LAB_BULK_PRE=n (stages issued before the activations land), LAB_BULK_MAXSTAGES=n and
// LAB_BULK_ONE_SLOT=1 (one ring slot per group is enough for MaxM). Kernel 3 (lab run 46): M = 2..8 on
// lab/gemv_group_act.cuh (the activations shared through shared memory by the warps of a K-part), the op's tiles
// kernels at M = 1 and M > 8; LAB_GA_SKIP=K (shapes with that K on the op's 8-token kernel instead),
// LAB_GA_R1=1 (the op's own blocks instead of larger ones), LAB_GA_CA=1 (its activation copies through L1).
// Kernel 4 (lab run 47): the op's tiles kernels on kernel 3's larger blocks (24-warp blocks need a build with
// -DORT_MTP_LAB_BOUND_WARPS=24 and lab47_bound_warps.patch). Lab runs 17-19 also compiled lab-only kernels into
// this file (lab/gemv_tiles_modes.cuh, gemv_lab15_kernel.cuh, gemv_tiles_split.cuh): they are in
// the history at a724a5d (lab/runs.md), not in the tree.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "matmul_nbits/gemv_stream.cuh"
#include "lab/gemv_bulk.cuh"
#include "lab/gemv_group_act.cuh"
#include "lab/gemv_repacked.cuh"
#include "lab/lab_common.cuh"

using namespace ort_mtp::gemv;

constexpr int kH = 5120, kI = 17408, kV = 248320, kBS = 32, kLayers = 4;

struct Mat {
  int N, K;
  uint8_t* b;
  __half* s;
  uint8_t* bp = nullptr;  // the same weights and scales in the tiles layout (lab/gemv_repacked.cuh)
  __half* sp = nullptr;
};

// Reference: one thread per (row, token), fp32, the same dequantisation (q - 8) * scale.
__global__ void RefKernel(const __half* a, const uint8_t* b, const __half* s, float* y, int M, int N, int K) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  const int tok = blockIdx.y;
  if (row >= N || tok >= M) return;
  double acc = 0;
  for (int k = 0; k < K; ++k) {
    const uint8_t byte = b[(size_t)row * (K / 2) + k / 2];
    const int q = (k & 1) ? (byte >> 4) : (byte & 15);
    acc += (double)__half2float(a[(size_t)tok * K + k]) * (double)((q - 8) * __half2float(s[(size_t)row * (K / kBS) + k / kBS]));
  }
  y[(size_t)tok * N + row] = (float)acc;
}

struct Cfg {
  int wps;        // warps per SM the plan aims at (the op: kStreamWarpsPerSm = 24)
  int min_warps;  // warps per block the plan fills with m-tiles (the op: kStreamMinBlockWarps = 4)
  int repacked = 0;  // 0: the op's stream kernel; 1: its tiles kernel (gemv_tiles.cuh) on the weights in the tiles layout
};

struct Plan {
  StreamCut cut;
  int per_sm;
  double waves;
};

int g_sms = 132, g_smem_sm = 0, g_smem_block = 0;
// LAB_NO_ACT_RING=1: the kernels at M = 1 load their activations from global memory as at M = 2..8,
// instead of taking them through the ring (the op's M = 1 kernels, gemv::RingActivations).
const bool g_no_act_ring = std::getenv("LAB_NO_ACT_RING") != nullptr;

// The op's cut (gemv::CutStream) with the configuration's constants.
template <typename Kernel>
Plan MakePlan(int N, int K, int kc, const Cfg& c, int warp_bytes, Kernel kernel8) {
  Plan p{};
  auto resident = [&](int warps, int& per_sm) -> const char* {
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel8, 32 * warps, warps * warp_bytes));
    return nullptr;
  };
  if (const char* e = CutStream((N + 15) / 16, K / kc, g_sms, c.wps, c.min_warps, resident, p.cut)) {
    std::fprintf(stderr, "%s\n", e);
    std::exit(1);
  }
  resident(p.cut.tiles * p.cut.kparts, p.per_sm);
  p.waves = (double)p.cut.blocks / (g_sms * std::max(1, p.per_sm));
  return p;
}

template <int kNT, int kKernel, bool kActRing = false>
auto KernelOf() {
  if constexpr (kKernel == 0) return GemvStreamKernel<__half, kBS, 256, kNT, false, kActRing>;
  else return GemvTilesKernel<__half, kBS, kNT, kActRing>;
}

// One launch of `kernel` on a cut: blocks x token passes of `tokens`; B and scales in the tiles layout
// (repacked) or MatMulNBits' own. name: printed with the cut on a shape's first launch (kernels 3 and 4), or null.
template <typename Kernel>
void LaunchOnCut(Kernel kernel, const char* name, const Mat& m, const __half* a, __half* y, int M, const StreamCut& cut,
                 int warps, int smem, int tokens, bool repacked, cudaStream_t st, bool pdl) {
  if (smem > g_smem_block) {
    std::fprintf(stderr, "%s: %d bytes of shared memory for M=%d on %dx%d\n", name ? name : "kernel", smem, M, m.N, m.K);
    std::exit(1);
  }
  StreamParams prm{};
  prm.a = a; prm.b = repacked ? m.bp : m.b; prm.scales = repacked ? m.sp : m.s;
  prm.zero_points = nullptr; prm.bias = nullptr; prm.y = y;
  prm.M = M; prm.N = m.N; prm.K = m.K; prm.k_blocks = m.K / kBS; prm.zp_row_bytes = 0; prm.kchunks = m.K / 256;
  prm.kparts = cut.kparts; prm.rows_per_block = 16 * cut.tiles; prm.pdl = pdl;
  prm.alt_blocks = (int)cut.alt_blocks; prm.alt_kparts = cut.alt_kparts; prm.alt_rows = 16 * cut.alt_tiles;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3((unsigned)cut.blocks, (M + tokens - 1) / tokens, 1);
  lc.blockDim = dim3(32 * warps, 1, 1);
  lc.dynamicSmemBytes = smem;
  lc.stream = st; lc.attrs = attr; lc.numAttrs = pdl ? 1 : 0;
  static bool printed[3] = {false, false, false};
  const int which = m.N == kI ? 0 : m.N == kH ? 1 : 2;
  if (name && !printed[which]) {
    printed[which] = true;
    std::printf("  %s cut %dx%d: %d blocks of %d warps, %d alt of %d m-tiles x %d, %d x %d K-parts; smem %d at M=%d\n", name,
                m.N, m.K, (int)cut.blocks, warps, (int)cut.alt_blocks, cut.alt_tiles, cut.alt_kparts, cut.tiles, cut.kparts, smem, M);
  }
  CK(cudaLaunchKernelEx(&lc, kernel, prm));
}

template <int kNT, int kKernel, bool kActRing = false>
void LaunchT(const Mat& m, const __half* a, __half* y, int M, const Cfg& c, cudaStream_t st, bool pdl, Plan* out) {
  constexpr int kKC = 256;
  using C = StreamConfig<kBS, kKC, kNT>;
  static_assert(StreamConfig<kBS, kKC, 1>::kWarpBytes == TilesConfig<kBS>::kWarpBytes, "the same ring per warp");
  constexpr bool kRepacked = kKernel != 0;
  auto kernel = KernelOf<kNT, kKernel, kActRing>();
  // The plan comes from the 8-token kernel whatever M is: the K-split must not depend on M.
  // LAB_PLAN_RING=1: from the M = 1 ring kernel instead (the largest ring; lab run 32).
  auto kernel8 = KernelOf<1, kKernel>();
  auto kernel1 = KernelOf<1, kKernel, true>();
  static bool configured = false;
  if (!configured) {
    for (auto k : {kernel, kernel8, kernel1}) {
      CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_block));
      if (const char* v = std::getenv("LAB_CARVEOUT"))  // the op leaves the carveout to the driver (lab run 12)
        CK(cudaFuncSetAttribute(k, cudaFuncAttributePreferredSharedMemoryCarveout, std::atoi(v)));
    }
    configured = true;
  }
  static const bool ring_plan = std::getenv("LAB_PLAN_RING") != nullptr;
  constexpr int kRingBytes = kKernel == 0 ? StreamConfig<kBS, kKC, 1, true>::kWarpBytes : TilesConfig<kBS, true>::kWarpBytes;
  Plan pl = MakePlan(m.N, m.K, kKC, c, ring_plan ? kRingBytes : StreamConfig<kBS, kKC, 1>::kWarpBytes,
                     ring_plan ? kernel1 : kernel8);
  if (out) *out = pl;
  const int warps = pl.cut.tiles * pl.cut.kparts;
  LaunchOnCut(kernel, nullptr, m, a, y, M, pl.cut, warps,
              warps * (kKernel == 0 ? StreamConfig<kBS, kKC, kNT, kActRing>::kWarpBytes : TilesConfig<kBS, kActRing>::kWarpBytes),
              C::kTokens, kRepacked, st, pdl);
}

// Kernel 2 (lab run 40): lab::GemvBulkKernel (lab/gemv_bulk.cuh), one block per SM. Its stages: the largest
// q dividing the m-tile's chunks with q x 2304 bytes <= 40 KB and two stages per consumer group beside one
// token's activations (a function of the shape only: the arithmetic must not depend on M); as many stages
// as fit beside the activations (a multiple of the groups: each group its own slots).
// Lab run 41: the groups G and warps per group W per shape, LAB_BULK_GW=GxW,GxW (K = 5120 shapes: gate_up
// and the lm_head; K = 17408: down; default 4x6,4x6 as 40l), and q, LAB_BULK_Q=q,q (0: the rule above).
struct BulkCut { int G, W, q; };
// Field n of a comma-separated list (the last one if there are fewer).
const char* Field(const char* v, int n) {
  for (int i = 0; i < n && std::strchr(v, ','); ++i) v = std::strchr(v, ',') + 1;
  return v;
}
BulkCut BulkCutOf(const Mat& m) {
  const int which = m.K == kH ? 0 : 1;
  BulkCut c{4, 6, 0};
  if (const char* v = std::getenv("LAB_BULK_GW")) std::sscanf(Field(v, which), "%dx%d", &c.G, &c.W);
  if (const char* v = std::getenv("LAB_BULK_Q")) c.q = std::atoi(Field(v, which));
  if (c.q == 0) {
    c.q = 1;
    for (int d = 1; d <= m.K / 256; ++d)
      if ((m.K / 256) % d == 0 && d * lab::kBulkStageChunkBytes <= 40 * 1024 &&
          lab::BulkSmemBytes(d, 2 * c.G, 1, m.K, c.G * c.W) <= g_smem_block)
        c.q = d;
  }
  return c;
}
int BulkStages(const Mat& m, int M) {
  const BulkCut c = BulkCutOf(m);
  // LAB_BULK_MAXSTAGES=n: at most n stages (lab run 41: a shallower ring).
  static const int cap = std::getenv("LAB_BULK_MAXSTAGES") ? std::atoi(std::getenv("LAB_BULK_MAXSTAGES")) : 1 << 30;
  int s = std::min(6 * c.G, cap / c.G * c.G);
  while (s > 0 && lab::BulkSmemBytes(c.q, s, M, m.K, c.G * c.W) > g_smem_block) s -= c.G;
  return s;
}
// The largest M a configuration runs on a matrix (bulk: while two stages per consumer group fit beside
// the activations, or one with LAB_BULK_ONE_SLOT=1).
int MaxM(const Mat& m, const Cfg& c) {
  if (c.repacked == 2) {
    static const int slots = std::getenv("LAB_BULK_ONE_SLOT") ? 1 : 2;
    int M = 0;
    while (M < 8 && BulkStages(m, M + 1) >= slots * BulkCutOf(m).G) ++M;
    return M;
  }
  return 16;
}

unsigned long long* g_trace = nullptr;  // lab run 41 (LAB_TRACE=1): the next bulk launch's timeline, or null

template <int G, int W>
void LaunchBulkGW(const lab::BulkParams& prm, int smem, cudaStream_t st, bool pdl) {
  static const bool no_math = std::getenv("LAB_BULK_NOMATH") != nullptr;  // lab run 40c: the pipeline alone
  auto kernel = g_trace ? lab::GemvBulkKernel<G, W, true, true>
                        : no_math ? lab::GemvBulkKernel<G, W, false> : lab::GemvBulkKernel<G, W, true>;
  static bool configured = false;
  if (!configured) {
    CK(cudaFuncSetAttribute(lab::GemvBulkKernel<G, W, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_block));
    CK(cudaFuncSetAttribute(lab::GemvBulkKernel<G, W, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_block));
    CK(cudaFuncSetAttribute(lab::GemvBulkKernel<G, W, true, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_block));
    configured = true;
  }
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t lc{};
  lc.gridDim = dim3(g_sms); lc.blockDim = dim3(32 * (G * W + 2)); lc.dynamicSmemBytes = smem;
  lc.stream = st; lc.attrs = attr; lc.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&lc, kernel, prm));
}

void LaunchBulk(const Mat& m, const __half* a, __half* y, int M, cudaStream_t st, bool pdl, Plan* out) {
  const BulkCut c = BulkCutOf(m);
  const int stages = BulkStages(m, M);
  if (M > MaxM(m, Cfg{24, 4, 2})) {
    std::fprintf(stderr, "bulk kernel: M=%d on %dx%d does not fit\n", M, m.N, m.K);
    std::exit(1);
  }
  const int smem = lab::BulkSmemBytes(c.q, stages, M, m.K, c.G * c.W);
  if (out) {
    *out = Plan{};
    out->cut.tiles = c.q; out->cut.kparts = stages; out->cut.blocks = g_sms; out->per_sm = 1; out->waves = 1.0;
  }
  // Lab run 41: LAB_BULK_SPLIT=1 equal stage ranges (default: whole m-tiles per block, 40l); LAB_BULK_PRE=n
  // stages issued before the activations have landed (default: no limit).
  static const int split = std::getenv("LAB_BULK_SPLIT") ? std::atoi(std::getenv("LAB_BULK_SPLIT")) : 0;
  static const int pre = std::getenv("LAB_BULK_PRE") ? std::atoi(std::getenv("LAB_BULK_PRE")) : 1 << 30;
  static float4* piece_sums = nullptr;
  static int* piece_count = nullptr;
  if (!piece_sums) {
    CK(cudaMalloc(&piece_sums, (size_t)g_sms * 2 * 32 * sizeof(float4)));
    CK(cudaMalloc(&piece_count, (size_t)kV / 16 * sizeof(int)));
    CK(cudaMemset(piece_count, 0, (size_t)kV / 16 * sizeof(int)));
    CK(cudaDeviceSynchronize());  // the memset runs on the legacy stream, st does not wait for it
  }
  lab::BulkParams prm{a, m.bp, reinterpret_cast<const uint8_t*>(m.sp), y, M, m.N, m.K, m.K / 256, c.q, stages,
                      m.K * 2 + 64, g_trace, split, piece_sums, piece_count, pre};
  const int gw = c.G * 100 + c.W;
  switch (gw) {
    case 406: LaunchBulkGW<4, 6>(prm, smem, st, pdl); break;
    case 405: LaunchBulkGW<4, 5>(prm, smem, st, pdl); break;
    case 604: LaunchBulkGW<6, 4>(prm, smem, st, pdl); break;
    case 1202: LaunchBulkGW<12, 2>(prm, smem, st, pdl); break;
    case 802: LaunchBulkGW<8, 2>(prm, smem, st, pdl); break;
    case 1002: LaunchBulkGW<10, 2>(prm, smem, st, pdl); break;
    default: std::fprintf(stderr, "bulk kernel: no instance for %dx%d\n", c.G, c.W); std::exit(1);
  }
}

// Kernel 3 (lab run 46): M = 2..8 on lab::GemvTilesGroupActKernel (lab/gemv_group_act.cuh), the op's tiles
// kernels at M = 1 and M > 8. Kernel 4 (lab run 47): the op's tiles kernels (M <= 8) on kernel 3's blocks.
// Those blocks regroup the op's cut (the 8-token kernel's, as LaunchT) without changing any m-tile's K-split:
// one block per SM of 3 or 2 m-tiles where the op has blocks of one m-tile (down: 1 x 8), else two of the op's
// blocks in one (gate_up: 2 x 3 -> 4 x 3, the alt 3 x 2 -> 6 x 2). Returns the warps per block.
int RegroupedCut(const Mat& m, const Cfg& c, StreamCut& ga) {
  const Plan pl = MakePlan(m.N, m.K, 256, c, StreamConfig<kBS, 256, 1>::kWarpBytes, KernelOf<1, 1>());
  const StreamCut& cut = pl.cut;
  const int n_tiles = (m.N + 15) / 16;
  ga = cut;
  // LAB_GA_R1=1: the op's own blocks (kernel 3 then shares only within them; M <= 4 keeps the op's blocks per SM).
  static const bool own_blocks = std::getenv("LAB_GA_R1") != nullptr;
  if (own_blocks) return cut.tiles * cut.kparts;
  if (cut.alt_blocks == 0 && cut.tiles == 1 && n_tiles > g_sms && (n_tiles / g_sms + 1) * cut.kparts <= lab::kGaMaxWarps) {
    const int base = n_tiles / g_sms, extra = n_tiles % g_sms;
    ga.tiles = base; ga.alt_tiles = base + 1; ga.alt_kparts = cut.kparts; ga.alt_blocks = extra; ga.blocks = g_sms;
    return (base + (extra ? 1 : 0)) * cut.kparts;
  }
  const int w = cut.tiles * cut.kparts;
  const int R = (cut.alt_blocks % 2 == 0 && 2 * w <= lab::kGaMaxWarps) ? 2 : 1;
  ga.tiles = R * cut.tiles; ga.alt_tiles = R * cut.alt_tiles; ga.alt_blocks = cut.alt_blocks / R;
  ga.blocks = ga.alt_blocks + (cut.blocks - cut.alt_blocks + R - 1) / R;
  return R * w;
}

void LaunchGA(const Mat& m, const __half* a, __half* y, int M, const Cfg& c, cudaStream_t st, bool pdl) {
  // LAB_GA_CA=1 (lab run 47): the activations copied with cp.async.ca (through L1) instead of .cg.
  static const bool via_l1 = std::getenv("LAB_GA_CA") != nullptr;
  auto kernel = via_l1 ? lab::GemvTilesGroupActKernel<__half, kBS, true> : lab::GemvTilesGroupActKernel<__half, kBS, false>;
  static bool configured = false;
  if (!configured) {
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_block));
    configured = true;
  }
  StreamCut ga;
  const int warps = RegroupedCut(m, c, ga);
  LaunchOnCut(kernel, "group-act", m, a, y, M, ga, warps, lab::GaSmemBytes<kBS>(warps, std::max(ga.kparts, ga.alt_kparts), M),
              8, true, st, pdl);
}

// Kernel 4 at M <= 8 (24-warp blocks need the lab built with -DORT_MTP_LAB_BOUND_WARPS=24: the op's kernels'
// launch bounds are 512 threads).
void LaunchRegrouped(const Mat& m, const __half* a, __half* y, int M, const Cfg& c, cudaStream_t st, bool pdl) {
  auto k1 = GemvTilesKernel<__half, kBS, 1, true>;
  auto k8 = GemvTilesKernel<__half, kBS, 1, false>;
  static bool configured = false;
  if (!configured) {
    for (auto k : {k1, k8}) CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem_block));
    configured = true;
  }
  StreamCut ga;
  const int warps = RegroupedCut(m, c, ga);
  if (M == 1) {
    LaunchOnCut(k1, "regrouped", m, a, y, M, ga, warps, warps * TilesConfig<kBS, true>::kWarpBytes, 8, true, st, pdl);
  } else {
    LaunchOnCut(k8, "regrouped", m, a, y, M, ga, warps, warps * TilesConfig<kBS>::kWarpBytes, 8, true, st, pdl);
  }
}

void Run(const Mat& m, const __half* a, __half* y, int M, const Cfg& c, cudaStream_t st, bool pdl, Plan* out = nullptr) {
  if (c.repacked == 2) return LaunchBulk(m, a, y, M, st, pdl, out);
  if (c.repacked == 3) {
    if (M == 1) return LaunchT<1, 1, true>(m, a, y, M, c, st, pdl, out);
    if (M > 8) return LaunchT<2, 1>(m, a, y, M, c, st, pdl, out);
    // LAB_GA_SKIP=K: shapes with this K run the op's 8-token tiles kernel instead (5120: gate_up and the
    // lm_head, 17408: down).
    static const int skip_k = std::getenv("LAB_GA_SKIP") ? std::atoi(std::getenv("LAB_GA_SKIP")) : 0;
    if (m.K == skip_k) return LaunchT<1, 1>(m, a, y, M, c, st, pdl, out);
    return LaunchGA(m, a, y, M, c, st, pdl);
  }
  if (c.repacked == 4) {
    if (M > 8) return LaunchT<2, 1>(m, a, y, M, c, st, pdl, out);
    if (out) *out = MakePlan(m.N, m.K, 256, c, StreamConfig<kBS, 256, 1>::kWarpBytes, KernelOf<1, 1>());  // the op's cut
    return LaunchRegrouped(m, a, y, M, c, st, pdl);
  }
#define LAB_LAUNCH(K)                                                                     \
  case K:                                                                                 \
    if (M > 8) LaunchT<2, K>(m, a, y, M, c, st, pdl, out);                                \
    else if (M == 1 && !g_no_act_ring) LaunchT<1, K, true>(m, a, y, M, c, st, pdl, out);   \
    else LaunchT<1, K>(m, a, y, M, c, st, pdl, out);                                      \
    break;
  switch (c.repacked) {
    LAB_LAUNCH(0) LAB_LAUNCH(1)
    default: std::fprintf(stderr, "no kernel %d\n", c.repacked); std::exit(1);
  }
#undef LAB_LAUNCH
}

Mat NewMat(int N, int K, uint32_t seed) {
  Mat m{N, K, nullptr, nullptr};
  CK(cudaMalloc(&m.b, (size_t)N * K / 2));
  CK(cudaMalloc(&m.s, (size_t)N * (K / kBS) * 2));
  FillBytes<<<2048, 256>>>(m.b, (size_t)N * K / 2, seed);
  // |q - 8| ~ 4.6 on average: scales ~ 1 / (4.6 sqrt(K)) keep outputs ~ inputs through the chain.
  const float s = 1.0f / (4.6f * std::sqrt((float)K));
  FillHalf<<<2048, 256>>>(m.s, (size_t)N * (K / kBS), seed ^ 0x9e3779b9u, 0.5f * s, 1.5f * s);
  CK(cudaMalloc(&m.bp, (size_t)N * K / 2));
  CK(cudaMalloc(&m.sp, (size_t)N * (K / kBS) * 2));
  lab::RepackWeights<<<2048, 256>>>(m.b, m.bp, N, K);
  lab::RepackScales<<<2048, 256>>>(m.s, m.sp, N, K, kBS);
  CK(cudaGetLastError());
  return m;
}

size_t Bytes(const Mat& m) { return (size_t)m.N * m.K / 2 + (size_t)m.N * (m.K / kBS) * 2; }

// Relative L2 error against the reference, and bit-identity of rows 0 and 5 with M = 1 calls.
bool Check(const char* name, const Mat& m, const Cfg& c, cudaStream_t st) {
  const int M = std::min(8, MaxM(m, c));
  __half *a, *y, *y1; float* ref;
  CK(cudaMalloc(&a, (size_t)M * m.K * 2)); CK(cudaMalloc(&y, (size_t)M * m.N * 2));
  CK(cudaMalloc(&y1, (size_t)m.N * 2)); CK(cudaMalloc(&ref, (size_t)M * m.N * 4));
  FillHalf<<<256, 256>>>(a, (size_t)M * m.K, 1234u + m.N, -1.f, 1.f);
  CK(cudaMemset(y, 0xFF, (size_t)M * m.N * 2));  // poison: NaN
  RefKernel<<<dim3((m.N + 127) / 128, M), 128, 0, st>>>(a, m.b, m.s, ref, M, m.N, m.K);
  Run(m, a, y, M, c, st, false);
  CK(cudaStreamSynchronize(st)); CK(cudaGetLastError());
  std::vector<__half> hy((size_t)M * m.N); std::vector<float> hr((size_t)M * m.N);
  CK(cudaMemcpy(hy.data(), y, hy.size() * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hr.data(), ref, hr.size() * 4, cudaMemcpyDeviceToHost));
  double num = 0, den = 0; bool finite = true;
  for (size_t i = 0; i < hy.size(); ++i) {
    const double v = __half2float(hy[i]);
    if (!std::isfinite(v)) finite = false;
    num += (v - hr[i]) * (v - hr[i]); den += (double)hr[i] * hr[i];
  }
  const double rel = std::sqrt(num / den);
  bool same = true;
  for (int row : {0, std::min(5, M - 1)}) {
    CK(cudaMemset(y1, 0xFF, (size_t)m.N * 2));
    Run(m, a + (size_t)row * m.K, y1, 1, c, st, false);
    CK(cudaStreamSynchronize(st));
    std::vector<__half> h1(m.N);
    CK(cudaMemcpy(h1.data(), y1, m.N * 2, cudaMemcpyDeviceToHost));
    if (std::memcmp(h1.data(), hy.data() + (size_t)row * m.N, (size_t)m.N * 2) != 0) same = false;
  }
  // M = 2, 3, 4 (below the checked M): their rows against the M-row call's.
  for (int Ms : {2, 3, 4}) {
    if (Ms >= M) continue;
    __half* ys;
    CK(cudaMalloc(&ys, (size_t)Ms * m.N * 2));
    CK(cudaMemset(ys, 0xFF, (size_t)Ms * m.N * 2));
    Run(m, a, ys, Ms, c, st, false);
    CK(cudaStreamSynchronize(st));
    std::vector<__half> hs((size_t)Ms * m.N);
    CK(cudaMemcpy(hs.data(), ys, hs.size() * 2, cudaMemcpyDeviceToHost));
    if (std::memcmp(hs.data(), hy.data(), hs.size() * 2) != 0) same = false;
    CK(cudaFree(ys));
  }
  // M = 16 pass: row 11 against the M = 8 pass's inputs is not comparable; check row 3 of a 16-row call.
  if (MaxM(m, c) >= 16) {
    __half* a16; __half* y16;
    CK(cudaMalloc(&a16, (size_t)16 * m.K * 2)); CK(cudaMalloc(&y16, (size_t)16 * m.N * 2));
    CK(cudaMemcpy(a16, a, (size_t)M * m.K * 2, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(a16 + (size_t)M * m.K, a, (size_t)M * m.K * 2, cudaMemcpyDeviceToDevice));
    Run(m, a16, y16, 16, c, st, false);
    CK(cudaStreamSynchronize(st));
    std::vector<__half> h16((size_t)16 * m.N);
    CK(cudaMemcpy(h16.data(), y16, h16.size() * 2, cudaMemcpyDeviceToHost));
    for (int row : {3, 11})
      if (std::memcmp(h16.data() + (size_t)row * m.N, hy.data() + (size_t)(row % 8) * m.N, (size_t)m.N * 2) != 0) same = false;
    CK(cudaFree(a16)); CK(cudaFree(y16));
  }
  std::printf("  check %-8s M=%d rel_err %.3e finite %d rows_identical %d\n", name, M, rel, finite, same);
  CK(cudaFree(a)); CK(cudaFree(y)); CK(cudaFree(y1)); CK(cudaFree(ref));
  return finite && same && rel < 2e-3;
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && !std::strcmp(argv[1], "--quick");
  CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaDeviceGetAttribute(&g_smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, 0));
  CK(cudaDeviceGetAttribute(&g_smem_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  std::printf("SMs %d, smem/SM %d, smem/block %d\n", g_sms, g_smem_sm, g_smem_block);
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  std::vector<Mat> chain;
  for (int l = 0; l < kLayers; ++l) {
    chain.push_back(NewMat(kI, kH, 100 + 2 * l));
    chain.push_back(NewMat(kH, kI, 101 + 2 * l));
  }
  Mat head = NewMat(kV, kH, 999);
  size_t chain_bytes = 0;
  for (auto& m : chain) chain_bytes += Bytes(m);
  const size_t head_bytes = Bytes(head);
  __half *x, *h1, *h2;
  CK(cudaMalloc(&x, (size_t)16 * kI * 2)); CK(cudaMalloc(&h1, (size_t)16 * kI * 2)); CK(cudaMalloc(&h2, (size_t)16 * kV * 2));
  FillHalf<<<256, 256>>>(x, (size_t)16 * kI, 7u, -1.f, 1.f);
  uint32_t* sink; CK(cudaMalloc(&sink, 4));
  CK(cudaDeviceSynchronize());

  // Streaming read of the chain, 8 launches (with and without PDL) and one launch of the lm_head.
  for (int blocks_per_sm : {4, 8}) {
    for (int pdl : {0, 1}) {
      const double us = TimeGraph(st, [&] {
        for (auto& m : chain) {
          cudaLaunchAttribute attr[1];
          attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          attr[0].val.programmaticStreamSerializationAllowed = 1;
          cudaLaunchConfig_t lc{};
          lc.gridDim = dim3(g_sms * blocks_per_sm); lc.blockDim = dim3(256); lc.stream = st;
          lc.attrs = attr; lc.numAttrs = pdl;
          CK(cudaLaunchKernelEx(&lc, ReadKernel, (const uint4*)m.b, (size_t)m.N * m.K / 32, sink, pdl));
        }
      });
      std::printf("read chain weights (%d blocks/SM, pdl %d): %.1f us, %.0f GB/s\n", blocks_per_sm, pdl, us,
                  chain_bytes / us / 1e3);
    }
  }
  {
    const double us = TimeGraph(st, [&] {
      ReadKernel<<<g_sms * 8, 256, 0, st>>>((const uint4*)head.b, (size_t)head.N * head.K / 32, sink, 0);
    });
    std::printf("read lm_head weights: %.1f us, %.0f GB/s\n", us, head_bytes / us / 1e3);
  }

  // --profile WPS MINW M [KERNEL]: plain launches of gate_up, down, lm_head (for ncu).
  if (argc > 1 && !std::strcmp(argv[1], "--profile")) {
    Cfg c{std::atoi(argv[2]), std::atoi(argv[3]), argc > 5 ? std::atoi(argv[5]) : 0};
    const int M = std::atoi(argv[4]);
    for (int rep = 0; rep < 2; ++rep) {
      Run(chain[0], x, h1, M, c, st, false);
      Run(chain[1], h1, x, M, c, st, false);
      Run(head, x, h2, M, c, st, false);
    }
    CK(cudaStreamSynchronize(st));
    std::printf("profile done\n");
    return 0;
  }
  std::vector<Cfg> cfgs;
  // wps min_warps (the product's plan first)
  if (quick) {
    cfgs = {{24, 4}};
  } else {
    // the op's stream kernel; its tiles kernel (packing=1); lab tiles modes 0, 1, 2 (lab/gemv_tiles_modes.cuh)
    cfgs = {{24, 4, 0}, {24, 4, 1}};  // the op's stream kernel; its tiles kernel (packing=1)
    if (const char* v = std::getenv("LAB_KERNELS")) {  // e.g. "1,0,1:20": kernel ids as in Cfg[:warps per SM]
      cfgs.clear();
      for (const char* q = v; *q;) {
        Cfg c{24, 4, std::atoi(q)};
        while (*q && *q != ',' && *q != ':') ++q;
        if (*q == ':') c.wps = std::atoi(++q);  // "1:20": kernel 1, a plan for 20 warps per SM
        cfgs.push_back(c);
        while (*q && *q != ',') ++q;
        if (*q == ',') ++q;
      }
    }
  }
  std::printf("\n%-12s %-44s %8s %8s %8s %8s %8s | %8s %8s %8s\n", "wps minw", "plan gu/down/head tilesxkp/blk/SM",
              "M=1", "M=2", "M=4", "M=8", "M=16", "head M=1", "M=8", "M=16");
  std::printf("(last four columns: us per gate_up launch at M=1, 8 and down at M=1, 8, 4 in a graph; read-only floor %.1f us each)\n",
              Bytes(chain[0]) / 4.4e6);
  for (const Cfg& c : cfgs) {
    Cfg c1 = c;
    Plan pg{}, pd{}, ph{};
    Run(chain[0], x, h1, 1, c1, st, true, &pg);
    Run(chain[1], h1, h2, 1, c1, st, true, &pd);
    Run(head, x, h2, 1, c1, st, true, &ph);
    CK(cudaStreamSynchronize(st));
    bool ok = Check("gate_up", chain[0], c1, st) & Check("down", chain[1], c1, st);
    if (!quick || &c == &cfgs[0]) ok &= Check("lm_head", head, c1, st);
    char label[96], plan[96];
    std::snprintf(label, sizeof label, "%d %d k%d%s", c.wps, c.min_warps, c.repacked, ok ? "" : " FAIL");
    std::snprintf(plan, sizeof plan, "%dx%d/%d/%.2fw %dx%d/%d/%.2fw %dx%d/%.1fw", pg.cut.tiles, pg.cut.kparts,
                  (int)pg.cut.blocks, pg.waves, pd.cut.tiles, pd.cut.kparts, (int)pd.cut.blocks, pd.waves, ph.cut.tiles,
                  ph.cut.kparts, ph.waves);
    std::printf("%-12s %-44s", label, plan);
    for (int M : {1, 2, 4, 8, 16}) {
      if (M > std::min(MaxM(chain[0], c), MaxM(chain[1], c))) {
        std::printf(" %8s", "-");
        continue;
      }
      const double us = TimeGraph(st, [&] {
        const __half* in = x;
        for (int l = 0; l < kLayers; ++l) {
          Run(chain[2 * l], in, h1, M, c1, st, true);
          Run(chain[2 * l + 1], h1, x, M, c1, st, true);
          in = x;
        }
      });
      std::printf(" %5.1f/%2.0f", us, 100.0 * chain_bytes / us / 1e3 / 4200.0);
    }
    std::printf(" |");
    for (int M : {1, 8, 16}) {
      if (M > MaxM(head, c)) {
        std::printf(" %8s", "-");
        continue;
      }
      const double us = TimeGraph(st, [&] { Run(head, x, h2, M, c1, st, true); });
      std::printf(" %5.1f/%2.0f", us, 100.0 * head_bytes / us / 1e3 / 4200.0);
    }
    // One shape at a time: 4 launches of gate_up (or down) on the 4 layers' weights, M = 1 and 8.
    std::printf(" |");
    for (int which : {0, 1}) {
      for (int M : {1, 8}) {
        if (M > MaxM(chain[which], c)) {
          std::printf(" %5s", "-");
          continue;
        }
        const double us = TimeGraph(st, [&] {
          for (int l = 0; l < kLayers; ++l) Run(chain[2 * l + which], which ? h1 : x, which ? x : h1, M, c1, st, true);
        });
        std::printf(" %5.1f", us / kLayers);
      }
    }
    std::printf("\n");
    std::fflush(stdout);
  }
  std::printf("(us / %% of 4.2 TB/s; chain %.0f MB, lm_head %.0f MB)\n", chain_bytes / 1e6, head_bytes / 1e6);

  // Timeline (LAB_TRACE=1, kernel 2's configurations): the 4 layers' gate_up (or down) launches at M=1 in
  // a graph, each block's events (lab::BulkTrace) of the last replay, in us from launch 0's first block
  // start: min / median / max over the blocks; gap: a block's start after the previous launch's block on
  // the same SM stored its last m-tile (one block per SM).
  if (std::getenv("LAB_TRACE")) {
    const int ev = lab::kBulkTraceEvents, per = g_sms * ev;
    unsigned long long* tr;
    CK(cudaMalloc(&tr, (size_t)kLayers * per * 8));
    for (const Cfg& c : cfgs) {
      if (c.repacked != 2) continue;
      for (int which : {0, 1}) {
        CK(cudaMemset(tr, 0, (size_t)kLayers * per * 8));
        TimeGraph(st, [&] {
          for (int l = 0; l < kLayers; ++l) {
            g_trace = tr + (size_t)l * per;
            Run(chain[2 * l + which], which ? h1 : x, which ? x : h1, 1, c, st, true);
          }
          g_trace = nullptr;
        }, 1, 5);
        std::vector<unsigned long long> h((size_t)kLayers * per);
        CK(cudaMemcpy(h.data(), tr, h.size() * 8, cudaMemcpyDeviceToHost));
        unsigned long long t0 = ~0ull;
        for (int b = 0; b < g_sms; ++b) t0 = std::min(t0, h[(size_t)b * ev + lab::kTraceEntry]);
        std::printf("trace k2 %s M=1, us from launch 0's first start: min/median/max over %d blocks\n",
                    which ? "down" : "gate_up", g_sms);
        const char* names[] = {"entry", "sm", "issued", "waited", "acts", "first", "last", "done"};
        for (int l = 0; l < kLayers; ++l) {
          std::printf("  launch %d:", l);
          for (int e = 0; e < ev; ++e) {
            if (e == lab::kTraceSm) continue;
            std::vector<double> v;
            for (int b = 0; b < g_sms; ++b) v.push_back((h[(size_t)l * per + b * ev + e] - (double)t0) / 1e3);
            std::sort(v.begin(), v.end());
            std::printf(" %s %.1f/%.1f/%.1f", names[e], v.front(), v[v.size() / 2], v.back());
          }
          if (l > 0) {
            std::vector<double> gap;
            for (int b = 0; b < g_sms; ++b)
              for (int b2 = 0; b2 < g_sms; ++b2)
                if (h[(size_t)(l - 1) * per + b2 * ev + lab::kTraceSm] == h[(size_t)l * per + b * ev + lab::kTraceSm])
                  gap.push_back((double)(h[(size_t)l * per + b * ev + lab::kTraceEntry] -
                                         h[(size_t)(l - 1) * per + b2 * ev + lab::kTraceDone]) / 1e3);
            std::sort(gap.begin(), gap.end());
            if (!gap.empty()) std::printf(" | gap %.2f/%.2f/%.2f", gap.front(), gap[gap.size() / 2], gap.back());
          }
          // The SMs of the 8 blocks that streamed longest (first stage to last): the same SMs every
          // launch would be slow SMs, not slow blocks.
          std::vector<std::pair<double, int>> span;
          for (int b = 0; b < g_sms; ++b) {
            const unsigned long long* e = &h[(size_t)l * per + b * ev];
            span.push_back({(double)(e[lab::kTraceLastStage] - e[lab::kTraceFirst]) / 1e3, (int)e[lab::kTraceSm]});
          }
          std::sort(span.begin(), span.end());
          std::printf(" | stream %.1f/%.1f/%.1f, longest on SMs", span.front().first, span[span.size() / 2].first,
                      span.back().first);
          for (int i = 0; i < 8; ++i) std::printf(" %d", span[span.size() - 1 - i].second);
          std::printf("\n");
        }
      }
    }
    CK(cudaFree(tr));
  }
  // Balance probe (the first configuration): the same K with N cut to a whole number of blocks per SM
  // (gate_up 16896 = 132 x 128 rows, down 4224 = 132 x 32) against the real N, GB/s per launch. If
  // blocks per SM = 4.12 / 2.42 (real) cost much more per byte than 4 / 2, the tail is the imbalance.
  // Launch probe (LAB_LAUNCH_PROBE=1): the same bytes as 4 launches (the 4 layers' gate_up, or down)
  // and as one launch of a matrix 4x as tall, M = 1, each configuration. If one launch is much faster
  // per byte, the cost is per launch (pipeline ramp and drain at each kernel boundary), not per byte.
  if (std::getenv("LAB_LAUNCH_PROBE")) {
    for (int which : {0, 1}) {
      const int N = which ? kH : kI, K = which ? kI : kH;
      Mat tall = NewMat(4 * N, K, 700 + which);
      CK(cudaDeviceSynchronize());
      for (const Cfg& c : cfgs) {
        const double four = TimeGraph(st, [&] {
          for (int l = 0; l < kLayers; ++l) Run(chain[2 * l + which], which ? h1 : x, which ? x : h1, 1, c, st, true);
        });
        const double one = TimeGraph(st, [&] { Run(tall, which ? h1 : x, h2, 1, c, st, true); });
        Plan pl{};
        Run(tall, which ? h1 : x, h2, 1, c, st, true, &pl);
        std::printf("launch probe k%-3d %-7s 4 launches %6.1f us (%4.0f GB/s) | one launch of %dx%d (%dx%d/%d blocks) %6.1f us (%4.0f GB/s)\n",
                    c.repacked, which ? "down" : "gate_up", four, 4 * Bytes(chain[which]) / four / 1e3, 4 * N, K,
                    pl.cut.tiles, pl.cut.kparts, (int)pl.cut.blocks, one, Bytes(tall) / one / 1e3);
      }
      // The plain streaming read of the same bytes (weights only), 4 launches with PDL and one.
      auto read = [&](const Mat& m) {
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cudaLaunchConfig_t lc{};
        lc.gridDim = dim3(g_sms * 4); lc.blockDim = dim3(256); lc.stream = st; lc.attrs = attr; lc.numAttrs = 1;
        CK(cudaLaunchKernelEx(&lc, ReadKernel, (const uint4*)m.b, (size_t)m.N * m.K / 32, sink, 1));
      };
      const double four = TimeGraph(st, [&] { for (int l = 0; l < kLayers; ++l) read(chain[2 * l + which]); });
      const double one = TimeGraph(st, [&] { read(tall); });
      const double wbytes = (double)N * K / 2;
      std::printf("launch probe read %-7s 4 launches %6.1f us (%4.0f GB/s) | one launch %6.1f us (%4.0f GB/s) (weights only)\n",
                  which ? "down" : "gate_up", four, 4 * wbytes / four / 1e3, one, 4 * wbytes / one / 1e3);
      CK(cudaFree(tall.b)); CK(cudaFree(tall.s)); CK(cudaFree(tall.bp)); CK(cudaFree(tall.sp));
    }
  }
  if (!std::getenv("LAB_NO_BALANCE")) {
    const Cfg c = cfgs[0];
    for (int which : {0, 1}) {
      const int K = which ? kI : kH;
      for (int N : {which ? kH : kI, which ? 4224 : 16896}) {
        std::vector<Mat> ms;
        for (int l = 0; l < kLayers; ++l) ms.push_back(NewMat(N, K, 500 + 10 * which + l));
        Plan pl{};
        Run(ms[0], x, h1, 1, c, st, true, &pl);
        for (int M : {1, 4}) {
          const double us = TimeGraph(st, [&] {
            for (int l = 0; l < kLayers; ++l) Run(ms[l], which ? h1 : x, which ? x : h1, M, c, st, true);
          }) / kLayers;
          std::printf("balance %-7s N=%-6d K=%-6d M=%d: %dx%d, %d blocks (%.2f per SM): %6.1f us, %5.0f GB/s\n",
                      which ? "down" : "gate_up", N, K, M, pl.cut.tiles, pl.cut.kparts, (int)pl.cut.blocks,
                      pl.cut.blocks / (double)g_sms, us,
                      Bytes(ms[0]) / us / 1e3);
        }
        for (auto& m : ms) { CK(cudaFree(m.b)); CK(cudaFree(m.s)); CK(cudaFree(m.bp)); CK(cudaFree(m.sp)); }
      }
    }
  }
  return 0;
}
