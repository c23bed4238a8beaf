// CUDA kernel of SkipSimplifiedLayerNormalization (skip_norm.h has the arithmetic and the order of the
// sum of squares). One block per row: a decode step's few rows are a few blocks, so the kernel is
// latency-bound (a 5120-wide fp16 row is 10 KB); what it is for is its launch. On sm_90 it is launched
// with programmatic stream serialization and lets the next kernel launch at once (griddepcontrol
// launch_dependents before anything else), then waits for the previous one's results: our matmul
// kernels start copying their weights during that wait and the norm's run
// (common/cuda_pdl.cuh), instead of after an ordinary launch's end.
#include <cuda_runtime.h>

#include <algorithm>

#include "common/cuda_numeric.cuh"
#include "common/cuda_pdl.cuh"
#include "norm/skip_norm.h"

namespace ort_mtp {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

struct Params {
  const void* input;
  const void* skip;
  const void* gamma;
  const void* bias;
  void* y;
  void* sum;
  int hidden;
  float epsilon;
  int pdl;
};

template <typename T>
__global__ void __launch_bounds__(kThreads) SkipNormKernel(const __grid_constant__ Params p) {
  if (p.pdl) {
    cuda::GridDependencyTrigger();
    cuda::GridDependencyWait();
  }
  extern __shared__ __align__(16) unsigned char smem[];
  float* s = reinterpret_cast<float*>(smem);  // the row's residual sums, as T holds them
  __shared__ float warp_sums[kWarps];
  const int H = p.hidden;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * H;
  const T* x = static_cast<const T*>(p.input) + row;
  const T* r = static_cast<const T*>(p.skip) + row;
  const T* bias = static_cast<const T*>(p.bias);
  T* sum = p.sum ? static_cast<T*>(p.sum) + row : nullptr;
  float ss = 0.f;
  for (int j = threadIdx.x; j < H; j += kThreads) {
    float v = cuda::ToF(x[j]) + cuda::ToF(r[j]);
    if (bias) v += cuda::ToF(bias[j]);
    const T t = cuda::FromF<T>(v);
    if (sum) sum[j] = t;
    const float f = cuda::ToF(t);
    s[j] = f;
    ss = fmaf(f, f, ss);
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, offset);
  if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = ss;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += warp_sums[w];
  const float inv = 1.0f / sqrtf(total / static_cast<float>(H) + p.epsilon);
  const T* gamma = static_cast<const T*>(p.gamma);
  T* y = static_cast<T*>(p.y) + row;
  for (int j = threadIdx.x; j < H; j += kThreads) y[j] = cuda::FromF<T>(s[j] * inv * cuda::ToF(gamma[j]));
}

template <typename T>
const char* Launch(const SkipNormProblem& p, cudaStream_t stream) {
  Params prm{p.input, p.skip, p.gamma, p.bias, p.y, p.sum, static_cast<int>(p.hidden), p.epsilon, 0};
  prm.pdl = cuda::DeviceMajor() >= 9 ? 1 : 0;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.blockDim = dim3(kThreads, 1, 1);
  cfg.dynamicSmemBytes = static_cast<size_t>(p.hidden) * sizeof(float);
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = prm.pdl ? 1 : 0;
  constexpr int64_t kMaxGrid = 0x7FFFFFFF;
  for (int64_t r0 = 0; r0 < p.rows; r0 += kMaxGrid) {
    const int64_t rows = std::min<int64_t>(kMaxGrid, p.rows - r0);
    const int64_t offset = r0 * p.hidden;
    prm.input = static_cast<const T*>(p.input) + offset;
    prm.skip = static_cast<const T*>(p.skip) + offset;
    prm.y = static_cast<T*>(p.y) + offset;
    prm.sum = p.sum ? static_cast<T*>(p.sum) + offset : nullptr;
    cfg.gridDim = dim3(static_cast<unsigned>(rows), 1, 1);
    const cudaError_t err = cudaLaunchKernelEx(&cfg, SkipNormKernel<T>, prm);
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  return nullptr;
}

}  // namespace

const char* SkipNormCuda(const SkipNormProblem& p, void* stream) {
  if (p.rows == 0) return nullptr;
  // 48 KB, the default limit of dynamic shared memory: no attribute to set (which a graph capture forbids).
  // (a launch asking for more fails with "invalid argument": the limit counts the static warp_sums too)
  static_assert((kSkipNormCudaMaxHidden + kWarps) * sizeof(float) <= 48 * 1024, "a row's sums fit the default shared memory");
  if (p.hidden > kSkipNormCudaMaxHidden) return "the hidden size is above the CUDA kernel's limit of 12280";
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  switch (p.type) {
    case FloatType::kFloat32: return Launch<float>(p, s);
    case FloatType::kFloat16: return Launch<__half>(p, s);
    case FloatType::kBFloat16: return Launch<__nv_bfloat16>(p, s);
  }
  return "internal error: unknown element type";
}

}  // namespace ort_mtp
