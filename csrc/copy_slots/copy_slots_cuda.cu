// CUDA path of CopySlots: one launch copies up to kMaxRangesPerLaunch byte ranges.
//
// The ranges are cut into 16 KB tiles and the grid has exactly one block per tile of all ranges
// together (a 1.5 MB recurrent state and a 60 KB conv state of the same layer get 96 and 4 blocks, not
// the same count). A block finds its range by binary search over the prefix sums of tiles carried in
// the kernel parameters, so a launch needs no device allocation and no host-to-device copy and is
// capturable in a CUDA graph. Each thread keeps four 16-byte loads in flight before it stores.
#include <cuda_runtime.h>

#include <algorithm>

#include "copy_slots/copy_slots.h"

namespace ort_mtp {
namespace {

constexpr int kThreads = 256;
constexpr int kVecsPerThread = 4;
constexpr uint64_t kTileBytes = static_cast<uint64_t>(kThreads) * kVecsPerThread * 16;  // 16 KB

struct RangeBatch {
  int count;
  uint32_t first_tile[kMaxRangesPerLaunch + 1];  // prefix sums: range i owns tiles [first_tile[i], first_tile[i+1])
  CopyRange ranges[kMaxRangesPerLaunch];
};
static_assert(sizeof(RangeBatch) <= 4096, "kernel parameters stay under the classic 4 KB limit");

__global__ void __launch_bounds__(kThreads) CopyRangesKernel(const __grid_constant__ RangeBatch batch) {
  const uint32_t tile = blockIdx.x;
  int lo = 0, hi = batch.count - 1;  // last range whose first tile is <= this tile
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (batch.first_tile[mid] <= tile) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const CopyRange r = batch.ranges[lo];
  const uint64_t begin = static_cast<uint64_t>(tile - batch.first_tile[lo]) * kTileBytes;
  const uint64_t end = min(r.bytes, begin + kTileBytes);
  const bool vec = ((reinterpret_cast<uintptr_t>(r.src) | reinterpret_cast<uintptr_t>(r.dst) | r.bytes) & 15) == 0;
  if (vec) {
    const uint4* src = static_cast<const uint4*>(r.src);
    uint4* dst = static_cast<uint4*>(r.dst);
    const uint64_t first = begin / 16 + threadIdx.x;
    const uint64_t last = end / 16;
    uint4 v[kVecsPerThread];
#pragma unroll
    for (int i = 0; i < kVecsPerThread; ++i) {
      const uint64_t idx = first + static_cast<uint64_t>(i) * kThreads;
      if (idx < last) v[i] = src[idx];
    }
#pragma unroll
    for (int i = 0; i < kVecsPerThread; ++i) {
      const uint64_t idx = first + static_cast<uint64_t>(i) * kThreads;
      if (idx < last) dst[idx] = v[i];
    }
  } else {
    const unsigned char* src = static_cast<const unsigned char*>(r.src);
    unsigned char* dst = static_cast<unsigned char*>(r.dst);
    for (uint64_t i = begin + threadIdx.x; i < end; i += kThreads) dst[i] = src[i];
  }
}

}  // namespace

const char* CopyRangesCuda(const CopyRange* ranges, size_t count, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  size_t next = 0;
  while (next < count) {
    RangeBatch batch{};
    uint64_t tiles = 0;
    for (; next < count && batch.count < kMaxRangesPerLaunch; ++next) {
      const CopyRange& r = ranges[next];
      if (r.bytes == 0) continue;
      const uint64_t range_tiles = (r.bytes + kTileBytes - 1) / kTileBytes;
      if (tiles + range_tiles > 0x7FFFFFFFu) break;  // grid.x limit: the rest goes to the next launch
      batch.first_tile[batch.count] = static_cast<uint32_t>(tiles);
      batch.ranges[batch.count] = r;
      ++batch.count;
      tiles += range_tiles;
    }
    if (batch.count == 0) {
      if (next < count && ranges[next].bytes != 0) return "CopySlots: a single range is too large for one launch";
      continue;
    }
    batch.first_tile[batch.count] = static_cast<uint32_t>(tiles);
    CopyRangesKernel<<<static_cast<unsigned>(tiles), kThreads, 0, s>>>(batch);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return cudaGetErrorString(err);
  }
  return nullptr;
}

}  // namespace ort_mtp
