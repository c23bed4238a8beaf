#include "common/huge_page_bytes.h"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace ort_mtp {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kChunkBytes = size_t{32} << 20;  // 16 huge pages: a few hundred KiB to a few MiB per buffer
constexpr size_t kAlign = 64;                      // every buffer starts on a cache line

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

struct Chunk {
  uint8_t* base = nullptr;
  size_t size = 0;
  size_t used = 0;  // guarded by the arena's mutex
  ~Chunk() { std::free(base); }
};

std::shared_ptr<Chunk> NewChunk(size_t size) {
  auto chunk = std::make_shared<Chunk>();
  chunk->size = RoundUp(size, kHugePage);
  chunk->base = static_cast<uint8_t*>(std::aligned_alloc(kHugePage, chunk->size));
  if (!chunk->base) throw std::bad_alloc();
#if defined(__linux__)
  madvise(chunk->base, chunk->size, MADV_HUGEPAGE);  // advice only: without THP the pages stay 4 KiB
#endif
  return chunk;
}

}  // namespace

HugePageBytes::HugePageBytes(size_t size) : size_(size) {
  if (size == 0) return;
  static std::mutex mutex;
  static std::weak_ptr<Chunk> current;  // weak: a chunk lives only as long as buffers in it do
  std::shared_ptr<Chunk> chunk;
  size_t offset = 0;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (size >= kChunkBytes / 2) {
      chunk = NewChunk(size);  // a large buffer gets a chunk of its own; the current one stays open
    } else {
      chunk = current.lock();
      if (!chunk || RoundUp(chunk->used, kAlign) + size > chunk->size) {
        chunk = NewChunk(kChunkBytes);
        current = chunk;
      }
      offset = RoundUp(chunk->used, kAlign);
      chunk->used = offset + size;
    }
  }
  data_ = chunk->base + offset;
  std::memset(data_, 0, size);
  chunk_ = std::move(chunk);
}

}  // namespace ort_mtp
