// SkipSimplifiedLayerNormalization: the problem shared by the op (skip_norm.cc: validation) and its
// kernels. A drop-in for com.microsoft's op of that name (the residual add and RMSNorm between a
// transformer's blocks), computing every row from that row alone in one fixed order, so a row of an
// M-row call is bit-identical to the 1-row call on it (both EPs), and launched on CUDA with programmatic
// dependent launch: the matmul after it starts streaming its weights while the norm runs, where ORT's
// own kernel (an ordinary launch) held it back to its own end (docs/kernels.md#launch-and-pdl; on the
// 27B-class folder two per layer, 128 per token).
//
// For each row (of M = the product of the input's extents but the last, H = the last):
//   s[j] = T(float(input[j]) + float(skip[j]) (+ float(bias[j])))        the residual sum, one rounding
//   r    = 1 / sqrt(sum_j float(s[j])^2 / H + epsilon)                     float32
//   y[j] = T(float(s[j]) * r * float(gamma[j]))
// and the optional output input_skip_bias_sum holds s. The sum of squares runs in a fixed order per
// kernel (below): the CPU and CUDA kernels may differ in its last bits, never across M.
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/float_type.h"
#include "common/parallel.h"

namespace ort_mtp {

struct SkipNormProblem {
  int64_t rows = 0;    // M
  int64_t hidden = 0;  // H
  float epsilon = 0.f;
  FloatType type = FloatType::kFloat32;
  const void* input = nullptr;  // [M, H]
  const void* skip = nullptr;   // [M, H]
  const void* gamma = nullptr;  // [H]
  const void* bias = nullptr;   // [H] or nullptr
  void* y = nullptr;            // [M, H]
  void* sum = nullptr;          // [M, H] or nullptr (input_skip_bias_sum)
};

// CPU kernel: rows spread over ORT's thread pool; each row's sum of squares in ascending j, float32,
// without fused multiply-add (the file is compiled with -ffp-contract=off).
void SkipNormCpu(const SkipNormProblem& p, ParallelFor parallel_for, void* parallel_context);

#ifdef ORT_MTP_WITH_CUDA
// The largest H the CUDA kernel takes: a row's sums live in shared memory as float32, beside the 8
// warps' partial sums, all within the default 48 KB a launch may use: (48 KB - 8 x 4 B) / 4 B.
constexpr int64_t kSkipNormCudaMaxHidden = 12280;
// CUDA kernel (skip_norm_cuda.cu): one block of 256 threads per row; thread t sums j = t, t + 256, ...
// in ascending order (fused multiply-add), the 256 partial sums meet in one fixed order (a butterfly in
// each warp, then the 8 warps in ascending order). On sm_90 launched with programmatic stream
// serialization. No allocation, no host synchronisation (capturable in a CUDA graph); nullptr on
// success, else what failed.
const char* SkipNormCuda(const SkipNormProblem& p, void* stream);
#endif

}  // namespace ort_mtp
