// CopySlots: stream-ordered copies of state slots between device tensors, many tensors per launch.
// The op resolves its inputs into a list of byte ranges (CopyRange) and runs them as one batch:
// on the CPU with memcpy, on CUDA with one kernel launch per kMaxRangesPerLaunch ranges.
#pragma once
#include <cstddef>
#include <cstdint>

namespace ort_mtp {

struct CopyRange {
  const void* src;
  void* dst;
  uint64_t bytes;
};

// Ranges per CUDA launch: the list travels as a kernel parameter (by value, under the 4 KB limit), so
// a launch needs no device allocation or host-to-device copy and can be captured in a CUDA graph.
constexpr int kMaxRangesPerLaunch = 128;

#ifdef ORT_MTP_WITH_CUDA
// Copies every range on `stream`. Ranges must not overlap each other. Returns nullptr on success,
// else a message saying what failed.
const char* CopyRangesCuda(const CopyRange* ranges, size_t count, void* stream);
#endif

}  // namespace ort_mtp
