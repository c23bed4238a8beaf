// CUDA path of CopySlots: one launch copies up to kMaxRangesPerLaunch byte ranges. blockIdx.y picks
// the range, blocks along x stride over it with 16-byte loads/stores when the range allows.
#include <cuda_runtime.h>

#include <algorithm>

#include "copy_slots/copy_slots.h"

namespace ort_mtp {
namespace {

struct RangeBatch {
  int count;
  CopyRange ranges[kMaxRangesPerLaunch];
};

constexpr int kThreads = 256;

__global__ void CopyRangesKernel(const __grid_constant__ RangeBatch batch) {
  const CopyRange r = batch.ranges[blockIdx.y];
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  const uint64_t first = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool vec = ((reinterpret_cast<uintptr_t>(r.src) | reinterpret_cast<uintptr_t>(r.dst) | r.bytes) & 15) == 0;
  if (vec) {
    const uint4* src = static_cast<const uint4*>(r.src);
    uint4* dst = static_cast<uint4*>(r.dst);
    const uint64_t n = r.bytes / 16;
    for (uint64_t i = first; i < n; i += stride) dst[i] = src[i];
  } else {
    const unsigned char* src = static_cast<const unsigned char*>(r.src);
    unsigned char* dst = static_cast<unsigned char*>(r.dst);
    for (uint64_t i = first; i < r.bytes; i += stride) dst[i] = src[i];
  }
}

}  // namespace

const char* CopyRangesCuda(const CopyRange* ranges, size_t count, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  for (size_t begin = 0; begin < count; begin += kMaxRangesPerLaunch) {
    RangeBatch batch{};
    uint64_t largest = 0;
    for (size_t i = begin; i < std::min(count, begin + kMaxRangesPerLaunch); ++i) {
      if (ranges[i].bytes == 0) continue;
      batch.ranges[batch.count++] = ranges[i];
      largest = std::max(largest, ranges[i].bytes);
    }
    if (batch.count == 0) continue;
    // Enough blocks along x to cover the largest range with one 16-byte access per thread, capped:
    // the grid-stride loop covers the rest, and ~8 blocks per SM per range keep HBM busy.
    const uint64_t per_block = static_cast<uint64_t>(kThreads) * 16;
    const unsigned blocks_x = static_cast<unsigned>(std::min<uint64_t>((largest + per_block - 1) / per_block, 1024));
    CopyRangesKernel<<<dim3(blocks_x, batch.count), kThreads, 0, s>>>(batch);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  return nullptr;
}

}  // namespace ort_mtp
