// CUDA path of MatMulNBits: picks a kernel for the problem and launches it on the session's stream.
//
//   gemv_mma.cuh      tensor-core kernel, the fast path: fp16/bf16, 4 bits, block 32..256, no or packed
//                     zero points, K a multiple of the chunk (128..512), 16-byte aligned A and B.
//   gemv_simt.cuh     CUDA-core kernel, the fallback fast path (ORT_MTP_GEMV_VARIANT=simt): fp16/bf16,
//                     4 bits, block 32..256, no or packed zero points, K a multiple of 32, aligned A, B.
//   gemv_generic.cuh  every other problem the op accepts (fp32, 8 bits, block 16, typed zero points,
//                     K not a multiple of the block, odd alignment).
//
// The choice, the chunk size and the K-split depend on the weights' shape and layout and on the device,
// never on M, so each row's arithmetic is the same for every M (decode-consistency). No allocation, no
// host synchronisation: launches only, capturable in a CUDA graph.
//
// Knobs, read once per process (for benchmarking the variants in one device run):
//   ORT_MTP_GEMV_VARIANT = mma (default) | simt | generic
//       mma: the tensor-core kernel; simt: the CUDA-core kernel instead; generic: the general kernel
//       for everything (a baseline).
//   ORT_MTP_GEMV_PDL = 1 (default) | 0
//       1: launch the tensor-core kernel with programmatic stream serialization, so its weight
//       prefetch overlaps the previous kernel's tail (only when B, scales and zero points are session
//       constants; device run 2: correct under ORT's CUDA graph, ~10% faster on the chain).
//   ORT_MTP_GEMV_L2_PREFETCH = 256 (default) | 0
//       256: the tensor-core kernel's weight and scale copies ask L2 to fetch whole 256-byte blocks
//       (cp.async .L2::256B): DRAM sees 256-byte runs per weight row instead of the 128 bytes one
//       stage holds, and the row's next stage comes from L2. 0: no hint (the kernel of device run 2).
//   ORT_MTP_GEMV_STAGES = 0 (default: as many as fit) | 2..12
//       an upper bound on the tensor-core kernel's pipeline depth (how many weight bytes a block keeps
//       in flight); a probe of how latency-bound the kernel is, not a tuning knob.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "matmul_nbits/gemv_generic.cuh"
#include "matmul_nbits/gemv_mma.cuh"
#include "matmul_nbits/gemv_simt.cuh"
#include "matmul_nbits/matmul_nbits.h"

namespace ort_mtp {
namespace {

enum class Variant { kMma, kSimt, kGeneric };

struct Options {
  Variant variant = Variant::kMma;
  bool pdl = true;
  bool l2_prefetch = true;
  int max_stages = 0;  // 0: no cap beyond shared memory
  const char* error = nullptr;
};

// An on/off environment switch: unset or empty keeps `value`; anything but `on` / `off` is an error.
void ReadSwitch(const char* name, const char* on, const char* off, const char* message, bool& value,
                const char*& error) {
  const char* v = std::getenv(name);
  if (!v || !*v) return;
  if (!std::strcmp(v, on)) {
    value = true;
  } else if (!std::strcmp(v, off)) {
    value = false;
  } else {
    error = message;
  }
}

Options ReadOptions() {
  Options o;
  if (const char* v = std::getenv("ORT_MTP_GEMV_VARIANT"); v && *v) {
    if (!std::strcmp(v, "mma")) {
      o.variant = Variant::kMma;
    } else if (!std::strcmp(v, "simt")) {
      o.variant = Variant::kSimt;
    } else if (!std::strcmp(v, "generic")) {
      o.variant = Variant::kGeneric;
    } else {
      o.error = "environment variable ORT_MTP_GEMV_VARIANT must be mma, simt or generic";
    }
  }
  ReadSwitch("ORT_MTP_GEMV_PDL", "1", "0", "environment variable ORT_MTP_GEMV_PDL must be 0 or 1", o.pdl, o.error);
  ReadSwitch("ORT_MTP_GEMV_L2_PREFETCH", "256", "0", "environment variable ORT_MTP_GEMV_L2_PREFETCH must be 256 or 0",
             o.l2_prefetch, o.error);
  if (const char* v = std::getenv("ORT_MTP_GEMV_STAGES"); v && *v) {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (*end != '\0' || !(n == 0 || (n >= 2 && n <= gemv::kMmaMaxStages))) {
      o.error = "environment variable ORT_MTP_GEMV_STAGES must be 0 (no cap) or 2..12";
    } else {
      o.max_stages = static_cast<int>(n);
    }
  }
  return o;
}

const Options& GetOptions() {
  static const Options options = ReadOptions();
  return options;
}

struct DeviceInfo {
  int index = 0;  // CUDA device ordinal
  int sm_count = 0;
  int cc_major = 0;
  int smem_per_sm = 0;         // bytes of shared memory per multiprocessor
  int smem_per_block = 0;      // the most one block may opt into
  int smem_reserved = 0;       // bytes the system reserves per resident block
};

// Multiprocessor count, compute capability and shared-memory sizes of the current device, looked up
// once per device.
const char* CurrentDeviceInfo(DeviceInfo& info) {
  constexpr int kMaxDevices = 64;
  static std::mutex mutex;
  static DeviceInfo cache[kMaxDevices];
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  if (device < 0 || device >= kMaxDevices) return "CUDA device index out of range";
  std::lock_guard<std::mutex> lock(mutex);
  DeviceInfo& d = cache[device];
  if (d.sm_count == 0) {
    DeviceInfo n;
    const std::pair<int*, cudaDeviceAttr> attrs[] = {
        {&n.sm_count, cudaDevAttrMultiProcessorCount},
        {&n.cc_major, cudaDevAttrComputeCapabilityMajor},
        {&n.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor},
        {&n.smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin},
        {&n.smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock}};
    for (const auto& [dst, attr] : attrs)
      if ((err = cudaDeviceGetAttribute(dst, attr, device)) != cudaSuccess) return cudaGetErrorString(err);
    d = n;
  }
  info = d;
  info.index = device;
  return nullptr;
}

bool Aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

// --- tensor-core path -------------------------------------------------------------------------------

// How the tensor-core kernel cuts a problem. Everything here is chosen from the weights' shape and
// layout and the device; M plays no part. Only `kc` and `splits` shape the arithmetic of a result
// (the K-split and its rank-order sum); the row ranges and warps decide which block computes a row.
struct MmaPlan {
  int device = 0;          // CUDA device ordinal (< 64, see CurrentDeviceInfo)
  int kc = 0;              // k-values per pipeline stage (chunk)
  int splits = 1;          // K-slices per row range = cluster size
  int rows_per_block = 0;  // rows of one row range
  int row_blocks = 0;      // row ranges: ceil(N / rows_per_block)
  int warps = 0;           // warps per block: ceil(rows_per_block / 16) <= kMmaMaxWarps
};

// Blocks per multiprocessor the plan aims at: two blocks of up to 8 warps (16 warps, 128 registers
// each) whose pipelines share the SM's shared memory.
constexpr int kMmaBlocksPerSm = 2;

// The work decomposition (bench/NOTES.md, version 2). Device run 2 measured ~11 GB/s per resident
// block whatever the shape: the layer-sized matrices, cut into 128-row tiles, left most multiprocessors
// with one block (37% of the copy ceiling) while the 1940-tile lm_head ran two per SM (71%). So:
//   * one wave of kMmaBlocksPerSm blocks on every SM: for a cluster size s in {1, 2, 4, 8} (a split
//     keeps >= 2 chunks per slice; clusters need sm_90), slots / s row ranges of balanced size
//     ceil(N / (slots / s)) rows, at least 16 (not rounded to 16: rows past a range are zero-filled,
//     so the bytes per block stay equal), W = ceil(rows / 16) warps; the largest s whose ranges need
//     <= 8 warps: the most warps (parallel 16-row x K-slice pieces) the wave can hold;
//   * N too large for one wave of 8-warp blocks (the lm_head): whole waves of equal ranges, no split.
// The pipeline depth is then chosen per kernel at launch (StagesFor): it changes no result.
bool PlanMma(const MatMulNBitsProblem& p, const DeviceInfo& dev, MmaPlan& plan) {
  if (p.type == ElemType::kFloat32 || p.bits != 4 || dev.cc_major < 8) return false;
  if (p.zp_kind == ZeroPointKind::kTyped) return false;
  const int bs = p.block_size;
  if (bs != 32 && bs != 64 && bs != 128 && bs != 256) return false;
  int kc = 0;
  if (bs <= 64) {
    kc = p.K % 256 == 0 ? 256 : (p.K % 128 == 0 ? 128 : 0);
  } else {
    kc = 2 * bs;
    if (p.K % kc != 0) kc = 0;
  }
  if (kc == 0) return false;
  const int scale_bytes = 2 * (kc / bs);
  if (!Aligned(p.a, 16) || !Aligned(p.b, 16) || !Aligned(p.scales, scale_bytes)) return false;
  if (p.K > (1 << 30) || p.N > (1 << 30)) return false;

  const int64_t N = p.N;
  const int64_t kchunks = p.K / kc;
  const int64_t slots = static_cast<int64_t>(kMmaBlocksPerSm) * dev.sm_count;
  int best_splits = 0;
  int64_t best_rows = 0, best_warps = 0;
  for (int s = 1; s <= 8; s *= 2) {
    if (s > 1 && (dev.cc_major < 9 || kchunks < 2 * s)) break;
    const int64_t ranges = std::max<int64_t>(1, slots / s);
    const int64_t rows = std::max<int64_t>(16, (N + ranges - 1) / ranges);
    const int64_t warps = (rows + 15) / 16;
    if (warps > gemv::kMmaMaxWarps) break;  // larger s: longer ranges still
    best_splits = s;
    best_rows = rows;
    best_warps = warps;
  }
  if (best_splits == 0) {  // more rows than one wave of 8-warp blocks holds: whole waves, no split
    const int64_t wave_rows = 16LL * gemv::kMmaMaxWarps * slots;
    const int64_t ranges = slots * ((N + wave_rows - 1) / wave_rows);
    best_splits = 1;
    best_rows = (N + ranges - 1) / ranges;
    best_warps = (best_rows + 15) / 16;
  }
  plan.device = dev.index;
  plan.kc = kc;
  plan.splits = best_splits;
  plan.rows_per_block = static_cast<int>(best_rows);
  plan.row_blocks = static_cast<int>((N + best_rows - 1) / best_rows);
  plan.warps = static_cast<int>(best_warps);
  return true;
}

// Pipeline depth for a kernel: as many stages as fit in the block's share of the SM's shared memory
// (kMmaBlocksPerSm blocks per SM; one if two cannot hold two stages each), at most one more than the
// longest K-slice has chunks, at most `max_stages` when set. Returns 0 if not even two stages fit.
int StagesFor(int stage_bytes, int red_bytes, const MmaPlan& plan, int64_t kchunks, const DeviceInfo& dev,
              int max_stages) {
  for (int per_sm = kMmaBlocksPerSm; per_sm >= 1; --per_sm) {
    const int budget = std::min(dev.smem_per_block, dev.smem_per_sm / per_sm - dev.smem_reserved);
    int stages = std::min(budget / stage_bytes, gemv::kMmaMaxStages);
    const int64_t slice = (kchunks + plan.splits - 1) / plan.splits;
    stages = static_cast<int>(std::min<int64_t>(stages, slice + 1));
    if (max_stages > 0) stages = std::min(stages, max_stages);
    while (stages >= 2 && stages * stage_bytes < red_bytes) ++stages;  // the epilogue's buffer must fit
    if (stages >= 2 && stages * stage_bytes <= budget) return stages;
  }
  return 0;
}

template <typename T, int kBS, int kKC, bool kZp, int kNT>
const char* LaunchMma(const MatMulNBitsProblem& p, const MmaPlan& plan, const DeviceInfo& dev, const Options& opt,
                      bool pdl, cudaStream_t stream) {
  using Cfg = gemv::MmaConfig<kBS, kKC, kNT>;
  auto kernel = gemv::GemvMmaKernel<T, kBS, kKC, kZp, kNT>;
  // The kernel's shared-memory limit, raised once per device: not on every call, because a call may
  // come while ORT captures a CUDA graph, and only stream work belongs in a capture.
  static std::atomic<uint64_t> configured{0};  // bit d: done on device d
  const uint64_t bit = uint64_t{1} << plan.device;
  if (!(configured.load(std::memory_order_acquire) & bit)) {
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dev.smem_per_block);
    if (err == cudaSuccess)  // a preference: the most shared memory (the kernel keeps nothing in L1)
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
    if (err != cudaSuccess) return cudaGetErrorString(err);
    configured.fetch_or(bit, std::memory_order_acq_rel);
  }
  const int stage_bytes = Cfg::StageBytes(plan.warps);
  const int stages = StagesFor(stage_bytes, Cfg::RedBytes(plan.warps), plan, p.K / kKC, dev, opt.max_stages);
  if (stages < 2) return "internal error: the tensor-core kernel's pipeline does not fit in shared memory";

  gemv::MmaParams prm{};
  prm.b = p.b;
  prm.scales = p.scales;
  prm.zero_points = static_cast<const uint8_t*>(p.zero_points);
  prm.bias = p.bias;
  prm.N = static_cast<int>(p.N);
  prm.K = static_cast<int>(p.K);
  prm.k_blocks = static_cast<int>(p.k_blocks);
  prm.zp_row_bytes = static_cast<int>(p.zp_row_bytes);
  prm.kchunks = static_cast<int>(p.K / kKC);
  prm.splits = plan.splits;
  prm.rows_per_block = plan.rows_per_block;
  prm.stages = stages;
  prm.pdl = pdl ? 1 : 0;
  prm.l2_prefetch = opt.l2_prefetch ? 1 : 0;

  cudaLaunchAttribute attrs[2];
  int n_attrs = 0;
  if (plan.splits > 1) {
    attrs[n_attrs].id = cudaLaunchAttributeClusterDimension;
    attrs[n_attrs].val.clusterDim.x = static_cast<unsigned>(plan.splits);
    attrs[n_attrs].val.clusterDim.y = 1;
    attrs[n_attrs].val.clusterDim.z = 1;
    ++n_attrs;
  }
  if (pdl) {
    attrs[n_attrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n_attrs].val.programmaticStreamSerializationAllowed = 1;
    ++n_attrs;
  }

  // Token groups go on grid.y (at most 65535 per launch; larger M takes several launches).
  constexpr int64_t kMaxGroups = 65535;
  const int64_t groups = (p.M + Cfg::kTokens - 1) / Cfg::kTokens;
  for (int64_t g0 = 0; g0 < groups; g0 += kMaxGroups) {
    const int64_t m0 = g0 * Cfg::kTokens;
    const int64_t rows = std::min<int64_t>(p.M - m0, kMaxGroups * Cfg::kTokens);
    prm.a = static_cast<const T*>(p.a) + m0 * p.K;
    prm.y = static_cast<T*>(p.y) + m0 * p.N;
    prm.M = static_cast<int>(rows);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(plan.row_blocks * plan.splits),
                       static_cast<unsigned>((rows + Cfg::kTokens - 1) / Cfg::kTokens), 1);
    cfg.blockDim = dim3(static_cast<unsigned>(32 * plan.warps), 1, 1);
    cfg.dynamicSmemBytes = static_cast<size_t>(stages) * stage_bytes;
    cfg.stream = stream;
    cfg.attrs = attrs;
    cfg.numAttrs = n_attrs;
    const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, prm);
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  return nullptr;
}

template <typename T, int kBS, int kKC, bool kZp>
const char* DispatchTokens(const MatMulNBitsProblem& p, const MmaPlan& plan, const DeviceInfo& dev,
                           const Options& opt, bool pdl, cudaStream_t s) {
  // 8 or 16 tokens per pass: the token tile changes which mma column a row lands in, not its result.
  return p.M > 8 ? LaunchMma<T, kBS, kKC, kZp, 2>(p, plan, dev, opt, pdl, s)
                 : LaunchMma<T, kBS, kKC, kZp, 1>(p, plan, dev, opt, pdl, s);
}

template <typename T, int kBS, int kKC>
const char* DispatchZp(const MatMulNBitsProblem& p, const MmaPlan& plan, const DeviceInfo& dev, const Options& opt,
                       bool pdl, cudaStream_t s) {
  return p.zp_kind == ZeroPointKind::kPacked ? DispatchTokens<T, kBS, kKC, true>(p, plan, dev, opt, pdl, s)
                                             : DispatchTokens<T, kBS, kKC, false>(p, plan, dev, opt, pdl, s);
}

template <typename T>
const char* DispatchMma(const MatMulNBitsProblem& p, const MmaPlan& plan, const DeviceInfo& dev, const Options& opt,
                        bool pdl, cudaStream_t s) {
  switch (p.block_size) {
    case 32: return plan.kc == 256 ? DispatchZp<T, 32, 256>(p, plan, dev, opt, pdl, s)
                                   : DispatchZp<T, 32, 128>(p, plan, dev, opt, pdl, s);
    case 64: return plan.kc == 256 ? DispatchZp<T, 64, 256>(p, plan, dev, opt, pdl, s)
                                   : DispatchZp<T, 64, 128>(p, plan, dev, opt, pdl, s);
    case 128: return DispatchZp<T, 128, 256>(p, plan, dev, opt, pdl, s);
    case 256: return DispatchZp<T, 256, 512>(p, plan, dev, opt, pdl, s);
  }
  return "internal error: block size without a tensor-core kernel";
}

// --- CUDA-core fallback path ------------------------------------------------------------------------

// Whether the CUDA-core kernel takes the problem. M plays no part.
bool PlanSimt(const MatMulNBitsProblem& p) {
  if (p.type == ElemType::kFloat32 || p.bits != 4 || p.zp_kind == ZeroPointKind::kTyped) return false;
  const int bs = p.block_size;
  if (bs != 32 && bs != 64 && bs != 128 && bs != 256) return false;
  if (p.K % 32 != 0 || !Aligned(p.a, 16) || !Aligned(p.b, 16)) return false;
  return p.K <= (1 << 30) && p.N <= (1 << 30);
}

template <typename T, int kTok>
const char* LaunchSimt(const MatMulNBitsProblem& p, cudaStream_t stream) {
  gemv::SimtParams prm{};
  prm.b = p.b;
  prm.scales = p.scales;
  prm.zero_points = p.zp_kind == ZeroPointKind::kPacked ? static_cast<const uint8_t*>(p.zero_points) : nullptr;
  prm.bias = p.bias;
  prm.N = static_cast<int>(p.N);
  prm.K = static_cast<int>(p.K);
  prm.k_blocks = static_cast<int>(p.k_blocks);
  prm.row_bytes = p.k_blocks * p.block_bytes;
  prm.zp_row_bytes = static_cast<int>(p.zp_row_bytes);
  prm.chunk_shift = p.block_size == 32 ? 0 : p.block_size == 64 ? 1 : p.block_size == 128 ? 2 : 3;
  auto kernel = gemv::GemvSimtKernel<T, kTok>;
  constexpr int64_t kMaxGroups = 65535;
  const int64_t groups = (p.M + kTok - 1) / kTok;
  for (int64_t g0 = 0; g0 < groups; g0 += kMaxGroups) {
    const int64_t m0 = g0 * kTok;
    const int64_t rows = std::min<int64_t>(p.M - m0, kMaxGroups * kTok);
    prm.a = static_cast<const T*>(p.a) + m0 * p.K;
    prm.y = static_cast<T*>(p.y) + m0 * p.N;
    prm.M = static_cast<int>(rows);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>((p.N + gemv::kSimtRows - 1) / gemv::kSimtRows),
                       static_cast<unsigned>((rows + kTok - 1) / kTok), 1);
    cfg.blockDim = dim3(32 * gemv::kSimtWarps, 1, 1);
    cfg.stream = stream;
    const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, prm);
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  return nullptr;
}

// Tokens per pass from M: which tokens share a pass, not what any token's result is. At most 8: with
// 16 the kernel needs 254 registers (2 blocks per SM), and from M = 4 on it is bound by the FMA rate
// anyway, so a second pass over the weights costs little.
template <typename T>
const char* DispatchSimt(const MatMulNBitsProblem& p, cudaStream_t s) {
  if (p.M <= 1) return LaunchSimt<T, 1>(p, s);
  if (p.M <= 2) return LaunchSimt<T, 2>(p, s);
  if (p.M <= 4) return LaunchSimt<T, 4>(p, s);
  return LaunchSimt<T, 8>(p, s);
}

// --- general path -----------------------------------------------------------------------------------

template <typename T, int kBits, ZeroPointKind kZk>
const char* LaunchGeneric(const MatMulNBitsProblem& p, cudaStream_t stream) {
  gemv::GenericParams prm{};
  prm.b = p.b;
  prm.scales = p.scales;
  prm.zero_points = p.zero_points;
  prm.bias = p.bias;
  prm.N = static_cast<int>(p.N);
  prm.K = static_cast<int>(p.K);
  prm.block_size = p.block_size;
  prm.k_blocks = static_cast<int>(p.k_blocks);
  prm.block_bytes = static_cast<int>(p.block_bytes);
  prm.zp_row_bytes = static_cast<int>(p.zp_row_bytes);
  auto kernel = gemv::GemvGenericKernel<T, kBits, kZk>;
  constexpr int64_t kMaxGroups = 65535;
  const int64_t groups = (p.M + gemv::kGenericTokens - 1) / gemv::kGenericTokens;
  for (int64_t g0 = 0; g0 < groups; g0 += kMaxGroups) {
    const int64_t m0 = g0 * gemv::kGenericTokens;
    const int64_t rows = std::min<int64_t>(p.M - m0, kMaxGroups * gemv::kGenericTokens);
    prm.a = static_cast<const T*>(p.a) + m0 * p.K;
    prm.y = static_cast<T*>(p.y) + m0 * p.N;
    prm.M = static_cast<int>(rows);
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>((p.N + gemv::kGenericWarps - 1) / gemv::kGenericWarps),
                       static_cast<unsigned>((rows + gemv::kGenericTokens - 1) / gemv::kGenericTokens), 1);
    cfg.blockDim = dim3(32 * gemv::kGenericWarps, 1, 1);
    cfg.stream = stream;
    const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, prm);
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  return nullptr;
}

template <typename T, int kBits>
const char* DispatchGenericZp(const MatMulNBitsProblem& p, cudaStream_t s) {
  switch (p.zp_kind) {
    case ZeroPointKind::kNone: return LaunchGeneric<T, kBits, ZeroPointKind::kNone>(p, s);
    case ZeroPointKind::kPacked: return LaunchGeneric<T, kBits, ZeroPointKind::kPacked>(p, s);
    case ZeroPointKind::kTyped: return LaunchGeneric<T, kBits, ZeroPointKind::kTyped>(p, s);
  }
  return "internal error: unknown zero-point kind";
}

template <typename T>
const char* DispatchGeneric(const MatMulNBitsProblem& p, cudaStream_t s) {
  return p.bits == 8 ? DispatchGenericZp<T, 8>(p, s) : DispatchGenericZp<T, 4>(p, s);
}

}  // namespace

const char* MatMulNBitsCuda(const MatMulNBitsProblem& p, void* stream) {
  const Options& options = GetOptions();
  if (options.error) return options.error;
  if (p.M <= 0) return nullptr;
  if (p.K > (1LL << 30) || p.N > (1LL << 30)) return "K and N above 2^30 are not supported by the CUDA kernels";
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  DeviceInfo dev;
  if (const char* error = CurrentDeviceInfo(dev)) return error;

  if (options.variant == Variant::kSimt && PlanSimt(p)) {
    return p.type == ElemType::kFloat16 ? DispatchSimt<__half>(p, s) : DispatchSimt<__nv_bfloat16>(p, s);
  }
  MmaPlan plan;
  if (options.variant == Variant::kMma && PlanMma(p, dev, plan)) {
    const bool pdl = options.pdl && dev.cc_major >= 9 && p.weights_constant;
    return p.type == ElemType::kFloat16 ? DispatchMma<__half>(p, plan, dev, options, pdl, s)
                                        : DispatchMma<__nv_bfloat16>(p, plan, dev, options, pdl, s);
  }
  switch (p.type) {
    case ElemType::kFloat32: return DispatchGeneric<float>(p, s);
    case ElemType::kFloat16: return DispatchGeneric<__half>(p, s);
    case ElemType::kBFloat16: return DispatchGeneric<__nv_bfloat16>(p, s);
  }
  return "internal error: unknown element type";
}

}  // namespace ort_mtp
