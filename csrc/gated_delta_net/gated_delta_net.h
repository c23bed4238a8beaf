// GatedDeltaNet: the problem description shared by the op (validation), the CPU reference kernel and the
// CUDA kernel. One node computes the whole linear-attention mixer of a Qwen3.5 layer, from the
// projections' outputs to out_proj's input, exactly what this com.microsoft subgraph computes
// (models/graph.py, linear_attention):
//
//   Transpose -> CausalConvWithState(silu) -> Transpose -> Split(q, k, v) -> LpNormalization(p=2) of q
//   and k per head -> q * scale -> LinearAttentionGate(a, dt_bias, neg_exp_A, b) -> LinearAttention
//   (gated_delta, scale 1) -> GatedRMSNorm(o, norm_weight, z)
//
// but token by token, so that token t's output row and the state after token t do not depend on how
// many tokens the call has: a call of width S is bit-identical to S calls of width 1 (README.md, "Op
// reference", has the arithmetic; ops/gated_delta_net.py is its float64 reference).
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/float_type.h"
#include "common/parallel.h"

namespace ort_mtp {

struct GatedDeltaNetProblem {
  int64_t batch = 0;        // B
  int64_t seq = 0;          // S >= 1: tokens in this call
  int64_t num_k_heads = 0;  // Hk: q and k heads
  int64_t num_v_heads = 0;  // Hv, a multiple of Hk: v head h reads q/k head h / (Hv / Hk)
  int64_t k_head_dim = 0;   // dk
  int64_t v_head_dim = 0;   // dv
  int64_t conv_kernel = 0;  // K: the conv state holds the last K - 1 inputs of every channel
  // State slots written: max(state_window, 1). Slot j holds the state after token S - slots + j, zeros
  // where that token is before this call's first (both ORT's state_window semantics, measured on its
  // CUDA EP; slots = 1 is the unwindowed state).
  int64_t slots = 1;
  float scale = 1.f;           // q multiplier after the l2 norm
  float epsilon = 0.f;         // GatedRMSNorm's
  float l2norm_epsilon = 0.f;  // added to the sum of squares of the q/k l2 norm (0: LpNormalization's)
  FloatType type = FloatType::kFloat32;        // T: qkv, z, a, b, conv and norm weights, conv state, y
  FloatType state_type = FloatType::kFloat32;  // the recurrent state: T or float32
  FloatType dt_bias_type = FloatType::kFloat32;    // T or float32
  FloatType neg_exp_a_type = FloatType::kFloat32;  // T or float32

  int64_t key_dim() const { return num_k_heads * k_head_dim; }
  int64_t value_dim() const { return num_v_heads * v_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // channels: q, k, v
  int64_t conv_state_len() const { return conv_kernel - 1; }

  const void* qkv = nullptr;          // [B, S, conv_dim]   T
  const void* z = nullptr;            // [B, S, Hv * dv]    T
  const void* a = nullptr;            // [B, S, Hv]         T
  const void* b = nullptr;            // [B, S, Hv]         T
  const void* conv_weight = nullptr;  // [conv_dim, 1, K]   T
  const void* conv_bias = nullptr;    // [conv_dim]         T, or nullptr
  const void* dt_bias = nullptr;      // [Hv]
  const void* neg_exp_a = nullptr;    // [Hv]               -exp(A_log)
  const void* norm_weight = nullptr;  // [dv]               T
  const void* past_conv = nullptr;       // [B, conv_dim, K - 1]: the slot the call starts from
  const void* past_recurrent = nullptr;  // [B, Hv, dk, dv]: likewise
  void* y = nullptr;                  // [B, S, Hv * dv]    T
  void* present_conv = nullptr;       // [slots, B, conv_dim, K - 1]
  void* present_recurrent = nullptr;  // [slots, B, Hv, dk, dv]
};

// The CPU kernels. Both compute token by token, every value in an order fixed by the problem's
// dimensions alone and by one task, each value the subgraph materialises rounded to its tensor's type and
// the recurrent state rounded to its type after every token: a width-S call is bit-identical to S
// width-1 calls at any thread count. Both read all of their past slot before writing their present
// slots, so present may alias past. `parallel_for(context, fn, n, user)` runs fn(user, i) for i < n
// (nullptr: serially).
// GatedDeltaNetCpu: float32 arithmetic, vectorised (gated_delta_net_cpu_fast.cc); the reference instead
// when ORT_MTP_CPU_KERNEL=reference.
void GatedDeltaNetCpu(const GatedDeltaNetProblem& p, ParallelFor parallel_for, void* parallel_context);
// GatedDeltaNetCpuReference: double arithmetic, every value rounded first to float32 and then to its
// tensor's type (gated_delta_net_cpu.cc): the tests' oracle for the float32 kernel.
void GatedDeltaNetCpuReference(const GatedDeltaNetProblem& p, ParallelFor parallel_for, void* parallel_context);

#ifdef ORT_MTP_WITH_CUDA
// The CUDA kernel (gated_delta_net_cuda.cu): one block per (batch, v head, group of state columns) over
// the call's tokens, the state on chip in float32, every sum in an order fixed by dk and dv (a width-S
// call bit-identical to S width-1 calls). Launches on `stream` (the session's compute stream): the
// recurrence, then a kernel that norms y's rows and writes present_conv (the conv state is read by
// several blocks, so it is written only once they have all finished). No host synchronisation, no
// allocation; returns nullptr on success, else what failed.
constexpr int64_t kGdnCudaMaxHeadDim = 128;  // dk and dv: the state column and rows a block holds
const char* GatedDeltaNetCuda(const GatedDeltaNetProblem& p, void* stream);
// nullptr when the CUDA kernel takes these head dims, else why not (checked at session creation).
const char* GatedDeltaNetCudaUnsupported(int64_t k_head_dim, int64_t v_head_dim);
#endif

}  // namespace ort_mtp
