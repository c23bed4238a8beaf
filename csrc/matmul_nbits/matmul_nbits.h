// MatMulNBits: the problem description shared by the op (validation), the CPU reference kernel and
// the CUDA kernels. Same contract as com.microsoft::MatMulNBits:
//   Y[M, N] = A[M, K] x dequant(B)^T + bias,   dequant(B)[n, k] = (q[n, k] - zp[n, k / block]) * scale[n, k / block]
// B is packed row-major per output column n: [N, k_blocks, block_size * bits / 8] bytes, element k of
// a block in bits [bits * (k % (8 / bits)), ...) of byte k * bits / 8 (low bits first).
#pragma once
#include <cstddef>
#include <cstdint>

namespace ort_mtp {

enum class ElemType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

enum class ZeroPointKind : int {
  kNone = 0,    // implicit zero point 2^(bits-1)
  kPacked = 1,  // uint8, `bits` bits per value, each row of N padded to whole bytes: [N, ceil(k_blocks * bits / 8)]
  kTyped = 2,   // same element type as A (a real-valued zero point): [N, k_blocks]
};

struct MatMulNBitsProblem {
  int64_t M = 0;           // rows of A (all leading dims of A flattened)
  int64_t N = 0;           // output features
  int64_t K = 0;           // input features
  int bits = 4;            // 4 or 8
  int block_size = 32;     // power of two, 16..256
  int64_t k_blocks = 0;    // ceil(K / block_size)
  int64_t block_bytes = 0; // block_size * bits / 8
  int64_t zp_row_bytes = 0;  // bytes per row of packed zero points (kPacked only)
  ElemType type = ElemType::kFloat32;
  ZeroPointKind zp_kind = ZeroPointKind::kNone;
  bool weights_constant = false;  // B, scales, zero_points are session constants (initializers)

  const void* a = nullptr;            // [M, K] of `type`
  const uint8_t* b = nullptr;         // [N, k_blocks, block_bytes]
  const void* scales = nullptr;       // [N, k_blocks] of `type`
  const void* zero_points = nullptr;  // see ZeroPointKind, or nullptr
  const void* bias = nullptr;         // [N] of `type`, or nullptr
  void* y = nullptr;                  // [M, N] of `type`
};

// CPU reference: each output is (sum over k of float(a) * float(dequant(b))) accumulated in double in
// ascending k, plus bias, rounded once to the output type. Rows are independent of each other, so
// row i of an M-row call equals the M=1 call on row i. `parallel_for(fn, user, n_tasks)` spreads the
// N dimension over ORT's intra-op thread pool (nullptr: run serially).
using ParallelFor = void (*)(void* context, void (*fn)(void*, size_t), size_t n_tasks, void* user);
void MatMulNBitsCpu(const MatMulNBitsProblem& p, ParallelFor parallel_for, void* parallel_context);

#ifdef ORT_MTP_WITH_CUDA
// Launches on `stream` (the session's compute stream); no host synchronisation, no allocation, so it
// is capturable in a CUDA graph. Returns nullptr on success, else a message saying what failed.
const char* MatMulNBitsCuda(const MatMulNBitsProblem& p, void* stream);
#endif

}  // namespace ort_mtp
