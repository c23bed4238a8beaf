// Element conversions of the CUDA kernels (GatedDeltaNet, GroupQueryAttention): float32 from and to
// the tensors' types, each rounding to nearest (an explicit intrinsic, so no code path rounds otherwise).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ort_mtp {
namespace cuda {

__device__ __forceinline__ float ToF(float v) { return v; }
__device__ __forceinline__ float ToF(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromF(float v);
template <>
__device__ __forceinline__ float FromF<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half FromF<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// v rounded to T (the value a T tensor would hold), as float.
template <typename T>
__device__ __forceinline__ float RoundTo(float v) { return ToF(FromF<T>(v)); }

}  // namespace cuda
}  // namespace ort_mtp
