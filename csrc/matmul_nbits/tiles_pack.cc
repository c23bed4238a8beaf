// The tiles layout's packer (WeightLayout::kTiles in matmul_nbits.h), exported for ops.packing to call
// through ctypes: it rewrites a row-major B and its scales into the tiles order in one pass over the
// bytes, split over threads by m-tile. numpy needs several passes over every word for the same map
// (about 0.1 GB/s); the 27B-class folder's 14 GB of int4 weights are packed here at memory speed,
// which is what lets the driver pack a model the first time it runs it (ops/tiles_cache.py).
#include <cstdint>
#include <cstring>
#include <system_error>
#include <thread>
#include <vector>

#include "matmul_nbits/matmul_nbits.h"

namespace {

using ort_mtp::kTileBytes;
using ort_mtp::kTileK;
using ort_mtp::kTileRows;

// A row-major word holds k 8i .. 8i + 7 of a row, element e in nibble e. The tiles word holds the
// same eight values with nibble i taking element (0, 2, 4, 6, 1, 3, 5, 7)[i]: the low nibbles of the
// four bytes, then their high nibbles.
inline uint32_t PermuteNibbles(uint32_t x) {
  uint32_t out = 0;
  for (int byte = 0; byte < 4; ++byte) {
    out |= ((x >> (8 * byte)) & 0xFu) << (4 * byte);
    out |= ((x >> (8 * byte + 4)) & 0xFu) << (16 + 4 * byte);
  }
  return out;
}

// Tiles [t_begin, t_end) of B (n x k / 2 bytes, rows of k / 8 words) and, when given, of the scales
// (n x k / block_size 16-bit values). Word (j, lane, w) of a tile-chunk comes from row
// g + 8 (j % 2) of the tile (g = lane / 4) at k 32 u + 8 t (u = 4 (j / 2) + w, t = lane % 4) of the
// chunk, as matmul_nbits.h documents the layout.
void PackTiles(const uint8_t* b, const uint16_t* scales, uint8_t* packed_b, uint16_t* packed_scales, int64_t k,
               int block_size, int64_t t_begin, int64_t t_end) {
  const int64_t row_words = k / 8, chunks = k / kTileK;
  const int per_row = kTileK / block_size;
  const int64_t k_blocks = k / block_size;
  for (int64_t tile = t_begin; tile < t_end; ++tile) {
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t tile_chunk = tile * chunks + c;
      if (b != nullptr) {
        uint32_t* out = reinterpret_cast<uint32_t*>(packed_b + tile_chunk * kTileBytes);
        for (int j = 0; j < 4; ++j) {
          for (int lane = 0; lane < 32; ++lane) {
            const int64_t row = tile * kTileRows + lane / 4 + 8 * (j % 2);
            const uint8_t* src = b + (row * row_words + 32 * c + lane % 4) * 4;
            for (int w = 0; w < 4; ++w) {
              const int u = 4 * (j / 2) + w;
              uint32_t word;
              std::memcpy(&word, src + 16 * u, 4);  // word 32 c + 4 u + t of the row
              out[128 * j + 4 * lane + w] = PermuteNibbles(word);
            }
          }
        }
      }
      if (scales != nullptr) {
        for (int r = 0; r < kTileRows; ++r) {
          const int64_t row = tile * kTileRows + r;
          std::memcpy(packed_scales + (tile_chunk * kTileRows + r) * per_row,
                      scales + row * k_blocks + c * per_row, per_row * sizeof(uint16_t));
        }
      }
    }
  }
}

}  // namespace

// Packs B ([n, k / block_size, block_size / 2] uint8, 4 bits) into packed_b and the 16-bit scales
// ([n, k / block_size], fp16 or bf16 bits) into packed_scales, each buffer the size of its source;
// either pair may be null to pack the other alone. threads <= 0: one per hardware thread. Returns 0,
// or 1 for a shape the layout does not take (k % 256, n % 16, block_size not 32 / 64 / 128).
extern "C" __attribute__((visibility("default"))) int OrtMtpPackTiles(const uint8_t* b, const uint16_t* scales,
                                                                      uint8_t* packed_b, uint16_t* packed_scales,
                                                                      int64_t n, int64_t k, int64_t block_size,
                                                                      int threads) {
  if (n <= 0 || k <= 0 || n % kTileRows || k % kTileK || (block_size != 32 && block_size != 64 && block_size != 128))
    return 1;
  if ((b == nullptr) != (packed_b == nullptr) || (scales == nullptr) != (packed_scales == nullptr)) return 1;
  const int64_t tiles = n / kTileRows;
  int64_t workers = threads > 0 ? threads : static_cast<int64_t>(std::thread::hardware_concurrency());
  if (workers < 1) workers = 1;
  if (workers > tiles) workers = tiles;
  const int bs = static_cast<int>(block_size);
  if (workers == 1) {
    PackTiles(b, scales, packed_b, packed_scales, k, bs, 0, tiles);
    return 0;
  }
  std::vector<std::thread> pool;
  int64_t i = 0;
  try {
    for (; i < workers; ++i)
      pool.emplace_back(PackTiles, b, scales, packed_b, packed_scales, k, bs, tiles * i / workers,
                        tiles * (i + 1) / workers);
  } catch (const std::system_error&) {  // no more threads to be had: this one packs the rest
    PackTiles(b, scales, packed_b, packed_scales, k, bs, tiles * i / workers, tiles);
  }
  for (auto& t : pool) t.join();
  return 0;
}
