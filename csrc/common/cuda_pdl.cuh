// Programmatic dependent launch (sm_90; no-ops before, and when the launch did not opt in), shared by
// the kernels that use it. Trigger: the next kernel on the stream, if launched with programmatic stream
// serialization, may start once every block of this grid has triggered or exited. Wait: until the grids
// this one depends on have completed and their writes are visible.
#pragma once
#include <cuda_runtime.h>

#include <atomic>

namespace ort_mtp {
namespace cuda {

// Compute capability major of the current device (cached per device; 0 if unknown): the launches that
// opt into programmatic dependent launch do so on sm_90 and later.
inline int DeviceMajor() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];  // major + 1; 0: not asked yet
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kMaxDevices) return 0;
  if (const int known = cache[device].load(std::memory_order_relaxed)) return known - 1;
  int major = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) major = 0;
  cache[device].store(major + 1, std::memory_order_relaxed);
  return major;
}

__device__ __forceinline__ void GridDependencyTrigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

}  // namespace cuda
}  // namespace ort_mtp
