// CUDA path of MatMulNBits: picks a kernel for the problem and launches it on the session's stream.
//
//   gemv_tiles.cuh    tensor-core kernel for weights in the tiles layout (packing=1), the only kernel
//                     for them: fp16/bf16, 4 bits, block 32..128, no zero points, 16-byte aligned A, B
//                     and scales.
//   gemv_stream.cuh   tensor-core kernel, the fast path: fp16/bf16, 4 bits, block 32..256, no or packed
//                     zero points, K a multiple of the chunk (128..512), 16-byte aligned A and B.
//   gemv_generic.cuh  every other problem the op accepts (fp32, 8 bits, block 16, typed zero points,
//                     K not a multiple of the block, odd alignment).
//
// The choice, the chunk size and the K-split depend on the weights' shape and layout and on the device,
// never on M, so each row's arithmetic is the same for every M (decode-consistency). No allocation, no
// host synchronisation: launches only, capturable in a CUDA graph. Every GPU the library builds for
// (sm_80 and sm_90 machine code, newer GPUs through compute_90 PTX) runs the tensor-core kernels:
// mma.sync, ldmatrix and cp.async need sm_80, and only programmatic dependent launch (griddepcontrol)
// needs sm_90, which is checked at launch. Why each kernel is built as it is: docs/kernels.md.
//
// Knobs, read once per process (for benchmarking the variants in one device run):
//   ORT_MTP_GEMV_VARIANT = mma (default) | generic
//       mma: the tensor-core kernel; generic: the general kernel for everything (a baseline). Weights
//       in the tiles layout always take gemv_tiles.cuh.
//   ORT_MTP_GEMV_PDL = 1 (default) | 0
//       1: launch the tensor-core kernel with programmatic stream serialization, so its weight
//       prefetch overlaps the previous kernel's tail (only when B, scales and zero points are session
//       constants).
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "matmul_nbits/gemv_generic.cuh"
#include "matmul_nbits/gemv_stream.cuh"
#include "matmul_nbits/gemv_tiles.cuh"
#include "matmul_nbits/matmul_nbits.h"

namespace ort_mtp {
namespace {

enum class Variant { kMma, kGeneric };

struct Options {
  Variant variant = Variant::kMma;
  bool pdl = true;
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
    } else if (!std::strcmp(v, "generic")) {
      o.variant = Variant::kGeneric;
    } else {
      o.error = "environment variable ORT_MTP_GEMV_VARIANT must be mma or generic";
    }
  }
  ReadSwitch("ORT_MTP_GEMV_PDL", "1", "0", "environment variable ORT_MTP_GEMV_PDL must be 0 or 1", o.pdl, o.error);
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
  int smem_per_block = 0;  // bytes of shared memory one block may opt into
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
        {&n.smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin}};
    for (const auto& [dst, attr] : attrs)
      if ((err = cudaDeviceGetAttribute(dst, attr, device)) != cudaSuccess) return cudaGetErrorString(err);
    d = n;
  }
  info = d;
  info.index = device;
  return nullptr;
}

bool Aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

// The problem's fields that every kernel reads; A, Y and M are set per token slice (LaunchSlices).
void FillOperands(const MatMulNBitsProblem& p, gemv::GemvOperands& o) {
  o.b = p.b;
  o.scales = p.scales;
  o.zero_points = p.zp_kind == ZeroPointKind::kNone ? nullptr : p.zero_points;
  o.bias = p.bias;
  o.N = static_cast<int>(p.N);
  o.K = static_cast<int>(p.K);
  o.k_blocks = static_cast<int>(p.k_blocks);
  o.zp_row_bytes = static_cast<int>(p.zp_row_bytes);
  o.swiglu = p.swiglu_over_y ? 1 : 0;
}

// Launches `kernel` over M in slices of at most 65535 groups of `tokens` tokens (grid.y's limit; only
// a prefill that long takes more than one): prm's A, Y and M are set to the slice, grid.y to its
// token groups; the rest of `cfg` (grid.x, block, shared memory, stream, attributes) is the caller's.
template <typename T, typename Params>
const char* LaunchSlices(const MatMulNBitsProblem& p, int tokens, void (*kernel)(Params), Params& prm,
                         cudaLaunchConfig_t cfg) {
  constexpr int64_t kMaxGroups = 65535;
  const int64_t groups = (p.M + tokens - 1) / tokens;
  for (int64_t g0 = 0; g0 < groups; g0 += kMaxGroups) {
    const int64_t m0 = g0 * tokens;
    const int64_t rows = std::min<int64_t>(p.M - m0, kMaxGroups * tokens);
    prm.a = static_cast<const T*>(p.a) + m0 * p.K;
    prm.y = static_cast<T*>(p.y) + m0 * p.N;
    prm.M = static_cast<int>(rows);
    cfg.gridDim.y = static_cast<unsigned>((rows + tokens - 1) / tokens);
    const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, prm);
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  return nullptr;
}

// --- tensor-core path -------------------------------------------------------------------------------

// How the tensor-core kernel cuts a problem: from the weights' shape and layout and the device only,
// never M. Only kc and a row's K-parts (kparts, or alt_kparts in the alt blocks of a two-shape cut)
// shape the arithmetic of a result (the K-split and its in-order sum); the m-tiles per block decide
// which block computes a row, not how.
struct StreamPlan {
  int kc = 0;  // k-values per pipeline stage (chunk)
  gemv::StreamCut cut;
};

// What the plan aims at (docs/kernels.md#k-split): ~24 resident warps per SM (more K-parts -> more
// warps, each with fewer chunks), blocks of at least 4 warps, and the whole grid in one wave where N
// allows (a cut of the chain's down matrix that needed a second wave ran ~24% slower).
constexpr int kStreamWarpsPerSm = 24;
constexpr int kStreamMinBlockWarps = 4;

// The chunk size for a block size and K, or 0 if the tensor-core kernel does not take the problem.
int StreamChunk(int block_size, int64_t K) {
  switch (block_size) {
    case 32:
    case 64: return K % 256 == 0 ? 256 : (K % 128 == 0 ? 128 : 0);
    case 128: return K % 256 == 0 ? 256 : 0;
    case 256: return K % 512 == 0 ? 512 : 0;
  }
  return 0;
}

bool TakesStream(const MatMulNBitsProblem& p, const DeviceInfo& dev) {
  if (p.type == FloatType::kFloat32 || p.bits != 4 || dev.cc_major < 8) return false;
  if (p.zp_kind == ZeroPointKind::kTyped) return false;
  const int kc = StreamChunk(p.block_size, p.K);
  if (kc == 0) return false;
  const int scale_bytes = 2 * (kc / p.block_size);
  return Aligned(p.a, 16) && Aligned(p.b, 16) && Aligned(p.scales, scale_bytes);
}

// Blocks of `warps` warps (and their shared memory) that fit on one SM, for the 8-token kernel:
// looked up once per (device, block size).
template <typename Kernel>
const char* ResidentBlocks(Kernel kernel, int device, int warps, int smem, int& blocks) {
  static std::atomic<int> cache[64][gemv::kStreamMaxWarps + 1];  // 0: not looked up yet
  std::atomic<int>& slot = cache[device][warps];
  blocks = slot.load(std::memory_order_acquire);
  if (blocks > 0) return nullptr;
  const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, 32 * warps, smem);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  blocks = std::max(blocks, 1);
  slot.store(blocks, std::memory_order_release);
  return nullptr;
}

// The kernel's shared-memory limit, raised once per device: not on every call, because a call may
// come while ORT captures a CUDA graph, and only stream work belongs in a capture.
template <typename Kernel>
const char* ConfigureOnce(Kernel kernel, std::atomic<uint64_t>& configured, const DeviceInfo& dev) {
  const uint64_t bit = uint64_t{1} << dev.index;
  if (configured.load(std::memory_order_acquire) & bit) return nullptr;
  // No shared-memory carveout preference: the driver's default leaves the rest of the 256 KB to L1,
  // where the activations every warp reads are cached. Asking for the most shared memory (100) cost
  // 2% at M = 1 and 7% at M = 8 on the chain (docs/kernels.md#warp-pipelines).
  const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, dev.smem_per_block);
  if (err != cudaSuccess) return cudaGetErrorString(err);
  configured.fetch_or(bit, std::memory_order_acq_rel);
  return nullptr;
}

// The cut of gemv::CutStream with this op's constants, residency from the 8-token kernel whatever M
// is, so the K-split never depends on M.
template <typename T, int kBS, int kKC, bool kZp>
const char* PlanStream(const MatMulNBitsProblem& p, const DeviceInfo& dev, StreamPlan& plan) {
  using Cfg = gemv::StreamConfig<kBS, kKC, 1>;
  auto kernel8 = gemv::GemvStreamKernel<T, kBS, kKC, 1, kZp>;
  static std::atomic<uint64_t> configured{0};
  if (const char* error = ConfigureOnce(kernel8, configured, dev)) return error;
  plan.kc = kKC;
  return gemv::CutStream(
      (p.N + 15) / 16, p.K / kKC, dev.sm_count, kStreamWarpsPerSm, kStreamMinBlockWarps,
      [&](int warps, int& per_sm) {
        return ResidentBlocks(kernel8, dev.index, warps, warps * Cfg::kWarpBytes, per_sm);
      },
      plan.cut);
}

// Launches a stream or tiles kernel (configured by the caller) over a cut: the cut's fields, PDL,
// token slices of `tokens` tokens, warp_bytes of shared memory per warp.
template <typename T>
const char* LaunchCut(const MatMulNBitsProblem& p, const gemv::StreamCut& cut, int64_t kchunks, int warp_bytes,
                      int tokens, void (*kernel)(gemv::StreamParams), bool pdl, cudaStream_t stream) {
  gemv::StreamParams prm{};
  FillOperands(p, prm);
  prm.kchunks = static_cast<int>(kchunks);
  prm.kparts = cut.kparts;
  prm.rows_per_block = 16 * cut.tiles;
  prm.alt_blocks = static_cast<int>(cut.alt_blocks);
  prm.alt_kparts = cut.alt_kparts;
  prm.alt_rows = 16 * cut.alt_tiles;
  prm.pdl = pdl ? 1 : 0;

  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  const int warps = cut.tiles * cut.kparts;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(cut.blocks), 1, 1);
  cfg.blockDim = dim3(static_cast<unsigned>(32 * warps), 1, 1);
  cfg.dynamicSmemBytes = static_cast<size_t>(warps) * warp_bytes;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return LaunchSlices<T>(p, tokens, kernel, prm, cfg);
}

template <typename T, int kBS, int kKC, bool kZp, int kNT, bool kActRing = false>
const char* LaunchStream(const MatMulNBitsProblem& p, const StreamPlan& plan, const DeviceInfo& dev, bool pdl,
                         cudaStream_t stream) {
  using Cfg = gemv::StreamConfig<kBS, kKC, kNT, kActRing>;
  auto kernel = gemv::GemvStreamKernel<T, kBS, kKC, kNT, kZp, kActRing>;
  static std::atomic<uint64_t> configured{0};
  if (const char* error = ConfigureOnce(kernel, configured, dev)) return error;
  return LaunchCut<T>(p, plan.cut, p.K / kKC, Cfg::kWarpBytes, Cfg::kTokens, kernel, pdl, stream);
}

template <typename T, int kBS, int kKC, bool kZp>
const char* DispatchStreamPlan(const MatMulNBitsProblem& p, const DeviceInfo& dev, bool pdl, cudaStream_t s) {
  StreamPlan plan;
  if (const char* error = PlanStream<T, kBS, kKC, kZp>(p, dev, plan)) return error;
  // 8 or 16 tokens per pass: the token tile changes which mma column a row lands in, not its result.
  // One token takes its activations through the ring (gemv::RingActivations): the same arithmetic, on
  // the same cut, with a larger stage.
  if (p.M == 1) return LaunchStream<T, kBS, kKC, kZp, 1, true>(p, plan, dev, pdl, s);
  return p.M > 8 ? LaunchStream<T, kBS, kKC, kZp, 2>(p, plan, dev, pdl, s)
                 : LaunchStream<T, kBS, kKC, kZp, 1>(p, plan, dev, pdl, s);
}

template <typename T, int kBS, int kKC>
const char* DispatchStreamZp(const MatMulNBitsProblem& p, const DeviceInfo& dev, bool pdl, cudaStream_t s) {
  return p.zp_kind == ZeroPointKind::kPacked ? DispatchStreamPlan<T, kBS, kKC, true>(p, dev, pdl, s)
                                             : DispatchStreamPlan<T, kBS, kKC, false>(p, dev, pdl, s);
}

template <typename T>
const char* DispatchStream(const MatMulNBitsProblem& p, const DeviceInfo& dev, bool pdl, cudaStream_t s) {
  const int kc = StreamChunk(p.block_size, p.K);
  switch (p.block_size) {
    case 32: return kc == 256 ? DispatchStreamZp<T, 32, 256>(p, dev, pdl, s) : DispatchStreamZp<T, 32, 128>(p, dev, pdl, s);
    case 64: return kc == 256 ? DispatchStreamZp<T, 64, 256>(p, dev, pdl, s) : DispatchStreamZp<T, 64, 128>(p, dev, pdl, s);
    case 128: return DispatchStreamZp<T, 128, 256>(p, dev, pdl, s);
    case 256: return DispatchStreamZp<T, 256, 512>(p, dev, pdl, s);
  }
  return "internal error: block size without a tensor-core kernel";
}

// --- tiles layout (packing=1) -----------------------------------------------------------------------

// The tiles kernel's cut: gemv::CutStream with the stream kernel's constants, residency from the
// 8-token tiles kernel whatever M is.
template <typename T, int kBS>
const char* PlanTiles(const MatMulNBitsProblem& p, const DeviceInfo& dev, gemv::StreamCut& cut) {
  using Cfg = gemv::TilesConfig<kBS>;
  auto kernel8 = gemv::GemvTilesKernel<T, kBS, 1>;
  static std::atomic<uint64_t> configured{0};
  if (const char* error = ConfigureOnce(kernel8, configured, dev)) return error;
  return gemv::CutStream(
      p.N / kTileRows, p.K / kTileK, dev.sm_count, kStreamWarpsPerSm, kStreamMinBlockWarps,
      [&](int warps, int& per_sm) {
        return ResidentBlocks(kernel8, dev.index, warps, warps * Cfg::kWarpBytes, per_sm);
      },
      cut);
}

template <typename T, int kBS, int kNT, bool kActRing = false>
const char* LaunchTiles(const MatMulNBitsProblem& p, const gemv::StreamCut& cut, const DeviceInfo& dev, bool pdl,
                        cudaStream_t stream) {
  auto kernel = gemv::GemvTilesKernel<T, kBS, kNT, kActRing>;
  static std::atomic<uint64_t> configured{0};
  if (const char* error = ConfigureOnce(kernel, configured, dev)) return error;
  return LaunchCut<T>(p, cut, p.K / kTileK, gemv::TilesConfig<kBS, kActRing>::kWarpBytes, 8 * kNT, kernel, pdl,
                      stream);
}

template <typename T, int kBS>
const char* DispatchTilesPlan(const MatMulNBitsProblem& p, const DeviceInfo& dev, bool pdl, cudaStream_t s) {
  gemv::StreamCut cut;
  if (const char* error = PlanTiles<T, kBS>(p, dev, cut)) return error;
  // 8 or 16 tokens per pass: the token tile changes which mma column a row lands in, not its result.
  // One token takes its activations through the ring (gemv::RingActivations): the same arithmetic, on
  // the same cut, with a larger stage.
  if (p.M == 1) return LaunchTiles<T, kBS, 1, true>(p, cut, dev, pdl, s);
  return p.M > 8 ? LaunchTiles<T, kBS, 2>(p, cut, dev, pdl, s) : LaunchTiles<T, kBS, 1>(p, cut, dev, pdl, s);
}

// The op has checked the layout's shape rules (bits, block size, K, N, type, no zero points); what
// is left is the device and the buffers' alignment, which no other kernel could make up for.
template <typename T>
const char* DispatchTiles(const MatMulNBitsProblem& p, const DeviceInfo& dev, bool pdl, cudaStream_t s) {
  if (dev.cc_major < 8) return "packing=1 (tiles) needs a GPU of compute capability 8.0 or newer";
  if (!Aligned(p.a, 16) || !Aligned(p.b, 16) || !Aligned(p.scales, 16))
    return "packing=1 (tiles) needs A, B and scales 16-byte aligned";
  switch (p.block_size) {
    case 32: return DispatchTilesPlan<T, 32>(p, dev, pdl, s);
    case 64: return DispatchTilesPlan<T, 64>(p, dev, pdl, s);
    case 128: return DispatchTilesPlan<T, 128>(p, dev, pdl, s);
  }
  return "internal error: block size without a tiles kernel";
}

// --- general path -----------------------------------------------------------------------------------

template <typename T, int kBits, ZeroPointKind kZk>
const char* LaunchGeneric(const MatMulNBitsProblem& p, cudaStream_t stream) {
  gemv::GenericParams prm{};
  FillOperands(p, prm);
  prm.block_size = p.block_size;
  prm.block_bytes = static_cast<int>(p.block_bytes);
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>((p.N + gemv::kGenericWarps - 1) / gemv::kGenericWarps), 1, 1);
  cfg.blockDim = dim3(32 * gemv::kGenericWarps, 1, 1);
  cfg.stream = stream;
  return LaunchSlices<T>(p, gemv::kGenericTokens, gemv::GemvGenericKernel<T, kBits, kZk>, prm, cfg);
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

  if (p.layout == WeightLayout::kTiles) {
    const bool pdl = options.pdl && dev.cc_major >= 9 && p.weights_constant;
    return p.type == FloatType::kFloat16 ? DispatchTiles<__half>(p, dev, pdl, s)
                                        : DispatchTiles<__nv_bfloat16>(p, dev, pdl, s);
  }
  if (options.variant == Variant::kMma && TakesStream(p, dev)) {
    const bool pdl = options.pdl && dev.cc_major >= 9 && p.weights_constant;
    return p.type == FloatType::kFloat16 ? DispatchStream<__half>(p, dev, pdl, s)
                                        : DispatchStream<__nv_bfloat16>(p, dev, pdl, s);
  }
  switch (p.type) {
    case FloatType::kFloat32: return DispatchGeneric<float>(p, s);
    case FloatType::kFloat16: return DispatchGeneric<__half>(p, s);
    case FloatType::kBFloat16: return DispatchGeneric<__nv_bfloat16>(p, s);
  }
  return "internal error: unknown element type";
}

const char* MatMulNBitsCudaPair(const MatMulNBitsProblem& p1, const MatMulNBitsProblem& p2, PairEpilogue epilogue,
                                void* stream) {
  if (const char* error = MatMulNBitsCuda(p1, stream)) return error;
  if (epilogue == PairEpilogue::kNone) return MatMulNBitsCuda(p2, stream);
  MatMulNBitsProblem up = p2;
  up.y = p1.y;
  up.swiglu_over_y = true;
  return MatMulNBitsCuda(up, stream);
}

}  // namespace ort_mtp
