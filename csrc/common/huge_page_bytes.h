// HugePageBytes: a zero-filled byte buffer for data that is read again and again while a session lives
// (the CPU kernels' weight copies), carved from large chunks that are 2 MiB aligned and advised for
// transparent huge pages. Linux's default THP mode ("madvise") gives huge pages only to ranges advised so;
// the CPU MatMulNBits kernel streams its weights on every call, and on 4 KiB pages that stream costs a
// TLB miss every 64 cache lines (what it saves: bench/results/2026-12-05-huge-pages).
//
// Buffers are placed one after another in the current chunk; one that does not fit starts a new chunk
// (its own, when it is at least half a chunk). A chunk is freed with the last buffer placed in it, so a
// process that creates and frees sessions does not keep their memory. Elsewhere than Linux (no madvise)
// the chunks are ordinary memory.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

namespace ort_mtp {

class HugePageBytes {
 public:
  HugePageBytes() = default;
  explicit HugePageBytes(size_t size);  // throws std::bad_alloc when no memory is left
  // Move-only: a copy would share the bytes (as the chunk is shared), unlike the std::vector it replaces.
  HugePageBytes(const HugePageBytes&) = delete;
  HugePageBytes& operator=(const HugePageBytes&) = delete;
  HugePageBytes(HugePageBytes&& other) noexcept
      : chunk_(std::move(other.chunk_)), data_(other.data_), size_(other.size_) {
    other.data_ = nullptr;
    other.size_ = 0;
  }
  HugePageBytes& operator=(HugePageBytes&& other) noexcept {
    if (this == &other) return *this;
    chunk_ = std::move(other.chunk_);
    data_ = other.data_;
    size_ = other.size_;
    other.data_ = nullptr;
    other.size_ = 0;
    return *this;
  }

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  std::shared_ptr<void> chunk_;  // keeps the chunk this buffer lies in
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace ort_mtp
