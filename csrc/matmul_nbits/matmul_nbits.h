// MatMulNBits: the problem description shared by the op (validation), the CPU reference kernel and
// the CUDA kernels. Same contract as com.microsoft::MatMulNBits:
//   Y[M, N] = A[M, K] x dequant(B)^T + bias,   dequant(B)[n, k] = (q[n, k] - zp[n, k / block]) * scale[n, k / block]
// B is packed row-major per output column n: [N, k_blocks, block_size * bits / 8] bytes, element k of
// a block in bits [bits * (k % (8 / bits)), ...) of byte k * bits / 8 (low bits first).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/float_type.h"
#include "common/huge_page_bytes.h"
#include "common/parallel.h"

namespace ort_mtp {

enum class ZeroPointKind : int {
  kNone = 0,    // implicit zero point 2^(bits-1)
  kPacked = 1,  // uint8, `bits` bits per value, each row of N padded to whole bytes: [N, ceil(k_blocks * bits / 8)]
  kTyped = 2,   // same element type as A (a real-valued zero point): [N, k_blocks]
};

// How B and scales are laid out (the op's `packing` attribute).
//   kRowMajor (0): com.microsoft::MatMulNBits' layout, above.
//   kTiles (1): the same bytes and scales regrouped for the tensor-core kernel (gemv_tiles.cuh), written
//     once by ops.packing (Python). Needs 4 bits, block 32/64/128, K % 256 == 0, N % 16 == 0, no zero
//     points, fp16/bf16. Per tile-chunk (16 rows x 256 k: m-tile T = n / 16, chunk c = k / 256, in
//     order T * (K / 256) + c): 2048 bytes of B, 16 rows x (256 / block_size) scales. Inside the 2048
//     bytes, word (j, lane, w) at 4 * (128 j + 4 lane + w) holds row g + 8 (j % 2) (g = lane / 4) of the
//     tile, k 32 u + 8 t .. + 7 (u = 4 (j / 2) + w, t = lane % 4) of the chunk, its nibbles in the
//     order k 0, 2, 4, 6, 1, 3, 5, 7: a warp lane's mma fragments are one 16-byte read, and the int4 ->
//     fp16 conversion hands out pairs of adjacent k, as the activations come. Scales: row r's at
//     r * (256 / block_size) within the tile-chunk's.
//   kCpuGroups (2): never an attribute value. The CPU int8 kernel's own copy of a node's constant
//     weights, made once when the session creates the kernel (MatMulNBitsCpuPack), in the order the
//     kernel reads them: the units of Int8Unit below, group by group (columns 4 g .. 4 g + 3), chunk
//     by chunk, so that a group's weights are one sequential stream and every vector the kernel loads
//     is one aligned read with no shuffle. B holds the units' bytes, scales their 16 scales, and
//     zero_points (where the node has them) their 16 zero points (uint8, or A's type if typed).
enum class WeightLayout : int { kRowMajor = 0, kTiles = 1, kCpuGroups = 2 };

// The CPU int8 kernel (accuracy_level 4, 4 bits) cuts k into segments of kSegK(block_size) = 32 k (16
// for block_size 16), so a segment lies in one block, and chunks of 4 segments; columns go in groups
// of 4. The unit of a (group, chunk): 16 lanes, lane L = 4 col + s (column 4 g + col, segment s of the
// chunk); its bytes are kSegK / 8 vectors of 64 bytes, vector v holding at 4 L .. 4 L + 3 the 4 bytes
// of column 4 g + col for k = chunk start + s kSegK + 8 v .. + 7 (as in the row-major layout: byte j
// holds k 2 j in its low nibble, 2 j + 1 in its high one); then 16 scales and 16 zero points, lane by
// lane: the ones of that lane's block. Lanes past N or past the last block hold zeros.
constexpr int kGroupCols = 4;
constexpr int kSegments = 4;  // segments per chunk
constexpr int kUnitLanes = kGroupCols * kSegments;
inline constexpr int kSegK(int block_size) { return block_size >= 32 ? 32 : 16; }
inline constexpr int kChunkK(int block_size) { return kSegments * kSegK(block_size); }
inline constexpr int kUnitBytes(int block_size) { return kGroupCols * kChunkK(block_size) / 2; }

#ifdef __CUDACC__
#define ORT_MTP_HOST_DEVICE __host__ __device__
#else
#define ORT_MTP_HOST_DEVICE
#endif

constexpr int kTileRows = 16;
constexpr int kTileK = 256;
constexpr int kTileBytes = kTileRows * kTileK / 2;

// kTiles: byte of B and nibble shift (0 or 4) holding element (n, k); index of scale (n, block). The one
// C++ statement of the map: the CPU kernel reads by it; ops.packing writes the same map in numpy, and
// tests/test_packing.py checks that the two agree (docs/kernels.md#layout says why this layout).
ORT_MTP_HOST_DEVICE inline int64_t TilesByte(int64_t K, int64_t n, int64_t k, int& shift) {
  constexpr int kPos[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // nibble position of a word's k-th element
  const int64_t tile_chunk = (n / kTileRows) * (K / kTileK) + k / kTileK;
  const int r = static_cast<int>(n % kTileRows), kk = static_cast<int>(k % kTileK);
  const int u = kk / 32, t = (kk % 32) / 8, e = kk % 8;
  const int j = 2 * (u / 4) + r / 8, lane = 4 * (r % 8) + t, w = u % 4;
  const int pos = kPos[e];
  shift = 4 * (pos & 1);
  return tile_chunk * kTileBytes + 4 * (128 * j + 4 * lane + w) + pos / 2;
}

ORT_MTP_HOST_DEVICE inline int64_t TilesScale(int64_t K, int block_size, int64_t n, int64_t block) {
  const int per_row = kTileK / block_size;
  const int64_t k = block * block_size;
  const int64_t tile_chunk = (n / kTileRows) * (K / kTileK) + k / kTileK;
  return (tile_chunk * kTileRows + n % kTileRows) * per_row + (k % kTileK) / block_size;
}

struct MatMulNBitsProblem {
  int64_t M = 0;           // rows of A (all leading dims of A flattened)
  int64_t N = 0;           // output features
  int64_t K = 0;           // input features
  int bits = 4;            // 4 or 8
  int block_size = 32;     // power of two, 16..256
  int64_t k_blocks = 0;    // ceil(K / block_size)
  int64_t block_bytes = 0; // block_size * bits / 8
  int64_t zp_row_bytes = 0;  // bytes per row of packed zero points (kPacked only)
  FloatType type = FloatType::kFloat32;
  ZeroPointKind zp_kind = ZeroPointKind::kNone;
  WeightLayout layout = WeightLayout::kRowMajor;
  bool weights_constant = false;  // B, scales, zero_points are session constants (initializers)
  int accuracy_level = 0;         // the node's attribute: 4 with bits=4 selects the CPU int8-activation kernel
  // Set only by MatMulNBitsCudaPair for the second launch of a swiglu pair: y already holds the gate
  // projection's outputs, and each result u is stored as T(SiluMul(gate, T(u))) over them.
  bool swiglu_over_y = false;

  const void* a = nullptr;            // [M, K] of `type`
  const uint8_t* b = nullptr;         // [N, k_blocks, block_bytes] (kTiles: the same bytes regrouped)
  const void* scales = nullptr;       // [N, k_blocks] of `type` (kTiles: regrouped)
  const void* zero_points = nullptr;  // see ZeroPointKind, or nullptr
  const void* bias = nullptr;         // [N] of `type`, or nullptr
  void* y = nullptr;                  // [M, N] of `type`
};

// Bytes per element of p's scales (A's type), and of its zero points in the kCpuGroups copy (uint8
// when packed, A's type when typed).
inline size_t ScaleBytes(const MatMulNBitsProblem& p) { return p.type == FloatType::kFloat32 ? 4 : 2; }
inline size_t GroupedZeroPointBytes(const MatMulNBitsProblem& p) {
  return p.zp_kind == ZeroPointKind::kTyped ? ScaleBytes(p) : 1;
}

// CPU kernels. MatMulNBitsCpu runs, for accuracy_level 4 with 4-bit row-major weights, the
// int8-activation kernel (matmul_nbits_cpu.cc's "Int8" comment, cpu_int8_body.h: A quantised to int8
// per row and block, integer dot products; AVX-512 VNNI, AVX-512BW, AVX-VNNI, AVX2 or portable scalar);
// otherwise the fast float32 kernel (cpu_gemv_body.h: AVX-512 or AVX2+FMA picked at run time, a fixed
// order of operations per output) where it applies, and the reference elsewhere.
// ORT_MTP_CPU_KERNEL=reference|avx2|avxvnni|avx512|avx512-novnni (read once) forces one ("reference"
// runs the scalar int8 kernel where accuracy_level 4 applies). MatMulNBitsCpuKernel names the kernel
// MatMulNBitsCpu would run for p.
// CPU reference: each output is (sum over k of float(a) * float(dequant(b))) accumulated in double in
// ascending k, plus bias, rounded once to the output type. Rows are independent of each other, so
// row i of an M-row call equals the M=1 call on row i. `parallel_for(fn, user, n_tasks)` spreads the
// N dimension over ORT's intra-op thread pool (nullptr: run serially).
void MatMulNBitsCpu(const MatMulNBitsProblem& p, ParallelFor parallel_for, void* parallel_context);
void MatMulNBitsCpuReference(const MatMulNBitsProblem& p, ParallelFor parallel_for, void* parallel_context);
// Two weight sets on one A (the op's N2 form): p1 and p2 differ only in N, their weights, bias and y.
// Each product is what MatMulNBitsCpu computes for it alone (the same bits), so rows stay independent
// of M; where the int8 kernel runs both, A is quantised once and both sets are one job for the pool
// (the first set's columns, then the second's), then the epilogue.
//   kNone: p1.y and p2.y get the two products.
//   kSwiGlu (p1.N == p2.N): p1.y gets silu(g) * u per element, g and u the two products (the gate and
//     up projections of a gated MLP) rounded to the type as two nodes would write them, then in
//     float32: silu(g) = g / (1 + exp(-g)), rounded once to the type. p2.y is not used.
enum class PairEpilogue : int { kNone = 0, kSwiGlu = 1 };
void MatMulNBitsCpuPair(const MatMulNBitsProblem& p1, const MatMulNBitsProblem& p2, PairEpilogue epilogue,
                        ParallelFor parallel_for, void* parallel_context);
const char* MatMulNBitsCpuKernel(const MatMulNBitsProblem& p);
// Whether the CPU kernel runs p (row-major, constant weights) from its own kCpuGroups copy: the SIMD
// int8 kernel at accuracy_level 4 with 4 bits, and ORT_MTP_CPU_PACK is not 0 (read on every call:
// sessions created after a change see it).
bool MatMulNBitsCpuPackable(const MatMulNBitsProblem& p);
// p's B, scales and zero points (if any) in the kCpuGroups layout.
// (HugePageBytes: on transparent huge pages where the system offers them, see common/huge_page_bytes.h.)
struct CpuGroupedWeights {
  HugePageBytes b, scales, zero_points;
};
void MatMulNBitsCpuPack(const MatMulNBitsProblem& p, CpuGroupedWeights& out);
// MatMulNBitsCpuPack's copy of p's weights, shared by every kernel of the process whose copy holds the
// same bytes: the MTP head's graph reads the main model's lm_head (the same initializer in
// model.onnx.data), and with one copy the head's draft right after a verify finds the lm_head the
// verify just read still in the CPU's last-level cache instead of reading a second copy from memory.
// p's weights are compared, packed group by group, with the copies already held (equal bytes are the
// only test), and packed into a new copy only where none is equal.
std::shared_ptr<const CpuGroupedWeights> MatMulNBitsCpuPackShared(const MatMulNBitsProblem& p);
// The bytes MatMulNBitsCpuPack allocates for p.
size_t MatMulNBitsCpuPackBytes(const MatMulNBitsProblem& p);

#ifdef ORT_MTP_WITH_CUDA
// Launches on `stream` (the session's compute stream); no host synchronisation, no allocation, so it
// is capturable in a CUDA graph. Returns nullptr on success, else a message saying what failed.
const char* MatMulNBitsCuda(const MatMulNBitsProblem& p, void* stream);
// Two weight sets on one A (the op's N2 form; p1 and p2 as for MatMulNBitsCpuPair, the same results up
// to the kernels' float32 sums): two launches of MatMulNBitsCuda's kernels, the first set's then the
// second's. kSwiGlu: the first writes the gate projection into p1.y and the second stores, over it,
// silu(g) * u with silu_mul.h's SiluMul, the CPU op's own sequence of operations (so the gate and up
// values a node holds give the same bits on both EPs); rows stay independent of M.
const char* MatMulNBitsCudaPair(const MatMulNBitsProblem& p1, const MatMulNBitsProblem& p2, PairEpilogue epilogue,
                                void* stream);
#endif

}  // namespace ort_mtp
