// GroupQueryAttention: the problem description shared by the op (validation) and its CPU kernel. The op
// is a drop-in for com.microsoft::GroupQueryAttention as onnxruntime-genai's builder emits it for
// Qwen3.5's full-attention layers (rotary applied before it, the KV cache in BNSH, past and present
// sharing one max_length buffer), with one difference that is the point of it: a query row's output is
// computed from its own position and the cache alone, in one fixed order, so row s of a width-S call is
// bit-identical to the width-1 call at that position. ORT's CPU kernel runs QK^T and probs x V as GEMMs
// over the call's S rows (gqa_attention_base.h), whose accumulation depends on S: that is what made a
// wide MTP verify differ from greedy decode in the last bits (docs/driver.md#token-identity).
#pragma once
#include <cstddef>
#include <cstdint>

#include "common/float_type.h"
#include "common/parallel.h"

namespace ort_mtp {

struct GroupQueryAttentionProblem {
  int64_t batch = 0;        // B
  int64_t seq = 0;          // S >= 1: new tokens in this call
  int64_t num_heads = 0;    // Nq
  int64_t kv_num_heads = 0; // Nkv; q head h reads kv head h / (Nq / Nkv)
  int64_t head_size = 0;    // H
  int64_t past_len = 0;     // P: past_key's sequence extent (the shared buffer's max_length)
  int64_t present_len = 0;  // max(total_sequence_length, P): present_key's sequence extent
  bool share_buffer = false;  // present_key is past_key's buffer (and present_value past_value's)
  float scale = 0.f;          // applied to q . k before the softcap and the softmax
  float softcap = 0.f;        // > 0: scores = softcap * tanh(scores / softcap)
  int64_t local_window = -1;  // > 0: a row sees only the last local_window positions, its own included
  bool smooth_softmax = false;  // the softmax's denominator also counts a logit 0 (exp(-max))
  FloatType type = FloatType::kFloat32;

  const void* query = nullptr;   // [B, S, Nq * H]
  const void* key = nullptr;     // [B, S, Nkv * H]
  const void* value = nullptr;   // [B, S, Nkv * H]
  const void* past_key = nullptr;    // [B, Nkv, P, H]
  const void* past_value = nullptr;  // [B, Nkv, P, H]
  const int32_t* seqlens_k = nullptr;  // [B]: the total length after this call, minus one (checked)
  void* output = nullptr;         // [B, S, Nq * H]
  void* present_key = nullptr;    // [B, Nkv, present_len, H]
  void* present_value = nullptr;  // [B, Nkv, present_len, H]
};

// CPU kernels. For each batch row b the call's tokens sit at positions past_b .. past_b + S - 1, past_b =
// seqlens_k[b] + 1 - S (the op checks 0 <= past_b and past_b + S <= present_len). First the new keys and
// values are written into present at those positions (when present is not past's buffer, present is
// zeroed and past's first past_b positions copied first, as ORT does: GroupQueryAttentionCpuCache). Then
// query row s of head h attends to positions [lo, past_b + s] of its kv head (lo = 0, or the local
// window's start): scores q . k_j times scale, softcap, softmax, output = sum_j exp_j v_j / sum, rounded
// to the output type. Nothing in a row's arithmetic depends on S or on the other rows: every order is
// fixed by the row's position and the head size. Work is spread over ORT's thread pool by (batch, head);
// each value is computed by one task.
// GroupQueryAttentionCpu: float32, vectorised (group_query_attention_cpu_fast.cc): each score in 16
// lanes (feature i in lane i % 16, ascending) summed in a fixed tree; max, exponentials (silu::Exp), their
// sum in 16 lanes by position, and sum_j exp_j v_j by ascending position, per feature. The reference
// instead when ORT_MTP_CPU_KERNEL=reference.
void GroupQueryAttentionCpu(const GroupQueryAttentionProblem& p, ParallelFor parallel_for,
                            void* parallel_context);
// GroupQueryAttentionCpuReference: the scores in double in ascending feature order, rounded to float32
// (as ORT's float scores), softcap, softmax in double (max, exp, sum in ascending position), the output
// sum in double in ascending position (group_query_attention_cpu.cc): the tests' oracle.
void GroupQueryAttentionCpuReference(const GroupQueryAttentionProblem& p, ParallelFor parallel_for,
                                     void* parallel_context);
// The cache pass alone (both kernels run it first).
void GroupQueryAttentionCpuCache(const GroupQueryAttentionProblem& p, ParallelFor parallel_for,
                                 void* parallel_context);

#ifdef ORT_MTP_WITH_CUDA
// The CUDA kernel (group_query_attention_cuda.cu): the cache rows, then the attention split over fixed
// 64-position chunks of the cache and combined in a fixed order, float32, every order fixed by the row's
// own positions (a width-S call bit-identical to S width-1 calls). seqlens_k is read on the device: a row
// outside the cache gets NaN outputs, nothing written out of bounds. Launches on `stream`; no host
// synchronisation; the scratch of partials is allocated on a stream's first call (and when a larger
// shape needs more), never inside a CUDA graph capture; returns nullptr on success, else what failed.
const char* GroupQueryAttentionCuda(const GroupQueryAttentionProblem& p, void* stream);
// nullptr when the CUDA kernel takes this head size (1..256), else why not.
const char* GroupQueryAttentionCudaUnsupported(int64_t head_size);
// A device buffer of at least `bytes` for (stream, slot), kept across calls (group_query_attention_cuda.cu
// says when it grows); nullptr on success, else what failed. Slots: the attention's partials, and
// GatedAttention's query, key and value.
constexpr int kScratchGqaPartials = 0;
constexpr int kScratchGatedQkv = 1;
const char* StreamScratch(void* stream, int slot, size_t bytes, void** out);
#endif

}  // namespace ort_mtp
