// MatMul: the problem description shared by the op (validation) and its kernels. The op is a drop-in for
// ONNX's MatMul where B is a [K, N] matrix (in the graphs: a constant weight), for float32, float16 and
// bfloat16, with one property the point of it: output row m is computed from row m of A and from B
// alone, in one fixed order, so row m of an M-row call is bit-identical to the 1-row call on that row.
// cuBLAS picks its GEMM algorithm (and a split of K over blocks) by M, so on the CUDA EP ORT's MatMul
// gives a wide MTP verify rows that differ in the last bits from width-1 decode (docs/driver.md).
// The graphs use it for the Gated DeltaNet's a and b projections, which the builder keeps dense: narrow
// outputs (N = the linear-attention value heads) that cuBLAS runs as split-K GEMMs.
//
// A second weight B2 [K, N2] (optional input 3, output 2) makes the node two MatMuls of one A in one
// launch: Y2 = A B2, each output column computed exactly as a node of its own computes it. The a and b
// projections read the same normed hidden and are each a few microseconds of launch and memory latency
// (6 blocks of 512 threads at N = 48), so one launch for both halves that cost (ops/float_matmul.py
// merges such pairs).
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/float_type.h"
#include "common/parallel.h"

namespace ort_mtp {

struct FloatMatMulProblem {
  int64_t m = 0;  // rows: the product of A's extents but the last
  int64_t k = 0;  // A's last extent, B's first
  int64_t n = 0;  // B's second extent
  FloatType type = FloatType::kFloat32;
  const void* a = nullptr;  // [M, K] row-major
  const void* b = nullptr;  // [K, N] row-major
  void* y = nullptr;        // [M, N]
  // The optional second product of the same A: Y2 = A B2 (n2 = 0: none).
  int64_t n2 = 0;
  const void* b2 = nullptr;  // [K, N2] row-major
  void* y2 = nullptr;        // [M, N2]
};

// CPU kernel: y[m, n] = sum over k = 0, 1, ..., K-1 in ascending order of a[m, k] * b[k, n], each product
// and each sum rounded to float32 (no fused multiply-add: the file is compiled with -ffp-contract=off),
// then rounded to the output type. Work is split over ORT's thread pool by tiles of columns and rows;
// each output is computed by one task, so neither M nor the thread count changes a result.
void FloatMatMulCpu(const FloatMatMulProblem& p, ParallelFor parallel_for, void* parallel_context);

#ifdef ORT_MTP_WITH_CUDA
// CUDA kernel (float_matmul_cuda.cu): one block per 8 output columns and pass of rows; thread t of the
// block's 512 sums k = t, t + 512, ... in ascending order (float32 fused multiply-add), the 512 partial
// sums are combined in one fixed order (a butterfly within each warp, then the 16 warps in ascending
// order), then rounded to the output type. Every output follows the same order whatever M is. Launches
// on `stream`; no host synchronisation, no allocation (capturable in a CUDA graph); nullptr on success,
// else what failed.
const char* FloatMatMulCuda(const FloatMatMulProblem& p, void* stream);
#endif

}  // namespace ort_mtp
