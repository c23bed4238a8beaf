// Programmatic dependent launch (sm_90; no-ops before, and when the launch did not opt in), shared by
// the kernels that use it. Trigger: the next kernel on the stream, if launched with programmatic stream
// serialization, may start once every block of this grid has triggered or exited. Wait: until the grids
// this one depends on have completed and their writes are visible.
#pragma once

namespace ort_mtp {
namespace cuda {

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
