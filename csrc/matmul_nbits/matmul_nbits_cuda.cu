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
//   ORT_MTP_GEMV_VARIANT = tm1 (default) | tm2 | simt | generic
//       tm1: 8 warps of 16 rows; tm2: 4 warps of 32 rows (fewer activation-fragment loads per weight
//       byte); simt: the CUDA-core kernel instead of the tensor-core one; generic: the general kernel
//       for everything (a baseline).
//   ORT_MTP_GEMV_PDL = 0 (default) | 1
//       1: launch with programmatic stream serialization, so a kernel's weight prefetch overlaps the
//       previous kernel's tail (only when B, scales and zero points are session constants).
//   ORT_MTP_GEMV_KC = 256 (default) | 128
//       k-values per pipeline stage for block sizes 32 and 64 (128: 64-byte row segments, 6 stages;
//       256: 128-byte row segments, 4 stages).
#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "matmul_nbits/gemv_generic.cuh"
#include "matmul_nbits/gemv_mma.cuh"
#include "matmul_nbits/gemv_simt.cuh"
#include "matmul_nbits/matmul_nbits.h"

namespace ort_mtp {
namespace {

enum class Variant { kTm1, kTm2, kSimt, kGeneric };

struct Options {
  Variant variant = Variant::kTm1;
  bool pdl = false;
  int kc = 256;  // preferred chunk for block sizes 32 and 64
  const char* error = nullptr;
};

Options ReadOptions() {
  Options o;
  if (const char* v = std::getenv("ORT_MTP_GEMV_VARIANT"); v && *v) {
    if (!std::strcmp(v, "tm1")) {
      o.variant = Variant::kTm1;
    } else if (!std::strcmp(v, "tm2")) {
      o.variant = Variant::kTm2;
    } else if (!std::strcmp(v, "simt")) {
      o.variant = Variant::kSimt;
    } else if (!std::strcmp(v, "generic")) {
      o.variant = Variant::kGeneric;
    } else {
      o.error = "environment variable ORT_MTP_GEMV_VARIANT must be tm1, tm2, simt or generic";
    }
  }
  if (const char* v = std::getenv("ORT_MTP_GEMV_PDL"); v && *v) {
    if (!std::strcmp(v, "1")) {
      o.pdl = true;
    } else if (std::strcmp(v, "0") != 0) {
      o.error = "environment variable ORT_MTP_GEMV_PDL must be 0 or 1";
    }
  }
  if (const char* v = std::getenv("ORT_MTP_GEMV_KC"); v && *v) {
    if (!std::strcmp(v, "128")) {
      o.kc = 128;
    } else if (std::strcmp(v, "256") != 0) {
      o.error = "environment variable ORT_MTP_GEMV_KC must be 128 or 256";
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
};

// Multiprocessor count and compute capability of the current device, looked up once per device.
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
    int sms = 0, major = 0;
    if ((err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess ||
        (err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) != cudaSuccess)
      return cudaGetErrorString(err);
    d.sm_count = sms;
    d.cc_major = major;
  }
  info = d;
  info.index = device;
  return nullptr;
}

bool Aligned(const void* p, uintptr_t bytes) { return (reinterpret_cast<uintptr_t>(p) % bytes) == 0; }

// --- tensor-core path -------------------------------------------------------------------------------

struct MmaPlan {
  int device = 0;  // CUDA device ordinal (< 64, see CurrentDeviceInfo)
  int kc = 0;      // k-values per pipeline stage (chunk)
  int splits = 1;  // K-slices per row tile = cluster size
  int tiles = 0;   // 128-row tiles
};

// Whether the tensor-core kernel takes the problem, and how it is cut. M plays no part.
bool PlanMma(const MatMulNBitsProblem& p, const DeviceInfo& dev, int preferred_kc, MmaPlan& plan) {
  if (p.type == ElemType::kFloat32 || p.bits != 4 || dev.cc_major < 8) return false;
  if (p.zp_kind == ZeroPointKind::kTyped) return false;
  const int bs = p.block_size;
  if (bs != 32 && bs != 64 && bs != 128 && bs != 256) return false;
  int kc = 0;
  if (bs <= 64) {
    kc = p.K % 256 == 0 && preferred_kc == 256 ? 256 : (p.K % 128 == 0 ? 128 : 0);
  } else {
    kc = 2 * bs;
    if (p.K % kc != 0) kc = 0;
  }
  if (kc == 0) return false;
  const int scale_bytes = 2 * (kc / bs);
  if (!Aligned(p.a, 16) || !Aligned(p.b, 16) || !Aligned(p.scales, scale_bytes)) return false;
  if (p.K > (1 << 30) || p.N > (1 << 30)) return false;

  plan.device = dev.index;
  plan.kc = kc;
  plan.tiles = static_cast<int>((p.N + 127) / 128);
  const int kchunks = static_cast<int>(p.K / kc);
  // Split K over a cluster only while the row tiles alone leave multiprocessors idle (a layer-sized N
  // gives 40..100 tiles for 132 SMs), keeping >= 2 chunks per slice. Clusters need sm_90.
  plan.splits = 1;
  if (dev.cc_major >= 9) {
    while (plan.splits < 8 && static_cast<int64_t>(plan.tiles) * plan.splits < dev.sm_count &&
           kchunks >= 4 * plan.splits)
      plan.splits *= 2;
  }
  return true;
}

template <typename T, int kBS, int kKC, bool kZp, int kNT, int kTM>
const char* LaunchMma(const MatMulNBitsProblem& p, const MmaPlan& plan, bool pdl, cudaStream_t stream) {
  using Cfg = gemv::MmaConfig<kBS, kKC, kNT, kTM>;
  auto kernel = gemv::GemvMmaKernel<T, kBS, kKC, kZp, kNT, kTM>;
  // The kernel's shared-memory limit, raised once per device: not on every call, because a call may
  // come while ORT captures a CUDA graph, and only stream work belongs in a capture.
  static std::atomic<uint64_t> configured{0};  // bit d: done on device d
  const uint64_t bit = uint64_t{1} << plan.device;
  if (!(configured.load(std::memory_order_acquire) & bit)) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::kSmemBytes);
    if (err != cudaSuccess) return cudaGetErrorString(err);
    configured.fetch_or(bit, std::memory_order_acq_rel);
  }
  cudaError_t err = cudaSuccess;

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
  prm.pdl = pdl ? 1 : 0;

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
    cfg.gridDim = dim3(static_cast<unsigned>(plan.tiles * plan.splits),
                       static_cast<unsigned>((rows + Cfg::kTokens - 1) / Cfg::kTokens), 1);
    cfg.blockDim = dim3(Cfg::kThreads, 1, 1);
    cfg.dynamicSmemBytes = Cfg::kSmemBytes;
    cfg.stream = stream;
    cfg.attrs = attrs;
    cfg.numAttrs = n_attrs;
    err = cudaLaunchKernelEx(&cfg, kernel, prm);
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  return nullptr;
}

template <typename T, int kBS, int kKC, bool kZp>
const char* DispatchTiles(const MatMulNBitsProblem& p, const MmaPlan& plan, Variant v, bool pdl, cudaStream_t s) {
  // 8 or 16 tokens per pass: the token tile changes which mma column a row lands in, not its result.
  const bool wide = p.M > 8;
  if (v == Variant::kTm2) {
    return wide ? LaunchMma<T, kBS, kKC, kZp, 2, 2>(p, plan, pdl, s) : LaunchMma<T, kBS, kKC, kZp, 1, 2>(p, plan, pdl, s);
  }
  return wide ? LaunchMma<T, kBS, kKC, kZp, 2, 1>(p, plan, pdl, s) : LaunchMma<T, kBS, kKC, kZp, 1, 1>(p, plan, pdl, s);
}

template <typename T, int kBS, int kKC>
const char* DispatchZp(const MatMulNBitsProblem& p, const MmaPlan& plan, Variant v, bool pdl, cudaStream_t s) {
  return p.zp_kind == ZeroPointKind::kPacked ? DispatchTiles<T, kBS, kKC, true>(p, plan, v, pdl, s)
                                             : DispatchTiles<T, kBS, kKC, false>(p, plan, v, pdl, s);
}

template <typename T>
const char* DispatchMma(const MatMulNBitsProblem& p, const MmaPlan& plan, Variant v, bool pdl, cudaStream_t s) {
  switch (p.block_size) {
    case 32: return plan.kc == 256 ? DispatchZp<T, 32, 256>(p, plan, v, pdl, s) : DispatchZp<T, 32, 128>(p, plan, v, pdl, s);
    case 64: return plan.kc == 256 ? DispatchZp<T, 64, 256>(p, plan, v, pdl, s) : DispatchZp<T, 64, 128>(p, plan, v, pdl, s);
    case 128: return DispatchZp<T, 128, 256>(p, plan, v, pdl, s);
    case 256: return DispatchZp<T, 256, 512>(p, plan, v, pdl, s);
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
  if ((options.variant == Variant::kTm1 || options.variant == Variant::kTm2) && PlanMma(p, dev, options.kc, plan)) {
    const bool pdl = options.pdl && dev.cc_major >= 9 && p.weights_constant;
    return p.type == ElemType::kFloat16 ? DispatchMma<__half>(p, plan, options.variant, pdl, s)
                                        : DispatchMma<__nv_bfloat16>(p, plan, options.variant, pdl, s);
  }
  switch (p.type) {
    case ElemType::kFloat32: return DispatchGeneric<float>(p, s);
    case ElemType::kFloat16: return DispatchGeneric<__half>(p, s);
    case ElemType::kBFloat16: return DispatchGeneric<__nv_bfloat16>(p, s);
  }
  return "internal error: unknown element type";
}

}  // namespace ort_mtp
